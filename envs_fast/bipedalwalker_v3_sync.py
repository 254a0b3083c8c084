"""State sync of the Rust BipedalWalker-v3 (`bipedalwalker_v3.rs`) with gymnasium's BipedalWalker
(pybox2d 2.3): the state in the order of its `autorl_state_fields`.

What pybox2d lets us read, and what it does not:
- bodies: sweep centre and angle, velocities, awake flag (exact, float32 values);
- joints: the accumulated impulses through GetReactionForce/Torque(1.0) and GetMotorTorque(1.0)
  (1.0 * impulse in float32 is exact); the limit state is derived from the sign of impulse.z;
- contacts: b2World's contact list in its real order (pybox2d's `contacts` is reversed),
  manifolds with their feature ids and warm-start impulses, touching/enabled flags;
- broad-phase: pybox2d exposes neither the fixtures' proxy ids nor the tree. Edge proxy ids are
  found by matching each edge's (static, exactly computable) fat AABB against
  broadPhase.GetFatAABB(id) over the tree's nodes; a walker body's proxy is the smallest node that
  is not an edge's and contains the body's swept AABB (its leaf; its ancestors are larger);
- NOT readable: each body's sleep timer (m_sleepTime). It is reconstructed as 0 (the value
  whenever a body moves faster than Box2D's sleep tolerances, i.e. in nearly every state); a state
  where a walker has stood still for a while may fall asleep one step later in the reference.

Writing back (`state_to_reference`) can set terrain (the world's edges are rebuilt in gymnasium's
order when the heights differ), body transforms and velocities, flags and prev_shaping, and the
impulses of contacts the reference already has with the same points. It cannot write joint
impulses, create contacts, or choose proxy ids: verification therefore steps both sides from
`state_from_reference` read back after `state_to_reference` (what the reference really holds).
"""
from __future__ import annotations

import math

import numpy as np

TERRAIN_LENGTH = 200
EDGES = TERRAIN_LENGTH - 1
MAX_CONTACTS = 48
BODY_FIELDS = 13
CONTACT_FIELDS = 20
HEADER = 5
O_BODY = HEADER
O_JOINT = O_BODY + 5 * BODY_FIELDS
O_TERRAIN = O_JOINT + 4 * 4
O_EDGE_PROXY = O_TERRAIN + TERRAIN_LENGTH
O_CONTACT = O_EDGE_PROXY + EDGES
STATE_SIZE = O_CONTACT + MAX_CONTACTS * CONTACT_FIELDS

F32 = np.float32
AABB_EXTENSION = F32(0.1)


def _bodies(u):
    return [u.hull, u.legs[0], u.legs[1], u.legs[2], u.legs[3]]


def _aabb(box) -> tuple:
    return (F32(box.lowerBound[0]), F32(box.lowerBound[1]), F32(box.upperBound[0]), F32(box.upperBound[1]))


def _node_capacity(broad_phase) -> int:
    """b2DynamicTree's node capacity: 16 doubled until it held every node (2 per proxy - 1)."""
    capacity = 16
    while capacity < 2 * broad_phase.proxyCount - 1:
        capacity *= 2
    return capacity


def _segment(edge_body) -> int:
    """The terrain segment an edge body holds: its first vertex is at x = i * TERRAIN_STEP."""
    return int(round(edge_body.fixtures[0].shape.vertices[0][0] / (14 / 30.0)))


def _edge_index(u) -> dict:
    """terrain body -> the index of its segment (gymnasium creates segment i as the i-th edge body
    and then reverses self.terrain)."""
    return {id(body): EDGES - 1 - k for k, body in enumerate(u.terrain)}


def _contact_list(u):
    """b2World's contact list in its real order, head first (pybox2d's `contacts` reverses it)."""
    return list(reversed(u.world.contacts))


def proxies(u):
    """(edge proxy ids in segment order, the 5 walker bodies' (proxy id, fat AABB))."""
    bp = u.world.contactManager.broadPhase
    nodes = {}
    for node in range(_node_capacity(bp)):
        nodes[node] = _aabb(bp.GetFatAABB(node))
    by_box: dict = {}
    for node, box in nodes.items():
        by_box.setdefault(box, []).append(node)
    edge_ids = [0] * EDGES
    order = _edge_index(u)
    for body in u.terrain:
        tight = _aabb(body.fixtures[0].GetAABB(0))
        fat = (tight[0] - AABB_EXTENSION, tight[1] - AABB_EXTENSION, tight[2] + AABB_EXTENSION, tight[3] + AABB_EXTENSION)
        edge_ids[order[id(body)]] = by_box.get(fat, [-1])[0]
    taken = set(edge_ids)
    walker = []
    for body in _bodies(u):
        tight = _aabb(body.fixtures[0].GetAABB(0))
        best = None
        for node, box in nodes.items():
            if node in taken:
                continue
            if box[0] <= tight[0] and box[1] <= tight[1] and tight[2] <= box[2] and tight[3] <= box[3]:
                area = (float(box[2]) - float(box[0])) * (float(box[3]) - float(box[1]))
                if best is None or area < best[0]:
                    best = (area, node, box)
        if best is None:
            walker.append((-1, tuple(float(v) for v in tight)))
        else:
            taken.add(best[1])
            walker.append((best[1], tuple(float(v) for v in best[2])))
    return edge_ids, walker


def state_from_reference(env):
    u = env.unwrapped
    s = [0.0] * STATE_SIZE
    s[0] = 1.0 if u.game_over else 0.0
    s[1] = 1.0 if u.legs[1].ground_contact else 0.0
    s[2] = 1.0 if u.legs[3].ground_contact else 0.0
    s[3] = float("nan") if u.prev_shaping is None else float(u.prev_shaping)
    edge_ids, walker = proxies(u)
    for b, body in enumerate(_bodies(u)):
        o = O_BODY + b * BODY_FIELDS
        c, v = body.worldCenter, body.linearVelocity
        s[o:o + 8] = [c[0], c[1], body.angle, v[0], v[1], body.angularVelocity, 1.0 if body.awake else 0.0, 0.0]
        proxy, fat = walker[b]
        s[o + 8:o + 12] = list(fat)
        s[o + 12] = float(proxy)
    for j, joint in enumerate(u.joints):
        o = O_JOINT + 4 * j
        force = joint.GetReactionForce(1.0)
        s[o:o + 4] = [force[0], force[1], joint.GetReactionTorque(1.0), joint.GetMotorTorque(1.0)]
    s[O_TERRAIN:O_TERRAIN + TERRAIN_LENGTH] = [float(y) for y in u.terrain_y]
    s[O_EDGE_PROXY:O_EDGE_PROXY + EDGES] = [float(p) for p in edge_ids]
    walker_bodies = _bodies(u)
    contacts = _contact_list(u)
    s[4] = float(len(contacts))
    for k, contact in enumerate(contacts[:MAX_CONTACTS]):
        o = O_CONTACT + k * CONTACT_FIELDS
        edge_body, body = contact.fixtureA.body, contact.fixtureB.body
        edge = _segment(edge_body)
        b = next(i for i, w in enumerate(walker_bodies) if w == body)
        m = contact.manifold
        s[o:o + 10] = [edge, b, 1.0 if contact.touching else 0.0, 1.0 if contact.enabled else 0.0, m.pointCount,
                       m.type_, m.localNormal[0], m.localNormal[1], m.localPoint[0], m.localPoint[1]]
        for p in range(m.pointCount):
            point = m.points[p]
            q = o + 10 + 5 * p
            s[q:q + 5] = [point.localPoint[0], point.localPoint[1], point.normalImpulse, point.tangentImpulse, point.id.key]
    return [float(v) for v in s]


def _rebuild_terrain(u, terrain_y) -> None:
    """Replace the world's edges by the segments of `terrain_y`, created as gymnasium creates them."""
    world = u.world
    listener = world.contactListener
    world.contactListener = None  # destroying touching contacts must not fire EndContact
    for body in u.terrain:
        world.DestroyBody(body)
    u.terrain = []
    u.terrain_y = [float(y) for y in terrain_y]
    u.terrain_x = [i * (14 / 30.0) for i in range(TERRAIN_LENGTH)]
    u.terrain_poly = []
    for i in range(EDGES):
        poly = [(u.terrain_x[i], u.terrain_y[i]), (u.terrain_x[i + 1], u.terrain_y[i + 1])]
        u.fd_edge.shape.vertices = poly
        body = world.CreateStaticBody(fixtures=u.fd_edge)
        body.color1 = body.color2 = (76, 255, 76)
        u.terrain.append(body)
        u.terrain_poly.append((poly + [(poly[1][0], 0), (poly[0][0], 0)], (102, 153, 76)))
    u.terrain.reverse()
    u.drawlist = u.terrain + u.legs + [u.hull]
    world.contactListener = listener


def state_to_reference(state, env) -> None:
    u = env.unwrapped
    s = [float(v) for v in state]
    terrain_y = s[O_TERRAIN:O_TERRAIN + TERRAIN_LENGTH]
    if any(F32(a) != F32(b) for a, b in zip(terrain_y, u.terrain_y)):
        _rebuild_terrain(u, terrain_y)
    for b, body in enumerate(_bodies(u)):
        o = O_BODY + b * BODY_FIELDS
        cx, cy, angle = F32(s[o]), F32(s[o + 1]), F32(s[o + 2])
        lc = body.localCenter
        sin, cos = F32(math.sin(angle)), F32(math.cos(angle))  # b2Rot::Set in float32
        position = (float(cx - (cos * F32(lc[0]) - sin * F32(lc[1]))), float(cy - (sin * F32(lc[0]) + cos * F32(lc[1]))))
        body.transform = (position, float(angle))
        body.linearVelocity = (s[o + 3], s[o + 4])
        body.angularVelocity = s[o + 5]
        body.awake = bool(s[o + 6])
    u.game_over = bool(s[0])
    u.legs[1].ground_contact = bool(s[1])
    u.legs[3].ground_contact = bool(s[2])
    u.prev_shaping = None if math.isnan(s[3]) else s[3]
    # warm-start impulses of contacts that exist on both sides with the same points
    walker_bodies = _bodies(u)
    wanted = {}
    for k in range(min(int(s[4]), MAX_CONTACTS)):
        o = O_CONTACT + k * CONTACT_FIELDS
        wanted[(int(s[o]), int(s[o + 1]))] = s[o:o + CONTACT_FIELDS]
    for contact in _contact_list(u):
        edge = _segment(contact.fixtureA.body)
        b = next(i for i, w in enumerate(walker_bodies) if w == contact.fixtureB.body)
        row = wanted.get((edge, b))
        m = contact.manifold
        if row is None or int(row[4]) != m.pointCount:
            continue
        for p in range(m.pointCount):
            if int(row[14 + 5 * p]) == m.points[p].id.key:
                m.points[p].normalImpulse = row[12 + 5 * p]
                m.points[p].tangentImpulse = row[13 + 5 * p]
