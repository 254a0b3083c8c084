//! BipedalWalker-v3 in Rust: gymnasium 1.x `box2d/bipedal_walker.py` (normal terrain) on a port of
//! the parts of Box2D 2.3 (box2d-py 2.3.8's C++ source, pybox2d 2.3.10) this scene uses, in float32
//! like Box2D's float32 build, each routine translated with the C++ operation order kept so that a
//! step from a synced state rounds like the reference:
//!   b2CollideEdgeAndPolygon (b2EPCollider), b2Contact::Update (warm-start matching by feature id,
//!   touching flags, the contact listener), b2ContactManager::Collide / AddPair, the broad-phase's
//!   fat AABBs and pair order (proxy ids), b2World::Solve's island DFS order, b2Island::Solve
//!   (integration, sequential impulses with warm starting, block solver, 180 velocity and 60 position
//!   iterations, sleeping), b2RevoluteJoint (motor, limits), b2EdgeShape::RayCast for the lidar.
//!   continuous collision: b2World::SolveTOI with b2TimeOfImpact (conservative advancement over
//!   b2Distance's GJK) and b2Island::SolveTOI's sub-steps.
//! The batched C ABI is documented in envs_fast/rust/backend.py; the framework auto-resets finished
//! envs and applies the 1600-step time limit.
//!
//! State (f64 per env, names from autorl_state_fields; bipedalwalker_v3_sync.py reads and writes it):
//!   game_over, ground_contact1, ground_contact3 (legs[1], legs[3]), prev_shaping, contact_count;
//!   per body (hull, leg0, lower0, leg1, lower1): sweep centre cx, cy, angle, vx, vy, w, awake,
//!     sleep_time, the broad-phase's fat AABB (fat_lx, fat_ly, fat_ux, fat_uy) and proxy id;
//!   per joint (gymnasium's order): accumulated impulse x, y, z (limit) and motor impulse;
//!   terrain_y0..199 (gymnasium's heights; x is i * TERRAIN_STEP), edge_proxy0..198;
//!   48 contact slots in b2World's list order (head first): segment, body, touching, enabled, and
//!     the manifold (points, type, local normal and point, per point: local point, normal and
//!     tangent impulse, feature id).
//! Reset draws the terrain with this file's RNG (not numpy's stream: the ABI's seeds are u64) and
//! gives proxy ids as a fresh b2World would; step reads everything it needs from the state.
//! Hardcore terrain (stumps, stairs, pits) is not ported.
use std::os::raw::c_char;

// ---------------------------------------------------------------- the environment's constants

const ENV_ID: &[u8] = b"BipedalWalker-v3\0";
const OBS_SIZE: usize = 24;
const ACTION_SIZE: usize = 4;

const FPS: f64 = 50.0;
const SCALE: f64 = 30.0;
const MOTORS_TORQUE: f64 = 80.0;
const SPEED_HIP: f64 = 4.0;
const SPEED_KNEE: f64 = 6.0;
const LIDAR_RANGE: f64 = 160.0 / SCALE;
const INITIAL_RANDOM: f64 = 5.0;
const HULL_POLY: [(f64, f64); 5] = [(-30.0, 9.0), (6.0, 9.0), (34.0, 1.0), (34.0, -8.0), (-30.0, -8.0)];
const LEG_DOWN: f64 = -8.0 / SCALE;
const LEG_W: f64 = 8.0 / SCALE;
const LEG_H: f64 = 34.0 / SCALE;
const VIEWPORT_W: f64 = 600.0;
const VIEWPORT_H: f64 = 400.0;
const TERRAIN_STEP: f64 = 14.0 / SCALE;
const TERRAIN_LENGTH: usize = 200;
const TERRAIN_HEIGHT: f64 = VIEWPORT_H / SCALE / 4.0;
const TERRAIN_GRASS: i64 = 10;
const TERRAIN_STARTPAD: i64 = 20;
const FRICTION: f64 = 2.5;
const EDGES: usize = TERRAIN_LENGTH - 1;

// Box2D's b2Settings.h
const LINEAR_SLOP: f32 = 0.005;
const PI32: f32 = 3.14159265359;
const ANGULAR_SLOP: f32 = 2.0 / 180.0 * PI32;
const POLYGON_RADIUS: f32 = 2.0 * LINEAR_SLOP;
const AABB_EXTENSION: f32 = 0.1;
const AABB_MULTIPLIER: f32 = 2.0;
const VELOCITY_THRESHOLD: f32 = 1.0;
const MAX_LINEAR_CORRECTION: f32 = 0.2;
const MAX_ANGULAR_CORRECTION: f32 = 8.0 / 180.0 * PI32;
const MAX_TRANSLATION: f32 = 2.0;
const MAX_ROTATION: f32 = 0.5 * PI32;
const BAUMGARTE: f32 = 0.2;
const TOI_BAUMGARTE: f32 = 0.75;
const MAX_SUB_STEPS: u32 = 8;
const MAX_TOI_CONTACTS: usize = 32;
const TOI_POSITION_ITERATIONS: usize = 20;
const TIME_TO_SLEEP: f32 = 0.5;
const LINEAR_SLEEP_TOLERANCE: f32 = 0.01;
const ANGULAR_SLEEP_TOLERANCE: f32 = 2.0 / 180.0 * PI32;
const EPSILON: f32 = f32::EPSILON;
const VELOCITY_ITERATIONS: usize = 6 * 30;
const POSITION_ITERATIONS: usize = 2 * 30;

// Bodies in gymnasium's order: hull, legs[0] (upper), legs[1] (lower), legs[2], legs[3].
const HULL: usize = 0;
const NB: usize = 5;
const STATIC: usize = NB; // the solver slot every terrain edge shares (zero mass, at rest)
// Joints in gymnasium's order: hull-leg0, leg0-lower0, hull-leg1, leg1-lower1.
const JOINT_BODIES: [(usize, usize); 4] = [(0, 1), (1, 2), (0, 3), (3, 4)];
// b2World's body list is newest first; each body's joint list likewise (see island()).
const BODY_LIST: [usize; NB] = [4, 3, 2, 1, 0];
const BODY_JOINTS: [&[usize]; NB] = [&[2, 0], &[1, 0], &[1], &[3, 2], &[3]];

// ---------------------------------------------------------------- state layout

/// Contact slots (b2World's contact list, head first); a contact is an (edge, body) pair.
const MAX_CONTACTS: usize = 48;
const BODY_FIELDS: [&str; 13] = ["cx", "cy", "angle", "vx", "vy", "w", "awake", "sleep_time",
                                 "fat_lx", "fat_ly", "fat_ux", "fat_uy", "proxy"];
const JOINT_FIELDS: [&str; 4] = ["impulse_x", "impulse_y", "impulse_z", "motor_impulse"];
const CONTACT_FIELDS: [&str; 20] = ["edge", "body", "touching", "enabled", "points", "type", "nx", "ny", "px", "py",
                                    "p0x", "p0y", "p0n", "p0t", "p0id", "p1x", "p1y", "p1n", "p1t", "p1id"];
const HEADER: usize = 5; // game_over, ground_contact1, ground_contact3, prev_shaping, contact_count
const O_BODY: usize = HEADER;
const O_JOINT: usize = O_BODY + NB * BODY_FIELDS.len();
const O_TERRAIN: usize = O_JOINT + 4 * JOINT_FIELDS.len();
const O_EDGE_PROXY: usize = O_TERRAIN + TERRAIN_LENGTH;
const O_CONTACT: usize = O_EDGE_PROXY + EDGES;
const STATE_SIZE: usize = O_CONTACT + MAX_CONTACTS * CONTACT_FIELDS.len();

fn state_fields() -> &'static [u8] {
    static FIELDS: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    FIELDS.get_or_init(|| {
        let mut names: Vec<String> = ["game_over", "ground_contact1", "ground_contact3", "prev_shaping", "contact_count"]
            .iter().map(|s| s.to_string()).collect();
        for b in ["hull", "leg0", "lower0", "leg1", "lower1"] {
            names.extend(BODY_FIELDS.iter().map(|f| format!("{b}_{f}")));
        }
        for j in 0..4 {
            names.extend(JOINT_FIELDS.iter().map(|f| format!("joint{j}_{f}")));
        }
        names.extend((0..TERRAIN_LENGTH).map(|i| format!("terrain_y{i}")));
        names.extend((0..EDGES).map(|i| format!("edge_proxy{i}")));
        for c in 0..MAX_CONTACTS {
            names.extend(CONTACT_FIELDS.iter().map(|f| format!("c{c}_{f}")));
        }
        assert_eq!(names.len(), STATE_SIZE);
        let mut bytes = names.join(",").into_bytes();
        bytes.push(0);
        bytes
    })
}

// ---------------------------------------------------------------- b2Math (float32)

#[derive(Clone, Copy, Default, Debug, PartialEq)]
struct V2 {
    x: f32,
    y: f32,
}
fn v2(x: f32, y: f32) -> V2 {
    V2 { x, y }
}
impl std::ops::Add for V2 {
    type Output = V2;
    fn add(self, o: V2) -> V2 {
        v2(self.x + o.x, self.y + o.y)
    }
}
impl std::ops::Sub for V2 {
    type Output = V2;
    fn sub(self, o: V2) -> V2 {
        v2(self.x - o.x, self.y - o.y)
    }
}
impl std::ops::Neg for V2 {
    type Output = V2;
    fn neg(self) -> V2 {
        v2(-self.x, -self.y)
    }
}
impl std::ops::Mul<V2> for f32 {
    type Output = V2;
    fn mul(self, v: V2) -> V2 {
        v2(self * v.x, self * v.y)
    }
}
fn dot(a: V2, b: V2) -> f32 {
    a.x * b.x + a.y * b.y
}
fn cross(a: V2, b: V2) -> f32 {
    a.x * b.y - a.y * b.x
}
fn cross_vs(a: V2, s: f32) -> V2 {
    v2(s * a.y, -s * a.x)
}
fn cross_sv(s: f32, a: V2) -> V2 {
    v2(-s * a.y, s * a.x)
}
fn vmin(a: V2, b: V2) -> V2 {
    v2(if a.x < b.x { a.x } else { b.x }, if a.y < b.y { a.y } else { b.y })
}
fn vmax(a: V2, b: V2) -> V2 {
    v2(if a.x > b.x { a.x } else { b.x }, if a.y > b.y { a.y } else { b.y })
}
fn length(a: V2) -> f32 {
    (a.x * a.x + a.y * a.y).sqrt()
}
/// b2Vec2::Normalize
fn normalize(a: V2) -> V2 {
    let len = length(a);
    if len < EPSILON {
        return a;
    }
    let inv = 1.0 / len;
    v2(a.x * inv, a.y * inv)
}
fn clampf(a: f32, lo: f32, hi: f32) -> f32 {
    // b2Clamp(a, lo, hi) = b2Max(lo, b2Min(a, hi)); b2Min(a, b) = a < b ? a : b
    let m = if a < hi { a } else { hi };
    if lo > m { lo } else { m }
}
fn minf(a: f32, b: f32) -> f32 {
    if a < b { a } else { b }
}
fn maxf(a: f32, b: f32) -> f32 {
    if a > b { a } else { b }
}
fn absf(a: f32) -> f32 {
    if a > 0.0 { a } else { -a }
}

#[derive(Clone, Copy, Default, Debug)]
struct Rot {
    s: f32,
    c: f32,
}
fn rot(angle: f32) -> Rot {
    Rot { s: angle.sin(), c: angle.cos() }
}
fn mul_r(q: Rot, v: V2) -> V2 {
    v2(q.c * v.x - q.s * v.y, q.s * v.x + q.c * v.y)
}
fn mult_r(q: Rot, v: V2) -> V2 {
    v2(q.c * v.x + q.s * v.y, -q.s * v.x + q.c * v.y)
}
#[derive(Clone, Copy, Default, Debug)]
struct Xf {
    p: V2,
    q: Rot,
}
const IDENTITY: Xf = Xf { p: V2 { x: 0.0, y: 0.0 }, q: Rot { s: 0.0, c: 1.0 } };
fn mul_x(t: Xf, v: V2) -> V2 {
    v2((t.q.c * v.x - t.q.s * v.y) + t.p.x, (t.q.s * v.x + t.q.c * v.y) + t.p.y)
}
fn mult_x(t: Xf, v: V2) -> V2 {
    let px = v.x - t.p.x;
    let py = v.y - t.p.y;
    v2(t.q.c * px + t.q.s * py, -t.q.s * px + t.q.c * py)
}
fn mult_xx(a: Xf, b: Xf) -> Xf {
    let q = Rot { s: a.q.c * b.q.s - a.q.s * b.q.c, c: a.q.c * b.q.c + a.q.s * b.q.s };
    Xf { q, p: mult_r(a.q, b.p - a.p) }
}

#[derive(Clone, Copy, Default)]
struct V3 {
    x: f32,
    y: f32,
    z: f32,
}
fn dot3(a: V3, b: V3) -> f32 {
    a.x * b.x + a.y * b.y + a.z * b.z
}
fn cross3(a: V3, b: V3) -> V3 {
    V3 { x: a.y * b.z - a.z * b.y, y: a.z * b.x - a.x * b.z, z: a.x * b.y - a.y * b.x }
}
#[derive(Clone, Copy, Default)]
struct M33 {
    ex: V3,
    ey: V3,
    ez: V3,
}
/// The parts of b2Mat33::Solve33 / Solve22 that depend on the matrix alone: a joint's matrix is
/// fixed over an island solve's 180 velocity iterations, so they are computed once (same values,
/// same bits) instead of a division per solve.
#[derive(Clone, Copy, Default)]
struct M33Factors {
    det33: f32, // 1 / det (0 for a singular matrix, as Solve33 leaves it)
    eyez: V3,   // cross(ey, ez)
    det22: f32,
}
impl M33 {
    fn factors(&self) -> M33Factors {
        let eyez = cross3(self.ey, self.ez);
        let mut det33 = dot3(self.ex, eyez);
        if det33 != 0.0 {
            det33 = 1.0 / det33;
        }
        let (a11, a12, a21, a22) = (self.ex.x, self.ey.x, self.ex.y, self.ey.y);
        let mut det22 = a11 * a22 - a12 * a21;
        if det22 != 0.0 {
            det22 = 1.0 / det22;
        }
        M33Factors { det33, eyez, det22 }
    }
    fn solve33(&self, f: &M33Factors, b: V3) -> V3 {
        let det = f.det33;
        V3 {
            x: det * dot3(b, f.eyez),
            y: det * dot3(self.ex, cross3(b, self.ez)),
            z: det * dot3(self.ex, cross3(self.ey, b)),
        }
    }
    fn solve22(&self, f: &M33Factors, b: V2) -> V2 {
        let (a11, a12, a21, a22) = (self.ex.x, self.ey.x, self.ex.y, self.ey.y);
        let det = f.det22;
        v2(det * (a22 * b.x - a12 * b.y), det * (a11 * b.y - a21 * b.x))
    }
}
#[derive(Clone, Copy, Default)]
struct M22 {
    ex: V2,
    ey: V2,
}
impl M22 {
    fn inverse(&self) -> M22 {
        let (a, b, c, d) = (self.ex.x, self.ey.x, self.ex.y, self.ey.y);
        let mut det = a * d - b * c;
        if det != 0.0 {
            det = 1.0 / det;
        }
        M22 { ex: v2(det * d, -det * c), ey: v2(-det * b, det * a) }
    }
    fn solve(&self, b: V2) -> V2 {
        let (a11, a12, a21, a22) = (self.ex.x, self.ey.x, self.ex.y, self.ey.y);
        let mut det = a11 * a22 - a12 * a21;
        if det != 0.0 {
            det = 1.0 / det;
        }
        v2(det * (a22 * b.x - a12 * b.y), det * (a11 * b.y - a21 * b.x))
    }
    fn mul(&self, v: V2) -> V2 {
        v2(self.ex.x * v.x + self.ey.x * v.y, self.ex.y * v.x + self.ey.y * v.y)
    }
}

// ---------------------------------------------------------------- shapes and mass (b2PolygonShape)

#[derive(Clone, Copy)]
struct Poly {
    count: usize,
    v: [V2; 8],
    n: [V2; 8],
    centroid: V2,
}

fn poly_box(hx: f32, hy: f32) -> Poly {
    let mut p = Poly { count: 4, v: [V2::default(); 8], n: [V2::default(); 8], centroid: V2::default() };
    p.v[..4].copy_from_slice(&[v2(-hx, -hy), v2(hx, -hy), v2(hx, hy), v2(-hx, hy)]);
    p.n[..4].copy_from_slice(&[v2(0.0, -1.0), v2(1.0, 0.0), v2(0.0, 1.0), v2(-1.0, 0.0)]);
    p
}

/// b2PolygonShape::Set: gift-wrapping hull (vertex order as Box2D makes it), normals, centroid.
fn poly_set(ps: &[V2]) -> Poly {
    let n = ps.len();
    let mut i0 = 0;
    let mut x0 = ps[0].x;
    for i in 1..n {
        let x = ps[i].x;
        if x > x0 || (x == x0 && ps[i].y < ps[i0].y) {
            i0 = i;
            x0 = x;
        }
    }
    let mut hull = [0usize; 8];
    let mut m = 0;
    let mut ih = i0;
    loop {
        hull[m] = ih;
        let mut ie = 0;
        for j in 1..n {
            if ie == ih {
                ie = j;
                continue;
            }
            let r = ps[ie] - ps[hull[m]];
            let v = ps[j] - ps[hull[m]];
            let c = cross(r, v);
            if c < 0.0 {
                ie = j;
            }
            if c == 0.0 && dot(v, v) > dot(r, r) {
                ie = j;
            }
        }
        m += 1;
        ih = ie;
        if ie == i0 {
            break;
        }
    }
    let mut p = Poly { count: m, v: [V2::default(); 8], n: [V2::default(); 8], centroid: V2::default() };
    for i in 0..m {
        p.v[i] = ps[hull[i]];
    }
    for i in 0..m {
        let i2 = if i + 1 < m { i + 1 } else { 0 };
        p.n[i] = normalize(cross_vs(p.v[i2] - p.v[i], 1.0));
    }
    // ComputeCentroid (pRef at the origin)
    let mut c = v2(0.0, 0.0);
    let mut area = 0.0f32;
    let inv3 = 1.0f32 / 3.0;
    let p_ref = v2(0.0, 0.0);
    for i in 0..m {
        let p1 = p_ref;
        let p2 = p.v[i];
        let p3 = if i + 1 < m { p.v[i + 1] } else { p.v[0] };
        let d = cross(p2 - p1, p3 - p1);
        let tri = 0.5 * d;
        area += tri;
        c = c + (tri * inv3) * (p1 + p2 + p3);
    }
    p.centroid = (1.0 / area) * c;
    p
}

/// b2PolygonShape::ComputeMass then b2Body::ResetMassData for a one-fixture dynamic body:
/// (mass, inverse mass, inverse inertia about the centre, local centre).
fn mass_data(p: &Poly, density: f32) -> (f32, f32, f32, V2) {
    let mut center = v2(0.0, 0.0);
    let mut area = 0.0f32;
    let mut inertia = 0.0f32;
    let mut s = v2(0.0, 0.0);
    for i in 0..p.count {
        s = s + p.v[i];
    }
    s = (1.0 / p.count as f32) * s;
    let k_inv3 = 1.0f32 / 3.0;
    for i in 0..p.count {
        let e1 = p.v[i] - s;
        let e2 = if i + 1 < p.count { p.v[i + 1] - s } else { p.v[0] - s };
        let d = cross(e1, e2);
        let tri = 0.5 * d;
        area += tri;
        center = center + (tri * k_inv3) * (e1 + e2);
        let (ex1, ey1, ex2, ey2) = (e1.x, e1.y, e2.x, e2.y);
        let intx2 = ex1 * ex1 + ex2 * ex1 + ex2 * ex2;
        let inty2 = ey1 * ey1 + ey2 * ey1 + ey2 * ey2;
        inertia += (0.25 * k_inv3 * d) * (intx2 + inty2);
    }
    let mass = density * area;
    center = (1.0 / area) * center;
    let mcenter = center + s;
    let mut i_body = density * inertia;
    i_body += mass * (dot(mcenter, mcenter) - dot(center, center));
    // ResetMassData
    let m_mass = 0.0f32 + mass;
    let mut local = v2(0.0, 0.0) + mass * mcenter;
    let m_i = 0.0f32 + i_body;
    let inv_mass = 1.0 / m_mass;
    local = inv_mass * local;
    let m_i = m_i - m_mass * dot(local, local);
    (m_mass, inv_mass, 1.0 / m_i, local)
}

struct Shapes {
    polys: [Poly; NB],
    inv_mass: [f32; NB],
    inv_i: [f32; NB],
    local_center: [V2; NB],
    friction: [f32; NB],
}

fn shapes() -> &'static Shapes {
    static SHAPES: std::sync::OnceLock<Shapes> = std::sync::OnceLock::new();
    SHAPES.get_or_init(|| {
        let hull_pts: Vec<V2> = HULL_POLY.iter().map(|&(x, y)| v2((x / SCALE) as f32, (y / SCALE) as f32)).collect();
        let hull = poly_set(&hull_pts);
        let leg = poly_box((LEG_W / 2.0) as f32, (LEG_H / 2.0) as f32);
        let lower = poly_box((0.8 * LEG_W / 2.0) as f32, (LEG_H / 2.0) as f32);
        let polys = [hull, leg, lower, leg, lower];
        let density = [5.0f32, 1.0, 1.0, 1.0, 1.0];
        let mut s = Shapes { polys, inv_mass: [0.0; NB], inv_i: [0.0; NB], local_center: [V2::default(); NB],
                             friction: [0.1, 0.2, 0.2, 0.2, 0.2] };
        for b in 0..NB {
            let (_, im, ii, lc) = mass_data(&s.polys[b], density[b]);
            s.inv_mass[b] = im;
            s.inv_i[b] = ii;
            s.local_center[b] = lc;
        }
        s
    })
}

fn terrain_x(i: usize) -> f32 {
    (i as f64 * TERRAIN_STEP) as f32
}

/// b2EdgeShape::ComputeAABB (identity transform) widened by b2_aabbExtension, as CreateProxy does.
fn edge_fat_aabb(v1: V2, v2_: V2) -> [f32; 4] {
    let lower = vmin(mul_x(IDENTITY, v1), mul_x(IDENTITY, v2_));
    let upper = vmax(mul_x(IDENTITY, v1), mul_x(IDENTITY, v2_));
    let r = v2(POLYGON_RADIUS, POLYGON_RADIUS);
    let (lo, up) = (lower - r, upper + r);
    let e = v2(AABB_EXTENSION, AABB_EXTENSION);
    let (lo, up) = (lo - e, up + e);
    [lo.x, lo.y, up.x, up.y]
}

fn poly_aabb(p: &Poly, xf: Xf) -> [f32; 4] {
    let mut lower = mul_x(xf, p.v[0]);
    let mut upper = lower;
    for i in 1..p.count {
        let v = mul_x(xf, p.v[i]);
        lower = vmin(lower, v);
        upper = vmax(upper, v);
    }
    let r = v2(POLYGON_RADIUS, POLYGON_RADIUS);
    let (lo, up) = (lower - r, upper + r);
    [lo.x, lo.y, up.x, up.y]
}

fn aabb_overlap(a: &[f32; 4], b: &[f32; 4]) -> bool {
    let d1 = v2(b[0] - a[2], b[1] - a[3]);
    let d2 = v2(a[0] - b[2], a[1] - b[3]);
    !(d1.x > 0.0 || d1.y > 0.0 || d2.x > 0.0 || d2.y > 0.0)
}

// ---------------------------------------------------------------- manifolds (b2CollideEdge.cpp)

#[derive(Clone, Copy, Default, Debug)]
struct MPoint {
    lp: V2,
    ni: f32,
    ti: f32,
    key: u32,
}
#[derive(Clone, Copy, Default, Debug)]
struct Manifold {
    count: usize,
    typ: u32, // b2Manifold::Type: 0 circles, 1 faceA, 2 faceB
    ln: V2,
    lp: V2,
    pts: [MPoint; 2],
}

// b2ContactFeature packed as b2ContactID::key (little endian: indexA, indexB, typeA, typeB)
const F_VERTEX: u32 = 0;
const F_FACE: u32 = 1;
fn key(ia: u32, ib: u32, ta: u32, tb: u32) -> u32 {
    ia | (ib << 8) | (ta << 16) | (tb << 24)
}
fn key_ia(k: u32) -> u32 {
    k & 0xff
}
fn key_ib(k: u32) -> u32 {
    (k >> 8) & 0xff
}
fn key_ta(k: u32) -> u32 {
    (k >> 16) & 0xff
}
fn key_tb(k: u32) -> u32 {
    (k >> 24) & 0xff
}

#[derive(Clone, Copy, Default)]
struct ClipV {
    v: V2,
    id: u32,
}

fn clip_segment_to_line(vin: &[ClipV; 2], normal: V2, offset: f32, vertex_index_a: u32) -> (usize, [ClipV; 2]) {
    let mut out = [ClipV::default(); 2];
    let mut n = 0;
    let d0 = dot(normal, vin[0].v) - offset;
    let d1 = dot(normal, vin[1].v) - offset;
    if d0 <= 0.0 {
        out[n] = vin[0];
        n += 1;
    }
    if d1 <= 0.0 {
        out[n] = vin[1];
        n += 1;
    }
    if d0 * d1 < 0.0 {
        let interp = d0 / (d0 - d1);
        out[n].v = vin[0].v + interp * (vin[1].v - vin[0].v);
        out[n].id = key(vertex_index_a, key_ib(vin[0].id), F_VERTEX, F_FACE);
        n += 1;
    }
    (n, out)
}

/// b2CollideEdgeAndPolygon for an edge without ghost vertices (gymnasium's terrain edges).
fn collide_edge_polygon(v1: V2, v2_: V2, xfa: Xf, poly: &Poly, xfb: Xf) -> Manifold {
    let mut manifold = Manifold::default();
    let xf = mult_xx(xfa, xfb);
    let centroid_b = mul_x(xf, poly.centroid);
    let edge1 = normalize(v2_ - v1);
    let normal1 = v2(edge1.y, -edge1.x);
    let offset1 = dot(normal1, centroid_b - v1);
    // neither hasVertex0 nor hasVertex3
    let front = offset1 >= 0.0;
    let (normal, lower_limit, upper_limit) = if front { (normal1, -normal1, -normal1) } else { (-normal1, normal1, normal1) };
    let count = poly.count;
    let mut pv = [V2::default(); 8];
    let mut pn = [V2::default(); 8];
    for i in 0..count {
        pv[i] = mul_x(xf, poly.v[i]);
        pn[i] = mul_r(xf.q, poly.n[i]);
    }
    let radius = 2.0 * POLYGON_RADIUS;
    // ComputeEdgeSeparation
    let mut edge_sep = f32::MAX;
    for i in 0..count {
        let s = dot(normal, pv[i] - v1);
        if s < edge_sep {
            edge_sep = s;
        }
    }
    if edge_sep > radius {
        return manifold;
    }
    // ComputePolygonSeparation: (known, index, separation)
    let poly_axis = {
        let mut axis = (false, -1i32, -f32::MAX);
        let perp = v2(-normal.y, normal.x);
        let mut early = None;
        for i in 0..count {
            let n = -pn[i];
            let s1 = dot(n, pv[i] - v1);
            let s2 = dot(n, pv[i] - v2_);
            let s = minf(s1, s2);
            if s > radius {
                early = Some((true, i as i32, s));
                break;
            }
            if dot(n, perp) >= 0.0 {
                if dot(n - upper_limit, normal) < -ANGULAR_SLOP {
                    continue;
                }
            } else if dot(n - lower_limit, normal) < -ANGULAR_SLOP {
                continue;
            }
            if s > axis.2 {
                axis = (true, i as i32, s);
            }
        }
        early.unwrap_or(axis)
    };
    if poly_axis.0 && poly_axis.2 > radius {
        return manifold;
    }
    let k_relative_tol = 0.98f32;
    let k_absolute_tol = 0.001f32;
    let primary_is_edge = if !poly_axis.0 {
        true
    } else {
        !(poly_axis.2 > k_relative_tol * edge_sep + k_absolute_tol)
    };
    let mut ie = [ClipV::default(); 2];
    let (rf_i1, rf_i2, rf_v1, rf_v2, rf_normal);
    if primary_is_edge {
        manifold.typ = 1;
        let mut best = 0;
        let mut best_value = dot(normal, pn[0]);
        for i in 1..count {
            let value = dot(normal, pn[i]);
            if value < best_value {
                best_value = value;
                best = i;
            }
        }
        let i1 = best;
        let i2 = if i1 + 1 < count { i1 + 1 } else { 0 };
        ie[0] = ClipV { v: pv[i1], id: key(0, i1 as u32, F_FACE, F_VERTEX) };
        ie[1] = ClipV { v: pv[i2], id: key(0, i2 as u32, F_FACE, F_VERTEX) };
        if front {
            rf_i1 = 0u32;
            rf_i2 = 1u32;
            rf_v1 = v1;
            rf_v2 = v2_;
            rf_normal = normal1;
        } else {
            rf_i1 = 1;
            rf_i2 = 0;
            rf_v1 = v2_;
            rf_v2 = v1;
            rf_normal = -normal1;
        }
    } else {
        manifold.typ = 2;
        let index = poly_axis.1 as u32;
        ie[0] = ClipV { v: v1, id: key(0, index, F_VERTEX, F_FACE) };
        ie[1] = ClipV { v: v2_, id: key(0, index, F_VERTEX, F_FACE) };
        rf_i1 = index;
        rf_i2 = if (rf_i1 as usize) + 1 < count { rf_i1 + 1 } else { 0 };
        rf_v1 = pv[rf_i1 as usize];
        rf_v2 = pv[rf_i2 as usize];
        rf_normal = pn[rf_i1 as usize];
    }
    let side_normal1 = v2(rf_normal.y, -rf_normal.x);
    let side_normal2 = -side_normal1;
    let side_offset1 = dot(side_normal1, rf_v1);
    let side_offset2 = dot(side_normal2, rf_v2);
    let (np, clip1) = clip_segment_to_line(&ie, side_normal1, side_offset1, rf_i1);
    if np < 2 {
        return manifold;
    }
    let (np, clip2) = clip_segment_to_line(&clip1, side_normal2, side_offset2, rf_i2);
    if np < 2 {
        return manifold;
    }
    if primary_is_edge {
        manifold.ln = rf_normal;
        manifold.lp = rf_v1;
    } else {
        manifold.ln = poly.n[rf_i1 as usize];
        manifold.lp = poly.v[rf_i1 as usize];
    }
    let mut pc = 0;
    for i in 0..2 {
        let separation = dot(rf_normal, clip2[i].v - rf_v1);
        if separation <= radius {
            let cp = &mut manifold.pts[pc];
            if primary_is_edge {
                cp.lp = mult_x(xf, clip2[i].v);
                cp.key = clip2[i].id;
            } else {
                let id = clip2[i].id;
                cp.lp = clip2[i].v;
                cp.key = key(key_ib(id), key_ia(id), key_tb(id), key_ta(id));
            }
            pc += 1;
        }
    }
    manifold.count = pc;
    manifold
}

/// b2WorldManifold::Initialize for face manifolds: (normal, points).
fn world_manifold(m: &Manifold, xfa: Xf, ra: f32, xfb: Xf, rb: f32) -> (V2, [V2; 2]) {
    let mut points = [V2::default(); 2];
    if m.count == 0 {
        return (V2::default(), points);
    }
    if m.typ == 1 {
        let normal = mul_r(xfa.q, m.ln);
        let plane = mul_x(xfa, m.lp);
        for i in 0..m.count {
            let clip = mul_x(xfb, m.pts[i].lp);
            let ca = clip + (ra - dot(clip - plane, normal)) * normal;
            let cb = clip - rb * normal;
            points[i] = 0.5 * (ca + cb);
        }
        (normal, points)
    } else {
        let normal = mul_r(xfb.q, m.ln);
        let plane = mul_x(xfb, m.lp);
        for i in 0..m.count {
            let clip = mul_x(xfa, m.pts[i].lp);
            let cb = clip + (rb - dot(clip - plane, normal)) * normal;
            let ca = clip - ra * normal;
            points[i] = 0.5 * (ca + cb);
        }
        (-normal, points)
    }
}

// ---------------------------------------------------------------- the contact solver (b2ContactSolver.cpp)

/// The island's positions and velocities, indexed by body, plus the slot every terrain edge
/// shares (edges are static: zero inverse mass, at rest at the origin, so one slot is exact).
struct SolverData {
    pos_c: [V2; NB + 1],
    pos_a: [f32; NB + 1],
    vel_v: [V2; NB + 1],
    vel_w: [f32; NB + 1],
    inv_mass: [f32; NB + 1],
    inv_i: [f32; NB + 1],
    local_center: [V2; NB + 1],
}

impl SolverData {
    fn new() -> SolverData {
        SolverData { pos_c: [V2::default(); NB + 1], pos_a: [0.0; NB + 1], vel_v: [V2::default(); NB + 1],
                     vel_w: [0.0; NB + 1], inv_mass: [0.0; NB + 1], inv_i: [0.0; NB + 1], local_center: [V2::default(); NB + 1] }
    }
    fn load(&mut self, b: usize, c: V2, a: f32, v: V2, w: f32) {
        let sh = shapes();
        self.pos_c[b] = c;
        self.pos_a[b] = a;
        self.vel_v[b] = v;
        self.vel_w[b] = w;
        self.inv_mass[b] = sh.inv_mass[b];
        self.inv_i[b] = sh.inv_i[b];
        self.local_center[b] = sh.local_center[b];
    }
    /// The integration of positions in b2Island::Solve / SolveTOI (translation and rotation capped).
    fn integrate(&mut self, h: f32, bodies: &[usize]) {
        for &b in bodies {
            let mut c = self.pos_c[b];
            let mut a = self.pos_a[b];
            let mut v = self.vel_v[b];
            let mut w = self.vel_w[b];
            let translation = h * v;
            if dot(translation, translation) > MAX_TRANSLATION * MAX_TRANSLATION {
                let ratio = MAX_TRANSLATION / length(translation);
                v = ratio * v;
            }
            let rotation = h * w;
            if rotation * rotation > MAX_ROTATION * MAX_ROTATION {
                let ratio = MAX_ROTATION / absf(rotation);
                w *= ratio;
            }
            c = c + h * v;
            a += h * w;
            self.pos_c[b] = c;
            self.pos_a[b] = a;
            self.vel_v[b] = v;
            self.vel_w[b] = w;
        }
    }
}

#[derive(Clone, Copy, Default)]
struct Vcp {
    ra: V2,
    rb: V2,
    ni: f32,
    ti: f32,
    normal_mass: f32,
    tangent_mass: f32,
    bias: f32,
}

/// One contact's velocity constraint (and the manifold its position constraint reads). Body A is
/// always a terrain edge (the edge-polygon contact puts the edge first), body B a walker body.
#[derive(Clone, Copy)]
struct Constraint {
    k: usize,
    b: usize,
    m: Manifold,
    points: [Vcp; 2],
    normal: V2,
    normal_mass: M22,
    kmat: M22,
    friction: f32,
    count: usize,
}

struct ContactSolver {
    vcs: Vec<Constraint>,
}

impl ContactSolver {
    fn new(contacts: &[Contact], island: &[usize], warm: bool, _sd: &SolverData) -> ContactSolver {
        let sh = shapes();
        let dt_ratio = 1.0f32; // m_inv_dt0 * dt with a fixed step (the TOI sub-step sets 1 too)
        let vcs = island.iter().map(|&k| {
            let c = &contacts[k];
            let mut points = [Vcp::default(); 2];
            for j in 0..c.m.count {
                let cp = &c.m.pts[j];
                points[j].ni = if warm { dt_ratio * cp.ni } else { 0.0 };
                points[j].ti = if warm { dt_ratio * cp.ti } else { 0.0 };
            }
            Constraint { k, b: c.body, m: c.m, points, normal: V2::default(), normal_mass: M22::default(),
                         kmat: M22::default(), friction: ((FRICTION as f32) * sh.friction[c.body]).sqrt(), count: c.m.count }
        }).collect();
        ContactSolver { vcs }
    }

    fn initialize_velocity_constraints(&mut self, _contacts: &[Contact], sd: &SolverData) {
        let radius = POLYGON_RADIUS;
        for vc in self.vcs.iter_mut() {
            let m = vc.m;
            let (ia_, ib_) = (STATIC, vc.b);
            let (ma, mb, ia, ib) = (0.0f32, sd.inv_mass[ib_], 0.0f32, sd.inv_i[ib_]);
            let (ca, aa, va, wa) = (sd.pos_c[ia_], sd.pos_a[ia_], sd.vel_v[ia_], sd.vel_w[ia_]);
            let (cb, ab, vb, wb) = (sd.pos_c[ib_], sd.pos_a[ib_], sd.vel_v[ib_], sd.vel_w[ib_]);
            let qa = rot(aa);
            let qb = rot(ab);
            let xfa = Xf { q: qa, p: ca - mul_r(qa, sd.local_center[ia_]) };
            let xfb = Xf { q: qb, p: cb - mul_r(qb, sd.local_center[ib_]) };
            let (normal, wpoints) = world_manifold(&m, xfa, radius, xfb, radius);
            vc.normal = normal;
            for j in 0..vc.count {
                let p = &mut vc.points[j];
                p.ra = wpoints[j] - ca;
                p.rb = wpoints[j] - cb;
                let rna = cross(p.ra, normal);
                let rnb = cross(p.rb, normal);
                let kn = ma + mb + ia * rna * rna + ib * rnb * rnb;
                p.normal_mass = if kn > 0.0 { 1.0 / kn } else { 0.0 };
                let tangent = cross_vs(normal, 1.0);
                let rta = cross(p.ra, tangent);
                let rtb = cross(p.rb, tangent);
                let kt = ma + mb + ia * rta * rta + ib * rtb * rtb;
                p.tangent_mass = if kt > 0.0 { 1.0 / kt } else { 0.0 };
                p.bias = 0.0;
                let vrel = dot(normal, vb + cross_sv(wb, p.rb) - va - cross_sv(wa, p.ra));
                if vrel < -VELOCITY_THRESHOLD {
                    p.bias = -0.0 * vrel; // restitution 0
                }
            }
            if vc.count == 2 {
                let (p1, p2) = (&vc.points[0], &vc.points[1]);
                let rn1a = cross(p1.ra, normal);
                let rn1b = cross(p1.rb, normal);
                let rn2a = cross(p2.ra, normal);
                let rn2b = cross(p2.rb, normal);
                let k11 = ma + mb + ia * rn1a * rn1a + ib * rn1b * rn1b;
                let k22 = ma + mb + ia * rn2a * rn2a + ib * rn2b * rn2b;
                let k12 = ma + mb + ia * rn1a * rn2a + ib * rn1b * rn2b;
                let k_max_condition = 1000.0f32;
                if k11 * k11 < k_max_condition * (k11 * k22 - k12 * k12) {
                    vc.kmat = M22 { ex: v2(k11, k12), ey: v2(k12, k22) };
                    vc.normal_mass = vc.kmat.inverse();
                } else {
                    vc.count = 1;
                }
            }
        }
    }

    fn warm_start(&self, sd: &mut SolverData) {
        for vc in self.vcs.iter() {
            let (ia_, ib_) = (STATIC, vc.b);
            let (ma, mb, ia, ib) = (0.0f32, sd.inv_mass[ib_], 0.0f32, sd.inv_i[ib_]);
            let (mut va, mut wa, mut vb, mut wb) = (sd.vel_v[ia_], sd.vel_w[ia_], sd.vel_v[ib_], sd.vel_w[ib_]);
            let normal = vc.normal;
            let tangent = cross_vs(normal, 1.0);
            for j in 0..vc.count {
                let p = &vc.points[j];
                let pp = p.ni * normal + p.ti * tangent;
                wa -= ia * cross(p.ra, pp);
                va = va - ma * pp;
                wb += ib * cross(p.rb, pp);
                vb = vb + mb * pp;
            }
            sd.vel_v[ia_] = va;
            sd.vel_w[ia_] = wa;
            sd.vel_v[ib_] = vb;
            sd.vel_w[ib_] = wb;
        }
    }

    #[inline(always)] // called from step_group and velocity_iteration: inlined in both (3% fewer instructions)
    fn solve_velocity_constraints(&mut self, sd: &mut SolverData) {
        for vc in self.vcs.iter_mut() {
            let (ia_, ib_) = (STATIC, vc.b);
            let (ma, mb, ia, ib) = (0.0f32, sd.inv_mass[ib_], 0.0f32, sd.inv_i[ib_]);
            let (mut va, mut wa, mut vb, mut wb) = (sd.vel_v[ia_], sd.vel_w[ia_], sd.vel_v[ib_], sd.vel_w[ib_]);
            let normal = vc.normal;
            let tangent = cross_vs(normal, 1.0);
            let friction = vc.friction;
            for j in 0..vc.count {
                let p = &mut vc.points[j];
                let dv = vb + cross_sv(wb, p.rb) - va - cross_sv(wa, p.ra);
                let vt = dot(dv, tangent) - 0.0;
                let mut lambda = p.tangent_mass * (-vt);
                let max_friction = friction * p.ni;
                let new_impulse = clampf(p.ti + lambda, -max_friction, max_friction);
                lambda = new_impulse - p.ti;
                p.ti = new_impulse;
                let pp = lambda * tangent;
                va = va - ma * pp;
                wa -= ia * cross(p.ra, pp);
                vb = vb + mb * pp;
                wb += ib * cross(p.rb, pp);
            }
            if vc.count == 1 {
                let p = &mut vc.points[0];
                let dv = vb + cross_sv(wb, p.rb) - va - cross_sv(wa, p.ra);
                let vn = dot(dv, normal);
                let mut lambda = -p.normal_mass * (vn - p.bias);
                let new_impulse = maxf(p.ni + lambda, 0.0);
                lambda = new_impulse - p.ni;
                p.ni = new_impulse;
                let pp = lambda * normal;
                va = va - ma * pp;
                wa -= ia * cross(p.ra, pp);
                vb = vb + mb * pp;
                wb += ib * cross(p.rb, pp);
            } else {
                // the block solver: Box2D's total enumeration of the 2-point LCP
                let a = v2(vc.points[0].ni, vc.points[1].ni);
                let (r1a, r1b, r2a, r2b) = (vc.points[0].ra, vc.points[0].rb, vc.points[1].ra, vc.points[1].rb);
                let dv1 = vb + cross_sv(wb, r1b) - va - cross_sv(wa, r1a);
                let dv2 = vb + cross_sv(wb, r2b) - va - cross_sv(wa, r2a);
                let vn1 = dot(dv1, normal);
                let vn2 = dot(dv2, normal);
                let mut b = v2(vn1 - vc.points[0].bias, vn2 - vc.points[1].bias);
                b = b - vc.kmat.mul(a);
                let mut solved: Option<V2> = None;
                let x = -vc.normal_mass.mul(b);
                if x.x >= 0.0 && x.y >= 0.0 {
                    solved = Some(x);
                }
                if solved.is_none() {
                    let x = v2(-vc.points[0].normal_mass * b.x, 0.0);
                    let vn2 = vc.kmat.ex.y * x.x + b.y;
                    if x.x >= 0.0 && vn2 >= 0.0 {
                        solved = Some(x);
                    }
                }
                if solved.is_none() {
                    let x = v2(0.0, -vc.points[1].normal_mass * b.y);
                    let vn1 = vc.kmat.ey.x * x.y + b.x;
                    if x.y >= 0.0 && vn1 >= 0.0 {
                        solved = Some(x);
                    }
                }
                if solved.is_none() && b.x >= 0.0 && b.y >= 0.0 {
                    solved = Some(v2(0.0, 0.0));
                }
                if let Some(x) = solved {
                    let d = x - a;
                    let p1 = d.x * normal;
                    let p2 = d.y * normal;
                    va = va - ma * (p1 + p2);
                    wa -= ia * (cross(r1a, p1) + cross(r2a, p2));
                    vb = vb + mb * (p1 + p2);
                    wb += ib * (cross(r1b, p1) + cross(r2b, p2));
                    vc.points[0].ni = x.x;
                    vc.points[1].ni = x.y;
                }
            }
            sd.vel_v[ia_] = va;
            sd.vel_w[ia_] = wa;
            sd.vel_v[ib_] = vb;
            sd.vel_w[ib_] = wb;
        }
    }

    fn store_impulses(&self, contacts: &mut [Contact]) {
        for vc in self.vcs.iter() {
            let m = &mut contacts[vc.k].m;
            for j in 0..vc.count {
                m.pts[j].ni = vc.points[j].ni;
                m.pts[j].ti = vc.points[j].ti;
            }
        }
    }

    /// SolvePositionConstraints (baumgarte b2_baumgarte) and SolveTOIPositionConstraints
    /// (b2_toiBaugarte; only the TOI pair's masses count, and edges have none): the minimum separation.
    fn solve_position_constraints(&self, _contacts: &[Contact], sd: &mut SolverData, baumgarte: f32) -> f32 {
        let radius = POLYGON_RADIUS;
        let mut min_separation = 0.0f32;
        for vc in self.vcs.iter() {
            let pc = &vc.m;
            let (ia_, ib_) = (STATIC, vc.b);
            let (lca, lcb) = (sd.local_center[ia_], sd.local_center[ib_]);
            let (ma, mb, ia, ib) = (0.0f32, sd.inv_mass[ib_], 0.0f32, sd.inv_i[ib_]);
            let (mut ca, mut aa, mut cb, mut ab) = (sd.pos_c[ia_], sd.pos_a[ia_], sd.pos_c[ib_], sd.pos_a[ib_]);
            for j in 0..pc.count {
                let qa = rot(aa);
                let qb = rot(ab);
                let xfa = Xf { q: qa, p: ca - mul_r(qa, lca) };
                let xfb = Xf { q: qb, p: cb - mul_r(qb, lcb) };
                let (normal, point, separation) = if pc.typ == 1 {
                    let normal = mul_r(xfa.q, pc.ln);
                    let plane = mul_x(xfa, pc.lp);
                    let clip = mul_x(xfb, pc.pts[j].lp);
                    (normal, clip, dot(clip - plane, normal) - radius - radius)
                } else {
                    let normal = mul_r(xfb.q, pc.ln);
                    let plane = mul_x(xfb, pc.lp);
                    let clip = mul_x(xfa, pc.pts[j].lp);
                    (-normal, clip, dot(clip - plane, normal) - radius - radius)
                };
                let ra = point - ca;
                let rb = point - cb;
                min_separation = minf(min_separation, separation);
                let cc = clampf(baumgarte * (separation + LINEAR_SLOP), -MAX_LINEAR_CORRECTION, 0.0);
                let rna = cross(ra, normal);
                let rnb = cross(rb, normal);
                let k = ma + mb + ia * rna * rna + ib * rnb * rnb;
                let impulse = if k > 0.0 { -cc / k } else { 0.0 };
                let p = impulse * normal;
                ca = ca - ma * p;
                aa -= ia * cross(ra, p);
                cb = cb + mb * p;
                ab += ib * cross(rb, p);
            }
            sd.pos_c[ia_] = ca;
            sd.pos_a[ia_] = aa;
            sd.pos_c[ib_] = cb;
            sd.pos_a[ib_] = ab;
        }
        min_separation
    }
}

// ---------------------------------------------------------------- time of impact (b2Distance.cpp, b2TimeOfImpact.cpp)

#[derive(Clone, Copy, Debug)]
struct Sweep {
    lc: V2,
    c0: V2,
    c: V2,
    a0: f32,
    a: f32,
}

impl Sweep {
    fn transform(&self, beta: f32) -> Xf {
        let p = (1.0 - beta) * self.c0 + beta * self.c;
        let angle = (1.0 - beta) * self.a0 + beta * self.a;
        let q = rot(angle);
        Xf { q, p: p - mul_r(q, self.lc) }
    }
    fn normalize(&mut self) {
        let two_pi = 2.0 * PI32;
        let d = two_pi * (self.a0 / two_pi).floor();
        self.a0 -= d;
        self.a -= d;
    }
}

struct DistanceProxy {
    v: [V2; 8],
    count: usize,
    radius: f32,
}

impl DistanceProxy {
    fn edge(v1: V2, v2_: V2) -> DistanceProxy {
        let mut v = [V2::default(); 8];
        v[0] = v1;
        v[1] = v2_;
        DistanceProxy { v, count: 2, radius: POLYGON_RADIUS }
    }
    fn poly(p: &Poly) -> DistanceProxy {
        DistanceProxy { v: p.v, count: p.count, radius: POLYGON_RADIUS }
    }
    fn support(&self, d: V2) -> usize {
        let mut best = 0;
        let mut best_value = dot(self.v[0], d);
        for i in 1..self.count {
            let value = dot(self.v[i], d);
            if value > best_value {
                best = i;
                best_value = value;
            }
        }
        best
    }
}

#[derive(Clone, Copy, Default)]
struct SimplexCache {
    metric: f32,
    count: usize,
    ia: [usize; 3],
    ib: [usize; 3],
}

#[derive(Clone, Copy, Default)]
struct SimplexVertex {
    wa: V2,
    wb: V2,
    w: V2,
    a: f32,
    ia: usize,
    ib: usize,
}

struct Simplex {
    v: [SimplexVertex; 3],
    count: usize,
}

fn distance(a: V2, b: V2) -> f32 {
    length(a - b)
}

impl Simplex {
    fn metric(&self) -> f32 {
        match self.count {
            2 => distance(self.v[0].w, self.v[1].w),
            3 => cross(self.v[1].w - self.v[0].w, self.v[2].w - self.v[0].w),
            _ => 0.0,
        }
    }
    fn read_cache(cache: &SimplexCache, pa: &DistanceProxy, xfa: Xf, pb: &DistanceProxy, xfb: Xf) -> Simplex {
        let mut s = Simplex { v: [SimplexVertex::default(); 3], count: cache.count };
        for i in 0..s.count {
            let v = &mut s.v[i];
            v.ia = cache.ia[i];
            v.ib = cache.ib[i];
            v.wa = mul_x(xfa, pa.v[v.ia]);
            v.wb = mul_x(xfb, pb.v[v.ib]);
            v.w = v.wb - v.wa;
            v.a = 0.0;
        }
        if s.count > 1 {
            let metric1 = cache.metric;
            let metric2 = s.metric();
            if metric2 < 0.5 * metric1 || 2.0 * metric1 < metric2 || metric2 < EPSILON {
                s.count = 0;
            }
        }
        if s.count == 0 {
            let v = &mut s.v[0];
            v.ia = 0;
            v.ib = 0;
            v.wa = mul_x(xfa, pa.v[0]);
            v.wb = mul_x(xfb, pb.v[0]);
            v.w = v.wb - v.wa;
            v.a = 1.0;
            s.count = 1;
        }
        s
    }
    fn write_cache(&self, cache: &mut SimplexCache) {
        cache.metric = self.metric();
        cache.count = self.count;
        for i in 0..self.count {
            cache.ia[i] = self.v[i].ia;
            cache.ib[i] = self.v[i].ib;
        }
    }
    fn search_direction(&self) -> V2 {
        match self.count {
            1 => -self.v[0].w,
            2 => {
                let e12 = self.v[1].w - self.v[0].w;
                let sgn = cross(e12, -self.v[0].w);
                if sgn > 0.0 { cross_sv(1.0, e12) } else { cross_vs(e12, 1.0) }
            }
            _ => V2::default(),
        }
    }
    fn witness_points(&self) -> (V2, V2) {
        let v = &self.v;
        match self.count {
            1 => (v[0].wa, v[0].wb),
            2 => (v[0].a * v[0].wa + v[1].a * v[1].wa, v[0].a * v[0].wb + v[1].a * v[1].wb),
            3 => {
                let pa = v[0].a * v[0].wa + v[1].a * v[1].wa + v[2].a * v[2].wa;
                (pa, pa)
            }
            _ => (V2::default(), V2::default()),
        }
    }
    fn solve2(&mut self) {
        let w1 = self.v[0].w;
        let w2 = self.v[1].w;
        let e12 = w2 - w1;
        let d12_2 = -dot(w1, e12);
        if d12_2 <= 0.0 {
            self.v[0].a = 1.0;
            self.count = 1;
            return;
        }
        let d12_1 = dot(w2, e12);
        if d12_1 <= 0.0 {
            self.v[1].a = 1.0;
            self.count = 1;
            self.v[0] = self.v[1];
            return;
        }
        let inv_d12 = 1.0 / (d12_1 + d12_2);
        self.v[0].a = d12_1 * inv_d12;
        self.v[1].a = d12_2 * inv_d12;
        self.count = 2;
    }
    fn solve3(&mut self) {
        let (w1, w2, w3) = (self.v[0].w, self.v[1].w, self.v[2].w);
        let e12 = w2 - w1;
        let w1e12 = dot(w1, e12);
        let w2e12 = dot(w2, e12);
        let d12_1 = w2e12;
        let d12_2 = -w1e12;
        let e13 = w3 - w1;
        let w1e13 = dot(w1, e13);
        let w3e13 = dot(w3, e13);
        let d13_1 = w3e13;
        let d13_2 = -w1e13;
        let e23 = w3 - w2;
        let w2e23 = dot(w2, e23);
        let w3e23 = dot(w3, e23);
        let d23_1 = w3e23;
        let d23_2 = -w2e23;
        let n123 = cross(e12, e13);
        let d123_1 = n123 * cross(w2, w3);
        let d123_2 = n123 * cross(w3, w1);
        let d123_3 = n123 * cross(w1, w2);
        if d12_2 <= 0.0 && d13_2 <= 0.0 {
            self.v[0].a = 1.0;
            self.count = 1;
            return;
        }
        if d12_1 > 0.0 && d12_2 > 0.0 && d123_3 <= 0.0 {
            let inv_d12 = 1.0 / (d12_1 + d12_2);
            self.v[0].a = d12_1 * inv_d12;
            self.v[1].a = d12_2 * inv_d12;
            self.count = 2;
            return;
        }
        if d13_1 > 0.0 && d13_2 > 0.0 && d123_2 <= 0.0 {
            let inv_d13 = 1.0 / (d13_1 + d13_2);
            self.v[0].a = d13_1 * inv_d13;
            self.v[2].a = d13_2 * inv_d13;
            self.count = 2;
            self.v[1] = self.v[2];
            return;
        }
        if d12_1 <= 0.0 && d23_2 <= 0.0 {
            self.v[1].a = 1.0;
            self.count = 1;
            self.v[0] = self.v[1];
            return;
        }
        if d13_1 <= 0.0 && d23_1 <= 0.0 {
            self.v[2].a = 1.0;
            self.count = 1;
            self.v[0] = self.v[2];
            return;
        }
        if d23_1 > 0.0 && d23_2 > 0.0 && d123_1 <= 0.0 {
            let inv_d23 = 1.0 / (d23_1 + d23_2);
            self.v[1].a = d23_1 * inv_d23;
            self.v[2].a = d23_2 * inv_d23;
            self.count = 2;
            self.v[0] = self.v[2];
            return;
        }
        let inv_d123 = 1.0 / (d123_1 + d123_2 + d123_3);
        self.v[0].a = d123_1 * inv_d123;
        self.v[1].a = d123_2 * inv_d123;
        self.v[2].a = d123_3 * inv_d123;
        self.count = 3;
    }
}

/// b2Distance (GJK) without radii: the distance between the proxies' cores.
fn gjk_distance(cache: &mut SimplexCache, pa: &DistanceProxy, xfa: Xf, pb: &DistanceProxy, xfb: Xf) -> f32 {
    let mut simplex = Simplex::read_cache(cache, pa, xfa, pb, xfb);
    let k_max_iters = 20;
    let mut save_a = [0usize; 3];
    let mut save_b = [0usize; 3];
    let mut iter = 0;
    while iter < k_max_iters {
        let save_count = simplex.count;
        for i in 0..save_count {
            save_a[i] = simplex.v[i].ia;
            save_b[i] = simplex.v[i].ib;
        }
        match simplex.count {
            2 => simplex.solve2(),
            3 => simplex.solve3(),
            _ => {}
        }
        if simplex.count == 3 {
            break;
        }
        let d = simplex.search_direction();
        if dot(d, d) < EPSILON * EPSILON {
            break;
        }
        let n = simplex.count;
        let vertex = &mut simplex.v[n];
        vertex.ia = pa.support(mult_r(xfa.q, -d));
        vertex.wa = mul_x(xfa, pa.v[vertex.ia]);
        vertex.ib = pb.support(mult_r(xfb.q, d));
        vertex.wb = mul_x(xfb, pb.v[vertex.ib]);
        vertex.w = vertex.wb - vertex.wa;
        iter += 1;
        let mut duplicate = false;
        for i in 0..save_count {
            if vertex.ia == save_a[i] && vertex.ib == save_b[i] {
                duplicate = true;
                break;
            }
        }
        if duplicate {
            break;
        }
        simplex.count += 1;
    }
    let (p_a, p_b) = simplex.witness_points();
    simplex.write_cache(cache);
    distance(p_a, p_b)
}

const SEP_POINTS: u8 = 0;
const SEP_FACE_A: u8 = 1;
const SEP_FACE_B: u8 = 2;

struct SeparationFunction<'a> {
    pa: &'a DistanceProxy,
    pb: &'a DistanceProxy,
    sa: Sweep,
    sb: Sweep,
    typ: u8,
    local_point: V2,
    axis: V2,
}

impl<'a> SeparationFunction<'a> {
    fn new(cache: &SimplexCache, pa: &'a DistanceProxy, sa: Sweep, pb: &'a DistanceProxy, sb: Sweep, t1: f32) -> SeparationFunction<'a> {
        let xfa = sa.transform(t1);
        let xfb = sb.transform(t1);
        let mut f = SeparationFunction { pa, pb, sa, sb, typ: SEP_POINTS, local_point: V2::default(), axis: V2::default() };
        if cache.count == 1 {
            let point_a = mul_x(xfa, pa.v[cache.ia[0]]);
            let point_b = mul_x(xfb, pb.v[cache.ib[0]]);
            f.axis = normalize(point_b - point_a);
        } else if cache.ia[0] == cache.ia[1] {
            f.typ = SEP_FACE_B;
            let b1 = pb.v[cache.ib[0]];
            let b2 = pb.v[cache.ib[1]];
            f.axis = normalize(cross_vs(b2 - b1, 1.0));
            let normal = mul_r(xfb.q, f.axis);
            f.local_point = 0.5 * (b1 + b2);
            let point_b = mul_x(xfb, f.local_point);
            let point_a = mul_x(xfa, pa.v[cache.ia[0]]);
            if dot(point_a - point_b, normal) < 0.0 {
                f.axis = -f.axis;
            }
        } else {
            f.typ = SEP_FACE_A;
            let a1 = pa.v[cache.ia[0]];
            let a2 = pa.v[cache.ia[1]];
            f.axis = normalize(cross_vs(a2 - a1, 1.0));
            let normal = mul_r(xfa.q, f.axis);
            f.local_point = 0.5 * (a1 + a2);
            let point_a = mul_x(xfa, f.local_point);
            let point_b = mul_x(xfb, pb.v[cache.ib[0]]);
            if dot(point_b - point_a, normal) < 0.0 {
                f.axis = -f.axis;
            }
        }
        f
    }

    fn find_min_separation(&self, t: f32) -> (usize, usize, f32) {
        let xfa = self.sa.transform(t);
        let xfb = self.sb.transform(t);
        match self.typ {
            SEP_POINTS => {
                let ia = self.pa.support(mult_r(xfa.q, self.axis));
                let ib = self.pb.support(mult_r(xfb.q, -self.axis));
                let point_a = mul_x(xfa, self.pa.v[ia]);
                let point_b = mul_x(xfb, self.pb.v[ib]);
                (ia, ib, dot(point_b - point_a, self.axis))
            }
            SEP_FACE_A => {
                let normal = mul_r(xfa.q, self.axis);
                let point_a = mul_x(xfa, self.local_point);
                let ib = self.pb.support(mult_r(xfb.q, -normal));
                let point_b = mul_x(xfb, self.pb.v[ib]);
                (usize::MAX, ib, dot(point_b - point_a, normal))
            }
            _ => {
                let normal = mul_r(xfb.q, self.axis);
                let point_b = mul_x(xfb, self.local_point);
                let ia = self.pa.support(mult_r(xfa.q, -normal));
                let point_a = mul_x(xfa, self.pa.v[ia]);
                (ia, usize::MAX, dot(point_a - point_b, normal))
            }
        }
    }

    fn evaluate(&self, ia: usize, ib: usize, t: f32) -> f32 {
        let xfa = self.sa.transform(t);
        let xfb = self.sb.transform(t);
        match self.typ {
            SEP_POINTS => {
                let point_a = mul_x(xfa, self.pa.v[ia]);
                let point_b = mul_x(xfb, self.pb.v[ib]);
                dot(point_b - point_a, self.axis)
            }
            SEP_FACE_A => {
                let normal = mul_r(xfa.q, self.axis);
                let point_a = mul_x(xfa, self.local_point);
                let point_b = mul_x(xfb, self.pb.v[ib]);
                dot(point_b - point_a, normal)
            }
            _ => {
                let normal = mul_r(xfb.q, self.axis);
                let point_b = mul_x(xfb, self.local_point);
                let point_a = mul_x(xfa, self.pa.v[ia]);
                dot(point_a - point_b, normal)
            }
        }
    }
}

// b2TOIOutput::State
const TOI_FAILED: u8 = 1;
const TOI_OVERLAPPED: u8 = 2;
const TOI_TOUCHING: u8 = 3;
const TOI_SEPARATED: u8 = 4;

/// b2TimeOfImpact: (state, t) for the sweeps over [0, t_max] (conservative advancement).
fn time_of_impact(pa: &DistanceProxy, sweep_a: Sweep, pb: &DistanceProxy, sweep_b: Sweep, t_max: f32) -> (u8, f32) {
    let mut sa = sweep_a;
    let mut sb = sweep_b;
    sa.normalize();
    sb.normalize();
    let total_radius = pa.radius + pb.radius;
    let target = maxf(LINEAR_SLOP, total_radius - 3.0 * LINEAR_SLOP);
    let tolerance = 0.25 * LINEAR_SLOP;
    let mut t1 = 0.0f32;
    let k_max_iterations = 20;
    let mut iter = 0;
    let mut cache = SimplexCache::default();
    loop {
        let xfa = sa.transform(t1);
        let xfb = sb.transform(t1);
        let dist = gjk_distance(&mut cache, pa, xfa, pb, xfb);
        if dist <= 0.0 {
            return (TOI_OVERLAPPED, 0.0);
        }
        if dist < target + tolerance {
            return (TOI_TOUCHING, t1);
        }
        let fcn = SeparationFunction::new(&cache, pa, sa, pb, sb, t1);
        let mut done: Option<(u8, f32)> = None;
        let mut t2 = t_max;
        let mut push_back_iter = 0;
        loop {
            let (ia, ib, mut s2) = fcn.find_min_separation(t2);
            if s2 > target + tolerance {
                done = Some((TOI_SEPARATED, t_max));
                break;
            }
            if s2 > target - tolerance {
                t1 = t2;
                break;
            }
            let mut s1 = fcn.evaluate(ia, ib, t1);
            if s1 < target - tolerance {
                done = Some((TOI_FAILED, t1));
                break;
            }
            if s1 <= target + tolerance {
                done = Some((TOI_TOUCHING, t1));
                break;
            }
            let mut root_iter_count = 0;
            let (mut a1, mut a2) = (t1, t2);
            loop {
                let t = if root_iter_count & 1 == 1 {
                    a1 + (target - s1) * (a2 - a1) / (s2 - s1)
                } else {
                    0.5 * (a1 + a2)
                };
                root_iter_count += 1;
                let s = fcn.evaluate(ia, ib, t);
                if absf(s - target) < tolerance {
                    t2 = t;
                    break;
                }
                if s > target {
                    a1 = t;
                    s1 = s;
                } else {
                    a2 = t;
                    s2 = s;
                }
                if root_iter_count == 50 {
                    break;
                }
            }
            push_back_iter += 1;
            if push_back_iter == 16 {
                // b2_maxPolygonVertices in pybox2d's b2Settings.h
                break;
            }
        }
        iter += 1;
        if let Some(result) = done {
            return result;
        }
        if iter == k_max_iterations {
            return (TOI_FAILED, t1);
        }
    }
}

// ---------------------------------------------------------------- the world

#[derive(Clone, Copy, Default)]
struct Body {
    c: V2,
    a: f32,
    c0: V2,
    a0: f32,
    v: V2,
    w: f32,
    xf: Xf,
    awake: bool,
    sleep_time: f32,
    fat: [f32; 4],
    proxy: i64,
    force: V2,
    alpha0: f32,
}
impl Body {
    /// b2Sweep::Advance
    fn advance_sweep(&mut self, alpha: f32) {
        let beta = (alpha - self.alpha0) / (1.0 - self.alpha0);
        self.c0 = (1.0 - beta) * self.c0 + beta * self.c;
        self.a0 = (1.0 - beta) * self.a0 + beta * self.a;
        self.alpha0 = alpha;
    }
    /// b2Body::Advance: to the safe time alpha (the broad-phase is not synchronized).
    fn advance(&mut self, alpha: f32, lc: V2) {
        self.advance_sweep(alpha);
        self.c = self.c0;
        self.a = self.a0;
        self.sync_transform(lc);
    }
    fn sync_transform(&mut self, lc: V2) {
        self.xf.q = rot(self.a);
        self.xf.p = self.c - mul_r(self.xf.q, lc);
    }
    fn set_awake(&mut self, flag: bool) {
        if flag {
            if !self.awake {
                self.awake = true;
                self.sleep_time = 0.0;
            }
        } else {
            self.awake = false;
            self.sleep_time = 0.0;
            self.v = v2(0.0, 0.0);
            self.w = 0.0;
            self.force = v2(0.0, 0.0);
        }
    }
}

#[derive(Clone, Copy, Default)]
struct Joint {
    local_a: V2,
    local_b: V2,
    reference: f32,
    lower: f32,
    upper: f32,
    impulse: V3,
    motor_impulse: f32,
    motor_speed: f32,
    max_torque: f32,
    limit_state: u8, // 0 inactive, 1 lower, 2 upper, 3 equal
    // solver temporaries
    ra: V2,
    rb: V2,
    lca: V2,
    lcb: V2,
    ma: f32,
    mb: f32,
    ia: f32,
    ib: f32,
    mass: M33,
    mass_f: M33Factors,
    motor_mass: f32,
}

#[derive(Clone, Copy, Default)]
struct Contact {
    edge: usize,
    body: usize,
    touching: bool,
    enabled: bool,
    m: Manifold,
    island: bool,
    toi_flag: bool,
    toi_count: u32,
    toi: f32,
}

/// A world's step between step_begin and step_end: the island DFS's flags and the first island
/// with its velocity iterations still to run (see World::step_group).
struct StepState {
    h: f32,
    body_flag: [bool; NB],
    joint_flag: [bool; 4],
    next_seed: usize, // in BODY_LIST: where the DFS looks for the next island
    island: Option<IslandSolve>,
}

impl StepState {
    fn empty() -> StepState {
        StepState { h: 0.0, body_flag: [false; NB], joint_flag: [false; 4], next_seed: NB, island: None }
    }
}

/// An island's solver state across b2Island::Solve's velocity iterations.
struct IslandSolve {
    h: f32,
    bodies: Vec<usize>,
    joints: Vec<usize>,
    sd: SolverData,
    cs: ContactSolver,
    position_solved: Option<bool>, // set once the position iterations ran
}

struct World {
    bodies: [Body; NB],
    joints: [Joint; 4],
    contacts: Vec<Contact>, // b2World's contact list, head first
    ys: [f32; TERRAIN_LENGTH], // the terrain heights as the edges hold them (float32)
    edge_proxy: [i64; EDGES],
    terrain_y: Option<Vec<f64>>, // the heights to write out (a reset); a step leaves them in place
    game_over: bool,
    ground: [bool; 2], // legs[1], legs[3]
    prev_shaping: f64,
}

fn joint_def(j: usize, bodies: &[Body; NB]) -> Joint {
    let (a, b) = JOINT_BODIES[j];
    let hip = j % 2 == 0;
    Joint {
        local_a: if hip { v2(0.0, LEG_DOWN as f32) } else { v2(0.0, (-LEG_H / 2.0) as f32) },
        local_b: v2(0.0, (LEG_H / 2.0) as f32),
        reference: bodies[b].a - bodies[a].a, // pybox2d's def takes bodyB.angle - bodyA.angle
        lower: if hip { -0.8 } else { -1.6 },
        upper: if hip { 1.1 } else { -0.1 },
        ..Joint::default()
    }
}

impl World {
    fn joints_static() -> [(f32, f32, f32); 4] {
        // reference angles, lower, upper are fixed by the scene (legs start at -0.05, +0.05)
        [((-0.05f64) as f32, -0.8, 1.1), (0.0, -1.6, -0.1), ((0.05f64) as f32, -0.8, 1.1), (0.0, -1.6, -0.1)]
    }

    fn from_state(s: &[f64]) -> World {
        let sh = shapes();
        let mut bodies = [Body::default(); NB];
        for (b, body) in bodies.iter_mut().enumerate() {
            let o = O_BODY + b * BODY_FIELDS.len();
            body.c = v2(s[o] as f32, s[o + 1] as f32);
            body.a = s[o + 2] as f32;
            body.v = v2(s[o + 3] as f32, s[o + 4] as f32);
            body.w = s[o + 5] as f32;
            body.awake = s[o + 6] != 0.0;
            body.sleep_time = s[o + 7] as f32;
            body.fat = [s[o + 8] as f32, s[o + 9] as f32, s[o + 10] as f32, s[o + 11] as f32];
            body.proxy = s[o + 12] as i64;
            body.c0 = body.c;
            body.a0 = body.a;
            body.sync_transform(sh.local_center[b]);
        }
        let mut joints = [Joint::default(); 4];
        for (j, joint) in joints.iter_mut().enumerate() {
            let (reference, lower, upper) = World::joints_static()[j];
            *joint = joint_def(j, &bodies);
            joint.reference = reference;
            joint.lower = lower;
            joint.upper = upper;
            let o = O_JOINT + j * JOINT_FIELDS.len();
            joint.impulse = V3 { x: s[o] as f32, y: s[o + 1] as f32, z: s[o + 2] as f32 };
            joint.motor_impulse = s[o + 3] as f32;
            // The limit state is not readable from pybox2d; only "was it at this limit" matters
            // (InitVelocityConstraints zeroes impulse.z otherwise), and a nonzero impulse.z says which.
            joint.limit_state = if joint.impulse.z > 0.0 { 1 } else if joint.impulse.z < 0.0 { 2 } else { 0 };
        }
        let mut world = World::with_terrain(bodies, joints, &s[O_TERRAIN..O_TERRAIN + TERRAIN_LENGTH]);
        for (p, v) in world.edge_proxy.iter_mut().zip(&s[O_EDGE_PROXY..O_EDGE_PROXY + EDGES]) {
            *p = *v as i64;
        }
        world.game_over = s[0] != 0.0;
        world.ground = [s[1] != 0.0, s[2] != 0.0];
        world.prev_shaping = s[3];
        let count = (s[4] as usize).min(MAX_CONTACTS);
        for k in 0..count {
            let o = O_CONTACT + k * CONTACT_FIELDS.len();
            let (edge, body) = (s[o] as usize, s[o + 1] as usize); // saturating: NaN and negatives give 0
            if edge >= EDGES || body >= NB {
                continue; // not a contact this scene can have: a state no step produced
            }
            let mut m = Manifold { count: (s[o + 4] as usize).min(2), typ: if s[o + 5] == 2.0 { 2 } else { 1 },
                                   ln: v2(s[o + 6] as f32, s[o + 7] as f32),
                                   lp: v2(s[o + 8] as f32, s[o + 9] as f32), pts: [MPoint::default(); 2] };
            for p in 0..2 {
                let q = o + 10 + 5 * p;
                m.pts[p] = MPoint { lp: v2(s[q] as f32, s[q + 1] as f32), ni: s[q + 2] as f32, ti: s[q + 3] as f32, key: s[q + 4] as u32 };
            }
            world.contacts.push(Contact { edge, body, touching: s[o + 2] != 0.0,
                                          enabled: s[o + 3] != 0.0, m, ..Contact::default() });
        }
        world
    }

    fn with_terrain(bodies: [Body; NB], joints: [Joint; 4], terrain_y: &[f64]) -> World {
        let mut ys = [0.0f32; TERRAIN_LENGTH];
        for (y, t) in ys.iter_mut().zip(terrain_y) {
            *y = *t as f32;
        }
        World { bodies, joints, contacts: Vec::with_capacity(MAX_CONTACTS), ys, edge_proxy: [0; EDGES], terrain_y: None,
                game_over: false, ground: [false; 2], prev_shaping: 0.0 }
    }

    /// Terrain segment i as its b2EdgeShape holds it.
    fn edge(&self, i: usize) -> (V2, V2) {
        (v2(terrain_x(i), self.ys[i]), v2(terrain_x(i + 1), self.ys[i + 1]))
    }

    fn edge_fat(&self, i: usize) -> [f32; 4] {
        let (a, b) = self.edge(i);
        edge_fat_aabb(a, b)
    }

    /// The segments whose fat AABB can reach x in [lo, hi] (a superset: callers test the AABBs).
    fn edge_range(lo: f32, hi: f32) -> std::ops::Range<usize> {
        let step = TERRAIN_STEP as f32;
        let first = ((lo - 1.0) / step).floor();
        let last = ((hi + 1.0) / step).ceil() + 1.0;
        let clamp = |v: f32| if v.is_nan() { 0.0 } else { v.max(0.0).min(EDGES as f32) };
        let (first, last) = (clamp(first) as usize, clamp(last) as usize);
        if lo.is_nan() || hi.is_nan() { 0..EDGES } else { first..last.max(first) }
    }

    fn to_state(&self, s: &mut [f64]) {
        s[0] = self.game_over as u8 as f64;
        s[1] = self.ground[0] as u8 as f64;
        s[2] = self.ground[1] as u8 as f64;
        s[3] = self.prev_shaping;
        for (b, body) in self.bodies.iter().enumerate() {
            let o = O_BODY + b * BODY_FIELDS.len();
            let vals = [body.c.x, body.c.y, body.a, body.v.x, body.v.y, body.w, body.awake as u8 as f32, body.sleep_time,
                        body.fat[0], body.fat[1], body.fat[2], body.fat[3]];
            for (k, v) in vals.iter().enumerate() {
                s[o + k] = *v as f64;
            }
            s[o + 12] = body.proxy as f64;
        }
        for (j, joint) in self.joints.iter().enumerate() {
            let o = O_JOINT + j * JOINT_FIELDS.len();
            s[o] = joint.impulse.x as f64;
            s[o + 1] = joint.impulse.y as f64;
            s[o + 2] = joint.impulse.z as f64;
            s[o + 3] = joint.motor_impulse as f64;
        }
        if let Some(terrain_y) = &self.terrain_y {
            s[O_TERRAIN..O_TERRAIN + TERRAIN_LENGTH].copy_from_slice(terrain_y);
            for (i, p) in self.edge_proxy.iter().enumerate() {
                s[O_EDGE_PROXY + i] = *p as f64;
            }
        }
        // A scene that outgrows the slots keeps the first MAX_CONTACTS (the count says how many exist).
        s[4] = self.contacts.len() as f64;
        for k in 0..MAX_CONTACTS {
            let o = O_CONTACT + k * CONTACT_FIELDS.len();
            if k >= self.contacts.len() {
                s[o..o + CONTACT_FIELDS.len()].fill(0.0);
                continue;
            }
            let c = &self.contacts[k];
            let m = &c.m;
            s[o..o + CONTACT_FIELDS.len()].fill(0.0); // an empty manifold's fields and unused points read 0
            s[o..o + 4].copy_from_slice(&[c.edge as f64, c.body as f64, c.touching as u8 as f64, c.enabled as u8 as f64]);
            if m.count > 0 {
                s[o + 4..o + 10].copy_from_slice(&[m.count as f64, m.typ as f64, m.ln.x as f64, m.ln.y as f64,
                                                   m.lp.x as f64, m.lp.y as f64]);
            }
            for p in 0..m.count.min(2) {
                let q = o + 10 + 5 * p;
                let mp = &m.pts[p];
                s[q..q + 5].copy_from_slice(&[mp.lp.x as f64, mp.lp.y as f64, mp.ni as f64, mp.ti as f64, mp.key as f64]);
            }
        }
    }

    // -- the contact listener (gymnasium's ContactDetector)
    fn begin_contact(&mut self, body: usize) {
        if body == HULL {
            self.game_over = true;
        }
        if body == 2 {
            self.ground[0] = true;
        }
        if body == 4 {
            self.ground[1] = true;
        }
    }
    fn end_contact(&mut self, body: usize) {
        if body == 2 {
            self.ground[0] = false;
        }
        if body == 4 {
            self.ground[1] = false;
        }
    }

    /// b2Contact::Update
    fn update_contact(&mut self, k: usize) {
        let sh = shapes();
        let c = self.contacts[k];
        let old = c.m;
        let was_touching = c.touching;
        let (v1, v2_) = self.edge(c.edge);
        let mut m = collide_edge_polygon(v1, v2_, IDENTITY, &sh.polys[c.body], self.bodies[c.body].xf);
        let touching = m.count > 0;
        for i in 0..m.count {
            m.pts[i].ni = 0.0;
            m.pts[i].ti = 0.0;
            for j in 0..old.count {
                if old.pts[j].key == m.pts[i].key {
                    m.pts[i].ni = old.pts[j].ni;
                    m.pts[i].ti = old.pts[j].ti;
                    break;
                }
            }
        }
        if touching != was_touching {
            self.bodies[c.body].set_awake(true); // the edge is static: SetAwake does nothing to it
        }
        let contact = &mut self.contacts[k];
        contact.m = m;
        contact.enabled = true;
        contact.touching = touching;
        if !was_touching && touching {
            self.begin_contact(c.body);
        }
        if was_touching && !touching {
            self.end_contact(c.body);
        }
    }

    /// b2ContactManager::Collide
    fn collide(&mut self) {
        let mut k = 0;
        while k < self.contacts.len() {
            let c = self.contacts[k];
            if !self.bodies[c.body].awake {
                k += 1;
                continue;
            }
            if !aabb_overlap(&self.edge_fat(c.edge), &self.bodies[c.body].fat) {
                // b2ContactManager::Destroy then b2Contact::Destroy
                if c.touching {
                    self.end_contact(c.body);
                }
                if c.m.count > 0 {
                    self.bodies[c.body].set_awake(true);
                }
                self.contacts.remove(k);
                continue;
            }
            self.update_contact(k);
            k += 1;
        }
    }

    /// b2Fixture::Synchronize -> b2DynamicTree::MoveProxy; true when the proxy moved (BufferMove).
    fn synchronize_fixtures(&mut self, b: usize) -> bool {
        let sh = shapes();
        let body = &mut self.bodies[b];
        let q1 = rot(body.a0);
        let xf1 = Xf { q: q1, p: body.c0 - mul_r(q1, sh.local_center[b]) };
        let a1 = poly_aabb(&sh.polys[b], xf1);
        let a2 = poly_aabb(&sh.polys[b], body.xf);
        let aabb = [minf(a1[0], a2[0]), minf(a1[1], a2[1]), maxf(a1[2], a2[2]), maxf(a1[3], a2[3])];
        let displacement = body.xf.p - xf1.p;
        let f = &body.fat;
        let contains = f[0] <= aabb[0] && f[1] <= aabb[1] && aabb[2] <= f[2] && aabb[3] <= f[3];
        if contains {
            return false;
        }
        let mut nb = [aabb[0] - AABB_EXTENSION, aabb[1] - AABB_EXTENSION, aabb[2] + AABB_EXTENSION, aabb[3] + AABB_EXTENSION];
        let d = AABB_MULTIPLIER * displacement;
        if d.x < 0.0 {
            nb[0] += d.x;
        } else {
            nb[2] += d.x;
        }
        if d.y < 0.0 {
            nb[1] += d.y;
        } else {
            nb[3] += d.y;
        }
        body.fat = nb;
        true
    }

    /// b2BroadPhase::UpdatePairs + b2ContactManager::AddPair for the moved bodies: new contacts are
    /// created in the order of (min proxy id, max proxy id) and each is put at the list's head.
    fn find_new_contacts(&mut self, moved: &[usize]) {
        let mut pairs: Vec<(i64, i64, usize, usize)> = Vec::new();
        for &b in moved {
            let fat = self.bodies[b].fat;
            for e in World::edge_range(fat[0], fat[2]) {
                if aabb_overlap(&fat, &self.edge_fat(e)) {
                    let (p, q) = (self.bodies[b].proxy, self.edge_proxy[e]);
                    pairs.push((p.min(q), p.max(q), e, b));
                }
            }
        }
        pairs.sort_by_key(|&(a, b, _, _)| (a, b));
        pairs.dedup_by_key(|p| (p.0, p.1));
        for &(_, _, e, b) in &pairs {
            if self.contacts.iter().any(|c| c.edge == e && c.body == b) {
                continue;
            }
            self.contacts.insert(0, Contact { edge: e, body: b, enabled: true, ..Contact::default() });
            self.bodies[b].set_awake(true);
        }
    }

    /// b2World::Step(1/FPS, 180, 60): collide, solve, continuous collision.
    fn step(&mut self) {
        let mut st = self.step_begin();
        if let Some(island) = st.island.as_mut() {
            for _ in 0..VELOCITY_ITERATIONS {
                self.velocity_iteration(island);
            }
        }
        self.step_end(st);
    }

    /// `step` of G worlds with their islands' velocity and position iterations interleaved joint by
    /// joint: the sequential impulses of one world are a chain of dependent float operations
    /// (latency-bound), and the other worlds' independent chains fill the gaps. Each world does
    /// exactly the operations `step` does, in the same order.
    fn step_group<const G: usize>(worlds: &mut [World; G]) {
        let mut sts: [StepState; G] = std::array::from_fn(|_| StepState::empty());
        for g in 0..G {
            sts[g] = worlds[g].step_begin();
        }
        let joints = sts.iter().map(|st| st.island.as_ref().map_or(0, |i| i.joints.len())).max().unwrap_or(0);
        if sts.iter().any(|st| st.island.is_some()) {
            for _ in 0..VELOCITY_ITERATIONS {
                for k in 0..joints {
                    for g in 0..G {
                        if let Some(isl) = sts[g].island.as_mut() {
                            if k < isl.joints.len() {
                                worlds[g].joint_solve_velocity(isl.joints[k], isl.h, &mut isl.sd.vel_v, &mut isl.sd.vel_w);
                            }
                        }
                    }
                }
                for st in sts.iter_mut() {
                    if let Some(isl) = st.island.as_mut() {
                        isl.cs.solve_velocity_constraints(&mut isl.sd);
                    }
                }
            }
            World::solve_positions_group(worlds, &mut sts, joints);
        }
        for (world, st) in worlds.iter_mut().zip(sts) {
            world.step_end(st);
        }
    }

    /// b2Island::Solve's position iterations of step_group's worlds, interleaved joint by joint;
    /// each world stops at its own first solved iteration.
    fn solve_positions_group<const G: usize>(worlds: &mut [World; G], sts: &mut [StepState; G], joints: usize) {
        let mut solved = [true; G];
        for g in 0..G {
            if let Some(isl) = sts[g].island.as_mut() {
                worlds[g].finish_velocities(isl);
                solved[g] = false;
            }
        }
        let had_island: [bool; G] = std::array::from_fn(|g| !solved[g]);
        for _ in 0..POSITION_ITERATIONS {
            let run: [bool; G] = std::array::from_fn(|g| !solved[g]);
            let mut contacts_ok = [false; G];
            for g in 0..G {
                if run[g] {
                    let isl = sts[g].island.as_mut().unwrap();
                    contacts_ok[g] = isl.cs.solve_position_constraints(&worlds[g].contacts, &mut isl.sd, BAUMGARTE) >= -3.0 * LINEAR_SLOP;
                }
            }
            let mut joints_ok = [true; G];
            for k in 0..joints {
                for g in 0..G {
                    if run[g] {
                        let isl = sts[g].island.as_mut().unwrap();
                        if k < isl.joints.len() {
                            let ok = worlds[g].joint_solve_position(isl.joints[k], &mut isl.sd.pos_c, &mut isl.sd.pos_a);
                            joints_ok[g] = joints_ok[g] && ok;
                        }
                    }
                }
            }
            for g in 0..G {
                solved[g] = solved[g] || (run[g] && contacts_ok[g] && joints_ok[g]);
            }
            if solved.iter().all(|&x| x) {
                break;
            }
        }
        for g in 0..G {
            if had_island[g] {
                sts[g].island.as_mut().unwrap().position_solved = Some(solved[g]);
            }
        }
    }

    /// b2World::Step up to the first island's velocity iterations: collide, then b2World::Solve's
    /// island DFS and b2Island::Solve's set-up. The joints connect all five bodies, so there is at
    /// most one island; step_end still looks for more, as b2World::Solve does.
    fn step_begin(&mut self) -> StepState {
        let h = (1.0 / FPS) as f32;
        self.collide();
        for c in self.contacts.iter_mut() {
            c.island = false;
        }
        let mut st = StepState { h, body_flag: [false; NB], joint_flag: [false; 4], next_seed: 0, island: None };
        if let Some((bodies, contacts, joints)) = self.next_island(&mut st) {
            st.island = Some(self.solve_island_begin(h, bodies, contacts, joints));
        }
        st
    }

    /// b2World::Solve's DFS from the body list's next awake dynamic body not yet in an island.
    fn next_island(&mut self, st: &mut StepState) -> Option<(Vec<usize>, Vec<usize>, Vec<usize>)> {
        while st.next_seed < NB {
            let seed = BODY_LIST[st.next_seed];
            st.next_seed += 1;
            if st.body_flag[seed] || !self.bodies[seed].awake {
                continue;
            }
            let body_flag = &mut st.body_flag;
            let joint_flag = &mut st.joint_flag;
            let mut island_bodies = Vec::with_capacity(NB);
            let mut island_contacts = Vec::with_capacity(self.contacts.len());
            let mut island_joints = Vec::with_capacity(4);
            let mut stack = Vec::with_capacity(NB);
            stack.push(seed);
            body_flag[seed] = true;
            while let Some(b) = stack.pop() {
                island_bodies.push(b);
                self.bodies[b].set_awake(true);
                for k in 0..self.contacts.len() {
                    let c = &mut self.contacts[k];
                    if c.body != b || c.island || !c.enabled || !c.touching {
                        continue;
                    }
                    c.island = true;
                    island_contacts.push(k); // the other body is a static edge: never propagates
                }
                for &j in BODY_JOINTS[b] {
                    if joint_flag[j] {
                        continue;
                    }
                    island_joints.push(j);
                    joint_flag[j] = true;
                    let (ja, jb) = JOINT_BODIES[j];
                    let other = if ja == b { jb } else { ja };
                    if body_flag[other] {
                        continue;
                    }
                    stack.push(other);
                    body_flag[other] = true;
                }
            }
            return Some((island_bodies, island_contacts, island_joints));
        }
        None
    }

    /// The rest of b2World::Step after the first island's velocity iterations.
    fn step_end(&mut self, mut st: StepState) {
        let h = st.h;
        if let Some(island) = st.island.take() {
            self.solve_island_end(island);
        }
        while let Some((bodies, contacts, joints)) = self.next_island(&mut st) {
            let mut island = self.solve_island_begin(h, bodies, contacts, joints);
            for _ in 0..VELOCITY_ITERATIONS {
                self.velocity_iteration(&mut island);
            }
            self.solve_island_end(island);
        }
        let mut moved = Vec::new();
        for &b in BODY_LIST.iter() {
            if st.body_flag[b] && self.synchronize_fixtures(b) {
                moved.push(b);
            }
        }
        self.find_new_contacts(&moved);
        self.solve_toi(h);
        for b in self.bodies.iter_mut() {
            b.force = v2(0.0, 0.0);
        }
    }

    /// b2Island::Solve up to the velocity iterations: integrate forces, set up and warm-start the
    /// contact and joint constraints.
    fn solve_island_begin(&mut self, h: f32, bodies: Vec<usize>, contacts: Vec<usize>, joints: Vec<usize>) -> IslandSolve {
        let sh = shapes();
        let gravity = v2(0.0, -10.0);
        let mut sd = SolverData::new();
        for &b in &bodies {
            let body = &mut self.bodies[b];
            let c = body.c;
            let a = body.a;
            let mut v = body.v;
            let mut w = body.w;
            body.c0 = body.c;
            body.a0 = body.a;
            v = v + h * (1.0 * gravity + sh.inv_mass[b] * body.force);
            w += h * sh.inv_i[b] * 0.0;
            v = clampf(1.0 - h * 0.0, 0.0, 1.0) * v;
            w *= clampf(1.0 - h * 0.0, 0.0, 1.0);
            sd.load(b, c, a, v, w);
        }
        let mut cs = ContactSolver::new(&self.contacts, &contacts, true, &sd);
        cs.initialize_velocity_constraints(&self.contacts, &sd);
        cs.warm_start(&mut sd);
        for &j in &joints {
            self.joint_init_velocity(j, &sd.pos_a, &mut sd.vel_v, &mut sd.vel_w, &sd.inv_mass, &sd.inv_i, &sd.local_center);
        }
        IslandSolve { h, bodies, joints, sd, cs, position_solved: None }
    }

    /// b2Island::Solve between the velocity and the position iterations.
    fn finish_velocities(&mut self, island: &mut IslandSolve) {
        island.cs.store_impulses(&mut self.contacts);
        island.sd.integrate(island.h, &island.bodies);
    }

    /// One of b2Island::Solve's velocity iterations: the joints, then the contacts.
    fn velocity_iteration(&mut self, island: &mut IslandSolve) {
        for &j in &island.joints {
            self.joint_solve_velocity(j, island.h, &mut island.sd.vel_v, &mut island.sd.vel_w);
        }
        island.cs.solve_velocity_constraints(&mut island.sd);
    }

    /// b2Island::Solve after the velocity iterations: store impulses, integrate, position
    /// iterations (unless step_group ran them), write back, sleep.
    fn solve_island_end(&mut self, mut island: IslandSolve) {
        if island.position_solved.is_none() {
            self.finish_velocities(&mut island);
            let mut solved = false;
            for _ in 0..POSITION_ITERATIONS {
                let contacts_okay = island.cs.solve_position_constraints(&self.contacts, &mut island.sd, BAUMGARTE) >= -3.0 * LINEAR_SLOP;
                let mut joints_okay = true;
                for &j in &island.joints {
                    let ok = self.joint_solve_position(j, &mut island.sd.pos_c, &mut island.sd.pos_a);
                    joints_okay = joints_okay && ok;
                }
                if contacts_okay && joints_okay {
                    solved = true;
                    break;
                }
            }
            island.position_solved = Some(solved);
        }
        let sh = shapes();
        let position_solved = island.position_solved == Some(true);
        let IslandSolve { h, bodies: island_bodies, sd, .. } = island;
        let island_bodies = &island_bodies[..];
        for &b in island_bodies {
            let body = &mut self.bodies[b];
            body.c = sd.pos_c[b];
            body.a = sd.pos_a[b];
            body.v = sd.vel_v[b];
            body.w = sd.vel_w[b];
            body.sync_transform(sh.local_center[b]);
        }
        // Sleep
        let mut min_sleep = f32::MAX;
        let lin_tol = LINEAR_SLEEP_TOLERANCE * LINEAR_SLEEP_TOLERANCE;
        let ang_tol = ANGULAR_SLEEP_TOLERANCE * ANGULAR_SLEEP_TOLERANCE;
        for &b in island_bodies {
            let body = &mut self.bodies[b];
            if body.w * body.w > ang_tol || dot(body.v, body.v) > lin_tol {
                body.sleep_time = 0.0;
                min_sleep = 0.0;
            } else {
                body.sleep_time += h;
                min_sleep = minf(min_sleep, body.sleep_time);
            }
        }
        if min_sleep >= TIME_TO_SLEEP && position_solved {
            for &b in island_bodies {
                self.bodies[b].set_awake(false);
            }
        }
    }

    /// b2World::SolveTOI: advance to the earliest time of impact of a walker body with the terrain,
    /// solve that body's contacts there (b2Island::SolveTOI) and repeat until no impact is left.
    fn solve_toi(&mut self, dt: f32) {
        let sh = shapes();
        let mut edge_alpha0 = vec![0.0f32; EDGES]; // a static sweep only ever changes alpha0
        for b in self.bodies.iter_mut() {
            b.alpha0 = 0.0;
        }
        for c in self.contacts.iter_mut() {
            c.toi_flag = false;
            c.island = false;
            c.toi_count = 0;
            c.toi = 1.0;
        }
        loop {
            let mut min_k = usize::MAX;
            let mut min_alpha = 1.0f32;
            for k in 0..self.contacts.len() {
                let c = self.contacts[k];
                if !c.enabled || c.toi_count > MAX_SUB_STEPS {
                    continue;
                }
                let alpha;
                if c.toi_flag {
                    alpha = c.toi;
                } else {
                    let b = c.body;
                    if !self.bodies[b].awake {
                        continue; // neither body active
                    }
                    let mut alpha0 = edge_alpha0[c.edge];
                    if edge_alpha0[c.edge] < self.bodies[b].alpha0 {
                        alpha0 = self.bodies[b].alpha0;
                        edge_alpha0[c.edge] = alpha0;
                    } else if self.bodies[b].alpha0 < edge_alpha0[c.edge] {
                        alpha0 = edge_alpha0[c.edge];
                        self.bodies[b].advance_sweep(alpha0);
                    }
                    let (v1, v2_) = self.edge(c.edge);
                    let proxy_a = DistanceProxy::edge(v1, v2_);
                    let proxy_b = DistanceProxy::poly(&sh.polys[b]);
                    let sweep_a = Sweep { lc: V2::default(), c0: V2::default(), c: V2::default(), a0: 0.0, a: 0.0 };
                    let body = &self.bodies[b];
                    let sweep_b = Sweep { lc: sh.local_center[b], c0: body.c0, c: body.c, a0: body.a0, a: body.a };
                    let (state, beta) = time_of_impact(&proxy_a, sweep_a, &proxy_b, sweep_b, 1.0);
                    alpha = if state == TOI_TOUCHING { minf(alpha0 + (1.0 - alpha0) * beta, 1.0) } else { 1.0 };
                    self.contacts[k].toi = alpha;
                    self.contacts[k].toi_flag = true;
                }
                if alpha < min_alpha {
                    min_k = k;
                    min_alpha = alpha;
                }
            }
            if min_k == usize::MAX || 1.0 - 10.0 * EPSILON < min_alpha {
                break;
            }
            let (e, b) = (self.contacts[min_k].edge, self.contacts[min_k].body);
            let backup_edge = edge_alpha0[e];
            let backup_body = self.bodies[b];
            edge_alpha0[e] = min_alpha; // b2Body::Advance of the static edge
            self.bodies[b].advance(min_alpha, sh.local_center[b]);
            self.update_contact(min_k);
            self.contacts[min_k].toi_flag = false;
            self.contacts[min_k].toi_count += 1;
            if !self.contacts[min_k].enabled || !self.contacts[min_k].touching {
                self.contacts[min_k].enabled = false;
                edge_alpha0[e] = backup_edge;
                self.restore_sweep(b, &backup_body);
                continue;
            }
            self.bodies[b].set_awake(true);
            let mut island = vec![min_k];
            let mut edge_flag = vec![false; EDGES];
            edge_flag[e] = true;
            self.contacts[min_k].island = true;
            for k in 0..self.contacts.len() {
                if island.len() == MAX_TOI_CONTACTS {
                    break;
                }
                let c = self.contacts[k];
                if c.body != b || c.island {
                    continue;
                }
                let other = c.edge; // static: always added
                let backup = edge_alpha0[other];
                if !edge_flag[other] {
                    edge_alpha0[other] = min_alpha;
                }
                self.update_contact(k);
                if !self.contacts[k].enabled || !self.contacts[k].touching {
                    edge_alpha0[other] = backup;
                    continue;
                }
                self.contacts[k].island = true;
                island.push(k);
                if edge_flag[other] {
                    continue;
                }
                edge_flag[other] = true;
            }
            let sub_dt = (1.0 - min_alpha) * dt;
            self.solve_toi_island(sub_dt, b, &island);
            let moved = self.synchronize_fixtures(b);
            for c in self.contacts.iter_mut() {
                if c.body == b {
                    c.toi_flag = false;
                    c.island = false;
                }
            }
            let moved: Vec<usize> = if moved { vec![b] } else { Vec::new() };
            self.find_new_contacts(&moved);
        }
    }

    fn restore_sweep(&mut self, b: usize, backup: &Body) {
        let body = &mut self.bodies[b];
        body.c0 = backup.c0;
        body.a0 = backup.a0;
        body.c = backup.c;
        body.a = backup.a;
        body.alpha0 = backup.alpha0;
        body.sync_transform(shapes().local_center[b]);
    }

    /// b2Island::SolveTOI for walker body `b` and its terrain contacts: position correction first
    /// (b2_toiBaugarte), then velocities without warm starting over the rest of the step.
    fn solve_toi_island(&mut self, h: f32, b: usize, contacts: &[usize]) {
        let sh = shapes();
        let mut sd = SolverData::new();
        let body = self.bodies[b];
        sd.load(b, body.c, body.a, body.v, body.w);
        let mut cs = ContactSolver::new(&self.contacts, contacts, false, &sd);
        for _ in 0..TOI_POSITION_ITERATIONS {
            if cs.solve_position_constraints(&self.contacts, &mut sd, TOI_BAUMGARTE) >= -1.5 * LINEAR_SLOP {
                break;
            }
        }
        self.bodies[b].c0 = sd.pos_c[b];
        self.bodies[b].a0 = sd.pos_a[b];
        cs.initialize_velocity_constraints(&self.contacts, &sd);
        for _ in 0..VELOCITY_ITERATIONS {
            cs.solve_velocity_constraints(&mut sd);
        }
        sd.integrate(h, &[b]);
        let body = &mut self.bodies[b];
        body.c = sd.pos_c[b];
        body.a = sd.pos_a[b];
        body.v = sd.vel_v[b];
        body.w = sd.vel_w[b];
        body.sync_transform(sh.local_center[b]);
    }

    fn joint_init_velocity(&mut self, j: usize, pos_a: &[f32], vel_v: &mut [V2], vel_w: &mut [f32], inv_mass: &[f32],
                           inv_i: &[f32], local_center: &[V2]) {
        let (ia_, ib_) = JOINT_BODIES[j];
        let jt = &mut self.joints[j];
        jt.lca = local_center[ia_];
        jt.lcb = local_center[ib_];
        jt.ma = inv_mass[ia_];
        jt.mb = inv_mass[ib_];
        jt.ia = inv_i[ia_];
        jt.ib = inv_i[ib_];
        let aa = pos_a[ia_];
        let (mut va, mut wa) = (vel_v[ia_], vel_w[ia_]);
        let ab = pos_a[ib_];
        let (mut vb, mut wb) = (vel_v[ib_], vel_w[ib_]);
        let qa = rot(aa);
        let qb = rot(ab);
        jt.ra = mul_r(qa, jt.local_a - jt.lca);
        jt.rb = mul_r(qb, jt.local_b - jt.lcb);
        let (ma, mb, ia, ib) = (jt.ma, jt.mb, jt.ia, jt.ib);
        let (ra, rb) = (jt.ra, jt.rb);
        let fixed_rotation = ia + ib == 0.0;
        jt.mass.ex.x = ma + mb + ra.y * ra.y * ia + rb.y * rb.y * ib;
        jt.mass.ey.x = -ra.y * ra.x * ia - rb.y * rb.x * ib;
        jt.mass.ez.x = -ra.y * ia - rb.y * ib;
        jt.mass.ex.y = jt.mass.ey.x;
        jt.mass.ey.y = ma + mb + ra.x * ra.x * ia + rb.x * rb.x * ib;
        jt.mass.ez.y = ra.x * ia + rb.x * ib;
        jt.mass.ex.z = jt.mass.ez.x;
        jt.mass.ey.z = jt.mass.ez.y;
        jt.mass.ez.z = ia + ib;
        jt.mass_f = jt.mass.factors();
        jt.motor_mass = ia + ib;
        if jt.motor_mass > 0.0 {
            jt.motor_mass = 1.0 / jt.motor_mass;
        }
        if fixed_rotation {
            jt.motor_impulse = 0.0;
        }
        if !fixed_rotation {
            let joint_angle = ab - aa - jt.reference;
            if absf(jt.upper - jt.lower) < 2.0 * ANGULAR_SLOP {
                jt.limit_state = 3;
            } else if joint_angle <= jt.lower {
                if jt.limit_state != 1 {
                    jt.impulse.z = 0.0;
                }
                jt.limit_state = 1;
            } else if joint_angle >= jt.upper {
                if jt.limit_state != 2 {
                    jt.impulse.z = 0.0;
                }
                jt.limit_state = 2;
            } else {
                jt.limit_state = 0;
                jt.impulse.z = 0.0;
            }
        } else {
            jt.limit_state = 0;
        }
        // warm starting (dtRatio 1)
        let dt_ratio = 1.0f32;
        jt.impulse = V3 { x: dt_ratio * jt.impulse.x, y: dt_ratio * jt.impulse.y, z: dt_ratio * jt.impulse.z };
        jt.motor_impulse *= dt_ratio;
        let p = v2(jt.impulse.x, jt.impulse.y);
        va = va - ma * p;
        wa -= ia * (cross(ra, p) + jt.motor_impulse + jt.impulse.z);
        vb = vb + mb * p;
        wb += ib * (cross(rb, p) + jt.motor_impulse + jt.impulse.z);
        vel_v[ia_] = va;
        vel_w[ia_] = wa;
        vel_v[ib_] = vb;
        vel_w[ib_] = wb;
    }

    #[inline(always)] // called from step_group and velocity_iteration: inlined in both (3% fewer instructions)
    fn joint_solve_velocity(&mut self, j: usize, dt: f32, vel_v: &mut [V2], vel_w: &mut [f32]) {
        let (ia_, ib_) = JOINT_BODIES[j];
        let jt = &mut self.joints[j];
        let (mut va, mut wa, mut vb, mut wb) = (vel_v[ia_], vel_w[ia_], vel_v[ib_], vel_w[ib_]);
        let (ma, mb, ia, ib) = (jt.ma, jt.mb, jt.ia, jt.ib);
        let fixed_rotation = ia + ib == 0.0;
        if jt.limit_state != 3 && !fixed_rotation {
            let cdot = wb - wa - jt.motor_speed;
            let mut impulse = -jt.motor_mass * cdot;
            let old = jt.motor_impulse;
            let max_impulse = dt * jt.max_torque;
            jt.motor_impulse = clampf(jt.motor_impulse + impulse, -max_impulse, max_impulse);
            impulse = jt.motor_impulse - old;
            wa -= ia * impulse;
            wb += ib * impulse;
        }
        let (ra, rb) = (jt.ra, jt.rb);
        if jt.limit_state != 0 && !fixed_rotation {
            let cdot1 = vb + cross_sv(wb, rb) - va - cross_sv(wa, ra);
            let cdot2 = wb - wa;
            let cdot = V3 { x: cdot1.x, y: cdot1.y, z: cdot2 };
            let s = jt.mass.solve33(&jt.mass_f, cdot);
            let mut impulse = V3 { x: -s.x, y: -s.y, z: -s.z };
            let add = |a: V3, b: V3| V3 { x: a.x + b.x, y: a.y + b.y, z: a.z + b.z };
            if jt.limit_state == 3 {
                jt.impulse = add(jt.impulse, impulse);
            } else if jt.limit_state == 1 || jt.limit_state == 2 {
                let new_impulse = jt.impulse.z + impulse.z;
                let reduce = if jt.limit_state == 1 { new_impulse < 0.0 } else { new_impulse > 0.0 };
                if reduce {
                    let rhs = -cdot1 + jt.impulse.z * v2(jt.mass.ez.x, jt.mass.ez.y);
                    let reduced = jt.mass.solve22(&jt.mass_f, rhs);
                    impulse.x = reduced.x;
                    impulse.y = reduced.y;
                    impulse.z = -jt.impulse.z;
                    jt.impulse.x += reduced.x;
                    jt.impulse.y += reduced.y;
                    jt.impulse.z = 0.0;
                } else {
                    jt.impulse = add(jt.impulse, impulse);
                }
            }
            let p = v2(impulse.x, impulse.y);
            va = va - ma * p;
            wa -= ia * (cross(ra, p) + impulse.z);
            vb = vb + mb * p;
            wb += ib * (cross(rb, p) + impulse.z);
        } else {
            let cdot = vb + cross_sv(wb, rb) - va - cross_sv(wa, ra);
            let impulse = jt.mass.solve22(&jt.mass_f, -cdot);
            jt.impulse.x += impulse.x;
            jt.impulse.y += impulse.y;
            va = va - ma * impulse;
            wa -= ia * cross(ra, impulse);
            vb = vb + mb * impulse;
            wb += ib * cross(rb, impulse);
        }
        vel_v[ia_] = va;
        vel_w[ia_] = wa;
        vel_v[ib_] = vb;
        vel_w[ib_] = wb;
    }

    fn joint_solve_position(&mut self, j: usize, pos_c: &mut [V2], pos_a: &mut [f32]) -> bool {
        let (ia_, ib_) = JOINT_BODIES[j];
        let jt = &self.joints[j];
        let (mut ca, mut aa, mut cb, mut ab) = (pos_c[ia_], pos_a[ia_], pos_c[ib_], pos_a[ib_]);
        let mut angular_error = 0.0f32;
        let fixed_rotation = jt.ia + jt.ib == 0.0;
        if jt.limit_state != 0 && !fixed_rotation {
            let angle = ab - aa - jt.reference;
            let mut limit_impulse = 0.0f32;
            if jt.limit_state == 3 {
                let c = clampf(angle - jt.lower, -MAX_ANGULAR_CORRECTION, MAX_ANGULAR_CORRECTION);
                limit_impulse = -jt.motor_mass * c;
                angular_error = absf(c);
            } else if jt.limit_state == 1 {
                let mut c = angle - jt.lower;
                angular_error = -c;
                c = clampf(c + ANGULAR_SLOP, -MAX_ANGULAR_CORRECTION, 0.0);
                limit_impulse = -jt.motor_mass * c;
            } else if jt.limit_state == 2 {
                let mut c = angle - jt.upper;
                angular_error = c;
                c = clampf(c - ANGULAR_SLOP, 0.0, MAX_ANGULAR_CORRECTION);
                limit_impulse = -jt.motor_mass * c;
            }
            aa -= jt.ia * limit_impulse;
            ab += jt.ib * limit_impulse;
        }
        let qa = rot(aa);
        let qb = rot(ab);
        let ra = mul_r(qa, jt.local_a - jt.lca);
        let rb = mul_r(qb, jt.local_b - jt.lcb);
        let c = cb + rb - ca - ra;
        let position_error = length(c);
        let (ma, mb, ia, ib) = (jt.ma, jt.mb, jt.ia, jt.ib);
        let k = M22 {
            ex: v2(ma + mb + ia * ra.y * ra.y + ib * rb.y * rb.y, -ia * ra.x * ra.y - ib * rb.x * rb.y),
            ey: v2(-ia * ra.x * ra.y - ib * rb.x * rb.y, ma + mb + ia * ra.x * ra.x + ib * rb.x * rb.x),
        };
        let impulse = -k.solve(c);
        ca = ca - ma * impulse;
        aa -= ia * cross(ra, impulse);
        cb = cb + mb * impulse;
        ab += ib * cross(rb, impulse);
        pos_c[ia_] = ca;
        pos_a[ia_] = aa;
        pos_c[ib_] = cb;
        pos_a[ib_] = ab;
        position_error <= LINEAR_SLOP && angular_error <= ANGULAR_SLOP
    }

    /// world.RayCast with gymnasium's LidarCallback: the nearest terrain edge (fraction 1 if none).
    /// The tree visits candidates in its own order, but each hit clips the ray, so the last
    /// reported fraction is the smallest.
    fn lidar(&self, p1: V2, p2: V2) -> f32 {
        let mut max_fraction = 1.0f32;
        let mut fraction = 1.0f32;
        let lo = v2(minf(p1.x, p2.x), minf(p1.y, p2.y));
        let hi = v2(maxf(p1.x, p2.x), maxf(p1.y, p2.y));
        let seg = [lo.x, lo.y, hi.x, hi.y];
        for e in World::edge_range(lo.x, hi.x) {
            if !aabb_overlap(&seg, &self.edge_fat(e)) {
                continue;
            }
            let (v1, v2_) = self.edge(e);
            if let Some(t) = edge_raycast(v1, v2_, p1, p2, max_fraction) {
                fraction = t;
                max_fraction = t;
            }
        }
        fraction
    }
}

/// b2EdgeShape::RayCast on an edge of a static body at the origin: the hit fraction, if any.
fn edge_raycast(v1: V2, v2_: V2, in_p1: V2, in_p2: V2, max_fraction: f32) -> Option<f32> {
    let p1 = mult_r(IDENTITY.q, in_p1 - IDENTITY.p);
    let p2 = mult_r(IDENTITY.q, in_p2 - IDENTITY.p);
    let d = p2 - p1;
    let e = v2_ - v1;
    let normal = normalize(v2(e.y, -e.x));
    let numerator = dot(normal, v1 - p1);
    let denominator = dot(normal, d);
    if denominator == 0.0 {
        return None;
    }
    let t = numerator / denominator;
    if t < 0.0 || max_fraction < t {
        return None;
    }
    let q = p1 + t * d;
    let r = v2_ - v1;
    let rr = dot(r, r);
    if rr == 0.0 {
        return None;
    }
    let s = dot(q - v1, r) / rr;
    if s < 0.0 || 1.0 < s {
        return None;
    }
    Some(t)
}

// ---------------------------------------------------------------- gymnasium's step

fn sign(a: f64) -> f64 {
    if a > 0.0 { 1.0 } else if a < 0.0 { -1.0 } else { 0.0 }
}

/// One env step; returns (reward, terminated). `hull_force`: ApplyForceToCenter before the step (reset).
fn env_step(world: &mut World, action: &[f64], obs: &mut [f32], hull_force: f32) -> (f64, bool) {
    env_act(world, action, hull_force);
    world.step();
    env_observe(world, action, obs)
}

/// gymnasium's step before world.Step: the motors' speeds and torques (and reset's push of the hull).
fn env_act(world: &mut World, action: &[f64], hull_force: f32) {
    // SetMotorSpeed / SetMaxMotorTorque wake both bodies of every joint.
    let speeds = [SPEED_HIP, SPEED_KNEE, SPEED_HIP, SPEED_KNEE];
    for j in 0..4 {
        let a = action[j] as f32 as f64; // the action space is float32
        world.joints[j].motor_speed = (speeds[j] * sign(a)) as f32;
        world.joints[j].max_torque = (MOTORS_TORQUE * a.abs().clamp(0.0, 1.0)) as f32;
        let (ja, jb) = JOINT_BODIES[j];
        world.bodies[ja].set_awake(true);
        world.bodies[jb].set_awake(true);
    }
    if hull_force != 0.0 {
        world.bodies[HULL].set_awake(true);
        world.bodies[HULL].force = world.bodies[HULL].force + v2(hull_force, 0.0);
    }
}

/// gymnasium's step after world.Step: the observation (lidar included), reward and termination.
fn env_observe(world: &mut World, action: &[f64], obs: &mut [f32]) -> (f64, bool) {
    let hull = &world.bodies[HULL];
    let pos = hull.xf.p;
    let vel = hull.v;
    let (px, py) = (pos.x as f64, pos.y as f64);
    let mut state = [0.0f64; OBS_SIZE];
    for i in 0..10 {
        let fi = i as f64;
        let p2 = v2((px + (1.5 * fi / 10.0).sin() * LIDAR_RANGE) as f32, (py - (1.5 * fi / 10.0).cos() * LIDAR_RANGE) as f32);
        state[14 + i] = world.lidar(pos, p2) as f64;
    }
    let jangle = |j: usize| {
        let (a, b) = JOINT_BODIES[j];
        (world.bodies[b].a - world.bodies[a].a - world.joints[j].reference) as f64
    };
    let jspeed = |j: usize| {
        let (a, b) = JOINT_BODIES[j];
        (world.bodies[b].w - world.bodies[a].w) as f64
    };
    state[0] = hull.a as f64;
    state[1] = 2.0 * hull.w as f64 / FPS;
    state[2] = 0.3 * vel.x as f64 * (VIEWPORT_W / SCALE) / FPS;
    state[3] = 0.3 * vel.y as f64 * (VIEWPORT_H / SCALE) / FPS;
    state[4] = jangle(0);
    state[5] = jspeed(0) / SPEED_HIP;
    state[6] = jangle(1) + 1.0;
    state[7] = jspeed(1) / SPEED_KNEE;
    state[8] = if world.ground[0] { 1.0 } else { 0.0 };
    state[9] = jangle(2);
    state[10] = jspeed(2) / SPEED_HIP;
    state[11] = jangle(3) + 1.0;
    state[12] = jspeed(3) / SPEED_KNEE;
    state[13] = if world.ground[1] { 1.0 } else { 0.0 };
    for (o, s) in obs.iter_mut().zip(state.iter()) {
        *o = *s as f32;
    }
    let mut shaping = 130.0 * px / SCALE;
    shaping -= 5.0 * state[0].abs();
    let mut reward = shaping - world.prev_shaping;
    world.prev_shaping = shaping;
    // With float32 actions numpy computes the control cost in float32 (a Python float is "weak").
    let mut reward32 = reward as f32;
    for j in 0..4 {
        let a = (action[j] as f32).abs().clamp(0.0, 1.0);
        reward32 -= (0.00035 * MOTORS_TORQUE) as f32 * a;
    }
    reward = reward32 as f64;
    let mut terminated = false;
    if world.game_over || px < 0.0 {
        reward = -100.0;
        terminated = true;
    }
    if px > (TERRAIN_LENGTH as f64 - TERRAIN_GRASS as f64) * TERRAIN_STEP {
        terminated = true;
    }
    (reward, terminated)
}

/// gymnasium's _generate_terrain (normal mode) with this file's RNG.
fn generate_terrain(rng: &mut Rng) -> Vec<f64> {
    let mut ys = Vec::with_capacity(TERRAIN_LENGTH);
    let mut velocity = 0.0f64;
    let mut y = TERRAIN_HEIGHT;
    let mut counter = TERRAIN_STARTPAD;
    let mut oneshot = false;
    for i in 0..TERRAIN_LENGTH {
        if !oneshot {
            velocity = 0.8 * velocity + 0.01 * sign(TERRAIN_HEIGHT - y);
            if i as i64 > TERRAIN_STARTPAD {
                velocity += rng.uniform(-1.0, 1.0) / SCALE;
            }
            y += velocity;
        }
        oneshot = false;
        ys.push(y);
        counter -= 1;
        if counter == 0 {
            counter = TERRAIN_GRASS / 2 + (rng.next_u64() % (TERRAIN_GRASS as u64 - TERRAIN_GRASS as u64 / 2)) as i64;
            oneshot = true;
        }
    }
    ys
}

/// gymnasium's reset: terrain, the walker standing at the start, a random push of the hull, and
/// the step with a zero action that reset() returns the observation of. Proxy ids are those of a
/// fresh b2World (leaves and internal nodes allocated in creation order).
fn reset_env(rng: &mut Rng, state: &mut [f64], obs: &mut [f32]) {
    let sh = shapes();
    let terrain_y = generate_terrain(rng);
    let init_x = TERRAIN_STEP * TERRAIN_STARTPAD as f64 / 2.0;
    let init_y = TERRAIN_HEIGHT + 2.0 * LEG_H;
    let mut bodies = [Body::default(); NB];
    let placements = [
        (init_x, init_y, 0.0),
        (init_x, init_y - LEG_H / 2.0 - LEG_DOWN, -0.05),
        (init_x, init_y - LEG_H * 3.0 / 2.0 - LEG_DOWN, -0.05),
        (init_x, init_y - LEG_H / 2.0 - LEG_DOWN, 0.05),
        (init_x, init_y - LEG_H * 3.0 / 2.0 - LEG_DOWN, 0.05),
    ];
    for (b, &(x, y, angle)) in placements.iter().enumerate() {
        let body = &mut bodies[b];
        body.xf = Xf { p: v2(x as f32, y as f32), q: rot(angle as f32) };
        body.a = angle as f32;
        body.a0 = body.a;
        body.c = mul_x(body.xf, sh.local_center[b]);
        body.c0 = body.c;
        body.awake = true;
        let mut fat = poly_aabb(&sh.polys[b], body.xf);
        fat = [fat[0] - AABB_EXTENSION, fat[1] - AABB_EXTENSION, fat[2] + AABB_EXTENSION, fat[3] + AABB_EXTENSION];
        body.fat = fat;
        body.proxy = 2 * (EDGES + b) as i64 - 1;
    }
    let mut joints = [Joint::default(); 4];
    for (j, joint) in joints.iter_mut().enumerate() {
        *joint = joint_def(j, &bodies);
    }
    let mut world = World::with_terrain(bodies, joints, &terrain_y);
    world.terrain_y = Some(terrain_y);
    for (e, p) in world.edge_proxy.iter_mut().enumerate() {
        *p = if e == 0 { 0 } else { 2 * e as i64 - 1 };
    }
    // the first Step's FindNewContacts (e_newFixture): every proxy is in the move buffer
    world.find_new_contacts(&[0, 1, 2, 3, 4]);
    let force = rng.uniform(-INITIAL_RANDOM, INITIAL_RANDOM) as f32;
    world.prev_shaping = f64::NAN; // gymnasium's None: the reset step's reward is not used
    env_step(&mut world, &[0.0; 4], obs, force);
    world.to_state(state);
}

fn step_env(_rng: &mut Rng, state: &mut [f64], action: &[f64], obs: &mut [f32]) -> (f64, bool) {
    let mut world = World::from_state(state);
    let (reward, terminated) = env_step(&mut world, action, obs, 0.0);
    world.to_state(state);
    (reward, terminated)
}

/// One env's arrays in a Batch: state, action, obs, reward, terminated.
type EnvSlot<'a> = (&'a mut [f64], &'a [f64], &'a mut [f32], &'a mut f64, &'a mut u8);

/// step_env of G envs at once, their worlds stepped by World::step_group (the same results as G
/// step_envs).
fn step_env_group<const G: usize>(envs: &mut [EnvSlot; G]) {
    let mut worlds: [World; G] = std::array::from_fn(|g| World::from_state(envs[g].0));
    for g in 0..G {
        env_act(&mut worlds[g], envs[g].1, 0.0);
    }
    World::step_group(&mut worlds);
    for (world, env) in worlds.iter_mut().zip(envs.iter_mut()) {
        let (reward, terminated) = env_observe(world, env.1, env.2);
        world.to_state(env.0);
        *env.3 = reward;
        *env.4 = terminated as u8;
    }
}

// ---------------------------------------------------------------- component entry points (tests)

/// The manifold of terrain segment (v1, v2) against body `kind` (0 hull, 1 upper leg, 2 lower leg)
/// at (x, y, angle): out = [pointCount, type, nx, ny, px, py, p0x, p0y, p0id, p1x, p1y, p1id]
/// (float64 so that the feature ids stay exact).
#[no_mangle]
pub unsafe extern "C" fn autorl_bw_manifold(edge: *const f32, kind: usize, pose: *const f32, out: *mut f64) {
    let e = std::slice::from_raw_parts(edge, 4);
    let pose = std::slice::from_raw_parts(pose, 3);
    let out = std::slice::from_raw_parts_mut(out, 12);
    let xf = Xf { p: v2(pose[0], pose[1]), q: rot(pose[2]) };
    let m = collide_edge_polygon(v2(e[0], e[1]), v2(e[2], e[3]), IDENTITY, &shapes().polys[kind.min(2)], xf);
    let vals = [m.count as f64, m.typ as f64, m.ln.x as f64, m.ln.y as f64, m.lp.x as f64, m.lp.y as f64,
                m.pts[0].lp.x as f64, m.pts[0].lp.y as f64, m.pts[0].key as f64, m.pts[1].lp.x as f64,
                m.pts[1].lp.y as f64, m.pts[1].key as f64];
    out.copy_from_slice(&vals);
}

/// The lidar fraction of the ray p1 -> p2 against the terrain of `state` (one env's).
#[no_mangle]
pub unsafe extern "C" fn autorl_bw_raycast(state: *const f64, ray: *const f32) -> f32 {
    let s = std::slice::from_raw_parts(state, STATE_SIZE);
    let r = std::slice::from_raw_parts(ray, 4);
    World::from_state(s).lidar(v2(r[0], r[1]), v2(r[2], r[3]))
}

/// b2TimeOfImpact of terrain segment edge = (v1, v2) (at rest) against body `kind` swept by
/// sweep = [c0x, c0y, a0, cx, cy, a] (its local centre is the body's), t_max 1: out = [state, t].
#[no_mangle]
pub unsafe extern "C" fn autorl_bw_toi(edge: *const f32, kind: usize, sweep: *const f32, out: *mut f32) {
    let e = std::slice::from_raw_parts(edge, 4);
    let s = std::slice::from_raw_parts(sweep, 6);
    let sh = shapes();
    let k = kind.min(2);
    let pa = DistanceProxy::edge(v2(e[0], e[1]), v2(e[2], e[3]));
    let pb = DistanceProxy::poly(&sh.polys[k]);
    let sa = Sweep { lc: V2::default(), c0: V2::default(), c: V2::default(), a0: 0.0, a: 0.0 };
    let sb = Sweep { lc: sh.local_center[k], c0: v2(s[0], s[1]), a0: s[2], c: v2(s[3], s[4]), a: s[5] };
    let (state, t) = time_of_impact(&pa, sa, &pb, sb, 1.0);
    std::slice::from_raw_parts_mut(out, 2).copy_from_slice(&[state as f32, t]);
}

/// Mass data of body `kind` (0 hull, 1 upper leg, 2 lower leg): out = [invMass, invI, lcx, lcy].
#[no_mangle]
pub unsafe extern "C" fn autorl_bw_mass(kind: usize, out: *mut f32) {
    let s = shapes();
    let k = kind.min(2);
    std::slice::from_raw_parts_mut(out, 4).copy_from_slice(&[s.inv_mass[k], s.inv_i[k], s.local_center[k].x, s.local_center[k].y]);
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
const MIN_ENVS_PER_THREAD: usize = 8; // a physics step costs ~50-100 us: at 16 envs two threads step 1.45x one (measured before SPIN)

/// Envs stepped together by one thread (step_env_group): 2 measured 2-5% faster than 1 (CPU time), 4 no faster than 2.
const GROUP: usize = 2;

/// Steps the first G of `pending` together and removes them.
fn step_pending<const G: usize>(pending: &mut Vec<EnvSlot>) {
    let mut taken = pending.drain(..G);
    let mut group: [EnvSlot; G] = std::array::from_fn(|_| taken.next().unwrap());
    drop(taken);
    step_env_group(&mut group);
}

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
        // Resets as they come; steps GROUP at a time (step_env_group), the rest in pairs and alone.
        let mut pending: Vec<EnvSlot> = Vec::with_capacity(GROUP);
        for ((((((seed, reset), state), action), obs), reward), terminated) in envs {
            if *reset != 0 {
                reset_env(&mut Rng::new(*seed), state, obs);
                *reward = 0.0;
                *terminated = 0;
                continue;
            }
            pending.push((state, action, obs, reward, terminated));
            if pending.len() == GROUP {
                step_pending::<GROUP>(&mut pending);
            }
        }
        while pending.len() >= 2 {
            step_pending::<2>(&mut pending);
        }
        if let Some((state, action, obs, reward, terminated)) = pending.pop() {
            let (r, t) = step_env(&mut Rng::new(0), state, action, obs); // a step draws nothing from its rng
            *reward = r;
            *terminated = t as u8;
        }
    }

    /// Envs are independent, so any split gives the same results as the serial loop.
    fn run(self) {
        let n = self.seeds.len();
        let threads = if n < 2 * MIN_ENVS_PER_THREAD { 1 } else { available_threads().min(n / MIN_ENVS_PER_THREAD) };
        if threads <= 1 {
            return self.run_serial();
        }
        let work = Work::new(self, GROUP, threads);
        // The pool's workers, unless another caller is using them (then fresh scoped threads).
        let mut pool = match POOL.try_lock() {
            Ok(guard) => guard,
            Err(_) => {
                return std::thread::scope(|scope| {
                    for _ in 1..threads {
                        scope.spawn(|| work.drain());
                    }
                    work.drain();
                });
            }
        };
        let pid = std::process::id();
        if pool.as_ref().map_or(true, |p| p.pid != pid || p.jobs.len() + 1 < threads) {
            *pool = Some(Pool::new(pid, threads - 1)); // (a forked child has the parent's pool but not its threads)
        }
        let pool = pool.as_ref().unwrap();
        // SAFETY: `work` outlives the jobs: this call waits below for every worker it sent it to,
        // even if its own share panics, before it returns or unwinds.
        let shared: &'static Work<'static> = unsafe { std::mem::transmute::<&Work<'_>, &'static Work<'static>>(&work) };
        for job in &pool.jobs[..threads - 1] {
            if job.send(shared).is_err() {
                std::process::abort(); // a worker is gone: `work` must not be freed under it
            }
        }
        let own = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work.drain()));
        let mut ok = own.is_ok();
        for _ in 1..threads {
            ok &= spin_recv(&pool.done).unwrap_or_else(|| std::process::abort());
        }
        if let Err(panic) = own {
            std::panic::resume_unwind(panic);
        }
        assert!(ok, "a worker thread panicked");
    }
}

/// A call's envs in chunks of GROUP that the calling thread and the workers take in turn: on
/// shared cores, the threads that are running take more chunks instead of the call waiting for a
/// descheduled thread's fixed share (which env a thread steps does not change its result).
struct Work<'a> {
    chunks: Vec<std::sync::Mutex<Option<Batch<'a>>>>,
    next: std::sync::atomic::AtomicUsize,
}

impl<'a> Work<'a> {
    /// Chunks of `size`, the last 2 x `threads` envs one by one: the threads then finish within about
    /// one env's step of each other instead of `size` envs'.
    fn new(batch: Batch<'a>, size: usize, threads: usize) -> Work<'a> {
        let mut chunks = Vec::with_capacity(batch.seeds.len() / size + 2 * threads);
        let mut rest = batch;
        while rest.seeds.len() > 1 {
            let n = if rest.seeds.len() > 2 * threads { size.min(rest.seeds.len() - 2 * threads) } else { 1 };
            let (chunk, tail) = rest.split_at(n);
            chunks.push(std::sync::Mutex::new(Some(chunk)));
            rest = tail;
        }
        chunks.push(std::sync::Mutex::new(Some(rest)));
        Work { chunks, next: std::sync::atomic::AtomicUsize::new(0) }
    }

    fn drain(&self) {
        loop {
            let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if i >= self.chunks.len() {
                return;
            }
            let chunk = self.chunks[i].lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
            if let Some(chunk) = chunk {
                chunk.run_serial();
            }
        }
    }
}

/// Worker threads kept between calls: spawning and joining a thread costs ~100 us on this VM, a
/// fifth of what 8 envs' steps take. Between jobs a worker polls for SPIN, then sleeps in recv().
struct Pool {
    pid: u32,
    jobs: Vec<std::sync::mpsc::Sender<&'static Work<'static>>>,
    done: std::sync::mpsc::Receiver<bool>,
}

static POOL: std::sync::Mutex<Option<Pool>> = std::sync::Mutex::new(None);

impl Pool {
    fn new(pid: u32, workers: usize) -> Pool {
        let (done_tx, done) = std::sync::mpsc::channel();
        let jobs = (0..workers).map(|_| {
            let (tx, rx) = std::sync::mpsc::channel::<&'static Work<'static>>();
            let done_tx = done_tx.clone();
            std::thread::spawn(move || {
                while let Some(work) = spin_recv(&rx) {
                    let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work.drain())).is_ok();
                    if done_tx.send(ok).is_err() {
                        return;
                    }
                }
            });
            tx
        }).collect();
        Pool { pid, jobs, done }
    }
}

/// How long a thread polls for its next message before it sleeps in recv(): a futex wake-up costs
/// tens of microseconds on this VM, paid twice per call (the job, then its end) against ~450 us of
/// steps per thread at 16 envs. Polling 200 us, with the tail split (Work::new), stepped 16 envs
/// 2.4x envpool against 1.7-1.9x sleeping at once, 50 us 2.2x (docs/concepts/backends.md).
/// Bounded, so that a worker idle between calls (while a learner runs) gives its core back soon.
const SPIN: std::time::Duration = std::time::Duration::from_micros(200);

fn spin_recv<T>(rx: &std::sync::mpsc::Receiver<T>) -> Option<T> {
    let start = std::time::Instant::now();
    loop {
        match rx.try_recv() {
            Ok(message) => return Some(message),
            Err(std::sync::mpsc::TryRecvError::Disconnected) => return None,
            Err(std::sync::mpsc::TryRecvError::Empty) if start.elapsed() < SPIN => std::hint::spin_loop(),
            Err(std::sync::mpsc::TryRecvError::Empty) => return rx.recv().ok(),
        }
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
    state_fields().as_ptr() as *const c_char
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
