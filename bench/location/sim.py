#!/usr/bin/env python3
"""BLE advert trace simulator for the zone engine benchmark.

    python3 bench/location/sim.py --scenario office --seed 1 --out OUT [--minutes 30]
    python3 bench/location/sim.py --scenario throughput --seed 1 --out OUT [--adverts 3000000]
    python3 bench/location/sim.py --scenario office --seed 1 --out OUT --survey
    python3 bench/location/sim.py --list

Writes OUT/site.toml, OUT/devices.csv, OUT/trace.jsonl, OUT/truth.jsonl and OUT/tags.json.
Scenario parameters live in scenarios.json next to this file; README.md describes the model.
The same scenario, seed and duration always give the same files. Python standard library only.
"""

import argparse
import bisect
import heapq
import json
import math
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCENARIOS_FILE = os.path.join(HERE, "scenarios.json")

CELL_M = 0.25  # grid of the cached mean path gain
CHUNK_S = 30.0  # adverts are generated, sorted and written in chunks of this many seconds
TRUTH_STEP_S = 0.1  # walking positions are sampled at 10 Hz for the truth
SITE_UUID = "f7826da6-4fa2-4e98-8024-bc5b71e0893e"
SITE_NAMESPACE = "edd1ebeac04e5defa017"
APPLE, MICROSOFT, SAMSUNG, NORDIC = "004c", "0006", "0075", "0059"
EDDYSTONE = "feaa"
SURVEY_DEVICE = "9/9/1"  # the survey tag's deviceaddress
MEAN_DB_EXP1 = -2.5066  # E[10 log10 X] for X ~ Exp(1) (Rayleigh power)


# ---------------------------------------------------------------- parameters

def load_config(path=None):
    with open(path or SCENARIOS_FILE) as f:
        return json.load(f)


def merge(base, over):
    """Objects merge key by key; anything else (lists, numbers, null) replaces."""
    if not isinstance(base, dict) or not isinstance(over, dict):
        return over
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(base.get(k), v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


def scenario_params(config, name):
    if name not in config["scenarios"]:
        raise SystemExit(f"unknown scenario {name!r}; known: {', '.join(config['scenarios'])}")
    return merge(config["defaults"], config["scenarios"][name])


def stream(name, seed, what):
    """An independent random stream per (scenario, seed, purpose), stable across Python runs."""
    return random.Random(f"{name}|{seed}|{what}")


def lognormal(rng, median_sigma):
    median, sigma = median_sigma
    return median * math.exp(rng.gauss(0.0, sigma))


# ---------------------------------------------------------------- geometry

class Space:
    def __init__(self, d, level):
        self.name = d["name"]
        self.zone = d["zone"]
        self.floor = d["floor"]
        self.level = level
        self.x0, self.y0, self.x1, self.y1 = (float(v) for v in d["rect"])

    def contains(self, x, y):
        return self.x0 <= x < self.x1 and self.y0 <= y < self.y1

    def clamp(self, x, y, margin):
        m = min(margin, (self.x1 - self.x0) / 2 - 0.05, (self.y1 - self.y0) / 2 - 0.05)
        return min(max(x, self.x0 + m), self.x1 - m), min(max(y, self.y0 + m), self.y1 - m)

    def random_point(self, rng, margin=0.4):
        return (rng.uniform(self.x0 + margin, self.x1 - margin), rng.uniform(self.y0 + margin, self.y1 - margin))


class Link:
    """A doorway (or the stairs) between two spaces, with a walking point on each side."""

    def __init__(self, a, b, pa, pb, cost, seconds=None, door=None):
        self.a, self.b = a, b  # space names ("outside" for the street)
        self.pa, self.pb = pa, pb  # (x, y) just inside a, just inside b
        self.cost = cost  # metres-equivalent for path planning
        self.seconds = seconds  # fixed traversal time (stairs) or None
        self.door = door  # (orient, coord, centre along wall, width) for doorways


class Layout:
    def __init__(self, d, rng, radio):
        self.floor_h = float(d["floor_height_m"])
        self.floors = d["floors"]
        level_of = {f["id"]: f["level"] for f in self.floors}
        self.levels = sorted(level_of.values())
        self.spaces = [Space(s, level_of[s["floor"]]) for s in d["spaces"]]
        self.by_name = {s.name: s for s in self.spaces}
        self.homes = d["homes"]
        self.visitor_homes = d["visitor_homes"]
        self.corridors = d["corridors"]
        self.visits = d["visits"]
        self.links = []
        for door in d["doors"]:
            self.links.append(self._door(door))
        for st in d.get("stairs", []):
            a, b = st["between"]
            self.links.append(Link(a, b, tuple(st["from"]), tuple(st["to"]), 1.2 * st["seconds"], seconds=st["seconds"]))
        self.links_of = {}
        for ln in self.links:
            self.links_of.setdefault(ln.a, []).append(ln)
            self.links_of.setdefault(ln.b, []).append(ln)
        wl = radio["wall_loss_db"]
        self.walls = {lv: self._walls(lv, rng, wl, radio["exterior_wall_loss_db"]) for lv in self.levels}
        xs = [s.x0 for s in self.spaces] + [s.x1 for s in self.spaces]
        ys = [s.y0 for s in self.spaces] + [s.y1 for s in self.spaces]
        self.bbox = (min(xs), min(ys), max(xs), max(ys))

    def _door(self, door):
        a, b = door["between"]
        x, y = (float(v) for v in door["at"])
        w = float(door["width"])
        sa = self.by_name[a]
        if abs(y - sa.y0) < 1e-6 or abs(y - sa.y1) < 1e-6:
            orient, coord, along = "h", y, x
            inward = 1.0 if abs(y - sa.y0) < 1e-6 else -1.0  # +y goes into a at its bottom edge
            pa, pb = (x, y + 0.4 * inward), (x, y - 0.4 * inward)
        else:
            orient, coord, along = "v", x, y
            inward = 1.0 if abs(x - sa.x0) < 1e-6 else -1.0
            pa, pb = (x + 0.4 * inward, y), (x - 0.4 * inward, y)
        return Link(a, b, pa, pb, 0.8, door=(orient, coord, along, w, sa.level))

    def _walls(self, level, rng, wall_loss, exterior_loss):
        """Wall pieces of one floor: every rectangle edge, split where neighbours change, with
        the doorway gaps cut out. A piece with a space on one side only is exterior."""
        lines = {}
        for s in self.spaces:
            if s.level != level:
                continue
            for orient, c, a, b in (("h", s.y0, s.x0, s.x1), ("h", s.y1, s.x0, s.x1),
                                    ("v", s.x0, s.y0, s.y1), ("v", s.x1, s.y0, s.y1)):
                lines.setdefault((orient, round(c, 3)), []).append((a, b))
        gaps = {}
        for ln in self.links:
            if ln.door and ln.door[4] == level:
                orient, c, along, w, _ = ln.door
                gaps.setdefault((orient, round(c, 3)), []).append((along - w / 2, along + w / 2))
        walls = []
        for key in sorted(lines):
            edges = lines[key]
            cuts = sorted({p for e in edges for p in e} | {p for g in gaps.get(key, []) for p in g})
            for p, q in zip(cuts, cuts[1:]):
                if q - p < 1e-6:
                    continue
                mid = (p + q) / 2
                n = sum(1 for a, b in edges if a <= mid <= b)
                if n == 0 or any(a <= mid <= b for a, b in gaps.get(key, [])):
                    continue
                loss = exterior_loss if n == 1 else rng.uniform(*wall_loss)
                walls.append((key[0], key[1], p, q, loss))
        # merge neighbouring pieces of equal loss on one line
        merged = []
        for w in walls:
            if merged and merged[-1][0] == w[0] and merged[-1][1] == w[1] and abs(merged[-1][3] - w[2]) < 1e-9 \
                    and merged[-1][4] == w[4]:
                merged[-1] = (w[0], w[1], merged[-1][2], w[3], w[4])
            else:
                merged.append(w)
        return merged

    def wall_loss(self, level, x0, y0, x1, y1):
        """Total wall loss (dB) and number of walls on the straight line, on one floor's plan."""
        loss, n = 0.0, 0
        for orient, c, a, b, l in self.walls.get(level, ()):
            if orient == "h":
                if (y0 - c) * (y1 - c) < 0:
                    x = x0 + (c - y0) * (x1 - x0) / (y1 - y0)
                    if a <= x <= b:
                        loss += l
                        n += 1
            else:
                if (x0 - c) * (x1 - c) < 0:
                    y = y0 + (c - x0) * (y1 - y0) / (x1 - x0)
                    if a <= y <= b:
                        loss += l
                        n += 1
        return loss, n

    def level_of_z(self, z):
        lv = int(z // self.floor_h)
        return min(max(lv, self.levels[0]), self.levels[-1])

    def space_at(self, x, y, level):
        for s in self.spaces:
            if s.level == level and s.contains(x, y):
                return s
        return None

    def zone_at(self, x, y, z):
        s = self.space_at(x, y, self.level_of_z(z))
        return s.zone if s else None

    # -- path planning over doorways (all spaces are rectangles, so straight lines inside one
    #    space stay inside it)
    def route(self, sa, pa, sb, pb):
        """Waypoints [(space, x, y, link_or_None)] from point pa in space sa to pb in sb."""
        if sa == sb:
            return [(sa, pa[0], pa[1], None), (sb, pb[0], pb[1], None)]
        # nodes: 0 start, 1 goal, then 2 per link (side a, side b)
        nodes = [(sa, pa), (sb, pb)]
        for ln in self.links:
            nodes.append((ln.a, ln.pa))
            nodes.append((ln.b, ln.pb))
        dist = {0: 0.0}
        prev = {}
        heap = [(0.0, 0)]
        done = set()
        while heap:
            d, i = heapq.heappop(heap)
            if i in done:
                continue
            done.add(i)
            if i == 1:
                break
            sp, p = nodes[i]
            cand = []
            for j, (sq, q) in enumerate(nodes):
                if j != i and sq == sp and j not in done:
                    cand.append((j, math.hypot(q[0] - p[0], q[1] - p[1])))
            if i >= 2:
                k = (i - 2) // 2
                other = 2 + 2 * k + (1 - (i - 2) % 2)
                cand.append((other, self.links[k].cost))
            for j, c in cand:
                nd = d + c
                if nd < dist.get(j, 1e18):
                    dist[j] = nd
                    prev[j] = i
                    heapq.heappush(heap, (nd, j))
        if 1 not in prev:
            raise RuntimeError(f"no route from {sa} to {sb}")
        seq = [1]
        while seq[-1] != 0:
            seq.append(prev[seq[-1]])
        seq.reverse()
        out = []
        for idx, i in enumerate(seq):
            sp, p = nodes[i]
            link = None
            if idx + 1 < len(seq) and i >= 2 and seq[idx + 1] >= 2 and (i - 2) // 2 == (seq[idx + 1] - 2) // 2:
                link = self.links[(i - 2) // 2]
            out.append((sp, p[0], p[1], link))
        return out


def latlon(config, x, y):
    lat0, lon0 = config["origin"]
    lat = lat0 + y / 111320.0
    lon = lon0 + x / (111320.0 * math.cos(math.radians(lat0)))
    return f"{lat:.6f},{lon:.6f}"


# ---------------------------------------------------------------- people

class Trajectory:
    """Piecewise-linear positions: segments (t0, t1, x0, y0, z0, x1, y1, z1, fx, fy, present)."""

    def __init__(self):
        self.segs = []

    def add(self, t0, t1, a, b, present=True, facing=None):
        if t1 <= t0:
            return
        if facing is None:
            dx, dy = b[0] - a[0], b[1] - a[1]
            n = math.hypot(dx, dy)
            facing = (dx / n, dy / n) if n > 1e-9 else (1.0, 0.0)
        self.segs.append((t0, t1, a[0], a[1], a[2], b[0], b[1], b[2], facing[0], facing[1], present))


def switched_off(traj, a, b):
    """A copy of traj in which the tag sends nothing during [a, b) (truth: no zone)."""
    out = Trajectory()
    for seg in traj.segs:
        t0, t1 = seg[0], seg[1]
        cuts = [t0] + [c for c in (a, b) if t0 < c < t1] + [t1]
        for u0, u1 in zip(cuts, cuts[1:]):
            def at(u):
                f = (u - t0) / (t1 - t0)
                return (seg[2] + f * (seg[5] - seg[2]), seg[3] + f * (seg[6] - seg[3]), seg[4] + f * (seg[7] - seg[4]))
            off = a <= u0 and u1 <= b
            out.segs.append((u0, u1) + at(u0) + at(u1) + (seg[8], seg[9], seg[10] and not off))
    return out


class Person:
    def __init__(self, idx, visitor, home, desk):
        self.idx = idx
        self.visitor = visitor
        self.home = home
        self.desk = desk
        self.desk_boundary = False
        self.traj = Trajectory()  # where the person is
        self.tag_traj = self.traj  # where the tag advertises from (gaps while switched off)


class Planner:
    """Builds each person's day: dwell, walk along doorways, visit, leave and come back."""

    def __init__(self, layout, people_p, radio_p, rng, end_s):
        self.L = layout
        self.P = people_p
        self.rng = rng
        self.end = end_s
        self.tag_h = radio_p["tag_height_m"]
        self.entrances = [ln for ln in layout.links if ln.b == "outside" or ln.a == "outside"]

    def z(self, space):
        return self.L.by_name[space].level * self.L.floor_h + self.tag_h

    def boundary_point(self, space):
        """A point 0.2-1 m inside `space` next to a doorway or a wall shared with another zone."""
        rng, s = self.rng, self.L.by_name[space]
        lo, hi = self.P["boundary_m"]
        doors = [ln for ln in self.L.links_of.get(space, []) if ln.door and "outside" not in (ln.a, ln.b)]
        if doors and rng.random() < 0.5:
            ln = rng.choice(doors)
            orient, c, along, w, _ = ln.door
            d = rng.uniform(lo, hi)
            lat = rng.uniform(-0.9, 0.9)
            if orient == "h":
                sign = 1.0 if abs(c - s.y0) < 1e-6 else -1.0
                x, y = along + lat, c + sign * d
            else:
                sign = 1.0 if abs(c - s.x0) < 1e-6 else -1.0
                x, y = c + sign * d, along + lat
            return s.clamp(x, y, min(lo, 0.2))
        # a wall shared with another zone space on the same floor
        edges = []
        for o in self.L.spaces:
            if o is s or o.level != s.level or o.zone is None:
                continue
            for c, sign, ox in ((s.y0, 1.0, o.y1), (s.y1, -1.0, o.y0)):
                if abs(c - ox) < 1e-6:
                    a, b = max(s.x0, o.x0), min(s.x1, o.x1)
                    if b - a > 1.2:
                        edges.append(("h", c, sign, a + 0.5, b - 0.5))
            for c, sign, ox in ((s.x0, 1.0, o.x1), (s.x1, -1.0, o.x0)):
                if abs(c - ox) < 1e-6:
                    a, b = max(s.y0, o.y0), min(s.y1, o.y1)
                    if b - a > 1.2:
                        edges.append(("v", c, sign, a + 0.5, b - 0.5))
        if not edges:
            return s.random_point(rng)
        orient, c, sign, a, b = rng.choice(edges)
        d = rng.uniform(lo, hi)
        along = rng.uniform(a, b)
        x, y = (along, c + sign * d) if orient == "h" else (c + sign * d, along)
        return s.clamp(x, y, min(lo, 0.2))

    def dwell_point(self, space, boundary=False):
        if boundary:
            return self.boundary_point(space)
        return self.L.by_name[space].random_point(self.rng)

    def walk(self, person, t, space, p, to_space, q, speed):
        """Append a walk; returns the arrival time."""
        tr = person.traj
        pts = self.L.route(space, p, to_space, q)
        for (s0, x0, y0, link), (s1, x1, y1, _) in zip(pts, pts[1:]):
            a = (x0, y0, self.z(s0) if s0 != "outside" else self.tag_h)
            b = (x1, y1, self.z(s1) if s1 != "outside" else self.tag_h)
            dist = math.hypot(x1 - x0, y1 - y0)
            if link is not None and link.seconds:
                dt = link.seconds * self.rng.uniform(0.85, 1.2)
            else:
                dt = dist / speed
            if dt <= 0:
                continue
            tr.add(t, t + dt, a, b)
            t += dt
        return t

    def speed(self):
        v = self.P["speed_mps"] * math.exp(self.rng.gauss(0, self.P["speed_sigma"]))
        return min(max(v, 0.6), 2.0)

    def dwell(self, person, t, space, p, seconds, small_fidget=False):
        """Stay near p for `seconds`, shifting position now and then; returns (t, p)."""
        rng, tr = self.rng, person.traj
        s = self.L.by_name[space]
        z = self.z(space)
        end = min(t + seconds, self.end)
        facing_a = rng.uniform(0, 2 * math.pi)
        while t < end:
            stay = min(lognormal(rng, self.P["fidget_every_min"]) * 60.0, end - t)
            f = (math.cos(facing_a), math.sin(facing_a))
            tr.add(t, t + stay, (p[0], p[1], z), (p[0], p[1], z), facing=f)
            t += stay
            if t >= end:
                break
            lo, hi = self.P["fidget_m"]
            if small_fidget:
                lo, hi = lo * 0.5, min(hi, 0.3)
            step = rng.uniform(lo, hi)
            ang = rng.uniform(0, 2 * math.pi)
            margin = 0.15 if small_fidget else 0.4
            q = s.clamp(p[0] + step * math.cos(ang), p[1] + step * math.sin(ang), margin)
            if small_fidget:  # keep standing by the same wall or doorway
                q = ((p[0] + q[0]) / 2, (p[1] + q[1]) / 2)
            dt = math.hypot(q[0] - p[0], q[1] - p[1]) / 0.7
            if dt > 0:
                tr.add(t, min(t + dt, end), (p[0], p[1], z), (q[0], q[1], z))
            t += dt
            p = q
            facing_a += rng.gauss(0, 1.2)
        return t, p

    def outside_point(self, ln):
        """A point 6-12 m out from an entrance, where the person leaves radio range."""
        inside, outside_pt = (ln.pa, ln.pb) if ln.b == "outside" else (ln.pb, ln.pa)
        dx, dy = outside_pt[0] - inside[0], outside_pt[1] - inside[1]
        n = math.hypot(dx, dy)
        d = self.rng.uniform(6, 12)
        lat = self.rng.uniform(-4, 4)
        return (outside_pt[0] + dx / n * d - dy / n * lat, outside_pt[1] + dy / n * d + dx / n * lat)

    def go_away(self, person, t, space, p):
        """Walk out of the building and stay away; returns (t, space, p) after coming back in
        (at the building entrance) or at the end."""
        rng, tr = self.rng, person.traj
        ln = rng.choice(self.entrances)
        far = self.outside_point(ln)
        t = self.walk(person, t, space, p, "outside", far, self.speed())
        away = lognormal(rng, self.P["away_min"]) * 60.0
        z = self.tag_h
        tr.add(t, min(t + away, self.end), (far[0], far[1], z), (far[0], far[1], z), present=False)
        t += away
        return t, "outside", far

    def plan(self, person):
        rng, P, L = self.rng, self.P, self.L
        t = 0.0
        home = person.home
        first = rng.random() < P["present_at_start"]
        if first:
            space, p = home, person.desk
        else:
            ln = rng.choice(self.entrances)
            far = self.outside_point(ln)
            arrive = rng.uniform(0, P["arrival_spread_min"] * 60.0)
            person.traj.add(0.0, arrive, (far[0], far[1], self.tag_h), (far[0], far[1], self.tag_h), present=False)
            t, space, p = arrive, "outside", far
        while t < self.end:
            if space == "outside":
                t = self.walk(person, t, space, p, home, person.desk, self.speed())
                space, p = home, person.desk
            # dwell where we are
            if first and space == home:
                secs = lognormal(rng, P["home_dwell_min"]) * 60.0 * rng.random()
            elif space == home:
                boundary_home = person.desk_boundary
                secs = lognormal(rng, P["boundary_dwell_min"] if boundary_home else P["home_dwell_min"]) * 60.0
            else:
                secs = 0.0  # visits dwell when they arrive
            first = False
            if secs > 0:
                t, p = self.dwell(person, t, space, p, secs, small_fidget=(space == home and person.desk_boundary))
            if t >= self.end:
                break
            # next activity
            r = rng.random()
            if r < P["p_leave"] and not person.visitor:
                t, space, p = self.go_away(person, t, space, p)
                continue
            r -= P["p_leave"]
            if r < P["p_short_visit"]:
                dest = self.pick_visit(space)
                q = self.near_door_point(dest)
                t = self.walk(person, t, space, p, dest, q, self.speed())
                t, q = self.dwell(person, t, dest, q, rng.uniform(*P["short_visit_s"]))
                space, p = dest, q
                # then straight on to the next activity (usually back home)
                nxt = home if rng.random() < 0.6 else self.pick_visit(space)
                q2 = person.desk if nxt == home else self.dwell_point(nxt)
                t = self.walk(person, t, space, p, nxt, q2, self.speed())
                space, p = nxt, q2
                if nxt != home:
                    t, p = self.visit_dwell(person, t, nxt, p)
                continue
            r -= P["p_short_visit"]
            if r < P["p_pass_through"]:
                rooms = [n for n in L.by_name if len([ln for ln in L.links_of.get(n, []) if ln.door
                                                      and "outside" not in (ln.a, ln.b)]) >= 2
                         and n not in L.corridors and L.by_name[n].zone is not None]
                room = rng.choice(rooms)
                doors = [ln for ln in L.links_of[room] if ln.door and "outside" not in (ln.a, ln.b)]
                d1, d2 = rng.sample(doors, 2)
                in1 = d1.pa if d1.a == room else d1.pb
                in2 = d2.pa if d2.a == room else d2.pb
                t = self.walk(person, t, space, p, room, in1, self.speed())
                t = self.walk(person, t, room, in1, room, in2, self.speed())
                out_space = d2.b if d2.a == room else d2.a
                out_pt = d2.pb if d2.a == room else d2.pa
                t = self.walk(person, t, room, in2, out_space, out_pt, self.speed())
                space, p = out_space, out_pt
                if space == "outside":
                    t = self.walk(person, t, "outside", p, home, person.desk, self.speed())
                    space, p = home, person.desk
                continue
            r -= P["p_pass_through"]
            if r < P["p_corridor_stop"]:
                cor = self.nearest_corridor(space)
                boundary = rng.random() < 0.5 + 0.5 * P["boundary_fraction"]
                q = self.boundary_point(cor) if boundary else L.by_name[cor].random_point(rng, 0.5)
                t = self.walk(person, t, space, p, cor, q, self.speed())
                t, p = self.dwell(person, t, cor, q, lognormal(rng, P["corridor_stop_s"]), small_fidget=True)
                space = cor
                continue
            # a visit, or back home
            if space != home and rng.random() < 0.65:
                dest = home
            else:
                dest = self.pick_visit(space)
            q = person.desk if dest == home else None
            boundary = False
            if q is None:
                boundary = rng.random() < P["boundary_fraction"]
                q = self.dwell_point(dest, boundary)
            t = self.walk(person, t, space, p, dest, q, self.speed())
            space, p = dest, q
            if dest != home:
                t, p = self.visit_dwell(person, t, dest, p, boundary)
        return person.traj

    def visit_dwell(self, person, t, dest, p, boundary=False):
        med = self.L.visits.get(dest, {"dwell_min": [3, 0.8]})["dwell_min"]
        if boundary:
            med = self.P["boundary_dwell_min"]
        return self.dwell(person, t, dest, p, lognormal(self.rng, med) * 60.0, small_fidget=boundary)

    def pick_visit(self, current):
        names = [n for n in self.L.visits if n != current]
        weights = [self.L.visits[n]["weight"] for n in names]
        return self.rng.choices(names, weights)[0]

    def near_door_point(self, space):
        """A point 0.6-2.5 m inside a doorway of `space` (a quick look into a room)."""
        rng = self.rng
        s = self.L.by_name[space]
        doors = [ln for ln in self.L.links_of[space] if ln.door and "outside" not in (ln.a, ln.b)]
        ln = rng.choice(doors)
        orient, c, along, w, _ = ln.door
        d = rng.uniform(0.6, 2.5)
        if orient == "h":
            sign = 1.0 if abs(c - s.y0) < 1e-6 else -1.0
            x, y = along + rng.uniform(-0.5, 0.5), c + sign * d
        else:
            sign = 1.0 if abs(c - s.x0) < 1e-6 else -1.0
            x, y = c + sign * d, along + rng.uniform(-0.5, 0.5)
        return s.clamp(x, y, 0.3)

    def nearest_corridor(self, space):
        if space in self.L.corridors:
            return space
        s = self.L.by_name.get(space)
        for c in self.L.corridors:
            if s is not None and self.L.by_name[c].level == s.level:
                return c
        return self.L.corridors[0]


def truth_intervals(layout, traj, end_s):
    """[(t0, t1, zone)] merged, covering [0, end_s]; walking sampled at 10 Hz."""
    out = []

    def put(t, zone):
        if out and out[-1][2] == zone:
            return
        if out:
            out[-1][1] = t
        out.append([t, None, zone])

    t_prev = 0.0
    for (t0, t1, x0, y0, z0, x1, y1, z1, fx, fy, present) in traj.segs:
        if t0 >= end_s:
            break
        if t0 > t_prev + 1e-9:  # a gap (should not happen): nobody
            put(t_prev, None)
        if not present:
            put(t0, None)
        elif x0 == x1 and y0 == y1 and z0 == z1:
            put(t0, layout.zone_at(x0, y0, z0))
        else:
            put(t0, layout.zone_at(x0, y0, z0))
            k = math.floor(t0 / TRUTH_STEP_S) + 1
            dur = t1 - t0
            while k * TRUTH_STEP_S < min(t1, end_s):
                ts = k * TRUTH_STEP_S
                f = (ts - t0) / dur
                put(ts, layout.zone_at(x0 + f * (x1 - x0), y0 + f * (y1 - y0), z0 + f * (z1 - z0)))
                k += 1
        t_prev = t1
    if not out:
        out.append([0.0, None, None])
    if t_prev < end_s:
        put(t_prev, None)
    out[-1][1] = end_s
    return [(a, b, z) for a, b, z in out if b > a]


# ---------------------------------------------------------------- radio

class Receiver:
    def __init__(self, d, layout, idx):
        self.idx = idx
        self.id = d["id"]
        sp = layout.by_name[d["space"]]
        self.space = sp
        self.zone = sp.zone
        self.level = sp.level
        self.x, self.y = (float(v) for v in d["at"])
        self.z = sp.level * layout.floor_h + float(d["height"])
        self.offset = 0.0
        self.written_offset = 0
        self.silent = []  # [(t0, t1)] seconds
        self.bad_starts, self.bad_ends = [], []
        self.field = []  # static multipath: [(kx, ky, phase)]


class RadioMap:
    """Mean path gain (dB, without tag power and receiver offset) from a grid cell to every
    receiver in reach, with the unit vector towards it (for body loss) and line of sight."""

    def __init__(self, layout, receivers, radio):
        self.L = layout
        self.rx = receivers
        self.n = radio["path_loss_exponent"]
        self.floor_db = radio["floor_loss_db"]
        self.mp_amp = radio["multipath_db"] * math.sqrt(2.0 / 12)
        self.tag_h = radio["tag_height_m"]
        p1m_max = max(radio["tag_p1m_dbm"]) + 2 * radio["tag_p1m_error_db"]
        self.floor_gain = radio["sensitivity_dbm"] - (p1m_max + radio["receiver_offset_db"]
                                                      + 3 * radio["shadowing_db"] + 2 * radio["multipath_db"] + 8)
        self.cache = {}

    def links(self, x, y, z):
        ix, iy = math.floor(x / CELL_M), math.floor(y / CELL_M)
        key = (ix, iy, round(z, 1))
        v = self.cache.get(key)
        if v is None:
            v = self.cache[key] = self._compute((ix + 0.5) * CELL_M, (iy + 0.5) * CELL_M, z)
        return v

    def _compute(self, x, y, z):
        L = self.L
        level = L.level_of_z(z)
        out = []
        for r in self.rx:
            dx, dy, dz = r.x - x, r.y - y, r.z - z
            d2 = math.hypot(dx, dy)
            d = max(math.sqrt(d2 * d2 + dz * dz), 0.5)
            wall, nwalls = L.wall_loss(level, x, y, r.x, r.y)
            floors = abs(level - r.level)
            g = -10.0 * self.n * math.log10(d) - wall - floors * self.floor_db
            if self.mp_amp > 0:
                g += self.mp_amp * sum(math.cos(kx * x + ky * y + ph) for kx, ky, ph in r.field)
            if g < self.floor_gain:
                continue
            ux, uy = (dx / d2, dy / d2) if d2 > 0.05 else (0.0, 0.0)
            out.append((r.idx, g, ux, uy, nwalls == 0 and floors == 0))
        return tuple(out)


def rician_mean_db(k_lin, rng):
    mu, sc = math.sqrt(k_lin / (k_lin + 1)), math.sqrt(1 / (2 * (k_lin + 1)))
    s = 0.0
    n = 20000
    for _ in range(n):
        re = mu + sc * rng.gauss(0, 1)
        im = sc * rng.gauss(0, 1)
        s += 10 * math.log10(max(re * re + im * im, 1e-12))
    return s / n


class Emitter:
    """Anything that advertises: a tracked tag, a foreign beacon or a phone."""

    def __init__(self, kind, interval_ms, p1m_true, traj=None, static=None, body=True):
        self.kind = kind
        self.interval_ms = interval_ms
        self.p1m = p1m_true
        self.traj = traj
        self.static = static  # (x, y, z) when it does not move
        self.seg_i = 0
        self.next_t = 0.0  # seconds
        self.count = 0
        self.body = body
        self.macs = []  # [(from_s, "AA:..")]
        self.mac_i = 0
        self.payload = None  # function (emitter, t) -> ',"mfg":{...}' text
        self.sh_val = {}
        self.sh_t = {}
        self.static_links = None
        self.jitter_s = 0.010

    def mac_at(self, t):
        while self.mac_i + 1 < len(self.macs) and self.macs[self.mac_i + 1][0] <= t:
            self.mac_i += 1
        return self.macs[self.mac_i][1]


def random_mac(rng, kind="static"):
    b = [rng.randrange(256) for _ in range(6)]
    if kind == "static":  # random static address: top bits 11
        b[0] |= 0xC0
    elif kind == "rpa":  # resolvable private address: top bits 01
        b[0] = (b[0] & 0x3F) | 0x40
    else:  # public (a vendor OUI)
        b[0] &= 0xFC
    return ":".join(f"{v:02X}" for v in b)


def hexs(rng, n):
    return "".join(f"{rng.randrange(256):02x}" for _ in range(n))


def i8(v):
    return f"{int(v) & 0xFF:02x}"


# ---------------------------------------------------------------- the generator

def build_site(config, P, name, seed):
    """The layout and its receivers (hardware offset, static multipath field) of one seed."""
    radio = P["radio"]
    rng_site = stream(name, seed, "site")
    layout = Layout(config["layouts"][P["layout"]], rng_site, radio)
    receivers = [Receiver(d, layout, i) for i, d in enumerate(config["layouts"][P["layout"]]["receivers"])]
    for r in receivers:
        r.offset = rng_site.uniform(-radio["receiver_offset_db"], radio["receiver_offset_db"])
        r.written_offset = int(round(-r.offset)) if radio["calibration"] == "known" else 0
        lo, hi = radio["multipath_wavelength_m"]
        for _ in range(12):
            k = 2 * math.pi / rng_site.uniform(lo, hi)
            a = rng_site.uniform(0, 2 * math.pi)
            r.field.append((k * math.cos(a), k * math.sin(a), rng_site.uniform(0, 2 * math.pi)))
    return layout, receivers


def add_bursts(receivers, burst, rng, dur_s):
    """Bursty reception: alternating good and bad spells per receiver."""
    if not burst:
        return
    for r in receivers:
        t = rng.expovariate(1.0 / burst["mean_good_s"])
        while t < dur_s + 60:
            b = rng.expovariate(1.0 / burst["mean_bad_s"])
            r.bad_starts.append(t)
            r.bad_ends.append(t + b)
            t += b + rng.expovariate(1.0 / burst["mean_good_s"])


def survey(name, seed, out, config=None, log=None):
    """A site survey of one scenario's site (same layout, receivers, offsets and multipath as
    `generate` for the seed): one person carries a survey tag through every zone in turn,
    walking slowly between random points of it with pauses (longer in larger zones), under the scenario's radio and
    loss (no receiver outages). Writes OUT/site.toml, OUT/devices.csv, OUT/survey.jsonl and
    OUT/marks.csv (zoneid,from_ms,until_ms: the time spent inside each zone's space)."""
    config = config or load_config()
    P = scenario_params(config, name)
    S = config["survey"]
    radio, loss_p = P["radio"], P["loss"]
    start_ms = int(config["start_ms"]) - 86_400_000
    os.makedirs(out, exist_ok=True)
    layout, receivers = build_site(config, P, name, seed)
    rng = stream(name, seed, "survey")
    spaces = [sp for sp in layout.spaces if sp.zone is not None]
    def seconds(sp):  # longer for larger zones, so that the walk covers them
        return max(S["seconds_min"], S["seconds_per_m2"] * (sp.x1 - sp.x0) * (sp.y1 - sp.y0))
    dur_guess = sum(seconds(sp) + 60 for sp in spaces) + 60
    add_bursts(receivers, loss_p.get("burst"), stream(name, seed, "survey-outages"), dur_guess)
    rmap = RadioMap(layout, receivers, radio)
    planner = Planner(layout, P["people"], radio, rng, dur_guess)
    person = Person(0, False, spaces[0].name, None)
    marks = []
    t, space, p = 0.0, spaces[0].name, spaces[0].random_point(rng)
    for sp in spaces:
        q = sp.random_point(rng)
        t = planner.walk(person, t, space, p, sp.name, q, S["walk_speed_mps"])
        space, p = sp.name, q
        z = planner.z(sp.name)
        entered, end = t, t + seconds(sp)
        while t < end:
            pause = rng.uniform(*S["pause_s"])
            person.traj.add(t, t + pause, (p[0], p[1], z), (p[0], p[1], z),
                            facing=(math.cos(a := rng.uniform(0, 2 * math.pi)), math.sin(a)))
            t += pause
            q = sp.random_point(rng)
            dt = math.hypot(q[0] - p[0], q[1] - p[1]) / S["walk_speed_mps"]
            person.traj.add(t, t + dt, (p[0], p[1], z), (q[0], q[1], z))
            t += dt
            p = q
        marks.append((sp.zone, start_ms + int(entered * 1000), start_ms + int(t * 1000)))
    dur_s = t + 1.0
    interval = S["interval_ms"]
    p1m_adv = rng.choice(radio["tag_p1m_dbm"])
    e = Emitter("tag", interval, p1m_adv + rng.gauss(0, radio["tag_p1m_error_db"]), traj=person.traj, body=True)
    e.next_t = rng.uniform(0, interval / 1000.0)
    e.macs.append((0.0, random_mac(rng, "static")))
    minor = 999
    frame = "0215" + SITE_UUID.replace("-", "") + f"{9:04x}{minor:04x}" + i8(p1m_adv)
    text = f',"mfg":{{"{APPLE}":"{frame}"}}'
    e.payload = lambda em, t: text
    write_site(os.path.join(out, "site.toml"), config, name, seed, layout, receivers)
    with open(os.path.join(out, "devices.csv"), "w") as f:
        f.write("deviceaddress,deviceid,label,tagtype,beacon,contactid\n")
        f.write(f"{SURVEY_DEVICE},9.9.1,Survey tag,1,ibeacon:{SITE_UUID}/9/{minor},\n")
    with open(os.path.join(out, "marks.csv"), "w") as f:
        f.write("zoneid,from,until\n")
        for zone, a, b in marks:
            f.write(f"{zone},{a},{b}\n")
    n_lines, _ = run_radio(os.path.join(out, "survey.jsonl"), [e], receivers, rmap, radio, loss_p,
                           stream(name, seed, "survey-radio"), start_ms, dur_s)
    summary = {"scenario": name, "seed": seed, "survey_adverts": n_lines, "survey_minutes": round(dur_s / 60.0, 2)}
    if log:
        log(summary)
    return summary


def generate(name, seed, out, minutes=None, adverts=None, config=None, log=None):
    """Writes the five files of one scenario run into `out`; returns a summary dict."""
    t_start = time.time()
    config = config or load_config()
    P = scenario_params(config, name)
    radio, loss_p, tags_p, people_p = P["radio"], P["loss"], P["tags"], P["people"]
    start_ms = int(config["start_ms"])
    if adverts is None and P.get("adverts") and minutes is None:
        adverts = int(P["adverts"])
    dur_s = float(minutes if minutes is not None else P["minutes"]) * 60.0
    os.makedirs(out, exist_ok=True)

    layout, receivers = build_site(config, P, name, seed)
    rng_out = stream(name, seed, "outages")
    if P.get("silent"):
        sp = P["silent"]
        room_rx = [r for r in receivers if r.space.name not in layout.corridors]
        for r in rng_out.sample(room_rx, sp["count"]):
            t0 = rng_out.uniform(*sp["start_fraction"]) * dur_s
            r.silent.append((t0, t0 + rng_out.uniform(*sp["duration_min"]) * 60.0))
    add_bursts(receivers, loss_p.get("burst"), rng_out, dur_s)
    rmap = RadioMap(layout, receivers, radio)

    # people and their tags
    rng_people = stream(name, seed, "people")
    planner = Planner(layout, people_p, radio, rng_people, dur_s)
    people = []
    n_tags, n_vis = tags_p["count"], tags_p["visitors"]
    for i in range(n_tags):
        visitor = i >= n_tags - n_vis
        home = rng_people.choice(layout.visitor_homes if visitor else layout.homes)
        boundary_desk = rng_people.random() < people_p["boundary_fraction"]
        person = Person(i, visitor, home, None)
        person.desk_boundary = boundary_desk
        person.desk = planner.dwell_point(home, boundary_desk)
        people.append(person)
    off = people_p.get("tag_off")
    for person in people:
        planner.plan(person)
        person.tag_traj = person.traj
        if off and rng_people.random() < off["fraction"]:
            a = rng_people.uniform(*off["start_fraction"]) * dur_s
            person.tag_traj = switched_off(person.traj, a, a + rng_people.uniform(*off["minutes"]) * 60.0)

    rng_tags = stream(name, seed, "tags")
    emitters = []
    devices = []
    tag_macs = {}
    fmt_names = list(tags_p["formats"])
    fmt_weights = [tags_p["formats"][k] for k in fmt_names]
    rot = tags_p.get("mac_rotation")
    for person in people:
        n = person.idx + 1
        fmt = rng_tags.choices(fmt_names, fmt_weights)[0]
        interval = rng_tags.choice(tags_p["interval_ms"])
        p1m_adv = rng_tags.choice(radio["tag_p1m_dbm"])
        p1m_true = p1m_adv + rng_tags.gauss(0, radio["tag_p1m_error_db"])
        e = Emitter("tag", interval, p1m_true, traj=person.tag_traj, body=True)
        e.next_t = rng_tags.uniform(0, interval / 1000.0)
        e.jitter_s = tags_p["jitter_ms"] / 1000.0
        rotating = rot is not None and fmt != "mac" and rng_tags.random() < rot["fraction"]
        if rotating:
            t = 0.0
            while t < dur_s + 1:
                e.macs.append((t, random_mac(rng_tags, "rpa")))
                t += rng_tags.uniform(*rot["every_min"]) * 60.0
        else:
            e.macs.append((0.0, random_mac(rng_tags, "static" if fmt != "mac" else "public")))
        address = f"5/1/{n}"
        if fmt == "ibeacon":
            minor = 100 + n
            beacon = f"ibeacon:{SITE_UUID}/5/{minor}"
            frame = "0215" + SITE_UUID.replace("-", "") + f"{5:04x}{minor:04x}" + i8(p1m_adv)
            text = f',"mfg":{{"{APPLE}":"{frame}"}}'
            e.payload = (lambda txt: (lambda em, t: txt))(text)
        elif fmt == "eddystone":
            instance = f"{0x5100 + n:012x}"
            beacon = f"eddystone:{SITE_NAMESPACE}/{instance}"
            uid = f',"svc":{{"{EDDYSTONE}":"00{i8(p1m_adv + 41)}{SITE_NAMESPACE}{instance}"}}'
            mv = rng_tags.randint(2700, 3100)
            boot = rng_tags.uniform(3600, 30 * 86400)
            temp = int(rng_tags.uniform(19, 26) * 256)
            every = tags_p["tlm_every"]

            def payload(em, t, uid=uid, mv=mv, boot=boot, temp=temp, every=every):
                if em.count % every == every - 1:
                    up = int((boot + t) * 10) & 0xFFFFFFFF
                    cnt = int((boot + t) * 1000 / em.interval_ms) & 0xFFFFFFFF
                    return f',"svc":{{"{EDDYSTONE}":"2000{mv:04x}{temp & 0xFFFF:04x}{cnt:08x}{up:08x}"}}'
                return uid
            e.payload = payload
        else:
            beacon = f"mac:{e.macs[0][1]}"
            data = "0a" + hexs(rng_tags, 6)
            text = f',"mfg":{{"{NORDIC}":"{data}"}}' if rng_tags.random() < 0.6 else ""
            e.payload = (lambda txt: (lambda em, t: txt))(text)
        for _, mac in e.macs:
            tag_macs[mac] = address
        kind = "Visitor badge" if person.visitor else "Staff badge"
        devices.append((address, f"5.1.{n}", f"{kind} {n:02d} ({person.home})", 2 if person.visitor else 1, beacon))
        person.emitter = e
        emitters.append(e)

    # foreign devices (not in devices.csv)
    fp = P.get("foreign")
    if fp:
        emitters += foreign_emitters(fp, stream(name, seed, "foreign"), layout, people, dur_s, radio)

    # ---- files
    write_site(os.path.join(out, "site.toml"), config, name, seed, layout, receivers)
    with open(os.path.join(out, "devices.csv"), "w") as f:
        f.write("deviceaddress,deviceid,label,tagtype,beacon,contactid\n")
        for d in devices:
            f.write(f"{d[0]},{d[1]},{d[2]},{d[3]},{d[4]},\n")
    with open(os.path.join(out, "tags.json"), "w") as f:
        json.dump(tag_macs, f, indent=1, sort_keys=True)
        f.write("\n")

    n_lines, end_s = run_radio(os.path.join(out, "trace.jsonl"), emitters, receivers, rmap, radio, loss_p,
                               stream(name, seed, "radio"), start_ms, dur_s, adverts)

    with open(os.path.join(out, "truth.jsonl"), "w") as f:
        for person, d in zip(people, devices):
            for a, b, z in truth_intervals(layout, person.tag_traj, end_s):
                f.write(json.dumps({"deviceaddress": d[0], "from_ms": start_ms + int(round(a * 1000)),
                                    "to_ms": start_ms + int(round(b * 1000)), "zoneid": z},
                                   separators=(",", ":")) + "\n")
    summary = {"scenario": name, "seed": seed, "adverts": n_lines, "minutes": round(end_s / 60.0, 3),
               "tags": n_tags, "receivers": len(receivers), "emitters": len(emitters),
               "seconds": round(time.time() - t_start, 2)}
    if log:
        log(summary)
    return summary


def foreign_emitters(fp, rng, layout, people, dur_s, radio):
    x0, y0, x1, y1 = layout.bbox
    spread = fp.get("spread_m", 10)
    out = []

    def static_pos():
        lv = rng.choice(layout.levels)
        return (rng.uniform(x0 - spread, x1 + spread), rng.uniform(y0 - spread, y1 + spread),
                lv * layout.floor_h + rng.uniform(0.3, 2.2))

    def const(txt):
        return lambda em, t: txt

    for i in range(fp.get("ibeacons", 0)):
        same = i < fp.get("ibeacons_site_uuid", 0)
        uuid = SITE_UUID.replace("-", "") if same else hexs(rng, 16)
        major, minor = (rng.choice([5, 6, 7]), rng.randrange(1000, 60000)) if same else (rng.randrange(65536), rng.randrange(65536))
        p1m = rng.choice([-59, -62, -65, -70, -56])
        e = Emitter("foreign", rng.choice(range(fp["beacon_interval_ms"][0], fp["beacon_interval_ms"][1] + 1, 50)),
                    p1m + rng.gauss(0, 2), static=static_pos(), body=False)
        e.macs.append((0.0, random_mac(rng, "static")))
        e.payload = const(f',"mfg":{{"{APPLE}":"0215{uuid}{major:04x}{minor:04x}{i8(p1m)}"}}')
        out.append(e)
    for i in range(fp.get("eddystones", 0)):
        ns, inst = hexs(rng, 10), hexs(rng, 6)
        p1m = rng.choice([-59, -62, -65])
        e = Emitter("foreign", rng.choice(range(fp["beacon_interval_ms"][0], fp["beacon_interval_ms"][1] + 1, 50)),
                    p1m, static=static_pos(), body=False)
        e.macs.append((0.0, random_mac(rng, "static")))
        url = f',"svc":{{"{EDDYSTONE}":"10{i8(p1m + 41)}03{hexs(rng, 9)}"}}'
        uid = f',"svc":{{"{EDDYSTONE}":"00{i8(p1m + 41)}{ns}{inst}0000"}}'
        tlm = f',"svc":{{"{EDDYSTONE}":"2000{rng.randint(2500, 3200):04x}8000{rng.randrange(1 << 32):08x}{rng.randrange(1 << 32):08x}"}}'

        def payload(em, t, uid=uid, url=url, tlm=tlm):
            k = em.count % 10
            return tlm if k == 9 else (url if k % 3 == 1 else uid)
        e.payload = payload
        out.append(e)
    carried = fp.get("phones_carried", 0.0)
    for i in range(fp.get("phones", 0)):
        if people and rng.random() < carried:
            person = rng.choice(people)
            e = Emitter("phone", 0, rng.uniform(-72, -60), traj=person.traj, body=True)
        else:
            e = Emitter("phone", 0, rng.uniform(-72, -60), static=static_pos(), body=False)
        e.interval_ms = rng.randint(*fp["phone_interval_ms"])
        t = 0.0
        while t < dur_s + 1:
            e.macs.append((t, random_mac(rng, "rpa")))
            t += rng.uniform(*fp["phone_mac_rotation_min"]) * 60.0
        style = rng.random()
        if style < 0.45:  # iPhone: nearby info (+ handoff sometimes)
            base = f"1005{hexs(rng, 5)}"
            extra = f"0c0e{hexs(rng, 14)}" if rng.random() < 0.4 else ""
            e.payload = (lambda b, x: (lambda em, t: f',"mfg":{{"{APPLE}":"{b}{x if em.count % 4 == 0 else ""}"}}'))(base, extra)
        elif style < 0.55:  # AirPods / AirTag style Apple frames
            e.payload = const(f',"mfg":{{"{APPLE}":"{rng.choice(["0719", "1219"])}{hexs(rng, 25)}"}}')
        elif style < 0.75:  # Windows laptop: Microsoft CDP beacon
            e.payload = const(f',"mfg":{{"{MICROSOFT}":"01092002{hexs(rng, 23)}"}}')
        elif style < 0.88:  # Samsung phone, plus Google fast pair service data
            e.payload = const(f',"mfg":{{"{SAMSUNG}":"420401{hexs(rng, 12)}"}},"svc":{{"fe2c":"{hexs(rng, 3)}"}}')
        elif style < 0.95:  # malformed iBeacon-looking frame (too short)
            e.payload = const(f',"mfg":{{"{APPLE}":"0215{hexs(rng, 12)}"}}')
        else:  # nothing but the address
            e.payload = const("")
        e.next_t = rng.uniform(0, 1)
        out.append(e)
    for e in out:
        if e.next_t == 0.0:
            e.next_t = rng.uniform(0, e.interval_ms / 1000.0)
    return out


def run_radio(path, emitters, receivers, rmap, radio, loss_p, rng, start_ms, dur_s, target=None):
    """Simulates every advert of every emitter and writes the received ones, sorted by time.
    Returns (lines written, end of the trace in seconds)."""
    gauss, rand, log10, exp, sqrt, log = rng.gauss, rng.random, math.log10, math.exp, math.sqrt, math.log
    sigma = radio["shadowing_db"]
    tau = radio["shadowing_tau_s"]
    body_db = radio["body_loss_db"]
    sens = radio["sensitivity_dbm"]
    jitter = radio["report_jitter_ms"]
    base_loss = loss_p["base"]
    burst = loss_p.get("burst")
    loss_bad = burst["loss_bad"] if burst else base_loss
    rician = radio["fading"] == "rician"
    k_los = 10 ** (radio["rician_k_los_db"] / 10)
    k_nlos = 10 ** (radio["rician_k_nlos_db"] / 10)
    frng = random.Random(12345)
    los_mean = rician_mean_db(k_los, frng) if rician else MEAN_DB_EXP1
    nlos_mean = rician_mean_db(k_nlos, frng) if rician and k_nlos > 1e-6 else MEAN_DB_EXP1
    los_mu, los_sc = sqrt(k_los / (k_los + 1)), sqrt(1 / (2 * (k_los + 1)))
    nlos_rician = rician and k_nlos > 1e-6
    nlos_mu, nlos_sc = sqrt(k_nlos / (k_nlos + 1)), sqrt(1 / (2 * (k_nlos + 1)))
    rx_ids = [r.id for r in receivers]
    rx_off = [r.offset for r in receivers]
    rx_silent = [r.silent for r in receivers]
    rx_bad = [(r.bad_starts, r.bad_ends) for r in receivers]
    bisect_right = bisect.bisect_right
    written = 0
    carry = []
    end_s = dur_s
    stop = False
    with open(path, "w", buffering=1 << 20) as f:
        chunk0 = 0.0
        while chunk0 < dur_s and not stop:
            chunk1 = min(chunk0 + CHUNK_S, dur_s)
            buf = carry
            for e in emitters:
                t = e.next_t
                if t >= chunk1:
                    continue
                segs = e.traj.segs if e.traj is not None else None
                interval = e.interval_ms / 1000.0
                sh_val, sh_t = e.sh_val, e.sh_t
                p1m = e.p1m
                use_body = e.body and body_db > 0
                jit = e.jitter_s
                while t < chunk1:
                    if segs is not None:
                        i = e.seg_i
                        while i < len(segs) and segs[i][1] <= t:
                            i += 1
                        e.seg_i = i
                        if i >= len(segs):
                            t = chunk1 + 1e9
                            break
                        s = segs[i]
                        if not s[10]:  # away: out of range until the segment ends
                            t = s[1] + rand() * interval
                            continue
                        span = s[1] - s[0]
                        fr = (t - s[0]) / span if span > 0 else 0.0
                        x = s[2] + fr * (s[5] - s[2])
                        y = s[3] + fr * (s[6] - s[3])
                        z = s[4] + fr * (s[7] - s[4])
                        fx, fy = s[8], s[9]
                        links = rmap.links(x, y, z)
                    else:
                        if e.static_links is None:
                            e.static_links = rmap.links(*e.static)
                        links = e.static_links
                        fx = fy = 0.0
                    mac = e.mac_at(t)
                    payload = e.payload(e, t)
                    e.count += 1
                    t_ms0 = start_ms + int(t * 1000)
                    for (ri, g, ux, uy, los) in links:
                        # time-correlated shadowing, AR(1) per (emitter, receiver)
                        last = sh_t.get(ri)
                        if last is None:
                            sv = gauss(0.0, sigma)
                        else:
                            a = exp(-(t - last) / tau)
                            sv = a * sh_val[ri] + sqrt(1.0 - a * a) * gauss(0.0, sigma)
                        sh_val[ri] = sv
                        sh_t[ri] = t
                        sil = rx_silent[ri]
                        if sil and any(a0 <= t < a1 for a0, a1 in sil):
                            continue
                        bs, be = rx_bad[ri]
                        p = base_loss
                        if bs:
                            k = bisect_right(bs, t) - 1
                            if k >= 0 and t < be[k]:
                                p = loss_bad
                        if rand() < p:
                            continue
                        if los:
                            if rician:
                                re = los_mu + los_sc * gauss(0.0, 1.0)
                                im = los_sc * gauss(0.0, 1.0)
                                fad = 10.0 * log10(re * re + im * im + 1e-12) - los_mean
                            else:
                                fad = 10.0 * log10(-log(1.0 - rand()) + 1e-12) - MEAN_DB_EXP1
                        elif nlos_rician:
                            re = nlos_mu + nlos_sc * gauss(0.0, 1.0)
                            im = nlos_sc * gauss(0.0, 1.0)
                            fad = 10.0 * log10(re * re + im * im + 1e-12) - nlos_mean
                        else:
                            fad = 10.0 * log10(-log(1.0 - rand()) + 1e-12) - MEAN_DB_EXP1
                        pw = p1m + g + sv + fad
                        if use_body:
                            pw -= body_db * 0.5 * (1.0 - (fx * ux + fy * uy))
                        if pw < sens:
                            continue
                        rssi = int(round(pw + rx_off[ri]))
                        tm = t_ms0 + int(rand() * jitter)
                        buf.append((tm, f'{{"t_ms":{tm},"receiver":"{rx_ids[ri]}","mac":"{mac}","rssi":{rssi}{payload}}}\n'))
                    t += interval + (rand() * 2.0 - 1.0) * jit
                e.next_t = t
            buf.sort(key=lambda item: item[0])
            cut_ms = start_ms + int(chunk1 * 1000)
            if chunk1 >= dur_s:
                cut = len(buf)
            else:
                cut = bisect.bisect_left(buf, cut_ms, key=lambda item: item[0])
            if target is not None and written + cut >= target:
                cut = target - written
                stop = True
                end_s = (buf[cut - 1][0] + 1 - start_ms) / 1000.0 if cut > 0 else chunk0
            f.writelines(item[1] for item in buf[:cut])
            written += cut
            carry = buf[cut:]
            chunk0 = chunk1
        if not stop:
            end_s = dur_s
    return written, end_s


def walking_graph(layout):
    """{zone: set of zones} a person walks into straight from it: through a doorway, or
    through spaces that are no zone (a stairwell); the street does not count."""
    zone_of = {s.name: s.zone for s in layout.spaces}
    out = {z: set() for z in zone_of.values() if z is not None}
    for s in layout.spaces:
        if s.zone is None:
            continue
        seen, todo = {s.name}, [s.name]
        while todo:
            for ln in layout.links_of.get(todo.pop(), []):
                for n in (ln.a, ln.b):
                    if n in seen or n == "outside":
                        continue
                    seen.add(n)
                    if zone_of[n] is None:
                        todo.append(n)
                    else:
                        out[s.zone].add(zone_of[n])
    return out


def write_site(path, config, name, seed, layout, receivers):
    L = []
    L.append(f"# Site map for the zone engine benchmark: scenario {name}, seed {seed} (bench/location/sim.py).")
    L.append("")
    L.append("[location]")
    L.append("# engine settings left out: the engine uses its defaults")
    L.append("")
    L.append("[[areas]]\nid = 1\nname = \"Site\"\n")
    L.append("[[buildings]]\nid = 1\nname = \"Main building\"\narea = 1\n")
    for fl in layout.floors:
        L.append(f"[[floors]]\nid = {fl['id']}\nlabel = \"{fl['label']}\"\nlevel = {fl['level']}\nbuilding = 1\n")
    adjacent = walking_graph(layout)
    for s in sorted((s for s in layout.spaces if s.zone is not None), key=lambda s: s.zone):
        transit = "transit = true\n" if s.name in layout.corridors else ""
        later = sorted(z for z in adjacent[s.zone] if z > s.zone)
        adj = f"adjacent = {later}\n" if later else ""
        L.append(f"[[zones]]\nid = {s.zone}\nname = \"{s.name}\"\nfloor = {s.floor}\n{transit}{adj}")
    for r in receivers:
        L.append(f"[[receivers]]\nid = \"{r.id}\"\nzone = {r.zone}\nposition = \"{latlon(config, r.x, r.y)}\"\n"
                 f"rssi_offset_db = {r.written_offset}\n")
    L.append("[[tag_types]]\nid = 1\ntitle = \"Staff badge\"\n")
    L.append("[[tag_types]]\nid = 2\ntitle = \"Visitor badge\"\n")
    with open(path, "w") as f:
        f.write("\n".join(L))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", help="scenario name from scenarios.json")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", help="output directory")
    ap.add_argument("--minutes", type=float, help="trace length (default: the scenario's)")
    ap.add_argument("--adverts", type=int, help="stop after this many trace lines (throughput)")
    ap.add_argument("--scenarios-file", help="scenarios.json to use instead of the one next to sim.py")
    ap.add_argument("--list", action="store_true", help="list the scenarios and exit")
    ap.add_argument("--survey", action="store_true",
                    help="write a site survey of the scenario's site instead (survey.jsonl, marks.csv)")
    args = ap.parse_args()
    config = load_config(args.scenarios_file)
    if args.list:
        for k, v in config["scenarios"].items():
            print(f"{k:16} {v.get('description', '')}")
        return
    if not args.scenario or not args.out:
        ap.error("--scenario and --out are required")
    if args.survey:
        survey(args.scenario, args.seed, args.out, config=config, log=lambda s: print(json.dumps(s), file=sys.stderr))
        return
    generate(args.scenario, args.seed, args.out, minutes=args.minutes, adverts=args.adverts, config=config,
             log=lambda s: print(json.dumps(s), file=sys.stderr))


if __name__ == "__main__":
    main()
