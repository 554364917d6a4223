#!/usr/bin/env python3
"""Decode speed against thread count, with and without a competitor.

The thread pool must hold up when threads outnumber the free cores: with
another process busy on one core, the default thread count must keep at
least 0.9x the better of -t 1 and -t 2, and -t 8 at least 0.7x the
default; and with nothing else running the pool must cost nothing against
a baseline build (within 3%). This runs `ringlm bench -p 0` (decode only)
for every model, load and thread count, rounds interleaved so that drifts
of this shared machine hit every cell alike, and prints medians, ratios
and the verdict of each check.

    /usr/bin/python3 bench/pool_contention.py --bin build/ringlm \
        --baseline /tmp/base/build/ringlm \
        --model models/brown-15m-4bit --model build-bench/gemma3-1b-4bit

The competitor is a busy loop pinned to the last CPU (taskset), started
before and killed after the loaded cells. "default" is the thread count
ringlm picks without -t (its physical cores, from `ringlm version`); when
that count is also listed, the two are one configuration, measured once.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys


def decode_tps(binary, model, threads, n, reps, act_bits):
    cmd = [binary, "bench", "-m", model, "-p", "0", "-n", str(n), "-r", str(reps), "--json"]
    if threads != "default":
        cmd += ["-t", str(threads)]
    if act_bits:
        cmd += ["--act-bits", str(act_bits)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["results"][0]["tokens_per_s"]


def default_threads(binary):
    out = subprocess.run([binary, "version"], check=True, capture_output=True, text=True).stdout
    m = re.search(r"(\d+) physical core", out)
    return int(m.group(1)) if m else None


def start_competitor():
    cpu = os.cpu_count() - 1
    return subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", "while True: pass"])


def measure(a, binaries, loaded):
    """{(binary, model, threads): [tok/s per round]} for one load; the
    cells of one round run back to back, so ratios are taken per round."""
    cells = {}
    comp = start_competitor() if loaded else None
    try:
        for rnd in range(a.rounds):
            for model in a.model:
                n = a.n_small if "brown" in model else a.n_large
                for t in a.threads:
                    for b in binaries:
                        v = decode_tps(b, model, t, n, a.reps, a.act_bits)
                        cells.setdefault((b, model, t), []).append(v)
                        print(f"  round {rnd + 1}: {'loaded' if loaded else 'idle':6} {os.path.basename(model):22} "
                              f"-t {t:7} {b}: {v:8.2f} tok/s", file=sys.stderr)
    finally:
        if comp:
            comp.kill()
            comp.wait()
    return cells


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/ringlm")
    ap.add_argument("--baseline", help="an older ringlm to compare idle decode against")
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--threads", default="1,2,8")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-r", "--reps", type=int, default=1, help="ringlm bench -r per cell and round")
    ap.add_argument("--n-small", type=int, default=256, help="decode tokens, embedded model")
    ap.add_argument("--n-large", type=int, default=32, help="decode tokens, larger models")
    ap.add_argument("--act-bits", type=int, default=0)
    ap.add_argument("--json", help="also write the medians here")
    a = ap.parse_args()
    a.threads = [t if t == "default" else int(t) for t in a.threads.split(",")]
    d = default_threads(a.bin)
    if d in a.threads:
        a.default = d  # the same configuration: measured once
        a.threads = [t for t in a.threads if t != "default"]
    else:
        a.default = "default"
        if "default" not in a.threads:
            a.threads.append("default")  # every check compares against it
    binaries = [a.bin] + ([a.baseline] if a.baseline else [])
    raw = {"idle": measure(a, binaries, False), "loaded": measure(a, [a.bin], True)}
    res = {load: {k: statistics.median(v) for k, v in d.items()} for load, d in raw.items()}

    def ratio(load, num, den):
        """Median over rounds of num / den, each cell a (binary, model, threads) key."""
        return statistics.median(x / y for x, y in zip(raw[load][num], raw[load][den]))
    checks = []
    label = {t: f"-t {t}" + (" (def)" if t == a.default else "") for t in a.threads}
    print(f"{'model':24} {'load':7} " + " ".join(f"{label[t]:>12}" for t in a.threads))
    for model in a.model:
        for load in ("idle", "loaded"):
            row = {t: res[load][(a.bin, model, t)] for t in a.threads}
            print(f"{os.path.basename(model):24} {load:7} " + " ".join(f"{row[t]:12.2f}" for t in a.threads))
            if load == "idle" and a.baseline:
                base = {t: res[load][(a.baseline, model, t)] for t in a.threads}
                print(f"{'  baseline':24} {load:7} " + " ".join(f"{base[t]:12.2f}" for t in a.threads))
                r = ratio(load, (a.bin, model, a.default), (a.baseline, model, a.default))
                checks.append((f"{os.path.basename(model)} idle default vs baseline", r, 0.97))
            if 1 in row and 2 in row and load == "loaded":
                best = 1 if row[1] > row[2] else 2
                checks.append((f"{os.path.basename(model)} loaded default vs -t {best} (the better)",
                               ratio(load, (a.bin, model, a.default), (a.bin, model, best)), 0.9))
            if 8 in row:
                checks.append((f"{os.path.basename(model)} {load} -t 8 vs default",
                               ratio(load, (a.bin, model, 8), (a.bin, model, a.default)), 0.7))
    print("\nchecks: medians over rounds of the ratio within each round")
    for name, r, need in checks:
        print(f"{name:60} {r:6.3f}x  (need >= {need})  {'met' if r >= need else 'NOT MET'}")
    if a.json:
        json.dump({"threads": [str(t) for t in a.threads],
                   "cells": [{"load": load, "bin": b, "model": m, "threads": str(t), "tokens_per_s": v}
                             for load, d in res.items() for (b, m, t), v in d.items()],
                   "checks": [{"name": n, "ratio": r, "need": need} for n, r, need in checks]},
                  open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
