#!/usr/bin/env python3
"""Bounds on zone accuracy for the simulated traces: how often the strongest receiver's zone,
judged from the mean signal without any noise, is the true zone.

    python3 bench/location/bound.py [--set tune|heldout] [--scenarios office,doorways]
        [--survey --bin target/release/sitegate]

For every tag, every 0.5 s it is present, the true zone is compared with the zone of the
receiver of the highest mean path gain G (walls, floors and distance), once with each
receiver's static multipath field (what a tag standing still keeps) and once without. No
shadowing, fading, body loss, loss or receiver offset: a rule that picks the strongest
receiver's zone cannot beat these on average, since noise only adds to its errors. The room
without a receiver is never right for such a rule and is reported apart.

With --survey, each seed's site is also surveyed (`sitegate survey`, as `evaluate.py --survey`
does) and every sample is placed, too, by the engine's fingerprint match of the mean signal
each receiver has of the tag (the tag's own power, the receiver's multipath field, residual
offset and the mean body loss; receivers the mean leaves below sensitivity unheard): how often
fingerprint matching would be right if smoothing took all the noise away. That is not a
strict bound: a survey's fingerprint holds receivers heard only on favourable fades, at their
heard (higher) mean, where the mean signal leaves them unheard; on far receivers (the other
floor) that makes the noise-free match worse than the engine.
"""

import argparse
import json
import math
import os
import sys
import tempfile
import tomllib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sim  # noqa: E402

STEP_S = 0.5


def position(seg, t):
    t0, t1 = seg[0], seg[1]
    f = 0.0 if t1 <= t0 else (t - t0) / (t1 - t0)
    return tuple(seg[2 + k] + f * (seg[5 + k] - seg[2 + k]) for k in range(3))


# The engine's fingerprint matching (src/location/engine.rs).
FLOOR_DBM, SHIFT_MAX_DB, GAP_CAP_DB = -105.0, 6.0, 25.0


def gap2(g):
    g = min(abs(g), GAP_CAP_DB)
    return g * g


def match(heard, prints):
    """The zone whose best fingerprint is nearest (RMS dB) to `heard` ({receiver: dBm})."""
    best_zone, best = None, float("inf")
    for zone, fps in prints.items():
        for fp in fps:
            common = [heard[r] - v for r, v in fp.items() if r in heard]
            shift = max(-SHIFT_MAX_DB, min(SHIFT_MAX_DB, sum(common) / len(common))) if len(common) >= 2 else 0.0
            acc, n = 0.0, 0
            for r, v in heard.items():
                acc += gap2(v - shift - fp[r]) if r in fp else gap2(max(v - shift - FLOOR_DBM, 0.0))
                n += 1
            for r, v in fp.items():
                if r not in heard:
                    acc += gap2(max(v - FLOOR_DBM, 0.0))
                    n += 1
            if n and acc / n < best:
                best_zone, best = zone, acc / n
    return best_zone


def score(emitters, receivers, rmap, end_s, prints=None):
    layout = rmap.L
    flat = sim.RadioMap(layout, receivers, {**RADIO, "multipath_db": 0.0})
    zone_rx = {r.zone for r in receivers}
    total = right = right_flat = norx = right_fp = 0.0
    body_mean = RADIO.get("body_loss_db", 0.0) / 2
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
                if prints:
                    heard = {}
                    for idx, g, *_ in rmap.links(x, y, z):
                        r = receivers[idx]
                        p = e.p1m + g - body_mean
                        if p >= RADIO["sensitivity_dbm"]:
                            heard[r.id] = p + r.offset + r.written_offset
                    if heard and match(heard, prints) == truth:
                        right_fp += STEP_S
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
    return total, right, right_flat, norx, right_fp


RADIO = {}


def survey_prints(binary, name, seed, config, d):
    """{zone id: [{receiver id: dBm}]} from `sitegate survey` on a simulated survey."""
    import evaluate
    eng = {}
    out = evaluate.survey_fingerprints(binary, name, seed, d, config, eng)
    if not out:
        sys.exit(f"bound.py: the survey of {name}-{seed} failed: {eng.get('survey_error', '')}")
    return {zone: tomllib.loads(text)["fingerprints"] for zone, text in out.items()}


def run(name, seed, config, binary=None):
    out = {}
    with tempfile.TemporaryDirectory() as d:
        prints = survey_prints(binary, name, seed, config, d) if binary else None

        def capture(path, emitters, receivers, rmap, radio, loss_p, rng, start_ms, dur_s, target=None):
            RADIO.clear()
            RADIO.update(radio)
            out["r"] = score(emitters, receivers, rmap, dur_s, prints)
            return 0, dur_s

        real = sim.run_radio
        sim.run_radio = capture
        try:
            sim.generate(name, seed, os.path.join(d, "trace"), config=config)
        finally:
            sim.run_radio = real
    return out["r"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", default="tune", choices=["tune", "heldout"])
    ap.add_argument("--scenarios")
    ap.add_argument("--survey", action="store_true", help="also bound fingerprint matching (needs --bin)")
    ap.add_argument("--bin", help="the sitegate binary that runs `sitegate survey`")
    args = ap.parse_args()
    if args.survey and not args.bin:
        ap.error("--survey needs --bin")
    binary = os.path.abspath(args.bin) if args.survey else None
    config = sim.load_config()
    seeds = config[args.set]
    names = args.scenarios.split(",") if args.scenarios else [
        k for k, v in config["scenarios"].items() if v.get("scored", True)]
    fp_head, fp_rule = (" fingerprints % |", "---|") if binary else ("", "")
    print(f"| scenario | multipath kept % | no multipath % | room without receiver % |{fp_head}")
    print(f"|---|---|---|---|{fp_rule}")

    def row(label, acc):
        cells = [100 * acc[i] / acc[0] for i in (1, 2, 3)] + ([100 * acc[4] / acc[0]] if binary else [])
        print(f"| {label} | " + " | ".join(f"{c:.1f}" for c in cells) + " |", flush=True)

    tot = [0.0] * 5
    for name in names:
        acc = [0.0] * 5
        for seed in seeds:
            for i, v in enumerate(run(name, seed, config, binary)):
                acc[i] += v
        tot = [a + b for a, b in zip(tot, acc)]
        row(name, acc)
    row("**all**", tot)


if __name__ == "__main__":
    main()
