//! Acrobot-v1 in Rust, equivalent to gymnasium 1.x `classic_control/acrobot.py` ("book" dynamics,
//! no torque noise, one RK4 step over [0, dt] per env step, float64 state like the reference).
//! The batched C ABI is documented in envs_fast/rust/backend.py; the framework auto-resets finished
//! envs and applies the 500-step time limit. Std only: everything below "ABI" is the same in every
//! translation.
use std::f64::consts::PI;
use std::os::raw::c_char;

// ---------------------------------------------------------------- the environment

const ENV_ID: &[u8] = b"Acrobot-v1\0";
const STATE_FIELDS: &[u8] = b"theta1,theta2,dtheta1,dtheta2\0";
const STATE_SIZE: usize = 4;
const OBS_SIZE: usize = 6;
const ACTION_SIZE: usize = 1;

const DT: f64 = 0.2;
const LINK_LENGTH_1: f64 = 1.0;
const LINK_MASS_1: f64 = 1.0;
const LINK_MASS_2: f64 = 1.0;
const LINK_COM_POS_1: f64 = 0.5;
const LINK_COM_POS_2: f64 = 0.5;
const LINK_MOI: f64 = 1.0;
const MAX_VEL_1: f64 = 4.0 * PI;
const MAX_VEL_2: f64 = 9.0 * PI;
const AVAIL_TORQUE: [f64; 3] = [-1.0, 0.0, 1.0];
const G: f64 = 9.8;

fn write_obs(s: &[f64], obs: &mut [f32]) {
    let values = [s[0].cos(), s[0].sin(), s[1].cos(), s[1].sin(), s[2], s[3]];
    for (o, v) in obs.iter_mut().zip(values) {
        *o = v as f32;
    }
}

fn reset_env(rng: &mut Rng, state: &mut [f64], obs: &mut [f32]) {
    for s in state.iter_mut() {
        *s = rng.uniform(-0.1, 0.1) as f32 as f64; // the reference stores its reset state as float32
    }
    write_obs(state, obs);
}

/// The reference's `_dsdt`, term for term (same operation order, so the same rounding).
fn derivatives(s: [f64; 4], a: f64) -> [f64; 4] {
    let (m1, m2, l1) = (LINK_MASS_1, LINK_MASS_2, LINK_LENGTH_1);
    let (lc1, lc2, i1, i2) = (LINK_COM_POS_1, LINK_COM_POS_2, LINK_MOI, LINK_MOI);
    let [theta1, theta2, dtheta1, dtheta2] = s;
    let d1 = m1 * (lc1 * lc1) + m2 * ((l1 * l1) + (lc2 * lc2) + 2.0 * l1 * lc2 * theta2.cos()) + i1 + i2;
    let d2 = m2 * ((lc2 * lc2) + l1 * lc2 * theta2.cos()) + i2;
    let phi2 = m2 * lc2 * G * (theta1 + theta2 - PI / 2.0).cos();
    let phi1 = -m2 * l1 * lc2 * (dtheta2 * dtheta2) * theta2.sin()
        - 2.0 * m2 * l1 * lc2 * dtheta2 * dtheta1 * theta2.sin()
        + (m1 * lc1 + m2 * l1) * G * (theta1 - PI / 2.0).cos()
        + phi2;
    let ddtheta2 = (a + d2 / d1 * phi1 - m2 * l1 * lc2 * (dtheta1 * dtheta1) * theta2.sin() - phi2)
        / (m2 * (lc2 * lc2) + i2 - (d2 * d2) / d1);
    let ddtheta1 = -(d2 * ddtheta2 + phi1) / d1;
    [dtheta1, dtheta2, ddtheta1, ddtheta2]
}

/// The reference's `rk4` over t = [0, dt]: one Runge-Kutta step, its operation order kept.
fn rk4(y0: [f64; 4], torque: f64) -> [f64; 4] {
    let dt = DT - 0.0;
    let dt2 = dt / 2.0;
    let shifted = |k: [f64; 4], h: f64| -> [f64; 4] { std::array::from_fn(|j| y0[j] + h * k[j]) };
    let k1 = derivatives(y0, torque);
    let k2 = derivatives(shifted(k1, dt2), torque);
    let k3 = derivatives(shifted(k2, dt2), torque);
    let k4 = derivatives(shifted(k3, dt), torque);
    std::array::from_fn(|j| y0[j] + dt / 6.0 * (k1[j] + 2.0 * k2[j] + 2.0 * k3[j] + k4[j]))
}

/// The reference's `wrap`: shift by whole periods until inside [low, high]. Its loop never ends
/// for huge |x| (x - period == x); past a million periods the closed form is used instead.
fn wrap(mut x: f64, low: f64, high: f64) -> f64 {
    let diff = high - low;
    if (x - high) / diff > 1e6 {
        return x - ((x - high) / diff).ceil() * diff;
    }
    if (low - x) / diff > 1e6 {
        return x + ((low - x) / diff).ceil() * diff;
    }
    while x > high {
        x = x - diff;
    }
    while x < low {
        x = x + diff;
    }
    x
}

/// The reference's `bound`: Python's min(max(x, low), high), NaN passing through as it does there.
fn bound(x: f64, low: f64, high: f64) -> f64 {
    let y = if low > x { low } else { x };
    if high < y { high } else { y }
}

/// One step; returns (reward, terminated).
fn step_env(_rng: &mut Rng, state: &mut [f64], action: &[f64], obs: &mut [f32]) -> (f64, bool) {
    // Out-of-range actions are clamped (the adapter rejects them; this only keeps the index in bounds).
    let torque = AVAIL_TORQUE[(action[0].max(0.0) as usize).min(2)];
    let ns = rk4([state[0], state[1], state[2], state[3]], torque);
    state[0] = wrap(ns[0], -PI, PI);
    state[1] = wrap(ns[1], -PI, PI);
    state[2] = bound(ns[2], -MAX_VEL_1, MAX_VEL_1);
    state[3] = bound(ns[3], -MAX_VEL_2, MAX_VEL_2);
    let terminated = -state[0].cos() - (state[1] + state[0]).cos() > 1.0;
    write_obs(state, obs);
    (if terminated { 0.0 } else { -1.0 }, terminated)
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
