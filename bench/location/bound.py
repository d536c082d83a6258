#!/usr/bin/env python3
"""Bounds on zone accuracy for the simulated traces: how often the strongest receiver's zone,
judged from the mean signal without any noise, is the true zone.

    python3 bench/location/bound.py [--set tune|heldout] [--scenarios office,doorways]

For every tag, every 0.5 s it is present, the true zone is compared with the zone of the
receiver of the highest mean path gain G (walls, floors and distance), once with each
receiver's static multipath field (what a tag standing still keeps) and once without. No
shadowing, fading, body loss, loss or receiver offset: a rule that picks the strongest
receiver's zone cannot beat these on average, since noise only adds to its errors. The room
without a receiver is never right for such a rule and is reported apart.
"""

import argparse
import json
import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sim  # noqa: E402

STEP_S = 0.5


def position(seg, t):
    t0, t1 = seg[0], seg[1]
    f = 0.0 if t1 <= t0 else (t - t0) / (t1 - t0)
    return tuple(seg[2 + k] + f * (seg[5 + k] - seg[2 + k]) for k in range(3))


def score(emitters, receivers, rmap, end_s):
    layout = rmap.L
    flat = sim.RadioMap(layout, receivers, {**RADIO, "multipath_db": 0.0})
    zone_rx = {r.zone for r in receivers}
    total = right = right_flat = norx = 0.0
    for e in emitters:
        if e.traj is None:
            continue
        for seg in e.traj.segs:
            if not seg[10]:
                continue
            t = math.ceil(seg[0] / STEP_S) * STEP_S
            while t < min(seg[1], end_s):
                x, y, z = position(seg, t)
                truth = layout.zone_at(x, y, z)
                t += STEP_S
                if truth is None:
                    continue
                total += STEP_S
                if truth not in zone_rx:
                    norx += STEP_S
                    continue
                for m, links in ((0, rmap.links(x, y, z)), (1, flat.links(x, y, z))):
                    if links:
                        best = max(links, key=lambda lk: lk[1])
                        if receivers[best[0]].zone == truth:
                            if m == 0:
                                right += STEP_S
                            else:
                                right_flat += STEP_S
    return total, right, right_flat, norx


RADIO = {}


def run(name, seed, config):
    out = {}

    def capture(path, emitters, receivers, rmap, radio, loss_p, rng, start_ms, dur_s, target=None):
        RADIO.clear()
        RADIO.update(radio)
        out["r"] = score(emitters, receivers, rmap, dur_s)
        return 0, dur_s

    real = sim.run_radio
    sim.run_radio = capture
    try:
        with tempfile.TemporaryDirectory() as d:
            sim.generate(name, seed, d, config=config)
    finally:
        sim.run_radio = real
    return out["r"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", default="tune", choices=["tune", "heldout"])
    ap.add_argument("--scenarios")
    args = ap.parse_args()
    config = sim.load_config()
    seeds = config[args.set]
    names = args.scenarios.split(",") if args.scenarios else [
        k for k, v in config["scenarios"].items() if v.get("scored", True)]
    print("| scenario | multipath kept % | no multipath % | room without receiver % |")
    print("|---|---|---|---|")
    tot = [0.0] * 4
    for name in names:
        acc = [0.0] * 4
        for seed in seeds:
            for i, v in enumerate(run(name, seed, config)):
                acc[i] += v
        tot = [a + b for a, b in zip(tot, acc)]
        print(f"| {name} | {100 * acc[1] / acc[0]:.1f} | {100 * acc[2] / acc[0]:.1f} | {100 * acc[3] / acc[0]:.1f} |",
              flush=True)
    print(f"| **all** | {100 * tot[1] / tot[0]:.1f} | {100 * tot[2] / tot[0]:.1f} | {100 * tot[3] / tot[0]:.1f} |")


if __name__ == "__main__":
    main()
