#!/usr/bin/env python3
"""Aggregate decode tokens/s against the batch size B, from the JSON Lines
that `ringlm bench --batch ... --json` prints (one file per series; the
series is named after the file), as docs/performance.md shows it. A file
may hold several rounds of the same sizes: the line goes through each B's
median, a bar from its slowest run to its fastest.

    ringlm bench -m build-bench/gemma3-1b-4bit --batch 1,2,4,8,16 -p 32 -n 16 --json > f32.jsonl
    /usr/bin/python3 bench/plot_batch.py OUT.png f32.jsonl [int8.jsonl ...]

Needs matplotlib (Debian: python3-matplotlib).
"""
import json
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def series(path):
    """B, the median tokens/s at each B, and the slowest and fastest run
    (a file may hold several rounds of the same sizes)."""
    runs = {}
    for line in open(path):
        if line.strip().startswith("{"):
            r = json.loads(line)
            runs.setdefault(r["pl"], []).append(r["speed_tg"])
    b = sorted(runs)
    return b, [statistics.median(runs[x]) for x in b], [min(runs[x]) for x in b], [max(runs[x]) for x in b]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    fig, ax = plt.subplots(figsize=(6, 4))
    for path in sys.argv[2:]:
        b, s, lo, hi = series(path)
        line = ax.plot(b, s, marker="o", label=os.path.splitext(os.path.basename(path))[0])[0]
        if lo != hi:  # rounds: the slowest to the fastest
            ax.errorbar(b, s, yerr=[[m - a for m, a in zip(s, lo)], [z - m for m, z in zip(s, hi)]],
                        fmt="none", ecolor=line.get_color(), capsize=3)
        if b and b[0] == 1:  # the ideal: B times the one-row speed
            ax.plot(b, [s[0] * x for x in b], linestyle=":", color="grey")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size B (sequences decoded at once)")
    ax.set_ylabel("aggregate decode tokens/s")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(sys.argv[1], dpi=110)


if __name__ == "__main__":
    main()
