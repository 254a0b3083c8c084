//! CartPole-v1 in Rust, equivalent to gymnasium 1.x `classic_control/cartpole.py` (explicit Euler,
//! float64 state like the reference). The batched C ABI is documented in envs_fast/rust/backend.py;
//! the framework auto-resets finished envs and applies the 500-step time limit.
//! Std only: everything below "ABI" is the same in every translation.
use std::os::raw::c_char;

// ---------------------------------------------------------------- the environment

const ENV_ID: &[u8] = b"CartPole-v1\0";
const STATE_FIELDS: &[u8] = b"x,x_dot,theta,theta_dot\0";
const STATE_SIZE: usize = 4;
const OBS_SIZE: usize = 4;
const ACTION_SIZE: usize = 1;

const GRAVITY: f64 = 9.8;
const MASS_CART: f64 = 1.0;
const MASS_POLE: f64 = 0.1;
const TOTAL_MASS: f64 = MASS_POLE + MASS_CART;
const LENGTH: f64 = 0.5; // half the pole's length
const POLEMASS_LENGTH: f64 = MASS_POLE * LENGTH;
const FORCE_MAG: f64 = 10.0;
const TAU: f64 = 0.02; // seconds between state updates
const THETA_THRESHOLD: f64 = 12.0 * 2.0 * std::f64::consts::PI / 360.0;
const X_THRESHOLD: f64 = 2.4;

fn write_obs(state: &[f64], obs: &mut [f32]) {
    for (o, s) in obs.iter_mut().zip(state) {
        *o = *s as f32;
    }
}

fn reset_env(rng: &mut Rng, state: &mut [f64], obs: &mut [f32]) {
    for s in state.iter_mut() {
        *s = rng.uniform(-0.05, 0.05);
    }
    write_obs(state, obs);
}

/// One step; returns (reward, terminated). Operations in the reference's order, so that rounding agrees.
fn step_env(_rng: &mut Rng, state: &mut [f64], action: &[f64], obs: &mut [f32]) -> (f64, bool) {
    let (x, x_dot, theta, theta_dot) = (state[0], state[1], state[2], state[3]);
    let force = if action[0] == 1.0 { FORCE_MAG } else { -FORCE_MAG };
    let costheta = theta.cos();
    let sintheta = theta.sin();
    let temp = (force + POLEMASS_LENGTH * (theta_dot * theta_dot) * sintheta) / TOTAL_MASS;
    let thetaacc = (GRAVITY * sintheta - costheta * temp)
        / (LENGTH * (4.0 / 3.0 - MASS_POLE * (costheta * costheta) / TOTAL_MASS));
    let xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS;
    // explicit Euler, the reference's default kinematics_integrator
    state[0] = x + TAU * x_dot;
    state[1] = x_dot + TAU * xacc;
    state[2] = theta + TAU * theta_dot;
    state[3] = theta_dot + TAU * thetaacc;
    let (x, theta) = (state[0], state[2]);
    let terminated = x < -X_THRESHOLD || x > X_THRESHOLD || theta < -THETA_THRESHOLD || theta > THETA_THRESHOLD;
    write_obs(state, obs);
    (1.0, terminated) // also 1.0 on the terminating step
}

// ---------------------------------------------------------------- random numbers

/// splitmix64 over a hashed seed: nearby seeds give unrelated streams.
struct Rng(u64);

fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
    z ^ (z >> 31)
}

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(mix64(seed ^ 0x5851F42D4C957F2D))
    }
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        mix64(self.0)
    }
    /// In [0, 1) with 53 random bits, like numpy's random().
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    fn uniform(&mut self, low: f64, high: f64) -> f64 {
        low + (high - low) * self.unit()
    }
}

// ---------------------------------------------------------------- ABI (see envs_fast/rust/backend.py)

const ABI_VERSION: u32 = 1;
const MIN_ENVS_PER_THREAD: usize = 4096; // below this a thread costs more than it saves

/// The per-env arrays of one `autorl_step` call (or a contiguous part of them).
struct Batch<'a> {
    seeds: &'a [u64],
    resets: &'a [u8],
    state: &'a mut [f64],
    actions: &'a [f64],
    obs: &'a mut [f32],
    reward: &'a mut [f64],
    terminated: &'a mut [u8],
}

impl<'a> Batch<'a> {
    fn split_at(self, k: usize) -> (Batch<'a>, Batch<'a>) {
        let (seeds_a, seeds_b) = self.seeds.split_at(k);
        let (resets_a, resets_b) = self.resets.split_at(k);
        let (state_a, state_b) = self.state.split_at_mut(k * STATE_SIZE);
        let (actions_a, actions_b) = self.actions.split_at(k * ACTION_SIZE);
        let (obs_a, obs_b) = self.obs.split_at_mut(k * OBS_SIZE);
        let (reward_a, reward_b) = self.reward.split_at_mut(k);
        let (terminated_a, terminated_b) = self.terminated.split_at_mut(k);
        (
            Batch { seeds: seeds_a, resets: resets_a, state: state_a, actions: actions_a, obs: obs_a, reward: reward_a, terminated: terminated_a },
            Batch { seeds: seeds_b, resets: resets_b, state: state_b, actions: actions_b, obs: obs_b, reward: reward_b, terminated: terminated_b },
        )
    }

    fn run_serial(self) {
        let envs = self.seeds.iter().zip(self.resets).zip(self.state.chunks_exact_mut(STATE_SIZE))
            .zip(self.actions.chunks_exact(ACTION_SIZE)).zip(self.obs.chunks_exact_mut(OBS_SIZE))
            .zip(self.reward.iter_mut()).zip(self.terminated.iter_mut());
        for ((((((seed, reset), state), action), obs), reward), terminated) in envs {
            let mut rng = Rng::new(*seed);
            if *reset != 0 {
                reset_env(&mut rng, state, obs);
                *reward = 0.0;
                *terminated = 0;
            } else {
                let (r, t) = step_env(&mut rng, state, action, obs);
                *reward = r;
                *terminated = t as u8;
            }
        }
    }

    /// Envs are independent, so any split gives the same results as the serial loop.
    fn run(self) {
        let n = self.seeds.len();
        let threads = if n < 2 * MIN_ENVS_PER_THREAD { 1 } else { available_threads().min(n / MIN_ENVS_PER_THREAD) };
        if threads <= 1 {
            return self.run_serial();
        }
        let per_thread = (n + threads - 1) / threads;
        std::thread::scope(|scope| {
            let mut rest = self;
            while rest.seeds.len() > per_thread {
                let (chunk, tail) = rest.split_at(per_thread);
                scope.spawn(move || chunk.run_serial());
                rest = tail;
            }
            rest.run_serial(); // the last chunk on the calling thread
        });
    }
}

fn available_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
}

#[no_mangle]
pub extern "C" fn autorl_abi_version() -> u32 {
    ABI_VERSION
}

#[no_mangle]
pub extern "C" fn autorl_env_id() -> *const c_char {
    ENV_ID.as_ptr() as *const c_char
}

#[no_mangle]
pub extern "C" fn autorl_state_fields() -> *const c_char {
    STATE_FIELDS.as_ptr() as *const c_char
}

#[no_mangle]
pub extern "C" fn autorl_state_size() -> usize {
    STATE_SIZE
}

#[no_mangle]
pub extern "C" fn autorl_obs_size() -> usize {
    OBS_SIZE
}

#[no_mangle]
pub extern "C" fn autorl_action_size() -> usize {
    ACTION_SIZE
}

/// Resets n envs, env i from seeds[i]: writes state (n * STATE_SIZE f64) and obs (n * OBS_SIZE f32).
#[no_mangle]
pub unsafe extern "C" fn autorl_reset(n: usize, seeds: *const u64, state: *mut f64, obs: *mut f32) {
    if n == 0 {
        return;
    }
    // A step in which every env resets: one code path (and one threading rule) for both.
    let resets = vec![1u8; n];
    let actions = vec![0.0f64; n * ACTION_SIZE];
    let mut reward = vec![0.0f64; n];
    let mut terminated = vec![0u8; n];
    Batch {
        seeds: std::slice::from_raw_parts(seeds, n),
        resets: &resets,
        state: std::slice::from_raw_parts_mut(state, n * STATE_SIZE),
        actions: &actions,
        obs: std::slice::from_raw_parts_mut(obs, n * OBS_SIZE),
        reward: &mut reward,
        terminated: &mut terminated,
    }
    .run();
}

/// Env i: resets[i] != 0 -> reset from seeds[i] (reward 0, terminated 0); else one step with
/// actions[i * ACTION_SIZE..]. state is read and written in place.
#[no_mangle]
pub unsafe extern "C" fn autorl_step(
    n: usize,
    seeds: *const u64,
    resets: *const u8,
    state: *mut f64,
    actions: *const f64,
    obs: *mut f32,
    reward: *mut f64,
    terminated: *mut u8,
) {
    if n == 0 {
        return;
    }
    Batch {
        seeds: std::slice::from_raw_parts(seeds, n),
        resets: std::slice::from_raw_parts(resets, n),
        state: std::slice::from_raw_parts_mut(state, n * STATE_SIZE),
        actions: std::slice::from_raw_parts(actions, n * ACTION_SIZE),
        obs: std::slice::from_raw_parts_mut(obs, n * OBS_SIZE),
        reward: std::slice::from_raw_parts_mut(reward, n),
        terminated: std::slice::from_raw_parts_mut(terminated, n),
    }
    .run();
}
