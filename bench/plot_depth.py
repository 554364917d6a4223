#!/usr/bin/env python3
"""Decode tokens/s against context depth, ringlm and llama.cpp, from the
JSON files bench/vs_llamacpp.py --json writes (one or several runs: rows
with the same test and KV are taken from the last file that has them).

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
        ax.plot([d for d, _ in pts], [r["ringlm_ts"] for _, r in pts], "o" + style, color="C0",
                label=f"ringlm, {label}")
        ax.plot([d for d, _ in pts], [r["llama_ts"] for _, r in pts], "s" + style, color="C1",
                label=f"llama.cpp, {label}")
    ax.set(xlabel="context depth (tokens)", ylabel="decode tokens/s",
           title=f"{meta.get('model')} ({meta.get('weights')} weights), {meta.get('threads')} threads")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
