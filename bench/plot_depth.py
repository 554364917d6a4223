#!/usr/bin/env python3
"""Decode tokens/s against context depth, ringlm and llama.cpp, from the
JSON files bench/vs_llamacpp.py --json writes (one or several runs: rows
with the same test and KV are taken from the last file that has them).
Rows of a --rounds run get bars from each engine's slowest to fastest
round.

    /usr/bin/python3 bench/plot_depth.py OUT.png RUN1.json [RUN2.json ...]

Needs matplotlib (Debian: python3-matplotlib).
"""
import json
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    out, files = sys.argv[1], sys.argv[2:]
    rows, meta = {}, {}
    for f in files:
        d = json.load(open(f))
        meta = d
        for r in d["rows"]:
            m = re.match(r"tg\d+ @ d(\d+)", r["test"])
            if m:
                rows[(r["kv"], int(m.group(1)))] = r
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for kv, style in (("f16", "-"), ("8", ":"), ("4", "--")):
        pts = sorted((d, r) for (k, d), r in rows.items() if k == kv)
        if not pts:
            continue
        label = "f16 KV" if kv == "f16" else f"{kv}-bit KV"
        for key, mark, color, who in (("ringlm_ts", "o", "C0", "ringlm"), ("llama_ts", "s", "C1", "llama.cpp")):
            xs, ys = [d for d, _ in pts], [r[key] for _, r in pts]
            ax.plot(xs, ys, mark + style, color=color, label=f"{who}, {label}")
            # --rounds runs: each engine's range over the rounds around its median
            lo = [y - min(x[key] for x in r.get("rounds", [{key: y}])) for y, (_, r) in zip(ys, pts)]
            hi = [max(x[key] for x in r.get("rounds", [{key: y}])) - y for y, (_, r) in zip(ys, pts)]
            if any(lo) or any(hi):
                ax.errorbar(xs, ys, yerr=[lo, hi], fmt="none", color=color, capsize=3, lw=1)
    ax.set(xlabel="context depth (tokens)", ylabel="decode tokens/s",
           title=f"{meta.get('model')} ({meta.get('weights')} weights), {meta.get('threads')} threads")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
