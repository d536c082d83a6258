#!/usr/bin/env python3
"""Zone engine benchmark: generates the scenarios of scenarios.json, replays each trace through
`sitegate replay` and two simple baselines, and scores all three against the ground truth.

    cargo build --release
    python3 bench/location/evaluate.py --bin target/release/sitegate [--set tune|heldout|all]
        [--scenarios office,doorways] [--seeds 1,2] [--workdir DIR] [--json OUT] [--jobs N]

Prints a Markdown table: one row per scenario (its seeds pooled) and an overall row, with for
each method (engine / nearest / bermuda) the % of time in the true zone, false switches per
device-hour, the median switch delay and the missed switches. If the engine is missing or a
replay fails, the baselines are still reported and the engine is marked failed.

With --workdir, generated traces and all decisions (engine.jsonl, nearest.jsonl,
bermuda.jsonl) are kept there and reused while the scenario and the simulator are unchanged;
without it they go to a temporary directory that is removed. `--scenarios throughput` times
the replay of the big trace instead of scoring it. Python standard library only.
"""

import argparse
import bisect
import collections
import hashlib
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import sim  # noqa: E402

METHODS = ("engine", "nearest", "bermuda")
WARMUP_MS = 30_000
FALSE_WINDOW_MS = 30_000
MIN_INTERVAL_MS = 15_000
EARLY_MS = 5_000
LATE_MS = 10_000


# ---------------------------------------------------------------- inputs

# [location] settings given with --engine, written into the engine's copy of site.toml.
ENGINE_SETTINGS = []


# With --survey: the engine gets zone fingerprints from a simulated survey of each site.
SURVEY = False

# With --late-truth: delays (s) at which the truth itself is also scored, as a method.
LATE_TRUTH_S = []


def survey_fingerprints(binary, name, seed, d, config, eng):
    """Simulates a survey of the trace's site, runs `sitegate survey` on it and returns the
    fingerprint lines of each zone ({zoneid: 'fingerprints = [...]'})."""
    sd = os.path.join(d, "survey")
    sim.survey(name, seed, sd, config=config)
    cmd = [binary, "survey", "--config", os.path.join(sd, "site.toml"), "--trace", os.path.join(sd, "survey.jsonl"),
           "--marks", os.path.join(sd, "marks.csv"), "--device", sim.SURVEY_DEVICE,
           "--devices", os.path.join(sd, "devices.csv")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        eng["survey_error"] = r.stderr[-400:]
        return {}
    out, zone = {}, None
    for line in r.stdout.splitlines():
        if line.startswith("# zone "):
            zone = int(line.split()[2])
        elif zone is not None and (line.startswith("fingerprints") or zone in out):
            out[zone] = out[zone] + "\n" + line if zone in out else line
            if line == "]":
                zone = None
    return out


def read_site(path):
    with open(path, "rb") as f:
        site = tomllib.load(f)
    zone_of = {r["id"]: r["zone"] for r in site.get("receivers", [])}
    offset = {r["id"]: float(r.get("rssi_offset_db", 0)) for r in site.get("receivers", [])}
    return zone_of, offset


def read_devices(path):
    out = []
    with open(path) as f:
        next(f)
        for line in f:
            if line.strip():
                out.append(line.split(",")[0])
    return out


def read_truth(path):
    truth = collections.defaultdict(list)
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            truth[d["deviceaddress"]].append((d["from_ms"], d["to_ms"], d["zoneid"]))
    for v in truth.values():
        v.sort()
    return truth


def read_decisions(path):
    """Decisions per device [(t_ms, event, zone)] in file order; non-JSON lines and unknown
    keys are ignored."""
    out = collections.defaultdict(list)
    bad = 0
    with open(path, errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                d = json.loads(line)
                ev = d["event"]
                if ev not in ("enter", "exit"):
                    continue
                out[d["deviceaddress"]].append((int(d["t_ms"]), ev, d["zoneid"]))
            except (ValueError, KeyError, TypeError):
                bad += 1
    for v in out.values():
        v.sort(key=lambda e: e[0])  # stable: keeps exit-before-enter at equal times
    return out, bad


# ---------------------------------------------------------------- baselines

def ibeacon_power(mfg):
    data = mfg.get("004c")
    if data and len(data) >= 46 and data.startswith("0215"):
        v = int(data[44:46], 16)
        return v - 256 if v > 127 else v
    return None


def eddystone_power(svc):
    data = svc.get("feaa")
    if data and len(data) >= 36 and data.startswith("00"):
        v = int(data[2:4], 16)
        return (v - 256 if v > 127 else v) - 41
    return None


class Rule:
    """What both baselines share: the zone per device and the decisions written as it changes."""

    def switch(self, dev, t, zone):
        cur = self.zone.get(dev)
        if cur == zone:
            return
        if cur is not None:
            self.events.append((t, dev, cur, "exit"))
        if zone is not None:
            self.events.append((t, dev, zone, "enter"))
        self.zone[dev] = zone


class Nearest(Rule):
    """Strongest receiver among the device's adverts of the last 1 s, on every advert; away
    5 s after the last advert."""

    WINDOW_MS, AWAY_MS = 1000, 5000

    def __init__(self, zone_of):
        self.zone_of = zone_of
        self.win = collections.defaultdict(collections.deque)
        self.zone = {}
        self.last = {}
        self.events = []

    def advert(self, dev, t, rx, rssi, power):
        last = self.last.get(dev)
        if last is not None and t - last > self.AWAY_MS:
            self.switch(dev, last + self.AWAY_MS, None)
        self.last[dev] = t
        w = self.win[dev]
        w.append((t, rx, rssi))
        while w[0][0] <= t - self.WINDOW_MS:
            w.popleft()
        best = max(w, key=lambda a: a[2])
        self.switch(dev, t, self.zone_of.get(best[1]))

    def finish(self, end_ms):
        for dev, last in self.last.items():
            if last + self.AWAY_MS <= end_ms:
                self.switch(dev, last + self.AWAY_MS, None)


class Bermuda(Rule):
    """Bermuda-style challenger rule on distances from a log-distance model (exponent 2.7 and
    the beacon's measured power, -59 dBm when it sends none), each receiver's distance the
    minimum of its last 5 samples."""

    HIST, STALE_MS, AWAY_MS, EXPONENT = 5, 10_000, 30_000, 2.7
    WIN_PCT, HIST_PCT = 0.30, 0.15

    def __init__(self, zone_of):
        self.zone_of = zone_of
        self.hist = collections.defaultdict(dict)  # dev -> rx -> deque of distances
        self.seen = collections.defaultdict(dict)  # dev -> rx -> last t
        self.cur = {}
        self.zone = {}
        self.last = {}
        self.power = {}
        self.events = []

    def advert(self, dev, t, rx, rssi, power):
        last = self.last.get(dev)
        if last is not None and t - last > self.AWAY_MS:
            self.switch(dev, last + self.AWAY_MS, None)
            self.cur[dev] = None
        self.last[dev] = t
        if power is not None:
            self.power[dev] = power
        p1m = self.power.get(dev, -59)
        d = 10 ** ((p1m - rssi) / (10 * self.EXPONENT))
        h = self.hist[dev].get(rx)
        if h is None:
            h = self.hist[dev][rx] = collections.deque(maxlen=self.HIST)
        h.append(d)
        seen = self.seen[dev]
        seen[rx] = t
        fresh = [r for r, ts in seen.items() if t - ts <= self.STALE_MS]
        cur = self.cur.get(dev)
        if cur not in fresh:
            cur = min(fresh, key=lambda r: min(self.hist[dev][r]))
        else:
            for r in fresh:
                if r == cur:
                    continue
                hc, hi = self.hist[dev][r], self.hist[dev][cur]
                dc, di = min(hc), min(hi)
                if dc >= di:
                    continue
                closer = (di - dc) / di
                if closer >= self.WIN_PCT or (max(hc) < di and closer >= self.HIST_PCT):
                    cur = r
        self.cur[dev] = cur
        self.switch(dev, t, self.zone_of.get(cur))

    def finish(self, end_ms):
        for dev, last in self.last.items():
            if last + self.AWAY_MS <= end_ms:
                self.switch(dev, last + self.AWAY_MS, None)


def run_baselines(d, end_ms):
    """Runs both baselines over d/trace.jsonl; writes d/nearest.jsonl and d/bermuda.jsonl."""
    zone_of, offset = read_site(os.path.join(d, "site.toml"))
    with open(os.path.join(d, "tags.json")) as f:
        tags = json.load(f)
    methods = {"nearest": Nearest(zone_of), "bermuda": Bermuda(zone_of)}
    handlers = [m.advert for m in methods.values()]
    loads = json.loads
    with open(os.path.join(d, "trace.jsonl")) as f:
        for line in f:
            i = line.find('"mac":"')
            if i < 0 or line[i + 7:i + 24] not in tags:
                continue
            a = loads(line)
            dev = tags[a["mac"]]
            rx = a["receiver"]
            if rx not in zone_of:
                continue
            power = None
            if "mfg" in a:
                power = ibeacon_power(a["mfg"])
            if power is None and "svc" in a:
                power = eddystone_power(a["svc"])
            rssi = a["rssi"] + offset.get(rx, 0.0)
            for h in handlers:
                h(dev, a["t_ms"], rx, rssi, power)
    for name, m in methods.items():
        m.finish(end_ms)
        with open(os.path.join(d, f"{name}.jsonl"), "w") as f:
            for t, dev, zone, ev in sorted(m.events, key=lambda e: e[0]):
                f.write(json.dumps({"t_ms": t, "deviceaddress": dev, "zoneid": zone, "event": ev},
                                   separators=(",", ":")) + "\n")


# ---------------------------------------------------------------- scoring

def states(events):
    """Events -> [(t, zone)] state changes (zone None = away); the state before the first is None."""
    out = []
    cur = None
    for t, ev, z in events:
        if ev == "enter":
            cur = z
        elif ev == "exit" and cur == z:
            cur = None
        if out and out[-1][0] == t:
            out[-1] = (t, cur)
        else:
            out.append((t, cur))
    return out


def zone_at(changes, times, t):
    i = bisect.bisect_right(times, t) - 1
    return changes[i][1] if i >= 0 else None


def score_device(truth, events, w0, w1):
    """Scores one device; truth = [(from, to, zone)], events = [(t, 'enter'|'exit', zone)]."""
    res = {"correct_ms": 0, "total_ms": 0, "false_switches": 0, "delays_ms": [], "missed": 0,
           "switches": 0, "missed_already_in": 0}
    changes = states(events)
    ctimes = [c[0] for c in changes]
    # time in the true zone
    for a, b, z in truth:
        a, b = max(a, w0), min(b, w1)
        if b <= a:
            continue
        res["total_ms"] += b - a
        t = a
        i = bisect.bisect_right(ctimes, t) - 1
        cur = changes[i][1] if i >= 0 else None
        j = i + 1
        while t < b:
            nxt = ctimes[j] if j < len(ctimes) else b
            nxt = min(nxt, b)
            if cur == z:
                res["correct_ms"] += nxt - t
            t = nxt
            if j < len(changes) and ctimes[j] <= t:
                cur = changes[j][1]
                j += 1
    # false switches
    starts = [iv[0] for iv in truth]

    def truth_overlapping(t0, t1):
        i = max(bisect.bisect_right(starts, t0) - 1, 0)
        while i < len(truth) and truth[i][0] <= t1:
            if truth[i][1] >= t0:
                yield truth[i]
            i += 1

    enter_times = {t for t, ev, z in events if ev == "enter"}
    for t, ev, z in events:
        if t < w0 or t > w1:
            continue
        if ev == "enter":
            if not any(iv[2] == z for iv in truth_overlapping(t - FALSE_WINDOW_MS, t)):
                res["false_switches"] += 1
        elif ev == "exit" and t not in enter_times:  # an exit to nothing, not half of a switch
            if all(iv[2] is not None for iv in truth_overlapping(t - FALSE_WINDOW_MS, t)):
                res["false_switches"] += 1
    # switch delays
    enters = collections.defaultdict(list)
    for t, ev, z in events:
        if ev == "enter":
            enters[z].append(t)
    for k in range(1, len(truth)):
        t0, t1, z = truth[k]
        if z is None or z == truth[k - 1][2] or t0 < w0 or t0 > w1 or t1 - t0 < MIN_INTERVAL_MS:
            continue
        res["switches"] += 1
        ts = enters.get(z, [])
        i = bisect.bisect_left(ts, t0 - EARLY_MS)
        if i < len(ts) and ts[i] <= t1 + LATE_MS:
            res["delays_ms"].append(max(0, ts[i] - t0))
        else:
            res["missed"] += 1
            if zone_at(changes, ctimes, t0 - EARLY_MS) == z:
                res["missed_already_in"] += 1
    return res


def write_late_truth(path, truth, late_ms):
    """The decisions of a method that knows the true zone but says so `late_ms` late: every
    change of the truth, as an enter (or an exit to no zone), that much after it happened."""
    with open(path, "w") as f:
        for dev, intervals in truth.items():
            cur = None
            for start, _end, zone in intervals:
                if zone == cur:
                    continue
                ev = {"t_ms": start + late_ms, "deviceaddress": dev, "zoneid": zone if zone is not None else cur,
                      "event": "enter" if zone is not None else "exit"}
                f.write(json.dumps(ev) + "\n")
                cur = zone


def score(d, decisions_path, devices, truth, w0, w1):
    events, bad = read_decisions(decisions_path)
    tot = {"correct_ms": 0, "total_ms": 0, "false_switches": 0, "delays_ms": [], "missed": 0, "switches": 0,
           "missed_already_in": 0, "device_hours": 0.0, "unknown_devices": len(set(events) - set(devices)),
           "bad_lines": bad}
    for dev in devices:
        r = score_device(truth.get(dev, [(w0 - WARMUP_MS, w1, None)]), events.get(dev, []), w0, w1)
        for k in ("correct_ms", "total_ms", "false_switches", "missed", "switches", "missed_already_in"):
            tot[k] += r[k]
        tot["delays_ms"] += r["delays_ms"]
        tot["device_hours"] += (w1 - w0) / 3_600_000
    return tot


# ---------------------------------------------------------------- runs

def file_hash(*paths):
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def run_one(job):
    """Generates (or reuses) one trace, runs the engine and the baselines, scores them."""
    name, seed, workdir, binary, config, timeout, keep = job
    d = os.path.join(workdir, f"{name}-{seed}")
    params = sim.scenario_params(config, name)
    stamp = json.dumps({"params": params, "layout": config["layouts"][params["layout"]], "seed": seed,
                        "sim": file_hash(os.path.join(HERE, "sim.py")),
                        "start": config["start_ms"]}, sort_keys=True)
    stamp_path = os.path.join(d, "stamp.json")
    fresh = os.path.exists(stamp_path) and open(stamp_path).read() == stamp
    out = {"scenario": name, "seed": seed}
    t0 = time.time()
    if not fresh:
        if os.path.isdir(d):
            shutil.rmtree(d)
        summary = sim.generate(name, seed, d, config=config)
        with open(stamp_path, "w") as f:
            f.write(stamp)
    else:
        with open(os.path.join(d, "trace.jsonl"), "rb") as f:
            summary = {"adverts": sum(1 for _ in f)}
    out["adverts"] = summary["adverts"]
    out["generate_s"] = round(time.time() - t0, 2)
    scored = params.get("scored", True)
    truth = read_truth(os.path.join(d, "truth.jsonl"))
    start = int(config["start_ms"])
    end = max(iv[1] for ivs in truth.values() for iv in ivs)
    w0, w1 = start + WARMUP_MS, end
    devices = read_devices(os.path.join(d, "devices.csv"))

    # engine
    eng = {"ok": False}
    if binary and os.path.exists(binary):
        site = os.path.join(d, "site.toml")
        fingerprints = survey_fingerprints(binary, name, seed, d, config, eng) if SURVEY else {}
        if ENGINE_SETTINGS or fingerprints:
            # The engine's [location] settings under test and the survey's zone fingerprints,
            # in a copy of the site map.
            with open(site) as f:
                text = f.read()
            lines = "".join(f"{k} = {v}\n" for k, v in ENGINE_SETTINGS)
            text = text.replace("[location]\n", "[location]\n" + lines, 1)
            for zone, line in fingerprints.items():
                text = text.replace(f"[[zones]]\nid = {zone}\n", f"[[zones]]\nid = {zone}\n{line}\n", 1)
            site = os.path.join(d, "engine-site.toml")
            with open(site, "w") as f:
                f.write(text)
        cmd = [binary, "replay", "--trace", os.path.join(d, "trace.jsonl"), "--config", site,
               "--devices", os.path.join(d, "devices.csv")]
        t1 = time.time()
        try:
            with open(os.path.join(d, "engine.jsonl"), "w") as fo, open(os.path.join(d, "engine.stderr"), "w") as fe:
                rc = subprocess.run(cmd, stdout=fo, stderr=fe, timeout=timeout).returncode
            eng["replay_s"] = round(time.time() - t1, 3)
            eng["ok"] = rc == 0
            if rc != 0:
                with open(os.path.join(d, "engine.stderr"), errors="replace") as fe:
                    eng["error"] = f"exit {rc}: " + fe.read()[-400:].strip()
        except subprocess.TimeoutExpired:
            eng["error"] = f"timed out after {timeout} s"
        except OSError as e:
            eng["error"] = str(e)
    else:
        eng["error"] = f"no binary at {binary}" if binary else "no --bin given"
    if eng.get("replay_s"):
        eng["adverts_per_s"] = round(out["adverts"] / max(eng["replay_s"], 1e-6))
    out["engine_run"] = eng
    if not scored:
        if not keep:
            shutil.rmtree(d, ignore_errors=True)
        return out

    # baselines (cached next to the trace)
    t2 = time.time()
    bstamp_path = os.path.join(d, "baselines.stamp")
    bstamp = file_hash(os.path.join(HERE, "evaluate.py"), stamp_path)
    cached = os.path.exists(bstamp_path) and open(bstamp_path).read() == bstamp
    if not cached or not all(os.path.exists(os.path.join(d, f"{m}.jsonl")) for m in ("nearest", "bermuda")):
        run_baselines(d, end)
        with open(bstamp_path, "w") as f:
            f.write(bstamp)
    out["baselines_s"] = round(time.time() - t2, 2)
    results = {}
    for m in METHODS:
        if m == "engine" and not eng["ok"]:
            continue
        results[m] = score(d, os.path.join(d, f"{m}.jsonl"), devices, truth, w0, w1)
    out["results"] = results
    if LATE_TRUTH_S:
        late = {}
        for late_s in LATE_TRUTH_S:
            path = os.path.join(d, f"truth-late-{late_s:g}.jsonl")
            write_late_truth(path, truth, round(late_s * 1000))
            r = score(d, path, devices, truth, w0, w1)
            late[f"{late_s:g}"] = {k: r[k] for k in ("correct_ms", "total_ms")}
            os.remove(path)
        out["late_truth"] = late
    if not keep:
        shutil.rmtree(d, ignore_errors=True)
    return out


def aggregate(runs):
    agg = {}
    for m in METHODS:
        rs = [r["results"][m] for r in runs if m in r.get("results", {})]
        if len(rs) < len(runs) or not rs:
            agg[m] = None
            continue
        total = sum(r["total_ms"] for r in rs)
        dh = sum(r["device_hours"] for r in rs)
        delays = [x for r in rs for x in r["delays_ms"]]
        agg[m] = {
            "in_zone_pct": 100.0 * sum(r["correct_ms"] for r in rs) / total if total else float("nan"),
            "false_per_hour": sum(r["false_switches"] for r in rs) / dh if dh else float("nan"),
            "median_delay_s": statistics.median(delays) / 1000.0 if delays else float("nan"),
            "missed": sum(r["missed"] for r in rs),
            "switches": sum(r["switches"] for r in rs),
        }
    return agg


def fmt_row(label, agg):
    def cells(key, f):
        return " / ".join("failed" if agg[m] is None else f(agg[m][key]) for m in METHODS)
    return (f"| {label} | {cells('in_zone_pct', lambda v: f'{v:.1f}')} | {cells('false_per_hour', lambda v: f'{v:.1f}')} "
            f"| {cells('median_delay_s', lambda v: f'{v:.1f}')} | {cells('missed', str)} "
            f"| {next((a['switches'] for a in agg.values() if a), 0)} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", help="the sitegate binary (target/release/sitegate)")
    ap.add_argument("--set", choices=("tune", "heldout", "all"), default="tune", help="seed list (default tune)")
    ap.add_argument("--scenarios", help="comma-separated scenario names (default: every scored scenario)")
    ap.add_argument("--seeds", help="comma-separated seeds instead of --set")
    ap.add_argument("--workdir", help="keep traces and decisions here and reuse them")
    ap.add_argument("--json", help="write the per-trace numbers to this file")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="traces in parallel (default: CPUs)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds allowed per replay")
    ap.add_argument("--scenarios-file", help="scenarios.json to use instead of the one next to this script")
    ap.add_argument("--engine", action="append", default=[], metavar="KEY=VALUE",
                    help="a [location] setting for the engine (repeatable), e.g. --engine hysteresis_db=3")
    ap.add_argument("--survey", action="store_true",
                    help="give the engine zone fingerprints from a simulated survey of each site (sitegate survey)")
    ap.add_argument("--late-truth", metavar="S,...",
                    help="also score the truth itself reported S seconds late (the share in zone that "
                         "a decision delay alone costs)")
    args = ap.parse_args()
    global SURVEY
    SURVEY = args.survey
    if args.late_truth:
        LATE_TRUTH_S.extend(float(x) for x in args.late_truth.split(",") if x.strip())
    for setting in args.engine:
        key, _, value = setting.partition("=")
        if not key or not value:
            ap.error(f"--engine {setting!r}: give KEY=VALUE")
        ENGINE_SETTINGS.append((key.strip(), value.strip()))

    config = sim.load_config(args.scenarios_file)
    if args.scenarios:
        names = [s.strip() for s in args.scenarios.split(",") if s.strip()]
        for n in names:
            sim.scenario_params(config, n)
    else:
        names = [n for n in config["scenarios"] if sim.scenario_params(config, n).get("scored", True)]
    if args.seeds:
        seeds = [int(s) for s in args.seeds.split(",")]
    else:
        seeds = config["tune"] + config["heldout"] if args.set == "all" else config[args.set]
    binary = os.path.abspath(args.bin) if args.bin else None
    if binary and not os.path.exists(binary):
        print(f"warning: {args.bin} does not exist; reporting the baselines only", file=sys.stderr)

    keep = args.workdir is not None
    workdir = os.path.abspath(args.workdir) if keep else tempfile.mkdtemp(prefix="sitegate-location-")
    os.makedirs(workdir, exist_ok=True)
    jobs = [(n, s, workdir, binary, config, args.timeout, keep) for n in names for s in seeds]
    # unscored (throughput) runs alone, so that the replay timing is not shared with other work
    timed = [j for j in jobs if not sim.scenario_params(config, j[0]).get("scored", True)]
    scored = [j for j in jobs if j not in timed]
    t0 = time.time()
    runs = []
    try:
        if scored:
            if args.jobs > 1 and len(scored) > 1:
                with multiprocessing.Pool(min(args.jobs, len(scored))) as pool:
                    for r in pool.imap(run_one, scored):
                        runs.append(r)
                        progress(r)
            else:
                for j in scored:
                    runs.append(run_one(j))
                    progress(runs[-1])
        for j in timed:
            runs.append(run_one(j))
            progress(runs[-1])
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)

    seeds_txt = ",".join(str(s) for s in seeds)
    print(f"Zone engine benchmark: seeds {seeds_txt} ({args.set if not args.seeds else 'given'}), "
          f"{len(runs)} traces, {time.time() - t0:.0f} s.\n")
    scored_runs = [r for r in runs if "results" in r]
    if scored_runs:
        print("Each cell: engine / nearest / bermuda. In-zone: % of device time in the true zone. "
              "False: false switches per device-hour. Delay: median switch delay (s). "
              "Missed: switches into zones held >= 15 s with no matching enter; N: such switches.\n")
        print("| scenario | in-zone % | false /h | delay s | missed | N |")
        print("|---|---|---|---|---|---|")
        for n in names:
            rs = [r for r in scored_runs if r["scenario"] == n]
            if rs:
                print(fmt_row(n, aggregate(rs)))
        print(fmt_row("**all**", aggregate(scored_runs)))
        print()
    if LATE_TRUTH_S and scored_runs:
        keys = [f"{x:g}" for x in LATE_TRUTH_S]
        print("The truth itself, reported late: % of device time in the true zone.\n")
        print("| scenario | " + " | ".join(f"{k} s late" for k in keys) + " |")
        print("|---|" + "---|" * len(keys))

        def late_row(label, rs):
            cells = []
            for k in keys:
                total = sum(r["late_truth"][k]["total_ms"] for r in rs)
                cells.append(f"{100.0 * sum(r['late_truth'][k]['correct_ms'] for r in rs) / total:.1f}" if total else "-")
            return f"| {label} | " + " | ".join(cells) + " |"
        for n in names:
            rs = [r for r in scored_runs if r["scenario"] == n]
            if rs:
                print(late_row(n, rs))
        print(late_row("**all**", scored_runs))
        print()
    failures = [r for r in runs if not r["engine_run"]["ok"]]
    if failures:
        reasons = sorted({r["engine_run"].get("error", "?").splitlines()[0][:200] for r in failures})
        print(f"Engine failed on {len(failures)} of {len(runs)} traces: " + "; ".join(reasons))
    for r in runs:
        if "results" not in r:
            e = r["engine_run"]
            if e.get("ok"):
                print(f"Throughput {r['scenario']}-{r['seed']}: {r['adverts']} adverts replayed in {e['replay_s']} s "
                      f"({e['adverts_per_s']} adverts/s).")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seeds": seeds, "runs": runs}, f, indent=1)


def progress(r):
    e = r["engine_run"]
    state = "engine ok" if e.get("ok") else "engine failed"
    print(f"  {r['scenario']}-{r['seed']}: {r['adverts']} adverts, generated in {r['generate_s']} s, "
          f"{state}{', replay ' + str(e['replay_s']) + ' s' if e.get('replay_s') else ''}", file=sys.stderr)


if __name__ == "__main__":
    main()
