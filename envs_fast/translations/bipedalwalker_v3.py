"""BipedalWalker-v3 in JAX: the algorithm of the Rust port (`bipedalwalker_v3.rs`, a port of the parts of
Box2D 2.3 gymnasium's scene uses) translated into pure, jittable, vmappable functions with fixed shapes,
for GPUs. Same equations in the same order, float32 like Box2D's float32 build:
  b2CollideEdgeAndPolygon, b2Contact::Update (warm starts matched by feature id, touching flags, the
  contact listener), b2ContactManager::Collide / AddPair in proxy-id pair order, b2Island::Solve
  (sequential impulses with warm starting and the 2-point block solver, 180 velocity and 60 position
  iterations, revolute joints with motors and limits, sleeping), b2World::SolveTOI with b2TimeOfImpact
  (GJK conservative advancement) and b2Island::SolveTOI, b2EdgeShape::RayCast for the lidar, gymnasium's
  reward, termination and observation scaling.

Shapes: the 5 bodies are arrays; the terrain is its 199 edge segments; the contact list is 48 slots
(b2World's list order, head first) with a count; islands are masks and permutations of those slots. The
solver's iterations are lax.fori_loop / lax.while_loop (never unrolled), so compile time stays bounded.
Every env step wakes every body (gymnasium sets every joint's motor, and the joints reach all 5 bodies),
so the island is always the whole walker, found by Box2D's DFS from the body list's head: bodies in
the order lower1, leg1, hull, leg0, lower0 and joints 3, 2, 0, 1 (static tables below).

The state is the Rust port's flat state (bipedalwalker_v3_sync.py reads and writes it; this file
reuses that companion) split into float32 arrays in the same order; feature ids are packed into
`FEATURE_CODE` (ia + 8 ib + 64 ta + 128 tb) because Box2D's 32-bit key is not exact in float32.

Where this deviates from the Rust port (none of it is an approximation of the physics):
- step and reset round every float operation on its own (envs_fast.c_rounding): XLA's CPU compiler would
  fuse a*b+c into one fused multiply-add, and its algebraic simplifier rewrites (a - c1) - c2, a / c,
  a / b / c and a / sqrt(b) into other roundings; the solver's 180 iterations carry such a last bit on
  (it made L2 and L3 fail). With it, one step from each of L2's 2231 rollout states, time of impact
  included, is the Rust port's bit for bit (bench/bipedal_jax_vs_rust.py). XLA's float32 sin/cos equal
  glibc's sinf/cosf (2,000,000 angles).
- The observation is computed in float32 (the Rust port and gymnasium compute it in float64 and round):
  it differs by a rounding, the state does not.
- A contact list longer than 48 is cut to 48 inside the step (the Rust port keeps it growing and writes
  the first 48).
- prev_shaping is float32 (the Rust port's float64): the reward is off by float32 roundings of the shaping.
- The reset's terrain comes from jax.random (another stream than gymnasium's numpy one, same law).

VERIFICATION TOLERANCE: the verifier's own, no declaration of this file's. One step from a synced state
deviates from the reference by float32 roundings (measured over random-action and declared-policy
states: observations up to ~3e-6, body positions and velocities ~5e-6, joint impulses ~1e-6, before
products were rounded; docs/concepts/backends.md), well inside L2's 1e-5 + 1e-4
|reference| + 125 x the reference's own movement under 8 float32 roundings of the state. L3 compares synced trajectories up to each one's
predictable horizon (CHAOTIC, from the sync companion), as for the Rust port. A wrong constant is not
inside it: a motor torque of 78 instead of 80 fails L2 naming the fields (see the figures file).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from envs_fast.c_rounding import rounded_like_c
from envs_fast.protocol import import_file, sync_companion

# The companion beside this file, not the package's: the one a verdict hashes and a snapshot carries.
sync = import_file(sync_companion(__file__), "_envs_fast_bipedalwalker_sync")
CHAOTIC, EPISODE_OUTCOMES = sync.CHAOTIC, sync.EPISODE_OUTCOMES
STATE_CATEGORIES, VERIFY_POLICIES = sync.STATE_CATEGORIES, sync.VERIFY_POLICIES
TRANSFER_PPO = sync.TRANSFER_PPO  # L4 as the Rust port's: PPO trained here scores as PPO trained on gymnasium
# A State, and the step, hold MAX_CONTACTS contacts (the Rust port's list grows): L2 fails if the reference's
# own episodes go beyond, and leaves out boundary states that do (a hull written metres from its legs pairs
# with ~300 terrain edges). Episodes stay far below it (the L2 report says how far).
CAPACITY = {"contacts": (lambda state: state.header[4], sync.MAX_CONTACTS)}

ENV_ID = "BipedalWalker-v3"

F32 = np.float32
f32 = jnp.float32
i32 = jnp.int32

# ---------------------------------------------------------------- the environment's constants
FPS = 50.0
SCALE = 30.0
MOTORS_TORQUE = 80.0
SPEED_HIP = 4.0
SPEED_KNEE = 6.0
LIDAR_RANGE = 160.0 / SCALE
INITIAL_RANDOM = 5.0
HULL_POLY = [(-30.0, 9.0), (6.0, 9.0), (34.0, 1.0), (34.0, -8.0), (-30.0, -8.0)]
LEG_DOWN = -8.0 / SCALE
LEG_W = 8.0 / SCALE
LEG_H = 34.0 / SCALE
VIEWPORT_W = 600.0
VIEWPORT_H = 400.0
TERRAIN_STEP = 14.0 / SCALE
TERRAIN_LENGTH = 200
TERRAIN_HEIGHT = VIEWPORT_H / SCALE / 4.0
TERRAIN_GRASS = 10
TERRAIN_STARTPAD = 20
FRICTION = 2.5
EDGES = TERRAIN_LENGTH - 1

# Box2D's b2Settings.h (float32 arithmetic as in the C++)
LINEAR_SLOP = F32(0.005)
PI32 = F32(3.14159265359)
ANGULAR_SLOP = F32(2.0) / F32(180.0) * PI32
POLYGON_RADIUS = F32(2.0) * LINEAR_SLOP
AABB_EXTENSION = F32(0.1)
AABB_MULTIPLIER = F32(2.0)
VELOCITY_THRESHOLD = F32(1.0)
MAX_LINEAR_CORRECTION = F32(0.2)
MAX_ANGULAR_CORRECTION = F32(8.0) / F32(180.0) * PI32
MAX_TRANSLATION = F32(2.0)
MAX_ROTATION = F32(0.5) * PI32
BAUMGARTE = F32(0.2)
TOI_BAUMGARTE = F32(0.75)
MAX_SUB_STEPS = 8
MAX_TOI_CONTACTS = 32
TOI_POSITION_ITERATIONS = 20
TIME_TO_SLEEP = F32(0.5)
LINEAR_SLEEP_TOLERANCE = F32(0.01)
ANGULAR_SLEEP_TOLERANCE = F32(2.0) / F32(180.0) * PI32
EPSILON = F32(np.finfo(np.float32).eps)
FLT_MAX = F32(np.finfo(np.float32).max)
VELOCITY_ITERATIONS = 6 * 30
POSITION_ITERATIONS = 2 * 30
H = F32(1.0 / FPS)

NB = 5
MAX_CONTACTS = sync.MAX_CONTACTS
JOINT_BODIES = ((0, 1), (1, 2), (0, 3), (3, 4))
KIND = (0, 1, 2, 1, 2)  # hull, upper leg, lower leg
BODY_LIST = (4, 3, 2, 1, 0)  # b2World's body list (newest first)
ISLAND_JOINTS = (3, 2, 0, 1)  # the DFS from lower1 adds the joints in this order ...
ISLAND_JOINT_ORDER = np.array(ISLAND_JOINTS, np.int32)
ISLAND_RANK = np.array([2, 3, 4, 1, 0], np.int32)  # ... and reaches body b as the rank[b]-th
TOI_LOOP_CAP = 256  # b2World::SolveTOI's loop ends by itself (toi counts, disabled contacts); a bound for XLA


# ---------------------------------------------------------------- shapes and mass (numpy float32, at import)

def _np_cross(a, b):
    return a[0] * b[1] - a[1] * b[0]


def _np_normalize(a):
    length = F32(np.sqrt(a[0] * a[0] + a[1] * a[1]))
    if length < EPSILON:
        return a
    inv = F32(1.0) / length
    return np.array([a[0] * inv, a[1] * inv], F32)


def _poly_box(hx, hy):
    hx, hy = F32(hx), F32(hy)
    v = np.array([(-hx, -hy), (hx, -hy), (hx, hy), (-hx, hy)], F32)
    n = np.array([(0, -1), (1, 0), (0, 1), (-1, 0)], F32)
    return v, n


def _poly_set(points):
    """b2PolygonShape::Set: gift-wrapping hull in Box2D's vertex order, then the edge normals."""
    ps = np.array(points, F32)
    n = len(ps)
    i0, x0 = 0, ps[0, 0]
    for i in range(1, n):
        x = ps[i, 0]
        if x > x0 or (x == x0 and ps[i, 1] < ps[i0, 1]):
            i0, x0 = i, x
    hull, ih = [], i0
    while True:
        hull.append(ih)
        ie = 0
        for j in range(1, n):
            if ie == ih:
                ie = j
                continue
            r, v = ps[ie] - ps[hull[-1]], ps[j] - ps[hull[-1]]
            c = _np_cross(r, v)
            if c < 0 or (c == 0 and (v[0] * v[0] + v[1] * v[1]) > (r[0] * r[0] + r[1] * r[1])):
                ie = j
        ih = ie
        if ie == i0:
            break
    v = ps[hull]
    normals = []
    for i in range(len(v)):
        e = v[(i + 1) % len(v)] - v[i]
        normals.append(_np_normalize(np.array([F32(1.0) * e[1], -F32(1.0) * e[0]], F32)))
    return v, np.array(normals, F32)


def _centroid(v):
    """b2PolygonShape::ComputeCentroid (reference point at the origin)."""
    c = np.zeros(2, F32)
    area = F32(0)
    inv3 = F32(1.0) / F32(3.0)
    p1 = np.zeros(2, F32)
    for i in range(len(v)):
        p2, p3 = v[i], v[(i + 1) % len(v)]
        tri = F32(0.5) * _np_cross(p2 - p1, p3 - p1)
        area = area + tri
        c = c + (tri * inv3) * (p1 + p2 + p3)
    return (F32(1.0) / area) * c


def _mass_data(v, density):
    """b2PolygonShape::ComputeMass then b2Body::ResetMassData: (inverse mass, inverse inertia, local centre)."""
    density = F32(density)
    count = len(v)
    s = np.zeros(2, F32)
    for i in range(count):
        s = s + v[i]
    s = (F32(1.0) / F32(count)) * s
    center, area, inertia = np.zeros(2, F32), F32(0), F32(0)
    k_inv3 = F32(1.0) / F32(3.0)
    for i in range(count):
        e1, e2 = v[i] - s, v[(i + 1) % count] - s
        d = _np_cross(e1, e2)
        tri = F32(0.5) * d
        area = area + tri
        center = center + (tri * k_inv3) * (e1 + e2)
        intx2 = e1[0] * e1[0] + e2[0] * e1[0] + e2[0] * e2[0]
        inty2 = e1[1] * e1[1] + e2[1] * e1[1] + e2[1] * e2[1]
        inertia = inertia + (F32(0.25) * k_inv3 * d) * (intx2 + inty2)
    mass = density * area
    center = (F32(1.0) / area) * center
    mcenter = center + s
    i_body = density * inertia
    i_body = i_body + mass * ((mcenter[0] * mcenter[0] + mcenter[1] * mcenter[1]) - (center[0] * center[0] + center[1] * center[1]))
    m_mass = F32(0.0) + mass
    local = np.zeros(2, F32) + mass * mcenter
    m_i = F32(0.0) + i_body
    inv_mass = F32(1.0) / m_mass
    local = inv_mass * local
    m_i = m_i - m_mass * (local[0] * local[0] + local[1] * local[1])
    return inv_mass, F32(1.0) / m_i, local


def _shapes():
    hull_v, hull_n = _poly_set([(F32(x / SCALE), F32(y / SCALE)) for x, y in HULL_POLY])
    leg = _poly_box(LEG_W / 2.0, LEG_H / 2.0)
    lower = _poly_box(0.8 * LEG_W / 2.0, LEG_H / 2.0)
    kinds = [(hull_v, hull_n), leg, lower]
    densities = (5.0, 1.0, 1.0, 1.0, 1.0)
    frictions = (0.1, 0.2, 0.2, 0.2, 0.2)
    verts = np.zeros((NB, 8, 2), F32)
    norms = np.zeros((NB, 8, 2), F32)
    counts = np.zeros(NB, np.int32)
    centroids = np.zeros((NB, 2), F32)
    inv_mass, inv_i, local_center, friction = (np.zeros(NB, F32), np.zeros(NB, F32), np.zeros((NB, 2), F32),
                                               np.zeros(NB, F32))
    for b in range(NB):
        v, n = kinds[KIND[b]]
        verts[b, :len(v)], norms[b, :len(v)], counts[b] = v, n, len(v)
        centroids[b] = _centroid(v)
        inv_mass[b], inv_i[b], local_center[b] = _mass_data(v, densities[b])
        friction[b] = F32(np.sqrt(F32(FRICTION) * F32(frictions[b])))  # b2MixFriction
    return verts, norms, counts, centroids, inv_mass, inv_i, local_center, friction


POLY_V, POLY_N, POLY_COUNT, CENTROID, INV_MASS, INV_I, LOCAL_CENTER, FRICTION_MIX = _shapes()
TERRAIN_X = np.array([F32(i * TERRAIN_STEP) for i in range(TERRAIN_LENGTH)], F32)
# gymnasium's joints: reference angle (legs start at -0.05, +0.05), lower and upper limits, anchors
JOINT_REFERENCE = np.array([F32(-0.05), 0.0, F32(0.05), 0.0], F32)
JOINT_LOWER = np.array([-0.8, -1.6, -0.8, -1.6], F32)
JOINT_UPPER = np.array([1.1, -0.1, 1.1, -0.1], F32)
JOINT_LOCAL_A = np.array([(0.0, F32(LEG_DOWN)), (0.0, F32(-LEG_H / 2.0)), (0.0, F32(LEG_DOWN)), (0.0, F32(-LEG_H / 2.0))], F32)
JOINT_LOCAL_B = np.array([(0.0, F32(LEG_H / 2.0))] * 4, F32)
JOINT_A = np.array([a for a, _ in JOINT_BODIES], np.int32)
JOINT_B = np.array([b for _, b in JOINT_BODIES], np.int32)
JOINT_RA_LOCAL = np.array([JOINT_LOCAL_A[j] - LOCAL_CENTER[JOINT_A[j]] for j in range(4)], F32)  # localAnchor - localCenter
JOINT_RB_LOCAL = np.array([JOINT_LOCAL_B[j] - LOCAL_CENTER[JOINT_B[j]] for j in range(4)], F32)
SPEEDS = np.array([SPEED_HIP, SPEED_KNEE, SPEED_HIP, SPEED_KNEE])
LIDAR_DX = np.array([math.sin(1.5 * i / 10.0) * LIDAR_RANGE for i in range(10)], F32)
LIDAR_DY = np.array([math.cos(1.5 * i / 10.0) * LIDAR_RANGE for i in range(10)], F32)


# ---------------------------------------------------------------- b2Math (float32)

def v2(x, y):
    return jnp.stack([x, y])


def dot(a, b):
    return a[0] * b[0] + a[1] * b[1]


def cross(a, b):
    return a[0] * b[1] - a[1] * b[0]


def cross_vs(a, s):
    return v2(s * a[1], -s * a[0])


def cross_sv(s, a):
    return v2(-s * a[1], s * a[0])


def length(a):
    return jnp.sqrt(a[0] * a[0] + a[1] * a[1])


def normalize(a):
    n = length(a)
    inv = 1.0 / jnp.where(n < EPSILON, 1.0, n)
    return jnp.where(n < EPSILON, a, v2(a[0] * inv, a[1] * inv))


def clampf(a, lo, hi):
    m = jnp.where(a < hi, a, hi)
    return jnp.where(lo > m, lo, m)


def minf(a, b):
    return jnp.where(a < b, a, b)


def maxf(a, b):
    return jnp.where(a > b, a, b)


def rot(angle):
    return jnp.sin(angle), jnp.cos(angle)


def mul_r(q, v):
    s, c = q
    return v2(c * v[0] - s * v[1], s * v[0] + c * v[1])


def mult_r(q, v):
    s, c = q
    return v2(c * v[0] + s * v[1], -s * v[0] + c * v[1])


def mul_x(xf, v):
    p, (s, c) = xf
    return v2((c * v[0] - s * v[1]) + p[0], (s * v[0] + c * v[1]) + p[1])


def mult_x(xf, v):
    p, (s, c) = xf
    px, py = v[0] - p[0], v[1] - p[1]
    return v2(c * px + s * py, -s * px + c * py)


def xform(c, a, lc):
    """b2Body::SynchronizeTransform: (position, rotation) of a body whose sweep centre is c, angle a."""
    q = rot(a)
    return c - mul_r(q, lc), q


def solve22(a11, a12, a21, a22, b):
    det = a11 * a22 - a12 * a21
    det = jnp.where(det != 0, 1.0 / jnp.where(det != 0, det, 1.0), det)
    return v2(det * (a22 * b[0] - a12 * b[1]), det * (a11 * b[1] - a21 * b[0]))


def _cross3(a, b):
    return (a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0])


def _dot3(a, b):
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]


def solve33(ex, ey, ez, b):
    det = _dot3(ex, _cross3(ey, ez))
    det = jnp.where(det != 0, 1.0 / jnp.where(det != 0, det, 1.0), det)
    return (det * _dot3(b, _cross3(ey, ez)), det * _dot3(ex, _cross3(b, ez)), det * _dot3(ex, _cross3(ey, b)))


# ---------------------------------------------------------------- manifolds (b2CollideEdge.cpp)

F_VERTEX, F_FACE = 0, 1


def key(ia, ib, ta, tb):
    return ia | (ib << 8) | (ta << 16) | (tb << 24)


def _clip(v0, id0, v1, id1, normal, offset, vertex_index_a):
    """b2ClipSegmentToLine: (count, points (2,2), ids (2,))."""
    d0 = dot(normal, v0) - offset
    d1 = dot(normal, v1) - offset
    interp = d0 / jnp.where(d0 - d1 == 0, 1.0, d0 - d1)
    vi = v0 + interp * (v1 - v0)
    idi = key(vertex_index_a, (id0 >> 8) & 0xff, F_VERTEX, F_FACE)
    take = jnp.stack([d0 <= 0, d1 <= 0, d0 * d1 < 0])
    pts = jnp.stack([v0, v1, vi])
    ids = jnp.stack([id0, id1, idi])
    order = jnp.argsort((~take).astype(i32), stable=True)  # the flagged candidates, in order
    return jnp.sum(take), pts[order[:2]], ids[order[:2]]


class Manifold(NamedTuple):
    count: jax.Array  # int32
    typ: jax.Array  # int32: 1 faceA, 2 faceB
    ln: jax.Array  # (2,)
    lp: jax.Array  # (2,)
    plp: jax.Array  # (2, 2) points' local points
    key: jax.Array  # (2,) int32


def collide_edge_polygon(v1, v2_, b, xfb) -> Manifold:
    """b2CollideEdgeAndPolygon for an edge without ghost vertices (the edge's body is at the origin)."""
    verts, norms, count, centroid = (jnp.asarray(x)[b] for x in (POLY_V, POLY_N, POLY_COUNT, CENTROID))
    xf = xfb  # b2MulT(identity, xfB) is xfB exactly
    centroid_b = mul_x(xf, centroid)
    edge1 = normalize(v2_ - v1)
    normal1 = v2(edge1[1], -edge1[0])
    offset1 = dot(normal1, centroid_b - v1)
    front = offset1 >= 0
    normal = jnp.where(front, normal1, -normal1)
    limit = -normal  # lower and upper limits without ghost vertices
    idx = jnp.arange(8)
    valid = idx < count
    pv = jax.vmap(lambda v: mul_x(xf, v))(verts)
    pn = jax.vmap(lambda n: mul_r(xf[1], n))(norms)
    radius = F32(2.0) * POLYGON_RADIUS
    edge_sep = jnp.min(jnp.where(valid, jax.vmap(lambda p: dot(normal, p - v1))(pv), FLT_MAX))
    # ComputePolygonSeparation (its side test on perp picks the upper or the lower limit: both are `limit`)
    n_ = -pn
    s1 = jax.vmap(lambda n, p: dot(n, p - v1))(n_, pv)
    s2 = jax.vmap(lambda n, p: dot(n, p - v2_))(n_, pv)
    s = jnp.minimum(s1, s2)
    early = valid & (s > radius)
    skip = jax.vmap(lambda n: dot(n - limit, normal) < -ANGULAR_SLOP)(n_)
    eligible = valid & ~skip
    has_early = jnp.any(early)
    i_early = jnp.argmax(early)
    i_best = jnp.argmax(jnp.where(eligible, s, -jnp.inf))
    axis_known = has_early | jnp.any(eligible)
    axis_index = jnp.where(has_early, i_early, i_best)
    axis_sep = jnp.where(has_early, s[i_early], jnp.where(jnp.any(eligible), s[i_best], -FLT_MAX))
    empty_early = (edge_sep > radius) | (axis_known & (axis_sep > radius))
    primary_is_edge = ~axis_known | ~(axis_sep > F32(0.98) * edge_sep + F32(0.001))
    # incident / reference faces of both cases
    i1 = jnp.argmin(jnp.where(valid, jax.vmap(lambda n: dot(normal, n))(pn), jnp.inf))
    i2 = jnp.where(i1 + 1 < count, i1 + 1, 0)
    j1 = axis_index
    j2 = jnp.where(j1 + 1 < count, j1 + 1, 0)
    e_ie0, e_ie1 = pv[i1], pv[i2]
    e_id0, e_id1 = key(0, i1, F_FACE, F_VERTEX), key(0, i2, F_FACE, F_VERTEX)
    p_id = key(0, j1, F_VERTEX, F_FACE)
    ie0 = jnp.where(primary_is_edge, e_ie0, v1)
    ie1 = jnp.where(primary_is_edge, e_ie1, v2_)
    id0 = jnp.where(primary_is_edge, e_id0, p_id)
    id1 = jnp.where(primary_is_edge, e_id1, p_id)
    rf_i1 = jnp.where(primary_is_edge, jnp.where(front, 0, 1), j1)
    rf_i2 = jnp.where(primary_is_edge, jnp.where(front, 1, 0), j2)
    rf_v1 = jnp.where(primary_is_edge, jnp.where(front, v1, v2_), pv[j1])
    rf_v2 = jnp.where(primary_is_edge, jnp.where(front, v2_, v1), pv[j2])
    rf_normal = jnp.where(primary_is_edge, jnp.where(front, normal1, -normal1), pn[j1])
    side1 = v2(rf_normal[1], -rf_normal[0])
    side2 = -side1
    n1, c1, cid1 = _clip(ie0, id0, ie1, id1, side1, dot(side1, rf_v1), rf_i1)
    n2, c2, cid2 = _clip(c1[0], cid1[0], c1[1], cid1[1], side2, dot(side2, rf_v2), rf_i2)
    ln = jnp.where(primary_is_edge, rf_normal, norms[j1])
    lp = jnp.where(primary_is_edge, rf_v1, verts[j1])
    sep = jax.vmap(lambda p: dot(rf_normal, p - rf_v1))(c2)
    keep = sep <= radius
    local_edge = jax.vmap(lambda p: mult_x(xf, p))(c2)
    swapped = ((cid2 >> 8) & 0xff) | ((cid2 & 0xff) << 8) | (((cid2 >> 24) & 0xff) << 16) | (((cid2 >> 16) & 0xff) << 24)
    plp = jnp.where(primary_is_edge, local_edge, c2)
    keys = jnp.where(primary_is_edge, cid2, swapped)
    order = jnp.argsort((~keep).astype(i32), stable=True)
    pc = jnp.sum(keep)
    ok = ~empty_early & (n1 >= 2) & (n2 >= 2)
    count_out = jnp.where(ok, pc, 0).astype(i32)
    typ = jnp.where(primary_is_edge, 1, 2).astype(i32)
    return Manifold(count_out, typ, ln, lp, plp[order], keys[order].astype(i32))


def world_manifold(m: Manifold, xfb, rb):
    """b2WorldManifold::Initialize with body A a terrain edge (identity transform): (normal, points)."""
    ra = POLYGON_RADIUS
    clip_b = jax.vmap(lambda p: mul_x(xfb, p))(m.plp)

    def face_a(i):
        normal, plane = m.ln, m.lp
        clip = clip_b[i]
        ca = clip + (ra - dot(clip - plane, normal)) * normal
        cb = clip - rb * normal
        return normal, 0.5 * (ca + cb)

    def face_b(i):
        normal = mul_r(xfb[1], m.ln)
        plane = mul_x(xfb, m.lp)
        clip = m.plp[i]
        cb = clip + (rb - dot(clip - plane, normal)) * normal
        ca = clip - ra * normal
        return -normal, 0.5 * (ca + cb)

    na0, pa0 = face_a(0)
    na1, pa1 = face_a(1)
    nb0, pb0 = face_b(0)
    nb1, pb1 = face_b(1)
    is_a = m.typ == 1
    normal = jnp.where(is_a, na0, nb0)
    points = jnp.stack([jnp.where(is_a, pa0, pb0), jnp.where(is_a, pa1, pb1)])
    return normal, points


# ---------------------------------------------------------------- the world

class World(NamedTuple):
    c: jax.Array  # (5, 2) sweep centres
    a: jax.Array  # (5,)
    c0: jax.Array
    a0: jax.Array
    v: jax.Array  # (5, 2)
    w: jax.Array
    awake: jax.Array  # (5,) bool
    sleep: jax.Array
    fat: jax.Array  # (5, 4)
    proxy: jax.Array  # (5,) int32
    alpha0: jax.Array
    force: jax.Array  # (5, 2)
    impulse: jax.Array  # (4, 3) joints
    motor_impulse: jax.Array
    limit_state: jax.Array  # int32: 0 inactive, 1 lower, 2 upper
    motor_speed: jax.Array
    max_torque: jax.Array
    ys: jax.Array  # (200,) float32 heights
    edge_proxy: jax.Array  # (199,) int32
    n: jax.Array  # int32 contacts in the list
    ce: jax.Array  # (48,) int32 edge
    cb: jax.Array  # (48,) int32 body
    touching: jax.Array  # bool
    enabled: jax.Array  # bool
    m: Manifold  # batched over the 48 slots
    ni: jax.Array  # (48, 2)
    ti: jax.Array  # (48, 2)
    game_over: jax.Array
    ground: jax.Array  # (2,) bool: legs[1], legs[3]
    prev_shaping: jax.Array


def _slots():
    return jnp.arange(MAX_CONTACTS)


def _active(world):
    return _slots() < world.n


def _edge(world, e):
    return v2(jnp.asarray(TERRAIN_X)[e], world.ys[e]), v2(jnp.asarray(TERRAIN_X)[e + 1], world.ys[e + 1])


def _edge_fat(world, e):
    """b2EdgeShape::ComputeAABB widened by b2_aabbExtension (as CreateProxy does)."""
    p1, p2 = _edge(world, e)
    lo, up = jnp.minimum(p1, p2), jnp.maximum(p1, p2)
    lo, up = lo - POLYGON_RADIUS, up + POLYGON_RADIUS
    return jnp.concatenate([lo - AABB_EXTENSION, up + AABB_EXTENSION])


def _overlap(a, b):
    return ~((b[0] - a[2] > 0) | (b[1] - a[3] > 0) | (a[0] - b[2] > 0) | (a[1] - b[3] > 0))


def _poly_aabb(b, xf):
    pv = jax.vmap(lambda v: mul_x(xf, v))(jnp.asarray(POLY_V)[b])
    valid = (jnp.arange(8) < jnp.asarray(POLY_COUNT)[b])[:, None]
    lo = jnp.min(jnp.where(valid, pv, jnp.inf), axis=0) - POLYGON_RADIUS
    up = jnp.max(jnp.where(valid, pv, -jnp.inf), axis=0) + POLYGON_RADIUS
    return jnp.concatenate([lo, up])


def _xf(world, b):
    return xform(world.c[b], world.a[b], jnp.asarray(LOCAL_CENTER)[b])


def _set_awake(world, mask):
    """b2Body::SetAwake(true) for the bodies in mask: a sleeping body wakes with its timer at 0."""
    return world._replace(awake=world.awake | mask, sleep=jnp.where(mask & ~world.awake, 0.0, world.sleep))


def _any_per_body(bodies, mask):
    """(5,) bool: whether mask holds for some slot of each body."""
    return jnp.zeros(NB, i32).at[bodies].add(mask.astype(i32)) > 0


def _listener(world, begin, end, body):
    """gymnasium's ContactDetector over events in list order: begin (hull: game over; lower legs: ground
    contact) and end (lower legs lose ground contact); the last event of a leg wins."""
    game_over = world.game_over | jnp.any(begin & (body == 0))
    ground = []
    for leg, flag in ((2, world.ground[0]), (4, world.ground[1])):
        events = (begin | end) & (body == leg)
        last = MAX_CONTACTS - 1 - jnp.argmax(events[::-1])
        ground.append(jnp.where(jnp.any(events), begin[last], flag))
    return world._replace(game_over=game_over, ground=jnp.stack(ground))


def _manifolds(world, mask):
    """b2Contact::Update's new manifolds for the slots in mask (impulses carried over by feature id)."""
    def one(e, b, count, keys, ni, ti):
        v1, v2_ = _edge(world, e)
        m = collide_edge_polygon(v1, v2_, b, _xf(world, b))
        match = (m.key[:, None] == keys[None, :]) & (jnp.arange(2)[None, :] < count)
        j = jnp.argmax(match, axis=1)
        found = jnp.any(match, axis=1)
        new_ni = jnp.where(found, ni[j], 0.0)
        new_ti = jnp.where(found, ti[j], 0.0)
        return m, new_ni, new_ti

    m, ni, ti = jax.vmap(one)(world.ce, world.cb, world.m.count, world.m.key, world.ni, world.ti)
    keep = lambda new, old: jnp.where(mask.reshape((-1,) + (1,) * (new.ndim - 1)), new, old)  # noqa: E731
    return jax.tree_util.tree_map(keep, m, world.m), keep(ni, world.ni), keep(ti, world.ti)


def _update_contacts(world, mask):
    """b2Contact::Update for the slots in mask, events to the listener in list order."""
    return _apply_update(world, mask, *_manifolds(world, mask))


def _apply_update(world, mask, m, ni, ti):
    """b2Contact::Update for the slots in mask with their new manifolds (m, ni, ti: from _manifolds over
    a superset of mask, so one manifold computation serves several updates while the bodies stay put)."""
    pick = lambda new, old: jnp.where(mask.reshape((-1,) + (1,) * (old.ndim - 1)), new, old)  # noqa: E731
    m, ni, ti = jax.tree_util.tree_map(pick, m, world.m), pick(ni, world.ni), pick(ti, world.ti)
    touching = m.count > 0
    was = world.touching
    changed = mask & (touching != was)
    world = _set_awake(world, _any_per_body(world.cb, changed))
    world = world._replace(m=m, ni=ni, ti=ti, touching=jnp.where(mask, touching, was),
                           enabled=world.enabled | mask)
    return _listener(world, mask & ~was & touching, mask & was & ~touching, world.cb)


def _reorder(world, order, n):
    """The contact list made of the slots `order` (indices into the current slots), n long."""
    take = lambda x: x[order]  # noqa: E731
    return world._replace(n=n.astype(i32), ce=take(world.ce), cb=take(world.cb), touching=take(world.touching),
                          enabled=take(world.enabled), m=jax.tree_util.tree_map(take, world.m),
                          ni=take(world.ni), ti=take(world.ti))


def _collide(world):
    """b2ContactManager::Collide: destroy the contacts whose fat AABBs stopped overlapping, update the rest."""
    active = _active(world)
    awake = world.awake[world.cb] & active
    fat_e = jax.vmap(lambda e: _edge_fat(world, e))(world.ce)
    overlap = jax.vmap(_overlap)(fat_e, world.fat[world.cb])
    destroy = awake & ~overlap
    update = awake & overlap
    m, ni, ti = _manifolds(world, update)
    touching = m.count > 0
    was = world.touching
    begin = update & ~was & touching
    end = (update & was & ~touching) | (destroy & was)
    wake = _any_per_body(world.cb, (update & (touching != was)) | (destroy & (world.m.count > 0)))
    world = world._replace(m=m, ni=ni, ti=ti, touching=jnp.where(update, touching, was),
                           enabled=world.enabled | update)
    world = _listener(world, begin, end, world.cb)
    world = _set_awake(world, wake)
    keep = active & ~destroy
    order = jnp.argsort((~keep).astype(i32), stable=True)
    return _reorder(world, order, jnp.sum(keep))


def _synchronize(world, b):
    """b2Fixture::Synchronize: (new fat AABB, moved?) of body b after a step from (c0, a0) to (c, a)."""
    xf1 = xform(world.c0[b], world.a0[b], jnp.asarray(LOCAL_CENTER)[b])
    xf2 = _xf(world, b)
    a1, a2 = _poly_aabb(b, xf1), _poly_aabb(b, xf2)
    aabb = jnp.concatenate([minf(a1[:2], a2[:2]), maxf(a1[2:], a2[2:])])
    f = world.fat[b]
    contains = (f[0] <= aabb[0]) & (f[1] <= aabb[1]) & (aabb[2] <= f[2]) & (aabb[3] <= f[3])
    d = AABB_MULTIPLIER * (xf2[0] - xf1[0])
    lo = aabb[:2] - AABB_EXTENSION
    up = aabb[2:] + AABB_EXTENSION
    lo = jnp.where(d < 0, lo + d, lo)
    up = jnp.where(d < 0, up, up + d)
    return jnp.where(contains, f, jnp.concatenate([lo, up])), ~contains


def _synchronize_all(world, bodies):
    """Synchronize the bodies in the mask `bodies`: (world, moved mask)."""
    fats, moved = [], []
    for b in range(NB):
        fat, mv = _synchronize(world, b)
        fats.append(jnp.where(bodies[b], fat, world.fat[b]))
        moved.append(bodies[b] & mv)
    return world._replace(fat=jnp.stack(fats)), jnp.stack(moved)


def _find_new_contacts(world, moved):
    """b2BroadPhase::UpdatePairs + b2ContactManager::AddPair for the moved bodies: new (edge, body) pairs
    in (min proxy id, max proxy id) order, each put at the list's head. Every edge is a candidate: a fat
    AABB grows by twice the body's displacement in the step, so it can span any number of edges (a leg
    the joint solver pulls back 4.5 m, from a written state, spans 33)."""
    edges = jnp.arange(EDGES)
    edge_fat = jax.vmap(lambda k: _edge_fat(world, k))(edges)
    exists = jnp.zeros((NB, EDGES), bool).at[world.cb, world.ce].max(_active(world))

    def candidates(b):
        fat = world.fat[b]
        overlap = jax.vmap(lambda f: _overlap(fat, f))(edge_fat)
        p, q = world.proxy[b], world.edge_proxy
        pair_key = jnp.minimum(p, q) * 4096 + jnp.maximum(p, q)
        return edges, jnp.full_like(edges, b), moved[b] & overlap & ~exists[b], pair_key

    e, b, new, pair_key = jax.vmap(candidates)(jnp.arange(NB))
    e, b, new, pair_key = e.ravel(), b.ravel(), new.ravel(), pair_key.ravel()
    count = jnp.sum(new)
    # the last added is the head: new pairs by descending key, then the old list
    order = jnp.argsort(jnp.where(new, -pair_key, jnp.iinfo(np.int32).max), stable=True)
    world = _set_awake(world, _any_per_body(b, new))
    position = jnp.arange(MAX_CONTACTS)
    from_new = position < count
    new_index = order[jnp.minimum(position, NB * EDGES - 1)]
    old_index = jnp.maximum(position - count, 0)
    zeros2 = jnp.zeros((MAX_CONTACTS, 2), f32)
    pick = lambda new_value, old: jnp.where(from_new.reshape((-1,) + (1,) * (old.ndim - 1)), new_value, old[old_index])  # noqa: E731
    empty = Manifold(jnp.zeros(MAX_CONTACTS, i32), jnp.zeros(MAX_CONTACTS, i32), zeros2, zeros2,
                     jnp.zeros((MAX_CONTACTS, 2, 2), f32), jnp.zeros((MAX_CONTACTS, 2), i32))
    world = world._replace(
        n=jnp.minimum(world.n + count, MAX_CONTACTS).astype(i32),
        ce=pick(e[new_index], world.ce), cb=pick(b[new_index], world.cb),
        touching=pick(jnp.zeros(MAX_CONTACTS, bool), world.touching),
        enabled=pick(jnp.ones(MAX_CONTACTS, bool), world.enabled),
        m=jax.tree_util.tree_map(pick, empty, world.m), ni=pick(zeros2, world.ni), ti=pick(zeros2, world.ti))
    return world, from_new, old_index


# ---------------------------------------------------------------- the contact solver (b2ContactSolver.cpp)

class Constraints(NamedTuple):
    slot: jax.Array  # (48,) the contact slot of each constraint, in solver order
    b: jax.Array
    m: Manifold
    normal: jax.Array  # (48, 2)
    ra: jax.Array  # (48, 2, 2)
    rb: jax.Array
    ni: jax.Array  # (48, 2)
    ti: jax.Array
    normal_mass: jax.Array  # (48, 2)
    tangent_mass: jax.Array
    k: jax.Array  # (48, 4) K matrix ex.x, ex.y, ey.x, ey.y
    nm: jax.Array  # (48, 4) its inverse
    count: jax.Array  # (48,) int32 (1 when the block solver's K is ill-conditioned)
    friction: jax.Array


def _constraints(world, order, warm):
    take = lambda x: x[order]  # noqa: E731
    m = jax.tree_util.tree_map(take, world.m)
    b = world.cb[order]
    zeros = jnp.zeros((MAX_CONTACTS, 2), f32)
    ni = jnp.where(warm, world.ni[order], 0.0)
    ti = jnp.where(warm, world.ti[order], 0.0)
    return Constraints(order, b, m, zeros, jnp.zeros((MAX_CONTACTS, 2, 2), f32), jnp.zeros((MAX_CONTACTS, 2, 2), f32),
                       ni, ti, zeros, zeros, jnp.zeros((MAX_CONTACTS, 4), f32), jnp.zeros((MAX_CONTACTS, 4), f32),
                       m.count, jnp.asarray(FRICTION_MIX)[b])


def _initialize_velocity(cs: Constraints, pos_c, pos_a, vel_v, vel_w):
    """InitializeVelocityConstraints, every constraint at once (each reads only positions)."""
    def one(b, m, count):
        mb, ib = jnp.asarray(INV_MASS)[b], jnp.asarray(INV_I)[b]
        cb = pos_c[b]
        xfb = xform(cb, pos_a[b], jnp.asarray(LOCAL_CENTER)[b])
        normal, wpoints = world_manifold(m, xfb, POLYGON_RADIUS)
        ra = wpoints - 0.0  # body A (an edge) has its centre at the origin
        rb = wpoints - cb[None, :]
        rnb = jax.vmap(lambda r: cross(r, normal))(rb)
        rna = jax.vmap(lambda r: cross(r, normal))(ra)
        kn = F32(0) + mb + F32(0) * rna * rna + ib * rnb * rnb
        normal_mass = jnp.where(kn > 0, 1.0 / jnp.where(kn > 0, kn, 1.0), 0.0)
        tangent = cross_vs(normal, F32(1.0))
        rta = jax.vmap(lambda r: cross(r, tangent))(ra)
        rtb = jax.vmap(lambda r: cross(r, tangent))(rb)
        kt = F32(0) + mb + F32(0) * rta * rta + ib * rtb * rtb
        tangent_mass = jnp.where(kt > 0, 1.0 / jnp.where(kt > 0, kt, 1.0), 0.0)
        k11 = F32(0) + mb + F32(0) * rna[0] * rna[0] + ib * rnb[0] * rnb[0]
        k22 = F32(0) + mb + F32(0) * rna[1] * rna[1] + ib * rnb[1] * rnb[1]
        k12 = F32(0) + mb + F32(0) * rna[0] * rna[1] + ib * rnb[0] * rnb[1]
        well = k11 * k11 < F32(1000.0) * (k11 * k22 - k12 * k12)
        det = k11 * k22 - k12 * k12
        det = jnp.where(det != 0, 1.0 / jnp.where(det != 0, det, 1.0), det)
        kmat = jnp.stack([k11, k12, k12, k22])
        inv = jnp.stack([det * k22, -det * k12, -det * k12, det * k11])  # ex = (det d, -det c), ey = (-det b, det a)
        new_count = jnp.where((count == 2) & ~well, 1, count)
        return normal, ra, rb, normal_mass, tangent_mass, kmat, inv, new_count

    normal, ra, rb, nmass, tmass, kmat, inv, count = jax.vmap(one)(cs.b, cs.m, cs.m.count)
    return cs._replace(normal=normal, ra=ra, rb=rb, normal_mass=nmass, tangent_mass=tmass, k=kmat, nm=inv, count=count)


def _warm_start(cs: Constraints, nc, vel_v, vel_w):
    def body(i, vw):
        vel_v, vel_w = vw
        b = cs.b[i]
        mb, ib = jnp.asarray(INV_MASS)[b], jnp.asarray(INV_I)[b]
        vb, wb = vel_v[b], vel_w[b]
        normal = cs.normal[i]
        tangent = cross_vs(normal, F32(1.0))
        for j in range(2):
            pp = cs.ni[i, j] * normal + cs.ti[i, j] * tangent
            use = j < cs.count[i]
            wb = jnp.where(use, wb + ib * cross(cs.rb[i, j], pp), wb)
            vb = jnp.where(use, vb + mb * pp, vb)
        return vel_v.at[b].set(vb), vel_w.at[b].set(wb)

    return lax.fori_loop(0, nc, body, (vel_v, vel_w))


def _solve_velocity_one(cs: Constraints, i, vel_v, vel_w):
    """SolveVelocityConstraints for constraint i (body A is a static edge: its velocity stays 0)."""
    b = cs.b[i]
    mb, ib = jnp.asarray(INV_MASS)[b], jnp.asarray(INV_I)[b]
    vb, wb = vel_v[b], vel_w[b]
    normal = cs.normal[i]
    tangent = cross_vs(normal, F32(1.0))
    count = cs.count[i]
    ni, ti = cs.ni[i], cs.ti[i]
    rb = cs.rb[i]
    new_ti = []
    for j in range(2):
        dv = vb + cross_sv(wb, rb[j])
        vt = dot(dv, tangent)
        lam = cs.tangent_mass[i, j] * (-vt)
        max_friction = cs.friction[i] * ni[j]
        new_impulse = clampf(ti[j] + lam, -max_friction, max_friction)
        lam = new_impulse - ti[j]
        use = j < count
        pp = lam * tangent
        vb = jnp.where(use, vb + mb * pp, vb)
        wb = jnp.where(use, wb + ib * cross(rb[j], pp), wb)
        new_ti.append(jnp.where(use, new_impulse, ti[j]))
    ti = jnp.stack(new_ti)
    # one point
    dv = vb + cross_sv(wb, rb[0])
    vn = dot(dv, normal)
    lam = -cs.normal_mass[i, 0] * (vn - 0.0)
    new_impulse = maxf(ni[0] + lam, F32(0.0))
    lam = new_impulse - ni[0]
    pp = lam * normal
    single = (vb + mb * pp, wb + ib * cross(rb[0], pp), jnp.stack([new_impulse, ni[1]]))
    # the block solver: Box2D's total enumeration of the 2-point LCP
    a = ni
    dv1 = vb + cross_sv(wb, rb[0])
    dv2 = vb + cross_sv(wb, rb[1])
    k = cs.k[i]
    kinv = cs.nm[i]
    bvec = v2(dot(dv1, normal) - 0.0, dot(dv2, normal) - 0.0)
    bvec = bvec - v2(k[0] * a[0] + k[2] * a[1], k[1] * a[0] + k[3] * a[1])
    x1 = -v2(kinv[0] * bvec[0] + kinv[2] * bvec[1], kinv[1] * bvec[0] + kinv[3] * bvec[1])
    ok1 = (x1[0] >= 0) & (x1[1] >= 0)
    x2 = v2(-cs.normal_mass[i, 0] * bvec[0], F32(0.0))
    ok2 = (x2[0] >= 0) & (k[1] * x2[0] + bvec[1] >= 0)
    x3 = v2(F32(0.0), -cs.normal_mass[i, 1] * bvec[1])
    ok3 = (x3[1] >= 0) & (k[2] * x3[1] + bvec[0] >= 0)
    ok4 = (bvec[0] >= 0) & (bvec[1] >= 0)
    x = jnp.where(ok1, x1, jnp.where(ok2, x2, jnp.where(ok3, x3, jnp.zeros(2, f32))))
    solved = ok1 | ok2 | ok3 | ok4
    d = x - a
    p1, p2 = d[0] * normal, d[1] * normal
    block = (jnp.where(solved, vb + mb * (p1 + p2), vb),
             jnp.where(solved, wb + ib * (cross(rb[0], p1) + cross(rb[1], p2)), wb),
             jnp.where(solved, x, a))
    one = count == 1
    vb, wb, ni = (jnp.where(one, s, t) for s, t in zip(single, block))
    return vel_v.at[b].set(vb), vel_w.at[b].set(wb), ni, ti


def _solve_position_one(cs: Constraints, i, pos_c, pos_a, baumgarte, min_sep):
    """SolvePositionConstraints (or the TOI variant) for constraint i: body B's position moves."""
    b = cs.b[i]
    mb, ib = jnp.asarray(INV_MASS)[b], jnp.asarray(INV_I)[b]
    lcb = jnp.asarray(LOCAL_CENTER)[b]
    m = jax.tree_util.tree_map(lambda x: x[i], cs.m)
    cb, ab = pos_c[b], pos_a[b]
    radius = POLYGON_RADIUS
    for j in range(2):
        xfb = xform(cb, ab, lcb)
        # face A: the edge's normal and plane, body B's point
        clip_a = mul_x(xfb, m.plp[j])
        sep_a = dot(clip_a - m.lp, m.ln) - radius - radius
        # face B: body B's normal and plane, the edge's point
        normal_b = mul_r(xfb[1], m.ln)
        plane_b = mul_x(xfb, m.lp)
        sep_b = dot(m.plp[j] - plane_b, normal_b) - radius - radius
        is_a = m.typ == 1
        normal = jnp.where(is_a, m.ln, -normal_b)
        point = jnp.where(is_a, clip_a, m.plp[j])
        separation = jnp.where(is_a, sep_a, sep_b)
        rb = point - cb
        use = j < m.count
        min_sep = jnp.where(use, minf(min_sep, separation), min_sep)
        cc = clampf(baumgarte * (separation + LINEAR_SLOP), -MAX_LINEAR_CORRECTION, F32(0.0))
        rnb = cross(rb, normal)
        kk = F32(0) + mb + F32(0) + ib * rnb * rnb
        impulse = jnp.where(kk > 0, -cc / jnp.where(kk > 0, kk, 1.0), 0.0)
        p = impulse * normal
        cb = jnp.where(use, cb + mb * p, cb)
        ab = jnp.where(use, ab + ib * cross(rb, p), ab)
    return pos_c.at[b].set(cb), pos_a.at[b].set(ab), min_sep


# ---------------------------------------------------------------- revolute joints (b2RevoluteJoint.cpp)

class JointSolver(NamedTuple):
    impulse: jax.Array  # (4, 3)
    motor_impulse: jax.Array
    limit_state: jax.Array
    ra: jax.Array  # (4, 2)
    rb: jax.Array
    mass: jax.Array  # (4, 9) M33 ex, ey, ez
    motor_mass: jax.Array


def _joint_bodies(j):
    """Joint j's bodies and their inverse masses and inertias (j may be traced)."""
    ia_, ib_ = jnp.asarray(JOINT_A)[j], jnp.asarray(JOINT_B)[j]
    return ia_, ib_, jnp.asarray(INV_MASS)[ia_], jnp.asarray(INV_MASS)[ib_], jnp.asarray(INV_I)[ia_], jnp.asarray(INV_I)[ib_]


def _joint_init(world, js: JointSolver, j, pos_a, vel_v, vel_w):
    ia_, ib_, ma, mb, ia, ib = _joint_bodies(j)
    aa, ab = pos_a[ia_], pos_a[ib_]
    ra = mul_r(rot(aa), jnp.asarray(JOINT_RA_LOCAL)[j])
    rb = mul_r(rot(ab), jnp.asarray(JOINT_RB_LOCAL)[j])
    exx = ma + mb + ra[1] * ra[1] * ia + rb[1] * rb[1] * ib
    eyx = -ra[1] * ra[0] * ia - rb[1] * rb[0] * ib
    ezx = -ra[1] * ia - rb[1] * ib
    eyy = ma + mb + ra[0] * ra[0] * ia + rb[0] * rb[0] * ib
    ezy = ra[0] * ia + rb[0] * ib
    ezz = ia + ib
    mass = jnp.stack([exx, eyx, ezx, eyx, eyy, ezy, ezx, ezy, ezz])
    motor_mass = F32(1.0) / ezz
    joint_angle = ab - aa - jnp.asarray(JOINT_REFERENCE)[j]
    limit, imp = js.limit_state[j], js.impulse[j]
    at_lower = joint_angle <= jnp.asarray(JOINT_LOWER)[j]
    at_upper = joint_angle >= jnp.asarray(JOINT_UPPER)[j]
    new_limit = jnp.where(at_lower, 1, jnp.where(at_upper, 2, 0)).astype(i32)
    keep_z = (at_lower & (limit == 1)) | (~at_lower & at_upper & (limit == 2))
    imp = imp.at[2].set(jnp.where(keep_z, imp[2], 0.0))
    mi = js.motor_impulse[j]
    p = imp[:2]
    va, wa, vb, wb = vel_v[ia_], vel_w[ia_], vel_v[ib_], vel_w[ib_]
    va = va - ma * p
    wa = wa - ia * (cross(ra, p) + mi + imp[2])
    vb = vb + mb * p
    wb = wb + ib * (cross(rb, p) + mi + imp[2])
    vel_v = vel_v.at[ia_].set(va).at[ib_].set(vb)
    vel_w = vel_w.at[ia_].set(wa).at[ib_].set(wb)
    js = js._replace(impulse=js.impulse.at[j].set(imp), limit_state=js.limit_state.at[j].set(new_limit),
                     ra=js.ra.at[j].set(ra), rb=js.rb.at[j].set(rb), mass=js.mass.at[j].set(mass),
                     motor_mass=js.motor_mass.at[j].set(motor_mass))
    return js, vel_v, vel_w


def _joint_velocity(world, js: JointSolver, j, vel_v, vel_w):
    ia_, ib_, ma, mb, ia, ib = _joint_bodies(j)
    va, wa, vb, wb = vel_v[ia_], vel_w[ia_], vel_v[ib_], vel_w[ib_]
    # motor
    cdot = wb - wa - world.motor_speed[j]
    impulse = -js.motor_mass[j] * cdot
    old = js.motor_impulse[j]
    max_impulse = H * world.max_torque[j]
    mi = clampf(old + impulse, -max_impulse, max_impulse)
    impulse = mi - old
    wa = wa - ia * impulse
    wb = wb + ib * impulse
    ra, rb = js.ra[j], js.rb[j]
    mass = js.mass[j]
    ex, ey, ez = (mass[0], mass[1], mass[2]), (mass[3], mass[4], mass[5]), (mass[6], mass[7], mass[8])
    limit = js.limit_state[j]
    acc = js.impulse[j]
    # limit active: the 3x3 solve, reduced to 2x2 when the limit impulse would change sign
    cdot1 = vb + cross_sv(wb, rb) - va - cross_sv(wa, ra)
    cdot2 = wb - wa
    s = solve33(ex, ey, ez, (cdot1[0], cdot1[1], cdot2))
    imp3 = jnp.stack([-s[0], -s[1], -s[2]])
    new_z = acc[2] + imp3[2]
    reduce = jnp.where(limit == 1, new_z < 0, new_z > 0)
    rhs = -cdot1 + acc[2] * v2(mass[2], mass[5])
    reduced = solve22(ex[0], ey[0], ex[1], ey[1], rhs)
    imp_reduced = jnp.stack([reduced[0], reduced[1], -acc[2]])
    acc_reduced = jnp.stack([acc[0] + reduced[0], acc[1] + reduced[1], F32(0.0)])
    imp_lim = jnp.where(reduce, imp_reduced, imp3)
    acc_lim = jnp.where(reduce, acc_reduced, acc + imp3)
    p = imp_lim[:2]
    lim = (va - ma * p, wa - ia * (cross(ra, p) + imp_lim[2]), vb + mb * p, wb + ib * (cross(rb, p) + imp_lim[2]), acc_lim)
    # no limit: the point constraint
    cdot = vb + cross_sv(wb, rb) - va - cross_sv(wa, ra)
    imp2 = solve22(ex[0], ey[0], ex[1], ey[1], -cdot)
    acc_free = jnp.stack([acc[0] + imp2[0], acc[1] + imp2[1], acc[2]])
    free = (va - ma * imp2, wa - ia * cross(ra, imp2), vb + mb * imp2, wb + ib * cross(rb, imp2), acc_free)
    va, wa, vb, wb, acc = (jnp.where(limit != 0, x, y) for x, y in zip(lim, free))
    vel_v = vel_v.at[ia_].set(va).at[ib_].set(vb)
    vel_w = vel_w.at[ia_].set(wa).at[ib_].set(wb)
    js = js._replace(impulse=js.impulse.at[j].set(acc), motor_impulse=js.motor_impulse.at[j].set(mi))
    return js, vel_v, vel_w


def _joint_position(js: JointSolver, j, pos_c, pos_a):
    ia_, ib_, ma, mb, ia, ib = _joint_bodies(j)
    ca, aa, cb, ab = pos_c[ia_], pos_a[ia_], pos_c[ib_], pos_a[ib_]
    limit = js.limit_state[j]
    angle = ab - aa - jnp.asarray(JOINT_REFERENCE)[j]
    c_low = angle - jnp.asarray(JOINT_LOWER)[j]
    c_up = angle - jnp.asarray(JOINT_UPPER)[j]
    angular_error = jnp.where(limit == 1, -c_low, jnp.where(limit == 2, c_up, F32(0.0)))
    cl = jnp.where(limit == 1, clampf(c_low + ANGULAR_SLOP, -MAX_ANGULAR_CORRECTION, F32(0.0)),
                   clampf(c_up - ANGULAR_SLOP, F32(0.0), MAX_ANGULAR_CORRECTION))
    limit_impulse = jnp.where(limit != 0, -js.motor_mass[j] * cl, F32(0.0))
    aa = jnp.where(limit != 0, aa - ia * limit_impulse, aa)
    ab = jnp.where(limit != 0, ab + ib * limit_impulse, ab)
    ra = mul_r(rot(aa), jnp.asarray(JOINT_RA_LOCAL)[j])
    rb = mul_r(rot(ab), jnp.asarray(JOINT_RB_LOCAL)[j])
    c = cb + rb - ca - ra
    position_error = length(c)
    k11 = ma + mb + ia * ra[1] * ra[1] + ib * rb[1] * rb[1]
    k12 = -ia * ra[0] * ra[1] - ib * rb[0] * rb[1]
    k22 = ma + mb + ia * ra[0] * ra[0] + ib * rb[0] * rb[0]
    impulse = -solve22(k11, k12, k12, k22, c)
    ca = ca - ma * impulse
    aa = aa - ia * cross(ra, impulse)
    cb = cb + mb * impulse
    ab = ab + ib * cross(rb, impulse)
    pos_c = pos_c.at[ia_].set(ca).at[ib_].set(cb)
    pos_a = pos_a.at[ia_].set(aa).at[ib_].set(ab)
    return pos_c, pos_a, (position_error <= LINEAR_SLOP) & (angular_error <= ANGULAR_SLOP)


# ---------------------------------------------------------------- b2Island::Solve

def _integrate(h, pos_c, pos_a, vel_v, vel_w):
    translation = h * vel_v
    big_t = (translation[:, 0] * translation[:, 0] + translation[:, 1] * translation[:, 1]) > MAX_TRANSLATION * MAX_TRANSLATION
    len_t = jnp.sqrt(translation[:, 0] * translation[:, 0] + translation[:, 1] * translation[:, 1])
    vel_v = jnp.where(big_t[:, None], (MAX_TRANSLATION / jnp.where(big_t, len_t, 1.0))[:, None] * vel_v, vel_v)
    rotation = h * vel_w
    big_r = rotation * rotation > MAX_ROTATION * MAX_ROTATION
    vel_w = jnp.where(big_r, vel_w * (MAX_ROTATION / jnp.where(big_r, jnp.abs(rotation), 1.0)), vel_w)
    return pos_c + h * vel_v, pos_a + h * vel_w, vel_v, vel_w


def _solve_island(world):
    """b2World::Solve's one island (the whole walker, awake) and b2Island::Solve."""
    h = H
    gravity = jnp.array([0.0, -10.0], f32)
    c0, a0 = world.c, world.a
    vel_v = world.v + h * (F32(1.0) * gravity + jnp.asarray(INV_MASS)[:, None] * world.force)
    vel_w = world.w
    pos_c, pos_a = world.c, world.a
    active = _active(world)
    eligible = active & world.enabled & world.touching
    order = jnp.argsort(jnp.where(eligible, jnp.asarray(ISLAND_RANK)[world.cb] * 64 + _slots(), 100000), stable=True)
    nc = jnp.sum(eligible)
    cs = _constraints(world, order, True)
    cs = _initialize_velocity(cs, pos_c, pos_a, vel_v, vel_w)
    vel_v, vel_w = _warm_start(cs, nc, vel_v, vel_w)
    js = JointSolver(world.impulse, world.motor_impulse, world.limit_state, jnp.zeros((4, 2), f32),
                     jnp.zeros((4, 2), f32), jnp.zeros((4, 9), f32), jnp.zeros(4, f32))
    js, vel_v, vel_w = lax.fori_loop(0, 4, lambda k, c: _joint_init(world, c[0], jnp.asarray(ISLAND_JOINT_ORDER)[k], pos_a, c[1], c[2]),
                                     (js, vel_v, vel_w))

    def velocity_iteration(_, carry):
        js, vel_v, vel_w, ni, ti = carry
        js, vel_v, vel_w = lax.fori_loop(0, 4, lambda k, c: _joint_velocity(world, c[0], jnp.asarray(ISLAND_JOINT_ORDER)[k], c[1], c[2]),
                                         (js, vel_v, vel_w))

        def contact(i, inner):
            vel_v, vel_w, ni, ti = inner
            vel_v, vel_w, n_i, t_i = _solve_velocity_one(cs._replace(ni=ni, ti=ti), i, vel_v, vel_w)
            return vel_v, vel_w, ni.at[i].set(n_i), ti.at[i].set(t_i)

        vel_v, vel_w, ni, ti = lax.fori_loop(0, nc, contact, (vel_v, vel_w, ni, ti))
        return js, vel_v, vel_w, ni, ti

    js, vel_v, vel_w, ni, ti = lax.fori_loop(0, VELOCITY_ITERATIONS, velocity_iteration,
                                             (js, vel_v, vel_w, cs.ni, cs.ti))
    # store impulses (the points the solver used: count may have dropped to 1)
    used = (jnp.arange(MAX_CONTACTS) < nc)[:, None] & (jnp.arange(2)[None, :] < cs.count[:, None])
    slot = jnp.where(jnp.arange(MAX_CONTACTS) < nc, order, MAX_CONTACTS)  # out of range: dropped
    world = world._replace(ni=world.ni.at[slot].set(jnp.where(used, ni, world.ni[order]), mode="drop"),
                           ti=world.ti.at[slot].set(jnp.where(used, ti, world.ti[order]), mode="drop"))
    pos_c, pos_a, vel_v, vel_w = _integrate(h, pos_c, pos_a, vel_v, vel_w)

    def position_iteration(carry):
        it, solved, pos_c, pos_a = carry

        def contact(i, inner):
            pos_c, pos_a, min_sep = inner
            return _solve_position_one(cs, i, pos_c, pos_a, BAUMGARTE, min_sep)

        pos_c, pos_a, min_sep = lax.fori_loop(0, nc, contact, (pos_c, pos_a, F32(0.0)))
        def joint(k, inner):
            pos_c, pos_a, okay = inner
            pos_c, pos_a, ok = _joint_position(js, jnp.asarray(ISLAND_JOINT_ORDER)[k], pos_c, pos_a)
            return pos_c, pos_a, okay & ok

        pos_c, pos_a, joints_okay = lax.fori_loop(0, 4, joint, (pos_c, pos_a, jnp.bool_(True)))
        return it + 1, (min_sep >= F32(-3.0) * LINEAR_SLOP) & joints_okay, pos_c, pos_a

    _, position_solved, pos_c, pos_a = lax.while_loop(
        lambda carry: (carry[0] < POSITION_ITERATIONS) & ~carry[1], position_iteration,
        (jnp.int32(0), jnp.bool_(False), pos_c, pos_a))
    # sleep
    lin_tol = LINEAR_SLEEP_TOLERANCE * LINEAR_SLEEP_TOLERANCE
    ang_tol = ANGULAR_SLEEP_TOLERANCE * ANGULAR_SLEEP_TOLERANCE
    moving = (vel_w * vel_w > ang_tol) | ((vel_v[:, 0] * vel_v[:, 0] + vel_v[:, 1] * vel_v[:, 1]) > lin_tol)
    sleep = jnp.where(moving, 0.0, world.sleep + h)
    min_sleep = jnp.min(jnp.where(moving, 0.0, sleep))
    to_sleep = (min_sleep >= TIME_TO_SLEEP) & position_solved
    return world._replace(
        c=pos_c, a=pos_a, c0=c0, a0=a0,
        v=jnp.where(to_sleep, 0.0, vel_v), w=jnp.where(to_sleep, 0.0, vel_w),
        awake=jnp.where(to_sleep, False, world.awake), sleep=jnp.where(to_sleep, 0.0, sleep),
        force=jnp.where(to_sleep, 0.0, world.force),
        impulse=js.impulse, motor_impulse=js.motor_impulse, limit_state=js.limit_state)


# ---------------------------------------------------------------- time of impact (b2Distance.cpp, b2TimeOfImpact.cpp)

class Simplex(NamedTuple):
    wa: jax.Array  # (3, 2)
    wb: jax.Array
    w: jax.Array
    a: jax.Array  # (3,)
    ia: jax.Array  # (3,) int32
    ib: jax.Array
    count: jax.Array


class Cache(NamedTuple):
    metric: jax.Array
    count: jax.Array
    ia: jax.Array  # (3,)
    ib: jax.Array


def _sweep_transform(sweep, beta, lc):
    c0, a0, c, a = sweep
    p = (1.0 - beta) * c0 + beta * c
    angle = (1.0 - beta) * a0 + beta * a
    q = rot(angle)
    return p - mul_r(q, lc), q


def _support(verts, count, d):
    values = jax.vmap(lambda v: dot(v, d))(verts)
    return jnp.argmax(jnp.where(jnp.arange(verts.shape[0]) < count, values, -jnp.inf)).astype(i32)


def _metric(s: Simplex):
    d2 = length(s.w[0] - s.w[1])
    d3 = cross(s.w[1] - s.w[0], s.w[2] - s.w[0])
    return jnp.where(s.count == 2, d2, jnp.where(s.count == 3, d3, F32(0.0)))


def _move(s: Simplex, dst, src):
    return jax.tree_util.tree_map(lambda x: x.at[dst].set(x[src]) if x.ndim else x, s)


def _solve2(s: Simplex) -> Simplex:
    w1, w2 = s.w[0], s.w[1]
    e12 = w2 - w1
    d12_2 = -dot(w1, e12)
    d12_1 = dot(w2, e12)
    inv = 1.0 / jnp.where(d12_1 + d12_2 == 0, 1.0, d12_1 + d12_2)
    case1 = s._replace(a=s.a.at[0].set(1.0), count=jnp.int32(1))
    moved = _move(s, 0, 1)
    case2 = moved._replace(a=moved.a.at[0].set(1.0), count=jnp.int32(1))
    case3 = s._replace(a=s.a.at[0].set(d12_1 * inv).at[1].set(d12_2 * inv), count=jnp.int32(2))
    return _select([d12_2 <= 0, d12_1 <= 0], [case1, case2], case3)


def _select(conditions, cases, default):
    out = default
    for cond, case in reversed(list(zip(conditions, cases))):
        out = jax.tree_util.tree_map(lambda x, y: jnp.where(cond, x, y), case, out)
    return out


def _solve3(s: Simplex) -> Simplex:
    w1, w2, w3 = s.w[0], s.w[1], s.w[2]
    e12 = w2 - w1
    d12_1, d12_2 = dot(w2, e12), -dot(w1, e12)
    e13 = w3 - w1
    d13_1, d13_2 = dot(w3, e13), -dot(w1, e13)
    e23 = w3 - w2
    d23_1, d23_2 = dot(w3, e23), -dot(w2, e23)
    n123 = cross(e12, e13)
    d123_1 = n123 * cross(w2, w3)
    d123_2 = n123 * cross(w3, w1)
    d123_3 = n123 * cross(w1, w2)
    safe = lambda x: jnp.where(x == 0, 1.0, x)  # noqa: E731
    one = jnp.int32(1)
    two = jnp.int32(2)
    c1 = s._replace(a=s.a.at[0].set(1.0), count=one)
    inv12 = 1.0 / safe(d12_1 + d12_2)
    c2 = s._replace(a=s.a.at[0].set(d12_1 * inv12).at[1].set(d12_2 * inv12), count=two)
    inv13 = 1.0 / safe(d13_1 + d13_2)
    c3 = _move(s._replace(a=s.a.at[0].set(d13_1 * inv13).at[2].set(d13_2 * inv13), count=two), 1, 2)
    m1 = _move(s, 0, 1)
    c4 = m1._replace(a=m1.a.at[0].set(1.0), count=one)
    m2 = _move(s, 0, 2)
    c5 = m2._replace(a=m2.a.at[0].set(1.0), count=one)
    inv23 = 1.0 / safe(d23_1 + d23_2)
    c6 = _move(s._replace(a=s.a.at[1].set(d23_1 * inv23).at[2].set(d23_2 * inv23), count=two), 0, 2)
    inv123 = 1.0 / safe(d123_1 + d123_2 + d123_3)
    c7 = s._replace(a=jnp.stack([d123_1 * inv123, d123_2 * inv123, d123_3 * inv123]), count=jnp.int32(3))
    return _select([(d12_2 <= 0) & (d13_2 <= 0),
                    (d12_1 > 0) & (d12_2 > 0) & (d123_3 <= 0),
                    (d13_1 > 0) & (d13_2 > 0) & (d123_2 <= 0),
                    (d12_1 <= 0) & (d23_2 <= 0),
                    (d13_1 <= 0) & (d23_1 <= 0),
                    (d23_1 > 0) & (d23_2 > 0) & (d123_1 <= 0)],
                   [c1, c2, c3, c4, c5, c6], c7)


def _gjk(cache: Cache, va, ca, xfa, vb, cb, xfb):
    """b2Distance without radii: (distance between the cores, the new cache)."""
    def vertex(ia, ib):
        wa = mul_x(xfa, va[ia])
        wb = mul_x(xfb, vb[ib])
        return wa, wb, wb - wa

    wa, wb, w = jax.vmap(vertex)(cache.ia, cache.ib)
    s = Simplex(wa, wb, w, jnp.zeros(3, f32), cache.ia, cache.ib, cache.count)
    metric2 = _metric(s)
    reset = (s.count == 0) | ((s.count > 1) & ((metric2 < 0.5 * cache.metric) | (2.0 * cache.metric < metric2)
                                               | (metric2 < EPSILON)))
    wa0, wb0, w0 = vertex(0, 0)
    s_reset = Simplex(s.wa.at[0].set(wa0), s.wb.at[0].set(wb0), s.w.at[0].set(w0), s.a.at[0].set(1.0),
                      s.ia.at[0].set(0), s.ib.at[0].set(0), jnp.int32(1))
    s = _select([reset], [s_reset], s)

    def cond(carry):
        return ~carry[2]

    def body(carry):
        s, it, _ = carry
        save_ia, save_ib, save_count = s.ia, s.ib, s.count
        s = _select([s.count == 2, s.count == 3], [_solve2(s), _solve3(s)], s)
        full = s.count == 3
        w0, w1 = s.w[0], s.w[1]
        e12 = w1 - w0
        sgn = cross(e12, -w0)
        d = jnp.where(s.count == 1, -w0, jnp.where(sgn > 0, cross_sv(F32(1.0), e12), cross_vs(e12, F32(1.0))))
        tiny = ~full & (dot(d, d) < EPSILON * EPSILON)
        n = jnp.minimum(s.count, 2)
        ia = _support(va, ca, mult_r(xfa[1], -d))
        ib = _support(vb, cb, mult_r(xfb[1], d))
        wa, wb, w = vertex(ia, ib)
        add = ~full & ~tiny
        s_added = s._replace(wa=s.wa.at[n].set(wa), wb=s.wb.at[n].set(wb), w=s.w.at[n].set(w),
                             ia=s.ia.at[n].set(ia), ib=s.ib.at[n].set(ib))
        s = _select([add], [s_added], s)
        it = jnp.where(add, it + 1, it)
        duplicate = add & jnp.any((jnp.arange(3) < save_count) & (save_ia == ia) & (save_ib == ib))
        s = s._replace(count=jnp.where(add & ~duplicate, s.count + 1, s.count))
        done = full | tiny | duplicate | (it >= 20)
        return s, it, done

    s, _, _ = lax.while_loop(cond, body, (s, jnp.int32(0), jnp.bool_(False)))
    pa1, pb1 = s.wa[0], s.wb[0]
    pa2 = s.a[0] * s.wa[0] + s.a[1] * s.wa[1]
    pb2 = s.a[0] * s.wb[0] + s.a[1] * s.wb[1]
    pa3 = s.a[0] * s.wa[0] + s.a[1] * s.wa[1] + s.a[2] * s.wa[2]
    pa = jnp.where(s.count == 1, pa1, jnp.where(s.count == 2, pa2, pa3))
    pb = jnp.where(s.count == 1, pb1, jnp.where(s.count == 2, pb2, pa3))
    return length(pa - pb), Cache(_metric(s), s.count, s.ia, s.ib)


TOI_FAILED, TOI_OVERLAPPED, TOI_TOUCHING, TOI_SEPARATED = 1, 2, 3, 4


def time_of_impact(v1, v2_, b, sweep_b):
    """b2TimeOfImpact of terrain edge (v1, v2) (at rest at the origin) against body b swept by
    sweep_b = (c0, a0, c, a) over [0, 1]: (state, t)."""
    va = jnp.zeros((8, 2), f32).at[0].set(v1).at[1].set(v2_)
    ca = jnp.int32(2)
    vb = jnp.asarray(POLY_V)[b]
    cb = jnp.asarray(POLY_COUNT)[b]
    lcb = jnp.asarray(LOCAL_CENTER)[b]
    lca = jnp.zeros(2, f32)
    zero2 = jnp.zeros(2, f32)
    sweep_a = (zero2, F32(0.0), zero2, F32(0.0))
    c0, a0, c, a = sweep_b
    two_pi = F32(2.0) * PI32
    dd = two_pi * jnp.floor(a0 / two_pi)
    sweep_b = (c0, a0 - dd, c, a - dd)
    target = maxf(LINEAR_SLOP, POLYGON_RADIUS + POLYGON_RADIUS - F32(3.0) * LINEAR_SLOP)
    tolerance = F32(0.25) * LINEAR_SLOP

    def transforms(t):
        return _sweep_transform(sweep_a, t, lca), _sweep_transform(sweep_b, t, lcb)

    def separation_function(cache, t1):
        xfa, xfb = transforms(t1)
        point_a = mul_x(xfa, va[cache.ia[0]])
        point_b = mul_x(xfb, vb[cache.ib[0]])
        axis_points = normalize(point_b - point_a)
        # face B
        b1, b2 = vb[cache.ib[0]], vb[cache.ib[1]]
        axis_b = normalize(cross_vs(b2 - b1, F32(1.0)))
        lp_b = 0.5 * (b1 + b2)
        flip_b = dot(mul_x(xfa, va[cache.ia[0]]) - mul_x(xfb, lp_b), mul_r(xfb[1], axis_b)) < 0
        axis_b = jnp.where(flip_b, -axis_b, axis_b)
        # face A
        a1, a2 = va[cache.ia[0]], va[cache.ia[1]]
        axis_a = normalize(cross_vs(a2 - a1, F32(1.0)))
        lp_a = 0.5 * (a1 + a2)
        flip_a = dot(mul_x(xfb, vb[cache.ib[0]]) - mul_x(xfa, lp_a), mul_r(xfa[1], axis_a)) < 0
        axis_a = jnp.where(flip_a, -axis_a, axis_a)
        typ = jnp.where(cache.count == 1, 0, jnp.where(cache.ia[0] == cache.ia[1], 2, 1))
        axis = jnp.where(typ == 0, axis_points, jnp.where(typ == 2, axis_b, axis_a))
        local_point = jnp.where(typ == 2, lp_b, lp_a)
        return typ, axis, local_point

    def find_min_separation(fcn, t):
        typ, axis, local_point = fcn
        xfa, xfb = transforms(t)
        # points
        ia0 = _support(va, ca, mult_r(xfa[1], axis))
        ib0 = _support(vb, cb, mult_r(xfb[1], -axis))
        s0 = dot(mul_x(xfb, vb[ib0]) - mul_x(xfa, va[ia0]), axis)
        # face A
        normal_a = mul_r(xfa[1], axis)
        ib1 = _support(vb, cb, mult_r(xfb[1], -normal_a))
        s1 = dot(mul_x(xfb, vb[ib1]) - mul_x(xfa, local_point), normal_a)
        # face B
        normal_b = mul_r(xfb[1], axis)
        ia2 = _support(va, ca, mult_r(xfa[1], -normal_b))
        s2 = dot(mul_x(xfa, va[ia2]) - mul_x(xfb, local_point), normal_b)
        ia = jnp.where(typ == 0, ia0, jnp.where(typ == 1, -1, ia2))
        ib = jnp.where(typ == 0, ib0, jnp.where(typ == 1, ib1, -1))
        return ia, ib, jnp.where(typ == 0, s0, jnp.where(typ == 1, s1, s2))

    def evaluate(fcn, ia, ib, t):
        typ, axis, local_point = fcn
        xfa, xfb = transforms(t)
        ia_, ib_ = jnp.maximum(ia, 0), jnp.maximum(ib, 0)
        s0 = dot(mul_x(xfb, vb[ib_]) - mul_x(xfa, va[ia_]), axis)
        normal_a = mul_r(xfa[1], axis)
        s1 = dot(mul_x(xfb, vb[ib_]) - mul_x(xfa, local_point), normal_a)
        normal_b = mul_r(xfb[1], axis)
        s2 = dot(mul_x(xfa, va[ia_]) - mul_x(xfb, local_point), normal_b)
        return jnp.where(typ == 0, s0, jnp.where(typ == 1, s1, s2))

    # outer loop: (t1, cache, iteration, state, t, done)
    def outer_body(carry):
        t1, cache, it, _, _, _ = carry
        xfa, xfb = transforms(t1)
        dist, cache = _gjk(cache, va, ca, xfa, vb, cb, xfb)
        overlapped = dist <= 0
        touching = ~overlapped & (dist < target + tolerance)
        fcn = separation_function(cache, t1)

        # push-back loop: (t1, t2, iteration, state (0 = continue outer), done)
        def push_body(pc):
            t1, t2, pit, _, _ = pc
            ia, ib, s2 = find_min_separation(fcn, t2)
            separated = s2 > target + tolerance
            advance = ~separated & (s2 > target - tolerance)
            s1 = evaluate(fcn, ia, ib, t1)
            failed = ~separated & ~advance & (s1 < target - tolerance)
            touch = ~separated & ~advance & ~failed & (s1 <= target + tolerance)
            root = ~separated & ~advance & ~failed & ~touch

            def root_body(rc):
                a1, a2, s1, s2, count, _, _ = rc
                t = jnp.where(count % 2 == 1, a1 + (target - s1) * (a2 - a1) / (s2 - s1), 0.5 * (a1 + a2))
                count = count + 1
                s = evaluate(fcn, ia, ib, t)
                found = jnp.abs(s - target) < tolerance
                above = s > target
                a1n = jnp.where(~found & above, t, a1)
                s1n = jnp.where(~found & above, s, s1)
                a2n = jnp.where(~found & ~above, t, a2)
                s2n = jnp.where(~found & ~above, s, s2)
                return a1n, a2n, s1n, s2n, count, jnp.where(found, t, rc[5]), found | (count == 50)

            _, _, _, _, _, t2_found, _ = lax.while_loop(
                lambda rc: ~rc[6], root_body, (t1, t2, s1, s2, jnp.int32(0), t2, ~root))
            new_t2 = jnp.where(root, t2_found, t2)
            pit = jnp.where(root, pit + 1, pit)
            state = jnp.where(separated, TOI_SEPARATED, jnp.where(failed, TOI_FAILED, jnp.where(touch, TOI_TOUCHING, 0)))
            new_t1 = jnp.where(advance, t2, t1)
            done = separated | advance | failed | touch | (pit == 16)
            return new_t1, new_t2, pit, state, done

        p_t1, _, _, p_state, _ = lax.while_loop(
            lambda pc: ~pc[4], push_body,
            (t1, F32(1.0), jnp.int32(0), jnp.int32(0), overlapped | touching))
        it = it + jnp.where(overlapped | touching, 0, 1)
        state = jnp.where(overlapped, TOI_OVERLAPPED, jnp.where(touching, TOI_TOUCHING, p_state))
        t_out = jnp.where(overlapped, F32(0.0), jnp.where(touching, t1, jnp.where(p_state == TOI_SEPARATED, F32(1.0), p_t1)))
        new_t1 = jnp.where(overlapped | touching, t1, p_t1)
        limit = ~(overlapped | touching) & (p_state == 0) & (it == 20)
        state = jnp.where(limit, TOI_FAILED, state)
        t_out = jnp.where(limit, new_t1, t_out)
        return new_t1, cache, it, state, t_out, state != 0

    empty = Cache(F32(0.0), jnp.int32(0), jnp.zeros(3, i32), jnp.zeros(3, i32))
    _, _, _, state, t, _ = lax.while_loop(lambda c: ~c[5], outer_body,
                                          (F32(0.0), empty, jnp.int32(0), jnp.int32(0), F32(0.0), jnp.bool_(False)))
    return state, t


# ---------------------------------------------------------------- b2World::SolveTOI

def _solve_toi_island(world, h, b, order, n_island):
    """b2Island::SolveTOI for body b and its island contacts: positions first, then velocities."""
    cs = _constraints(world, order, False)
    pos_c, pos_a, vel_v, vel_w = world.c, world.a, world.v, world.w

    def position_iteration(carry):
        it, done, pos_c, pos_a = carry

        def contact(i, inner):
            pos_c, pos_a, min_sep = inner
            return _solve_position_one(cs, i, pos_c, pos_a, TOI_BAUMGARTE, min_sep)

        pos_c, pos_a, min_sep = lax.fori_loop(0, n_island, contact, (pos_c, pos_a, F32(0.0)))
        return it + 1, min_sep >= F32(-1.5) * LINEAR_SLOP, pos_c, pos_a

    _, _, pos_c, pos_a = lax.while_loop(lambda c: (c[0] < TOI_POSITION_ITERATIONS) & ~c[1], position_iteration,
                                        (jnp.int32(0), jnp.bool_(False), pos_c, pos_a))
    world = world._replace(c0=world.c0.at[b].set(pos_c[b]), a0=world.a0.at[b].set(pos_a[b]))
    cs = _initialize_velocity(cs, pos_c, pos_a, vel_v, vel_w)

    def velocity_iteration(_, carry):
        def contact(i, inner):
            vel_v, vel_w, ni, ti = inner
            vel_v, vel_w, n_i, t_i = _solve_velocity_one(cs._replace(ni=ni, ti=ti), i, vel_v, vel_w)
            return vel_v, vel_w, ni.at[i].set(n_i), ti.at[i].set(t_i)

        return lax.fori_loop(0, n_island, contact, carry)

    vel_v, vel_w, _, _ = lax.fori_loop(0, VELOCITY_ITERATIONS, velocity_iteration, (vel_v, vel_w, cs.ni, cs.ti))
    only_b = jnp.arange(NB) == b
    new_c, new_a, new_v, new_w = _integrate(h, pos_c, pos_a, vel_v, vel_w)
    return world._replace(c=jnp.where(only_b[:, None], new_c, world.c), a=jnp.where(only_b, new_a, world.a),
                          v=jnp.where(only_b[:, None], new_v, world.v), w=jnp.where(only_b, new_w, world.w))


def _advance_sweep(c0, a0, c, a, alpha0, alpha):
    beta = (alpha - alpha0) / (1.0 - alpha0)
    return (1.0 - beta) * c0 + beta * c, (1.0 - beta) * a0 + beta * a


class TOI(NamedTuple):
    flag: jax.Array  # (48,) bool
    count: jax.Array  # (48,) int32
    toi: jax.Array  # (48,)
    edge_alpha0: jax.Array  # (199,)


def _solve_toi(world):
    """b2World::SolveTOI: advance to the earliest time of impact of a walker body with the terrain, solve
    that body's contacts there, and repeat until no impact is left."""
    dt = H
    world = world._replace(alpha0=jnp.zeros(NB, f32))
    toi = TOI(jnp.zeros(MAX_CONTACTS, bool), jnp.zeros(MAX_CONTACTS, i32), jnp.ones(MAX_CONTACTS, f32),
              jnp.zeros(EDGES, f32))

    def align(carry, inputs):
        """The sweeps of contact k's pair brought to a common alpha0, in list order (Box2D's loop)."""
        world, edge_alpha0 = carry
        k, consider = inputs
        e, b = world.ce[k], world.cb[k]
        ea, ba = edge_alpha0[e], world.alpha0[b]
        raise_edge = consider & (ea < ba)
        advance_body = consider & ~(ea < ba) & (ba < ea)
        alpha0 = jnp.where(raise_edge, ba, jnp.where(advance_body, ea, ea))
        c0, a0 = _advance_sweep(world.c0[b], world.a0[b], world.c[b], world.a[b], ba, ea)
        world = world._replace(c0=world.c0.at[b].set(jnp.where(advance_body, c0, world.c0[b])),
                               a0=world.a0.at[b].set(jnp.where(advance_body, a0, world.a0[b])),
                               alpha0=world.alpha0.at[b].set(jnp.where(advance_body, ea, ba)))
        edge_alpha0 = edge_alpha0.at[e].set(jnp.where(raise_edge, ba, ea))
        return (world, edge_alpha0), (alpha0, world.c0[b], world.a0[b])

    def cond(carry):
        return ~carry[2] & (carry[3] < TOI_LOOP_CAP)

    def body(carry):
        world, toi, _, it = carry
        active = _active(world)
        candidate = active & world.enabled & (toi.count <= MAX_SUB_STEPS)
        need = candidate & ~toi.flag & world.awake[world.cb]
        (world, edge_alpha0), (alpha0, c0, a0) = lax.scan(align, (world, toi.edge_alpha0), (_slots(), need))

        def one(e, b, c0, a0, alpha0):
            v1, v2_ = _edge(world, e)
            state, beta = time_of_impact(v1, v2_, b, (c0, a0, world.c[b], world.a[b]))
            return jnp.where(state == TOI_TOUCHING, minf(alpha0 + (1.0 - alpha0) * beta, F32(1.0)), F32(1.0))

        fresh = jax.vmap(one)(world.ce, world.cb, c0, a0, alpha0)
        values = jnp.where(need, fresh, toi.toi)
        toi = toi._replace(toi=values, flag=toi.flag | need, edge_alpha0=edge_alpha0)
        considered = candidate & (toi.flag)
        alpha = jnp.where(considered, values, F32(1.0))
        min_k = jnp.argmin(alpha)  # the first of the smallest
        min_alpha = alpha[min_k]
        stop = ~(min_alpha < 1.0) | (F32(1.0) - F32(10.0) * EPSILON < min_alpha)
        world, toi = lax.cond(stop, lambda w, t: (w, t), lambda w, t: _toi_event(w, t, min_k, min_alpha, dt), world, toi)
        return world, toi, stop, it + 1

    world, _, _, _ = lax.while_loop(cond, body, (world, toi, jnp.bool_(False), jnp.int32(0)))
    return world


def _toi_event(world, toi, min_k, min_alpha, dt):
    e, b = world.ce[min_k], world.cb[min_k]
    lc = jnp.asarray(LOCAL_CENTER)[b]
    backup = (world.c0, world.a0, world.c, world.a, world.alpha0)
    backup_edge = toi.edge_alpha0[e]
    edge_alpha0 = toi.edge_alpha0.at[e].set(min_alpha)
    c0, a0 = _advance_sweep(world.c0[b], world.a0[b], world.c[b], world.a[b], world.alpha0[b], min_alpha)
    world = world._replace(c0=world.c0.at[b].set(c0), a0=world.a0.at[b].set(a0), c=world.c.at[b].set(c0),
                           a=world.a.at[b].set(a0), alpha0=world.alpha0.at[b].set(min_alpha))
    del lc
    only_k = _slots() == min_k
    # body b's contacts at its advanced pose, computed once: the island's updates below reuse them
    mine = _active(world) & (world.cb == b)
    updated = _manifolds(world, mine)
    world = _apply_update(world, only_k, *updated)
    toi = toi._replace(flag=toi.flag & ~only_k, count=toi.count + only_k)
    ok = world.touching[min_k]

    def rejected(world, toi):
        c0, a0, c, a, alpha0 = backup
        world = world._replace(enabled=world.enabled & ~only_k, c0=c0, a0=a0, c=c, a=a, alpha0=alpha0)
        return world, toi._replace(edge_alpha0=edge_alpha0.at[e].set(backup_edge))

    def accepted(world, toi):
        active = _active(world)
        # the island: min_k first, then body b's other contacts that touch after an update, up to 32
        others = mine & ~only_k
        touches = others & (updated[0].count > 0)
        before = jnp.cumsum(touches) - touches
        processed = others & (1 + before < MAX_TOI_CONTACTS)
        world = _apply_update(world, processed, *updated)
        joined = processed & world.touching
        edges = jnp.where(joined, world.ce, EDGES)
        new_edge_alpha0 = edge_alpha0.at[edges].set(min_alpha, mode="drop")
        order = jnp.argsort(jnp.where(only_k, -1, jnp.where(joined, _slots(), 1000)), stable=True)
        n_island = 1 + jnp.sum(joined)
        world = _solve_toi_island(world, (1.0 - min_alpha) * dt, b, order, n_island)
        fat, moved = _synchronize(world, b)
        world = world._replace(fat=world.fat.at[b].set(fat))
        flags = toi.flag & ~(active & (world.cb == b))
        world, from_new, old_index = _find_new_contacts(world, (jnp.arange(NB) == b) & moved)
        # contacts shifted by the insertion keep their TOI bookkeeping: shift it the same way
        return world, TOI(flag=jnp.where(from_new, False, flags[old_index]),
                          count=jnp.where(from_new, 0, toi.count[old_index]),
                          toi=jnp.where(from_new, F32(1.0), toi.toi[old_index]), edge_alpha0=new_edge_alpha0)

    return lax.cond(ok, accepted, rejected, world, toi)


# ---------------------------------------------------------------- the lidar (b2EdgeShape::RayCast)

def _raycast(world, p1, p2):
    """world.RayCast with gymnasium's LidarCallback: the nearest terrain hit's fraction, 1 if none."""
    lo, hi = jnp.minimum(p1, p2), jnp.maximum(p1, p2)
    seg = jnp.concatenate([lo, hi])
    e = jnp.arange(EDGES)

    def one(i):
        v1, v2_ = _edge(world, i)
        overlap = _overlap(seg, _edge_fat(world, i))
        d = p2 - p1
        ed = v2_ - v1
        normal = normalize(v2(ed[1], -ed[0]))
        numerator = dot(normal, v1 - p1)
        denominator = dot(normal, d)
        t = numerator / jnp.where(denominator == 0, 1.0, denominator)
        q = p1 + t * d
        rr = dot(ed, ed)
        s = dot(q - v1, ed) / jnp.where(rr == 0, 1.0, rr)
        hit = overlap & (denominator != 0) & (t >= 0) & (t <= 1.0) & (rr != 0) & (s >= 0) & (s <= 1)
        return jnp.where(hit, t, F32(1.0))

    return jnp.min(jax.vmap(one)(e))


# ---------------------------------------------------------------- gymnasium's step

def _world_step(world):
    """b2World::Step(1/FPS, 180, 60): collide, solve the island, find new contacts, continuous collision."""
    world = _collide(world)
    world = _solve_island(world)
    world, moved = _synchronize_all(world, jnp.ones(NB, bool))
    world, _, _ = _find_new_contacts(world, moved)
    world = _solve_toi(world)
    return world._replace(force=jnp.zeros((NB, 2), f32))


def _env_step(world, action, hull_force):
    action = jnp.asarray(action, f32).reshape(4)
    world = world._replace(motor_speed=(jnp.asarray(SPEEDS, f32) * jnp.sign(action)).astype(f32),
                           max_torque=(F32(MOTORS_TORQUE) * jnp.clip(jnp.abs(action), 0.0, 1.0)).astype(f32),
                           force=world.force.at[0, 0].add(hull_force))
    world = _set_awake(world, jnp.ones(NB, bool))  # SetMotorSpeed wakes both bodies of every joint
    world = _world_step(world)
    pos, _ = _xf(world, 0)
    hull_a, hull_w, vel = world.a[0], world.w[0], world.v[0]
    lidar = jax.vmap(lambda dx, dy: _raycast(world, pos, v2(pos[0] + dx, pos[1] - dy)))(jnp.asarray(LIDAR_DX),
                                                                                         jnp.asarray(LIDAR_DY))

    def jangle(j):
        a, b = JOINT_BODIES[j]
        return world.a[b] - world.a[a] - JOINT_REFERENCE[j]

    def jspeed(j):
        a, b = JOINT_BODIES[j]
        return world.w[b] - world.w[a]

    obs = jnp.stack([
        hull_a, 2.0 * hull_w / FPS, 0.3 * vel[0] * (VIEWPORT_W / SCALE) / FPS, 0.3 * vel[1] * (VIEWPORT_H / SCALE) / FPS,
        jangle(0), jspeed(0) / SPEED_HIP, jangle(1) + 1.0, jspeed(1) / SPEED_KNEE, world.ground[0].astype(f32),
        jangle(2), jspeed(2) / SPEED_HIP, jangle(3) + 1.0, jspeed(3) / SPEED_KNEE, world.ground[1].astype(f32),
    ]).astype(f32)
    obs = jnp.concatenate([obs, lidar.astype(f32)])
    px = pos[0]
    shaping = 130.0 * px / SCALE - 5.0 * jnp.abs(hull_a)
    reward = shaping - world.prev_shaping
    for j in range(4):  # numpy's float32 control cost, joint by joint
        reward = reward - F32(0.00035 * MOTORS_TORQUE) * jnp.clip(jnp.abs(action[j]), 0.0, 1.0)
    world = world._replace(prev_shaping=shaping.astype(f32))
    fell = world.game_over | (px < 0)
    reward = jnp.where(fell, F32(-100.0), reward)
    terminated = fell | (px > (TERRAIN_LENGTH - TERRAIN_GRASS) * TERRAIN_STEP)
    return world, obs, reward.astype(f32), terminated


# ---------------------------------------------------------------- the state (the Rust port's flat state, split)

FEATURE_KEY_BITS = (0, 8, 16, 24)


class State(NamedTuple):
    header: jax.Array  # (5,) game_over, ground_contact1, ground_contact3, prev_shaping (NaN: None), contact_count
    bodies: jax.Array  # (5, 13) cx, cy, angle, vx, vy, w, awake, sleep_time, fat lx ly ux uy, proxy
    joints: jax.Array  # (4, 4) impulse x, y, z (limit), motor impulse
    terrain_y: jax.Array  # (200,)
    edge_proxy: jax.Array  # (199,)
    contacts: jax.Array  # (48, 20) edge, body, touching, enabled, points, type, n, p, (lp, ni, ti, FEATURE_CODE) x 2


def feature_code(k):
    """Box2D's contact feature key (indexA | indexB << 8 | typeA << 16 | typeB << 24) as a small
    number float32 holds exactly: ia + 8 ib + 64 ta + 128 tb."""
    return (k & 0xff) + 8 * ((k >> 8) & 0xff) + 64 * ((k >> 16) & 0xff) + 128 * ((k >> 24) & 0xff)


def feature_key(code):
    return (code % 8) | (((code // 8) % 8) << 8) | (((code // 64) % 2) << 16) | (((code // 128) % 2) << 24)


def _world_from_state(s: State) -> World:
    bodies = s.bodies
    c = bodies[:, 0:2]
    a = bodies[:, 2]
    impulse = s.joints[:, :3]
    cs = s.contacts
    n = jnp.minimum(s.header[4], MAX_CONTACTS)
    n = jnp.where(jnp.isnan(n), 0, n).astype(i32)
    count = jnp.clip(jnp.nan_to_num(cs[:, 4]), 0, 2).astype(i32)
    m = Manifold(count, jnp.where(cs[:, 5] == 2, 2, 1).astype(i32), cs[:, 6:8], cs[:, 8:10],
                 jnp.stack([cs[:, 10:12], cs[:, 15:17]], axis=1),
                 jnp.stack([feature_key(cs[:, 14].astype(i32)), feature_key(cs[:, 19].astype(i32))], axis=1))
    edge = jnp.clip(jnp.nan_to_num(cs[:, 0]), 0, EDGES - 1).astype(i32)
    body = jnp.clip(jnp.nan_to_num(cs[:, 1]), 0, NB - 1).astype(i32)
    return World(
        c=c, a=a, c0=c, a0=a, v=bodies[:, 3:5], w=bodies[:, 5], awake=bodies[:, 6] != 0, sleep=bodies[:, 7],
        fat=bodies[:, 8:12], proxy=bodies[:, 12].astype(i32), alpha0=jnp.zeros(NB, f32), force=jnp.zeros((NB, 2), f32),
        impulse=impulse, motor_impulse=s.joints[:, 3],
        limit_state=jnp.where(impulse[:, 2] > 0, 1, jnp.where(impulse[:, 2] < 0, 2, 0)).astype(i32),
        motor_speed=jnp.zeros(4, f32), max_torque=jnp.zeros(4, f32),
        ys=s.terrain_y.astype(f32), edge_proxy=s.edge_proxy.astype(i32),
        n=n, ce=edge, cb=body, touching=cs[:, 2] != 0, enabled=cs[:, 3] != 0, m=m,
        ni=jnp.stack([cs[:, 12], cs[:, 17]], axis=1), ti=jnp.stack([cs[:, 13], cs[:, 18]], axis=1),
        game_over=s.header[0] != 0, ground=s.header[1:3] != 0, prev_shaping=s.header[3])


def _state_from_world(world: World, terrain_y) -> State:
    header = jnp.stack([world.game_over.astype(f32), world.ground[0].astype(f32), world.ground[1].astype(f32),
                        world.prev_shaping, world.n.astype(f32)])
    bodies = jnp.concatenate([world.c, world.a[:, None], world.v, world.w[:, None], world.awake[:, None].astype(f32),
                              world.sleep[:, None], world.fat, world.proxy[:, None].astype(f32)], axis=1)
    joints = jnp.concatenate([world.impulse, world.motor_impulse[:, None]], axis=1)
    m = world.m
    active = _active(world)
    has = active & (m.count > 0)
    point = [jnp.concatenate([m.plp[:, p], world.ni[:, p:p + 1], world.ti[:, p:p + 1],
                              feature_code(m.key[:, p:p + 1]).astype(f32)], axis=1)
             * (has & (p < m.count))[:, None] for p in range(2)]
    manifold = jnp.concatenate([m.count[:, None].astype(f32), m.typ[:, None].astype(f32), m.ln, m.lp], axis=1) * has[:, None]
    head = jnp.stack([world.ce.astype(f32), world.cb.astype(f32), world.touching.astype(f32),
                      world.enabled.astype(f32)], axis=1) * active[:, None]
    contacts = jnp.concatenate([head, manifold, point[0], point[1]], axis=1)
    return State(header, bodies.astype(f32), joints.astype(f32), terrain_y, world.edge_proxy.astype(f32),
                 contacts.astype(f32))


# ---------------------------------------------------------------- the protocol

def _step(key, state: State, action):
    world = _world_from_state(state)
    world, obs, reward, terminated = _env_step(world, action, F32(0.0))
    return obs, _state_from_world(world, state.terrain_y), reward, terminated


def step(key, state: State, action):
    return rounded_like_c(_step)(key, state, action)


def _terrain(key):
    """gymnasium's _generate_terrain (normal mode) with jax.random."""
    k_vel, k_counter = jax.random.split(key)
    noise = jax.random.uniform(k_vel, (TERRAIN_LENGTH,), jnp.float32, -1.0, 1.0)
    counters = jax.random.randint(k_counter, (TERRAIN_LENGTH,), TERRAIN_GRASS // 2, TERRAIN_GRASS)

    def body(carry, inputs):
        y, velocity, counter, oneshot = carry
        i, u, fresh = inputs
        new_velocity = 0.8 * velocity + 0.01 * jnp.sign(TERRAIN_HEIGHT - y)
        new_velocity = jnp.where(i > TERRAIN_STARTPAD, new_velocity + u / SCALE, new_velocity)
        velocity = jnp.where(oneshot, velocity, new_velocity)
        y = jnp.where(oneshot, y, y + velocity)
        counter = counter - 1
        oneshot = counter == 0
        counter = jnp.where(oneshot, fresh, counter)
        return (y, velocity, counter, oneshot), y

    _, ys = lax.scan(body, (F32(TERRAIN_HEIGHT), F32(0.0), jnp.int32(TERRAIN_STARTPAD), jnp.bool_(False)),
                     (jnp.arange(TERRAIN_LENGTH), noise, counters))
    return ys


def reset(key):
    """gymnasium's reset: terrain, the walker standing at the start, a random push of the hull, and the step
    with a zero action whose observation reset returns. Proxy ids are those of a fresh b2World."""
    return rounded_like_c(_reset)(key)


def _reset(key):
    k_terrain, k_force = jax.random.split(key)
    terrain_y = _terrain(k_terrain).astype(f32)
    init_x = TERRAIN_STEP * TERRAIN_STARTPAD / 2.0
    init_y = TERRAIN_HEIGHT + 2.0 * LEG_H
    placements = [(init_x, init_y, 0.0), (init_x, init_y - LEG_H / 2.0 - LEG_DOWN, -0.05),
                  (init_x, init_y - LEG_H * 3.0 / 2.0 - LEG_DOWN, -0.05), (init_x, init_y - LEG_H / 2.0 - LEG_DOWN, 0.05),
                  (init_x, init_y - LEG_H * 3.0 / 2.0 - LEG_DOWN, 0.05)]
    cs, angles, fats = [], [], []
    for b, (x, y, angle) in enumerate(placements):
        p = jnp.array([F32(x), F32(y)])
        q = rot(jnp.float32(angle))
        cs.append(mul_x((p, q), jnp.asarray(LOCAL_CENTER[b])))
        angles.append(jnp.float32(angle))
        fat = _poly_aabb(b, (p, q))
        fats.append(jnp.concatenate([fat[:2] - AABB_EXTENSION, fat[2:] + AABB_EXTENSION]))
    c, a = jnp.stack(cs), jnp.stack(angles)
    zeros2 = jnp.zeros((MAX_CONTACTS, 2), f32)
    world = World(
        c=c, a=a, c0=c, a0=a, v=jnp.zeros((NB, 2), f32), w=jnp.zeros(NB, f32), awake=jnp.ones(NB, bool),
        sleep=jnp.zeros(NB, f32), fat=jnp.stack(fats), proxy=jnp.array([2 * (EDGES + b) - 1 for b in range(NB)], i32),
        alpha0=jnp.zeros(NB, f32), force=jnp.zeros((NB, 2), f32), impulse=jnp.zeros((4, 3), f32),
        motor_impulse=jnp.zeros(4, f32), limit_state=jnp.zeros(4, i32), motor_speed=jnp.zeros(4, f32),
        max_torque=jnp.zeros(4, f32), ys=terrain_y,
        edge_proxy=jnp.array([0] + [2 * e - 1 for e in range(1, EDGES)], i32),
        n=jnp.int32(0), ce=jnp.zeros(MAX_CONTACTS, i32), cb=jnp.zeros(MAX_CONTACTS, i32),
        touching=jnp.zeros(MAX_CONTACTS, bool), enabled=jnp.zeros(MAX_CONTACTS, bool),
        m=Manifold(jnp.zeros(MAX_CONTACTS, i32), jnp.zeros(MAX_CONTACTS, i32), zeros2, zeros2,
                   jnp.zeros((MAX_CONTACTS, 2, 2), f32), jnp.zeros((MAX_CONTACTS, 2), i32)),
        ni=zeros2, ti=zeros2, game_over=jnp.bool_(False), ground=jnp.zeros(2, bool), prev_shaping=F32(np.nan))
    world, _, _ = _find_new_contacts(world, jnp.ones(NB, bool))  # the first Step's: every proxy is new
    force = jax.random.uniform(k_force, (), jnp.float32, -INITIAL_RANDOM, INITIAL_RANDOM)
    world, obs, _, _ = _env_step(world, jnp.zeros(4, f32), force)
    return obs, _state_from_world(world, terrain_y)


def state_from_reference(env) -> State:
    s = np.asarray(sync.state_from_reference(env), np.float64)
    contacts = s[sync.O_CONTACT:].reshape(MAX_CONTACTS, sync.CONTACT_FIELDS).copy()
    for column in (14, 19):
        contacts[:, column] = [feature_code(int(k)) for k in contacts[:, column]]
    return State(header=s[:sync.HEADER].astype(F32), bodies=s[sync.O_BODY:sync.O_JOINT].reshape(NB, sync.BODY_FIELDS).astype(F32),
                 joints=s[sync.O_JOINT:sync.O_TERRAIN].reshape(4, 4).astype(F32),
                 terrain_y=s[sync.O_TERRAIN:sync.O_EDGE_PROXY].astype(F32),
                 edge_proxy=s[sync.O_EDGE_PROXY:sync.O_CONTACT].astype(F32), contacts=contacts.astype(F32))


def state_to_reference(state: State, env) -> None:
    contacts = np.array(state.contacts, np.float64).reshape(MAX_CONTACTS, sync.CONTACT_FIELDS)
    for column in (14, 19):
        contacts[:, column] = [feature_key(int(c)) for c in contacts[:, column]]
    flat = np.concatenate([np.asarray(state.header, np.float64).ravel(), np.asarray(state.bodies, np.float64).ravel(),
                           np.asarray(state.joints, np.float64).ravel(), np.asarray(state.terrain_y, np.float64).ravel(),
                           np.asarray(state.edge_proxy, np.float64).ravel(), contacts.ravel()])
    sync.state_to_reference(flat, env)


# ---------------------------------------------------------------- what verification reads

def rust_field_names() -> list[str]:
    """The Rust port's state field names (autorl_state_fields) in flat order."""
    names = ["game_over", "ground_contact1", "ground_contact3", "prev_shaping", "contact_count"]
    body_fields = ("cx", "cy", "angle", "vx", "vy", "w", "awake", "sleep_time", "fat_lx", "fat_ly", "fat_ux", "fat_uy", "proxy")
    for b in ("hull", "leg0", "lower0", "leg1", "lower1"):
        names += [f"{b}_{f}" for f in body_fields]
    for j in range(4):
        names += [f"joint{j}_{f}" for f in ("impulse_x", "impulse_y", "impulse_z", "motor_impulse")]
    names += [f"terrain_y{i}" for i in range(TERRAIN_LENGTH)] + [f"edge_proxy{i}" for i in range(EDGES)]
    for k in range(MAX_CONTACTS):
        names += [f"c{k}_{f}" for f in sync._CONTACT_FIELDS]
    return names


def _state_field_names() -> list[str]:
    """This State's per-element names as the verifier writes them (probes.field_names, without the dot)."""
    shapes = (("header", 5), ("bodies", NB * 13), ("joints", 16), ("terrain_y", TERRAIN_LENGTH), ("edge_proxy", EDGES),
              ("contacts", MAX_CONTACTS * 20))
    return [f"{name}[{i}]" for name, size in shapes for i in range(size)]


_RUST_TO_JAX = dict(zip(rust_field_names(), _state_field_names()))
READ_ONLY_FIELDS = tuple(_RUST_TO_JAX[name] for name in sync.READ_ONLY_FIELDS)
UNREADABLE_FIELDS = tuple(_RUST_TO_JAX[name] for name in sync.UNREADABLE_FIELDS)
