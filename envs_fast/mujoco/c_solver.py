"""C MuJoCo 4.0's constraint solve over MJX's data (`c_solve`): C's warm start choice, stopping rules
and line search, where MJX 3.17's solver stops elsewhere; and the Cholesky steps it shares with C
(`chol_factor`, `chol_solve`). mjx_c_engine.py puts it into mjx.forward and mjx.step."""
from __future__ import annotations

import collections

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
