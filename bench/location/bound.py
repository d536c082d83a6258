#!/usr/bin/env python3
"""Bounds on zone accuracy for the simulated traces: how often the strongest receiver's zone,
judged from the mean signal without any noise, is the true zone.

    python3 bench/location/bound.py [--set tune|heldout] [--scenarios office,doorways]
        [--survey --bin target/release/sitegate] [--clean-survey 20,5]

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

With --clean-survey W1,W2,..., the same match against fingerprints of a survey without noise:
the survey walk's mean signal every 0.5 s, one fingerprint per W seconds spent in a zone (the
mean of those samples; receivers heard in under half of them left out). How far fingerprints
could go if the survey itself were free of noise, and how much finer stretches would give.
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


def steps(seg, end_s):
    """The points of a trajectory segment every STEP_S (on the STEP_S grid), up to end_s."""
    t = math.ceil(seg[0] / STEP_S) * STEP_S
    while t < min(seg[1], end_s):
        yield position(seg, t)
        t += STEP_S


def score(emitters, receivers, rmap, end_s, print_sets=()):
    """Seconds present in a zone, right by the strongest receiver (multipath kept, without),
    in a zone without a receiver, then right by fingerprint match per set in `print_sets`."""
    layout = rmap.L
    flat = sim.RadioMap(layout, receivers, {**RADIO, "multipath_db": 0.0})
    zone_rx = {r.zone for r in receivers}
    total = right = right_flat = norx = 0.0
    right_fp = [0.0] * len(print_sets)
    for e in emitters:
        if e.traj is None:
            continue
        for seg in e.traj.segs:
            if not seg[10]:
                continue
            for x, y, z in steps(seg, end_s):
                truth = layout.zone_at(x, y, z)
                if truth is None:
                    continue
                total += STEP_S
                if print_sets:
                    heard = mean_heard(e, receivers, rmap, x, y, z)
                    for i, prints in enumerate(print_sets):
                        if heard and match(heard, prints) == truth:
                            right_fp[i] += STEP_S
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
    return (total, right, right_flat, norx, *right_fp)


def with_radio(capture, simulate, *args, **kw):
    """Runs a sim.py step with `capture` in place of its radio simulation."""
    real = sim.run_radio
    sim.run_radio = capture
    try:
        simulate(*args, **kw)
    finally:
        sim.run_radio = real


RADIO = {}


def survey_prints(binary, name, seed, config, d):
    """{zone id: [{receiver id: dBm}]} from `sitegate survey` on a simulated survey."""
    import evaluate
    eng = {}
    out = evaluate.survey_fingerprints(binary, name, seed, d, config, eng)
    if not out:
        sys.exit(f"bound.py: the survey of {name}-{seed} failed: {eng.get('survey_error', '')}")
    return {zone: tomllib.loads(text)["fingerprints"] for zone, text in out.items()}


def mean_heard(e, receivers, rmap, x, y, z):
    """{receiver id: dBm}: the mean signal of emitter e at a point, as the receivers write it."""
    heard = {}
    for idx, g, *_ in rmap.links(x, y, z):
        r = receivers[idx]
        p = e.p1m + g - RADIO.get("body_loss_db", 0.0) / 2
        if p >= RADIO["sensitivity_dbm"]:
            heard[r.id] = p + r.offset + r.written_offset
    return heard


def clean_survey_samples(name, seed, config, d):
    """[(zone or None, {receiver id: dBm})] every STEP_S of a survey walk, without noise."""
    out = []

    def capture(path, emitters, receivers, rmap, radio, loss_p, rng, start_ms, dur_s, target=None):
        RADIO.clear()
        RADIO.update(radio)
        e = emitters[0]
        for seg in e.traj.segs:
            for x, y, z in steps(seg, seg[1]):
                out.append((rmap.L.zone_at(x, y, z), mean_heard(e, receivers, rmap, x, y, z)))
        return 0, dur_s

    with_radio(capture, sim.survey, name, seed, os.path.join(d, "clean-survey"), config=config)
    return out


def clean_prints(samples, window_s):
    """{zone: [{receiver id: dBm}]}: one fingerprint per window_s seconds spent in a zone."""
    prints, group, zone = {}, [], None
    per = max(1, round(window_s / STEP_S))

    def flush():
        if zone is None or not group:
            return
        sums, counts = {}, {}
        for heard in group:
            for r, v in heard.items():
                sums[r] = sums.get(r, 0.0) + v
                counts[r] = counts.get(r, 0) + 1
        fp = {r: sums[r] / counts[r] for r in sums if counts[r] >= 0.5 * len(group)}
        if fp:
            prints.setdefault(zone, []).append(fp)

    for z, heard in samples:
        if z != zone or len(group) >= per:
            flush()
            group, zone = [], z
        if heard:
            group.append(heard)
    flush()
    return prints


def run(name, seed, config, binary=None, windows=()):
    """score() of one seed's trace; fingerprint sets: the survey's (with a binary), then one
    per clean-survey window."""
    out = {}
    with tempfile.TemporaryDirectory() as d:
        print_sets = [survey_prints(binary, name, seed, config, d)] if binary else []
        if windows:
            clean = clean_survey_samples(name, seed, config, d)
            print_sets += [clean_prints(clean, w) for w in windows]

        def capture(path, emitters, receivers, rmap, radio, loss_p, rng, start_ms, dur_s, target=None):
            RADIO.clear()
            RADIO.update(radio)
            out["r"] = score(emitters, receivers, rmap, dur_s, print_sets)
            return 0, dur_s

        with_radio(capture, sim.generate, name, seed, os.path.join(d, "trace"), config=config)
    return out["r"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", default="tune", choices=["tune", "heldout"])
    ap.add_argument("--scenarios")
    ap.add_argument("--survey", action="store_true", help="also bound fingerprint matching (needs --bin)")
    ap.add_argument("--bin", help="the sitegate binary that runs `sitegate survey`")
    ap.add_argument("--clean-survey", metavar="W,...",
                    help="also match against fingerprints of a noise-free survey, one per W seconds")
    args = ap.parse_args()
    if args.survey and not args.bin:
        ap.error("--survey needs --bin")
    windows = [float(w) for w in args.clean_survey.split(",")] if args.clean_survey else []
    binary = os.path.abspath(args.bin) if args.survey else None
    config = sim.load_config()
    seeds = config[args.set]
    names = args.scenarios.split(",") if args.scenarios else [
        k for k, v in config["scenarios"].items() if v.get("scored", True)]
    fp_head, fp_rule = (" fingerprints % |", "---|") if binary else ("", "")
    fp_head += "".join(f" clean survey, {w:g} s % |" for w in windows)
    fp_rule += "---|" * len(windows)
    print(f"| scenario | multipath kept % | no multipath % | room without receiver % |{fp_head}")
    print(f"|---|---|---|---|{fp_rule}")
    n = 4 + (1 if binary else 0) + len(windows)

    def row(label, acc):
        cells = [100 * acc[i] / acc[0] for i in range(1, n)]
        print(f"| {label} | " + " | ".join(f"{c:.1f}" for c in cells) + " |", flush=True)

    tot = [0.0] * n
    for name in names:
        acc = [0.0] * n
        for seed in seeds:
            for i, v in enumerate(run(name, seed, config, binary, windows)):
                acc[i] += v
        tot = [a + b for a, b in zip(tot, acc)]
        row(name, acc)
    row("**all**", tot)


if __name__ == "__main__":
    main()
