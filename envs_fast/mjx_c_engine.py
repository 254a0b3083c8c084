"""C MuJoCo 4.0's algorithms over MJX's data, where MJX 3.17's differ: the constraint solve (`c_solve`,
C's warm start choice, stopping rules and line search), capsule contacts and their frames
(`c_fwd_position`), and RK4 on free and ball joints (`c_step`: Runge-Kutta-Munthe-Kaas orientations,
C's quaternion rule). `c_forward` and `c_step` are mjx.forward and mjx.step with these in place; the
mjx backend (mjx_backend.py) steps its envs with them. Measured: docs/concepts/backends.md (MJX)."""
from __future__ import annotations

import collections

import numpy as np

MJ_MINVAL = 1e-15  # mjMINVAL: C's floor for a Cholesky diagonal; below it, C leaves a vector unnormalised

# ---------------------------------------------------------------- the constraint solve, with C MuJoCo's stopping rules
#
# MJX 3.17's solver (mujoco/mjx/_src/solver.py) is MuJoCo's primal Newton method with MuJoCo 3.x's old
# termination (improvement or gradient below opt.tolerance) and its own vectorised line search. MuJoCo
# 4.0's C solver (engine_solver.c, mj_solPrimal / PrimalSearch) stops differently: before the first line
# search when the gradient and either the duality-gap certificate 0.5 g'M^-1 g or the Newton decrement
# 0.5 g'H^-1 g (scaled by 1/trace M, the island's inertia) are below tolerance; after each iteration when
# the line search's improvement is positive and below tolerance, the gradient is, or the Newton decrement
# is; and its line search accepts a point only when it lowers the cost (costs shifted by cost(0)). So
# from the same state the two solves stop at different points of the same convex problem: both within
# tolerance of its minimum, yet 1e-4 apart in qacc (a Hopper joint limit: C stops after one iteration
# whose Newton decrement is 3.3e-10 < 1e-8; MJX takes the second). Measured: docs/concepts/backends.md.
# What follows is C's algorithm for the models these envs use
# (Newton solver, pyramidal cones, one kinematic tree, no equality or friction-loss rows), written over
# MJX's constraint rows (rows of inactive contacts are zero: J = 0 and aref = 0, so they never activate).

def c_solver_covers(model) -> str | None:
    """Why `c_solve` does not apply to this MjModel (one line), or None when it does."""
    import mujoco

    opt = model.opt
    if opt.solver != mujoco.mjtSolver.mjSOL_NEWTON:
        return f"solver {mujoco.mjtSolver(opt.solver).name}, not Newton"
    if opt.cone != mujoco.mjtCone.mjCONE_PYRAMIDAL:
        return "elliptic friction cones"
    if model.ntree != 1:
        return f"{model.ntree} kinematic trees (constraint islands)"
    if model.neq or (model.dof_frictionloss > 0).any() or model.ntendon:
        return "equality, friction-loss or tendon constraints"
    if opt.noslip_iterations:
        return "the noslip solver"
    return None


# ---------------------------------------------------------------- small dense Cholesky, without LAPACK
#
# jax.scipy.linalg.cho_factor lowers on CPU to LAPACK's potrf through a custom call that, batched (one
# matrix per env), splits the batch over XLA's intra-op thread pool from inside a pool thread and waits
# for it (jaxlib's ParallelBatchMap). Two such calls running at once on a 2-thread pool wait for each
# other forever: HalfCheetah's and Ant's 1000-env steps hung at 0% CPU in lapack_spotrf_ffi
# (docs/concepts/backends.md). So the solve's Hessian is factored here, in plain
# JAX ops (unrolled over the static size, nv <= a few dozen), by C MuJoCo's own rule; M itself is
# factored by MJX's sparse LDL (the mjx backend puts its model with a sparse inertia), as C's mj_factorM.

def chol_factor(a):
    """mju_cholFactor(a, n, mjMINVAL): the lower Cholesky factor of a symmetric (n, n) matrix, column by
    column, a diagonal below mjMINVAL raised to it (C's rank-deficient rule)."""
    import jax.numpy as jnp

    n = a.shape[-1]
    lower = jnp.zeros_like(a)
    for j in range(n):
        row = lower[j, :j]
        diagonal = a[j, j] - jnp.dot(row, row)
        diagonal = jnp.sqrt(jnp.where(diagonal < MJ_MINVAL, jnp.asarray(MJ_MINVAL, a.dtype), diagonal))
        lower = lower.at[j, j].set(diagonal)
        if j + 1 < n:
            lower = lower.at[j + 1:, j].set((a[j + 1:, j] - lower[j + 1:, :j] @ row) * (1 / diagonal))
    return lower


def chol_solve(lower, b):
    """mju_cholSolve: x with (L L') x = b, forward then backward substitution."""
    import jax.numpy as jnp

    n = b.shape[-1]
    y = []
    for i in range(n):
        y.append((b[i] - jnp.dot(lower[i, :i], jnp.stack(y)) if i else b[i]) / lower[i, i])
    x = [None] * n
    for i in reversed(range(n)):
        x[i] = (y[i] - jnp.dot(lower[i + 1:, i], jnp.stack(x[i + 1:])) if i + 1 < n else y[i]) / lower[i, i]
    return jnp.stack(x)


class _Point(collections.namedtuple("_Point", "alpha cost d0 d1")):
    """A line-search point: step size, cost(alpha) - cost(0), first and second derivative."""


def c_solve(m, d, tolerance=None, ls_tolerance=None, iterations=None, ls_iterations=None):
    """MuJoCo 4.0's warm start and primal Newton solve (mj_fwdConstraint's `warmstart`, mj_solPrimal,
    PrimalSearch) on MJX data after fwd_acceleration: sets qacc, qfrc_constraint and efc_force. Options
    default to the model's (opt.tolerance, ls_tolerance, iterations, ls_iterations)."""
    import jax
    import jax.numpy as jnp
    import mujoco
    from mujoco.mjx._src import smooth, support

    tol = m.opt.tolerance if tolerance is None else tolerance
    ls_tol = m.opt.ls_tolerance if ls_tolerance is None else ls_tolerance
    max_iter = int(m.opt.iterations if iterations is None else iterations)
    ls_max = int(m.opt.ls_iterations if ls_iterations is None else ls_iterations)
    impl = d._impl
    J, D, aref = impl.efc_J, impl.efc_D, impl.efc_aref
    f = d.qacc_smooth.dtype
    M = support.full_m(m, d)
    qfrc_smooth, qacc_smooth = d.qfrc_smooth, d.qacc_smooth
    minval = jnp.asarray(mujoco.mjMINVAL, f)
    scale = 1 / jnp.sum(jnp.diagonal(M))  # the island's inertia: every dof is in the one tree's island

    def constraint_cost(jaref):
        active = jaref < 0
        return 0.5 * jnp.sum(jnp.where(active, D * jaref * jaref, 0)), active

    def gauss(ma, qacc):
        return 0.5 * jnp.dot(ma - qfrc_smooth, qacc - qacc_smooth)

    # warm start: qacc_warmstart unless qacc_smooth costs less (ties keep the warm start)
    warm = d.qacc_warmstart
    cost_warm = constraint_cost(J @ warm - aref)[0] + gauss(M @ warm, warm)
    cost_smooth = constraint_cost(J @ qacc_smooth - aref)[0]
    qacc = jnp.where(cost_warm > cost_smooth, qacc_smooth, warm)

    def update(qacc, ma, jaref):
        """efc_force, qfrc_constraint, grad and the Newton direction's H^-1 grad at this qacc."""
        active = jaref < 0
        force = jnp.where(active, -D * jaref, 0)
        qfrc_constraint = J.T @ force
        grad = ma - qfrc_smooth - qfrc_constraint
        hessian = M + (J.T * jnp.where(active, D, 0)) @ J
        mgrad = chol_solve(chol_factor(hessian), grad)
        return force, qfrc_constraint, grad, mgrad

    def search_line(qacc, ma, jaref, search):
        """PrimalSearch: step size along `search` and the cost it removes (0 and 0 when it finds none)."""
        snorm = jnp.linalg.norm(search)
        gtol = tol * ls_tol * snorm / scale
        mv, jv = M @ search, J @ search
        gauss1 = jnp.dot(search, ma) - jnp.dot(qfrc_smooth, search)
        gauss2 = 0.5 * jnp.dot(search, mv)
        q0, q1, q2 = 0.5 * jaref * D * jaref, jv * D * jaref, 0.5 * jv * D * jv
        cost0 = jnp.where(jaref < 0, q0, 0)

        def point(alpha):
            active = jaref + alpha * jv < 0
            t0 = jnp.sum(jnp.where(active, q0 - cost0, 0))
            t1 = gauss1 + jnp.sum(jnp.where(active, q1, 0))
            t2 = gauss2 + jnp.sum(jnp.where(active, q2, 0))
            cost = alpha * alpha * t2 + alpha * t1 + t0 - jnp.sum(jnp.where(active, 0, cost0))
            d1 = 2 * t2
            return _Point(alpha, cost, 2 * alpha * t2 + t1, jnp.where(d1 <= 0, minval, d1))

        def newton(p):
            return point(p.alpha - p.d0 / p.d1)

        def pick(flag, a, b):
            return jax.tree_util.tree_map(lambda x, y: jnp.where(flag, x, y), a, b)

        p0 = point(jnp.zeros((), f))
        p1 = newton(p0)
        direction = jnp.where(p1.d0 < 0, 1, -1).astype(f)
        converged = (jnp.abs(p1.d0) < gtol) & ((p1.alpha == 0) | (p1.cost < 0))
        tiny = snorm < minval
        ONESIDED, BRACKET, DONE = 0, 1, 2
        state = dict(phase=jnp.where(tiny | converged, DONE, ONESIDED), evals=jnp.int32(2), p1=p1, p2=p0,
                     p1next=p1, p2next=p1, alpha=jnp.where(tiny, 0, p1.alpha).astype(f),
                     gain=jnp.where(tiny, 0, -p1.cost).astype(f))

        def onesided(s):
            p1 = s["p1"]
            moving = (p1.d0 * direction <= -gtol) & (s["evals"] < ls_max)
            nxt = newton(p1)  # the next Newton point: p1's successor, or the bracket's p1next
            done_here = moving & (jnp.abs(nxt.d0) < gtol) & (nxt.cost < 0)
            out_of_evals = ~moving & (s["evals"] >= ls_max)
            s2 = dict(s)
            s2["p2"] = pick(moving, p1, s["p2"])
            s2["p1"] = pick(moving, nxt, p1)
            s2["p1next"] = pick(moving, s["p1next"], nxt)
            s2["p2next"] = pick(moving, s["p2next"], p1)
            s2["evals"] = jnp.where(out_of_evals, s["evals"], s["evals"] + 1)
            finish = done_here | out_of_evals
            s2["phase"] = jnp.where(finish, DONE, jnp.where(moving, ONESIDED, BRACKET))
            s2["alpha"] = jnp.where(done_here, nxt.alpha, jnp.where(out_of_evals, p1.alpha, s["alpha"]))
            s2["gain"] = jnp.where(done_here, -nxt.cost, jnp.where(out_of_evals, -p1.cost, s["gain"]))
            return s2

        def bracket_update(p, candidates):
            flag = jnp.bool_(False)
            for c in candidates:
                better = ((p.d0 < 0) & (c.d0 < 0) & (p.d0 < c.d0)) | ((p.d0 > 0) & (c.d0 > 0) & (p.d0 > c.d0))
                p = pick(better, c, p)
                flag = flag | better
            return p, flag

        def bracketed(s):
            p1, p2 = s["p1"], s["p2"]
            exhausted = s["evals"] >= ls_max
            mid = point(0.5 * (p1.alpha + p2.alpha))
            candidates = (s["p1next"], s["p2next"], mid)
            best_cost, best_alpha, found = jnp.asarray(0, f), jnp.asarray(0, f), jnp.bool_(False)
            for c in candidates:
                take = (jnp.abs(c.d0) < gtol) & (~found | (c.cost < best_cost))
                best_cost, best_alpha = jnp.where(take, c.cost, best_cost), jnp.where(take, c.alpha, best_alpha)
                found = found | take
            n1, b1 = bracket_update(p1, candidates)
            n2, b2 = bracket_update(p2, candidates)
            n1next, n2next = newton(n1), newton(n2)
            stuck = ~found & ~b1 & ~b2
            # evaluations run out: the better bracket end if it lowers the cost, else no step
            end1 = (p1.cost <= p2.cost) & (p1.cost < 0)
            end2 = ~end1 & (p2.cost <= p1.cost) & (p2.cost < 0)
            final_alpha = jnp.where(end1, p1.alpha, jnp.where(end2, p2.alpha, 0))
            final_gain = jnp.where(end1, -p1.cost, jnp.where(end2, -p2.cost, 0))
            s2 = dict(s)
            s2["p1"], s2["p2"] = pick(exhausted, p1, n1), pick(exhausted, p2, n2)
            s2["p1next"] = pick(~exhausted & b1, n1next, s["p1next"])
            s2["p2next"] = pick(~exhausted & b2, n2next, s["p2next"])
            s2["evals"] = s["evals"] + jnp.where(exhausted, 0, 1 + b1.astype(jnp.int32) + b2.astype(jnp.int32))
            s2["phase"] = jnp.where(exhausted | found | stuck, DONE, BRACKET)
            s2["alpha"] = jnp.where(exhausted, final_alpha, jnp.where(found, best_alpha, jnp.where(stuck, mid.alpha, 0)))
            s2["gain"] = jnp.where(exhausted, final_gain, jnp.where(found, -best_cost, jnp.where(stuck, -mid.cost, 0)))
            return s2

        state = jax.lax.while_loop(lambda s: s["phase"] != DONE,
                                   lambda s: jax.lax.cond(s["phase"] == ONESIDED, onesided, bracketed, s), state)
        return state["alpha"], state["gain"], mv, jv

    ma, jaref = M @ qacc, J @ qacc - aref
    force, qfrc_constraint, grad, mgrad = update(qacc, ma, jaref)
    # no constraint row at all (MJX keeps zero rows for inactive contacts and limits): C has nefc = 0 and
    # takes qacc_smooth without solving
    rows = jnp.any(J != 0)
    gradient_small = scale * jnp.linalg.norm(grad) < tol
    # M^-1 grad through the factor fwd_position made (C's qLD)
    gap = jnp.maximum(0, 0.5 * scale * jnp.dot(grad, smooth.solve_m(m, d, grad))) < tol
    decrement = jnp.maximum(0, 0.5 * scale * jnp.dot(grad, mgrad)) < tol
    done = (gradient_small & (gap | decrement)) | ~rows
    solve_state = dict(qacc=qacc, ma=ma, jaref=jaref, force=force, qfrc_constraint=qfrc_constraint, grad=grad,
                       mgrad=mgrad, done=done, iteration=jnp.int32(0))

    def iterate(s):
        search = -s["mgrad"]
        alpha, gain, mv, jv = search_line(s["qacc"], s["ma"], s["jaref"], search)
        moved = alpha != 0
        qacc, ma, jaref = s["qacc"] + alpha * search, s["ma"] + alpha * mv, s["jaref"] + alpha * jv
        force, qfrc_constraint, grad, mgrad = update(qacc, ma, jaref)
        improvement = scale * gain
        stop = ((improvement > 0) & (improvement < tol)) | (scale * jnp.linalg.norm(grad) < tol) \
            | (jnp.maximum(0, 0.5 * scale * jnp.dot(grad, mgrad)) < tol)
        new = dict(qacc=qacc, ma=ma, jaref=jaref, force=force, qfrc_constraint=qfrc_constraint, grad=grad,
                   mgrad=mgrad, done=stop, iteration=s["iteration"] + 1)
        return jax.tree_util.tree_map(lambda x, y: jnp.where(moved, x, y), new, dict(s, done=jnp.bool_(True)))

    solve_state = jax.lax.while_loop(lambda s: ~s["done"] & (s["iteration"] < max_iter), iterate, solve_state)
    zero = jnp.zeros_like
    return d.tree_replace({"qacc": jnp.where(rows, solve_state["qacc"], qacc_smooth),
                           "qfrc_constraint": jnp.where(rows, solve_state["qfrc_constraint"], zero(qacc_smooth)),
                           "_impl.efc_force": jnp.where(rows, solve_state["force"], zero(D))})


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
