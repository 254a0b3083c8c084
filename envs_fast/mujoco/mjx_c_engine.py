"""C MuJoCo 4.0's algorithms over MJX's data, where MJX 3.17's differ: the constraint solve (`c_solve`,
c_solver.py), capsule contacts and their frames (`c_fwd_position`), and RK4 on free and ball joints
(`c_step`: Runge-Kutta-Munthe-Kaas orientations, C's quaternion rule). `c_forward` and `c_step` are
mjx.forward and mjx.step with these in place; the mjx backend (mjx.py) steps its envs with them.
Measured: docs/concepts/backends.md (MJX)."""
from __future__ import annotations

import numpy as np

from envs_fast.mujoco.c_solver import MJ_MINVAL, c_solve, c_solver_covers  # noqa: F401  (c_solver_covers: mjx.py's)


def _c_contact_frames(m, d):
    """Contact frames of plane-capsule contacts as C MuJoCo builds them. Both align the first tangent with
    the capsule's axis projected onto the plane (mjc_PlaneCapsule, mju_makeFrame), but MJX falls back to
    (0, 1, 0) when that projection is shorter than 0.5 (a leg steeper than 60 degrees), where C keeps it:
    under a pyramidal cone the friction pyramid then turns about the normal, and a sliding Ant foot gets
    another friction force (qvel 0.1 apart after one step)."""
    import jax.numpy as jnp
    import mujoco

    contact = d._impl.contact
    if contact.frame.shape[0] == 0:
        return d
    geom_type = jnp.asarray(m.geom_type)
    plane_capsule = (geom_type[contact.geom[:, 0]] == int(mujoco.mjtGeom.mjGEOM_PLANE)) & (
        geom_type[contact.geom[:, 1]] == int(mujoco.mjtGeom.mjGEOM_CAPSULE))
    normal = contact.frame[:, 0]
    axis = d.geom_xmat[contact.geom[:, 1], :, 2]
    tangent = axis - normal * jnp.sum(normal * axis, axis=1, keepdims=True)
    length = jnp.linalg.norm(tangent, axis=1, keepdims=True)
    fallback = jnp.asarray([1.0, 0.0, 0.0], tangent.dtype)  # mju_normalize3 of a null vector
    tangent = jnp.where(length < mujoco.mjMINVAL, fallback, tangent / jnp.maximum(length, mujoco.mjMINVAL))
    frame = jnp.stack((normal, tangent, jnp.cross(normal, tangent)), axis=1)
    frame = jnp.where(plane_capsule[:, None, None], frame, contact.frame)
    return d.tree_replace({"_impl.contact": contact.replace(frame=frame)})


def _c_capsule_capsule(m, d):
    """Capsule-capsule contacts as C MuJoCo computes them (mjraw_CapsuleCapsule, mjraw_SphereSphere): the
    segments' nearest points in closed form, where MJX's regularises the line-line solve (1e-6 in its
    denominator) and so misses by up to 1e-6 of the segment length; and where the segments cross (nearest
    points equal) C takes the normal across both axes, MJX whatever direction its rounding leaves: a
    folded Hopper (leg past its limit) pushes its torso and foot apart in the plane under MJX and not at
    all under C (normal along y, the planar model's null direction). Parallel axes, where C may report
    two contacts for the pair and MJX has one slot, keep C's first."""
    import jax
    import jax.numpy as jnp
    import mujoco
    from mujoco.mjx._src import math as mjx_math

    contact = d._impl.contact
    if contact.frame.shape[0] == 0:
        return d
    capsule = int(mujoco.mjtGeom.mjGEOM_CAPSULE)
    if not (np.asarray(m.geom_type) == capsule).sum() > 1:
        return d
    geom_type = jnp.asarray(m.geom_type)
    both = (geom_type[contact.geom[:, 0]] == capsule) & (geom_type[contact.geom[:, 1]] == capsule)
    size = jnp.asarray(m.geom_size)
    minval = mujoco.mjMINVAL

    def one(g1, g2):
        pos1, pos2 = d.geom_xpos[g1], d.geom_xpos[g2]
        mat1, mat2 = d.geom_xmat[g1], d.geom_xmat[g2]
        size1, size2 = size[g1], size[g2]
        axis1, axis2 = mat1[:, 2] * size1[1], mat2[:, 2] * size2[1]
        dif = pos1 - pos2
        ma, mb, mc = jnp.dot(axis1, axis1), -jnp.dot(axis1, axis2), jnp.dot(axis2, axis2)
        u, v = -jnp.dot(axis1, dif), jnp.dot(axis2, dif)
        det = ma * mc - mb * mb
        general = jnp.abs(det) >= minval
        safe_det = jnp.where(general, det, 1.0)
        x1, x2 = (mc * u - mb * v) / safe_det, (ma * v - mb * u) / safe_det
        x2 = jnp.where(x1 > 1, (v - mb) / mc, jnp.where(x1 < -1, (v + mb) / mc, x2))
        x1 = jnp.clip(x1, -1, 1)
        x1 = jnp.where(x2 > 1, jnp.clip((u - mb) / ma, -1, 1), jnp.where(x2 < -1, jnp.clip((u + mb) / ma, -1, 1), x1))
        x2 = jnp.clip(x2, -1, 1)
        # parallel axes: C's first candidate, x1 = 1
        x1 = jnp.where(general, x1, 1.0)
        x2 = jnp.where(general, x2, jnp.clip((v - mb) / mc, -1, 1))
        vec1, vec2 = pos1 + axis1 * x1, pos2 + axis2 * x2
        normal = vec2 - vec1
        length = jnp.linalg.norm(normal)
        dist = length - size1[0] - size2[0]
        across = jnp.cross(mat1[:, 2], mat2[:, 2])  # centres equal: the normal across both axes
        across_length = jnp.linalg.norm(across)
        across = jnp.where(across_length < minval, jnp.asarray([1.0, 0.0, 0.0], across.dtype),
                           across / jnp.maximum(across_length, minval))
        normal = jnp.where(length < minval, across, normal / jnp.maximum(length, minval))
        return dist, vec1 + normal * (size1[0] + dist / 2), mjx_math.make_frame(normal)

    dist, pos, frame = jax.vmap(one)(contact.geom[:, 0], contact.geom[:, 1])
    contact = contact.replace(dist=jnp.where(both, dist, contact.dist), pos=jnp.where(both[:, None], pos, contact.pos),
                              frame=jnp.where(both[:, None, None], frame, contact.frame))
    return d.tree_replace({"_impl.contact": contact})


def c_fwd_position(m, d):
    """mjx's fwd_position with C's capsule contacts (`_c_contact_frames`, `_c_capsule_capsule`)."""
    from mujoco.mjx._src import collision_driver, constraint, smooth

    for stage in (smooth.kinematics, smooth.com_pos, smooth.camlight, smooth.tendon, smooth.crb,
                  smooth.tendon_armature, smooth.factor_m, collision_driver.collision):
        d = stage(m, d)
    d = _c_contact_frames(m, d)
    d = _c_capsule_capsule(m, d)
    d = constraint.make_constraint(m, d)
    return smooth.transmission(m, d)


def c_forward(m, d, **solver_options):
    """mjx.forward with C MuJoCo's contact frames (`c_fwd_position`) and constraint solve (`c_solve`)."""
    from mujoco.mjx._src import forward as fwd
    from mujoco.mjx._src import sensor

    d = c_fwd_position(m, d)
    d = sensor.sensor_pos(m, d)
    d = fwd.fwd_velocity(m, d)
    d = sensor.sensor_vel(m, d)
    d = fwd.fwd_actuation(m, d)
    d = fwd.fwd_acceleration(m, d)
    if d._impl.efc_J.size == 0:
        return d.replace(qacc=d.qacc_smooth)
    d = c_solve(m, d, **solver_options)
    return sensor.sensor_acc(m, d)


def _c_quat_integrate(quat, vel, dt):
    """mju_quatIntegrate, rows of (k, 4) quaternions by (k, 3) local angular velocities: the quaternion
    normalised first (mju_normalize4: only if its norm is off 1 by more than mjMINVAL, identity below mjMINVAL),
    then multiplied by the rotation of angle dt*|vel| about vel/|vel| (x axis for |vel| < mjMINVAL); the product
    is not normalised again (MJX's `math.quat_integrate` normalises it after, not before)."""
    import jax
    import jax.numpy as jnp
    from mujoco.mjx._src import math as mjx_math

    n2 = jnp.sum(vel * vel, axis=-1, keepdims=True)
    norm = jnp.where(n2 > 0, jnp.sqrt(jnp.where(n2 > 0, n2, 1)), 0)
    small = norm < MJ_MINVAL
    axis = jnp.where(small, jnp.array([1.0, 0.0, 0.0], vel.dtype), vel / jnp.where(small, 1, norm))
    half = 0.5 * dt * norm
    rotation = jnp.concatenate([jnp.cos(half), axis * jnp.sin(half)], axis=-1)
    q2 = jnp.sum(quat * quat, axis=-1, keepdims=True)
    qnorm = jnp.sqrt(q2)
    scaled = jnp.where(jnp.abs(qnorm - 1) > MJ_MINVAL, quat / jnp.where(qnorm < MJ_MINVAL, 1, qnorm), quat)
    quat = jnp.where(qnorm < MJ_MINVAL, jnp.array([1.0, 0.0, 0.0, 0.0], quat.dtype), scaled)
    return jax.vmap(mjx_math.quat_mul)(quat, rotation)


def _joint_indices(m):
    """Static index arrays of the model's joints by kind: hinge/slide (qpos, dof), free translations (qpos,
    dof, 3 each), quaternions of free and ball joints (qpos 4 each, their 3 rotational dofs)."""
    from mujoco.mjx._src.types import JointType

    scalar_q, scalar_v, pos_q, pos_v, quat_q, rot_v = [], [], [], [], [], []
    for typ, qadr, vadr in zip(m.jnt_type, m.jnt_qposadr, m.jnt_dofadr):
        qadr, vadr = int(qadr), int(vadr)
        if typ == JointType.FREE:
            pos_q.append(range(qadr, qadr + 3))
            pos_v.append(range(vadr, vadr + 3))
            quat_q.append(range(qadr + 3, qadr + 7))
            rot_v.append(range(vadr + 3, vadr + 6))
        elif typ == JointType.BALL:
            quat_q.append(range(qadr, qadr + 4))
            rot_v.append(range(vadr, vadr + 3))
        else:
            scalar_q.append(qadr)
            scalar_v.append(vadr)
    as_array = lambda rows, width: np.array([list(r) for r in rows], int).reshape(-1, width)  # noqa: E731
    return (np.array(scalar_q, int), np.array(scalar_v, int), as_array(pos_q, 3), as_array(pos_v, 3),
            as_array(quat_q, 4), as_array(rot_v, 3))


def c_integrate_pos(m, qpos, qvel, dt):
    """mj_integratePos: hinge and slide joints and free joints' positions qpos + dt*qvel, free and ball
    joints' quaternions by `_c_quat_integrate` (C's normalise-then-rotate)."""
    scalar_q, scalar_v, pos_q, pos_v, quat_q, rot_v = _joint_indices(m)
    if len(scalar_q):
        qpos = qpos.at[scalar_q].set(qpos[scalar_q] + dt * qvel[scalar_v])
    if len(pos_q):
        qpos = qpos.at[pos_q].set(qpos[pos_q] + dt * qvel[pos_v])
    if len(quat_q):
        qpos = qpos.at[quat_q].set(_c_quat_integrate(qpos[quat_q], qvel[rot_v], dt))
    return qpos


def _rkmk_velocity(m, qvel, offset):
    """The velocity a Runge-Kutta stage contributes to positions in C MuJoCo 4's RK4 (4.0.0 changelog, commit
    9a7f240f0: Runge-Kutta-Munthe-Kaas for ball and free joints): each rotational 3-vector w of the stage's
    qvel, whose orientation is the start's rotated by `offset` (the stage's theta = h * its dX), replaced
    by dexp^-1_{-theta}(w) = w + theta x w / 2 + c(|theta|) theta x (theta x w), c(t) = (1 - (t/2) cot(t/2)) / t^2,
    in closed form (its series where the closed form cancels); other dofs as they are. Matches mujoco 4.0.0's
    mj_step bit for bit on free and ball joints (docs/concepts/backends.md)."""
    import jax.numpy as jnp

    rot_v = _joint_indices(m)[5]
    if not len(rot_v):
        return qvel
    w, theta = qvel[rot_v], -offset[rot_v]  # dexp^-1_x(w) = w - x x w / 2 + c x x (x x w) at x = -theta
    t2 = jnp.sum(theta * theta, axis=-1, keepdims=True)
    cut = 1e-3 if qvel.dtype == jnp.float64 else 0.3  # below: the series (error < 1e-20); above: closed form
    safe = jnp.sqrt(jnp.where(t2 > cut * cut, t2, 1.0))
    closed = (1 - (safe / 2) / jnp.tan(safe / 2)) / (safe * safe)
    series = 1 / 12 + t2 * (1 / 720 + t2 * (1 / 30240 + t2 / 1209600))
    c = jnp.where(t2 > cut * cut, closed, series)
    once = jnp.cross(theta, w)
    return qvel.at[rot_v].set(w - 0.5 * once + c * jnp.cross(theta, once))


def c_step(m, d, **solver_options):
    """mjx.step over `c_forward`: MJX's Euler (implicit damping) and C MuJoCo 4's RK4, each stage's forward
    solving its constraints as C MuJoCo does. C's RK4 (mj_RungeKutta) where it is not MJX's: positions move
    from the step's qpos as given (`c_integrate_pos`: C's quaternion rule) and each stage's rotational
    velocities are Runge-Kutta-Munthe-Kaas corrected before they integrate positions (`_rkmk_velocity`);
    for hinge and slide joints alone (Hopper, Walker2d, HalfCheetah) this is MJX's RK4 op for op."""
    import jax
    import jax.numpy as jnp
    from mujoco.mjx._src import forward as fwd
    from mujoco.mjx._src.types import IntegratorType

    qpos0 = d.qpos  # C's X[0]: as given; MJX's kinematics writes normalised quaternions back into d.qpos
    d = c_forward(m, d, **solver_options)
    if m.opt.integrator == IntegratorType.EULER:
        return fwd.euler(m, d)
    if m.opt.integrator != IntegratorType.RK4:
        raise NotImplementedError(f"integrator {m.opt.integrator}")
    d0, h = d, m.opt.timestep
    A, B = fwd._RK4_A, fwd._RK4_B
    T = d.time + jnp.tril(A).sum(axis=0) * h
    qvel, qacc, act_dot = (B[0] * d.qvel, B[0] * d.qacc, B[0] * d.act_dot)
    kqvel = d.qvel  # the previous stage's velocity for positions (stage 0's needs no correction)

    def stage(carry, x):
        qvel, qacc, act_dot, kqvel, d = carry
        a, b, t = x
        dq = a * kqvel
        kqpos = c_integrate_pos(m, qpos0, dq, h)
        kact = d0.act + a * d.act_dot * h
        stage_qvel = d0.qvel + a * d.qacc * h
        d = c_forward(m, d.replace(qpos=kqpos, qvel=stage_qvel, act=kact, time=t), **solver_options)
        kqvel = _rkmk_velocity(m, stage_qvel, h * dq)
        return (qvel + b * kqvel, qacc + b * d.qacc, act_dot + b * d.act_dot, kqvel, d), None

    abt = jnp.vstack([jnp.diag(A), B[1:4], T]).T
    (qvel, qacc, act_dot, _, d1), _ = jax.lax.scan(stage, (qvel, qacc, act_dot, kqvel, d), abt, unroll=3)
    d = d1.replace(qpos=qpos0, qvel=d0.qvel, act=d0.act, time=d0.time)
    # mj_advance (MJX's _advance with C's position rule): velocities by the stages' accelerations, positions
    # from X[0] by the stages' corrected velocities, time, and the last stage's qacc as the next warm start
    act = fwd._next_activation(m, d, act_dot)
    return d.replace(act=act, qvel=d.qvel + qacc * h, qpos=c_integrate_pos(m, qpos0, qvel, h), time=d.time + h,
                     qacc_warmstart=d.qacc)
