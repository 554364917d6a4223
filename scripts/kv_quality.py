#!/usr/bin/env python3
"""The KV-quantization quality table of docs/kv-quality.md: for each KV
cache configuration, `ringlm perplexity --kl` over the held-out split of
the embedded model's corpus, against a dense (bf16) KV run of the same
windows. One command regenerates the table, its JSON and its plot:

    python3 scripts/prepare_corpus.py build-corpus      # once: the held-out text
    /usr/bin/python3 scripts/kv_quality.py               # ~40 min on 2 cores
    /usr/bin/python3 scripts/kv_quality.py --render      # table + plot again from the JSON

Options: --ringlm PATH (default build/ringlm), --model DIR (default
models/brown-15m-8bit), --text FILE (default build-corpus/test.txt),
--windows N (default 32 windows of --ctx 512 tokens: contexts 4x the
128-token sliding window, so every ring wraps), --threads T, --out PREFIX
(default docs/kv-quality). The plot needs matplotlib (Debian:
python3-matplotlib); without it the table and JSON are still written.
"""
import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = ([(f"{b}-bit g{g}", b, b, g) for b in (8, 6, 5, 4, 3, 2) for g in (32, 64, 128)]
           + [("K8V4 g64", 8, 4, 64), ("K4V8 g64", 4, 8, 64)])


def run_one(a, k, v, g):
    cmd = [a.ringlm, "perplexity", "-m", a.model, "-f", a.text, "--ctx", str(a.ctx), "--max-windows",
           str(a.windows), "-t", str(a.threads), "--kl", "--k-bits", str(k), "--v-bits", str(v),
           "--kv-group-size", str(g)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:  # e.g. a group wider than the head dim: MLX's layout cannot hold it
        return {"error": res.stderr.strip().splitlines()[-1], "command": shown(cmd)}
    out = res.stdout
    ppl = re.search(r"^perplexity ([\d.]+) \(mean nll [\d.]+ over (\d+) tokens", out, re.M)
    kl = re.search(r"mean KL ([\d.]+), top-1 agreement ([\d.]+)%, dense-KV perplexity ([\d.]+)", out)
    return {"ppl": float(ppl.group(1)), "tokens": int(ppl.group(2)), "kl": float(kl.group(1)),
            "top1": float(kl.group(2)), "dense_ppl": float(kl.group(3)), "command": shown(cmd)}


def shown(cmd):
    """The command as a reader would type it: `ringlm ...`, paths relative."""
    return " ".join(["ringlm"] + [c.replace(ROOT + "/", "") for c in cmd[1:]])


def bytes_per_token(a, k, v, g):
    """KV bytes per token of the growing layers, from `ringlm inspect -m`."""
    out = subprocess.run([a.ringlm, "inspect", "-m", a.model, "--kv-group-size", str(g)], check=True,
                         capture_output=True, text=True).stdout
    name = "dense" if k == 0 else (f"{k}-bit" if k == v else f"k{k}v{v}")
    m = re.search(rf"^  {name}\s+([\d.]+)", out, re.M)
    return float(m.group(1)) if m else None


def write_table(a, rows, dense):
    lines = [
        "# KV-cache quantization: quality on the embedded model",
        "",
        f"Model `{os.path.relpath(a.model, ROOT)}` (MLX 8-bit weights), the first {a.windows} windows of "
        f"{a.ctx} tokens of the held-out split of its corpus ({next(r for r in rows if 'tokens' in r)['tokens']} "
        "positions scored; each window is 4x the 128-token sliding window, so every ring wraps; these "
        "documents are harder than the split's average, whose dense perplexity is 94.15). Each row quantizes every layer's KV cache (rings included) "
        "and is compared, position by position, with a dense bf16 KV run of the same windows: perplexity, "
        "its change, mean KL divergence KL(dense ‖ quantized) of the next-token distribution, and how "
        "often the two agree on the most likely token.",
        "",
        f"Dense bf16 KV: perplexity **{dense:.4f}**, {bytes_per_token(a, 0, 0, 64):.0f} bytes per token "
        "in the full-attention layers.",
        "",
        "| KV cache | bytes/token | perplexity | Δ perplexity | mean KL | top-1 agreement |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | — | n/a: {r['error'].replace('ringlm: ', '')} | | | |")
            continue
        lines.append(f"| {r['name']} | {r['bytes_per_token']:.0f} | {r['ppl']:.4f} | "
                     f"{100 * (r['ppl'] / dense - 1):+.2f}% | {r['kl']:.5f} | {r['top1']:.2f}% |")
    lines += ["", "Regenerate (prints each row as it goes; writes this file, "
              f"`{os.path.basename(a.out)}.json` and `{os.path.basename(a.out)}.png`):", "",
              "    python3 scripts/prepare_corpus.py build-corpus",
              f"    /usr/bin/python3 scripts/kv_quality.py --windows {a.windows}   # Debian's python3, python3-matplotlib",
              "", "One row's command:", "", "    " + rows[0]["command"], "",
              "Group 128 needs a head dim that is a multiple of 128 (MLX quantizes K and V along the "
              "head dim); this model's is 64, so those rows cannot exist here.", ""]
    if os.path.exists(a.out + ".png"):
        lines += [f"![KL divergence and perplexity change against KV bits]({os.path.basename(a.out)}.png)", ""]
    open(a.out + ".md", "w").write("\n".join(lines))


def plot(a, rows, dense):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("kv_quality: matplotlib missing (apt install python3-matplotlib): no plot", file=sys.stderr)
        return
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for g, mark in ((32, "o"), (64, "s"), (128, "^")):
        sel = [r for r in rows if r["group"] == g and r["k"] == r["v"]]
        if not sel:
            continue
        bits = [r["k"] for r in sel]
        ax[0].semilogy(bits, [max(r["kl"], 1e-7) for r in sel], marker=mark, label=f"group {g}")
        ax[1].plot(bits, [100 * (r["ppl"] / dense - 1) for r in sel], marker=mark, label=f"group {g}")
    for r in rows:
        if r["k"] != r["v"]:
            ax[0].scatter([(r["k"] + r["v"]) / 2], [r["kl"]], marker="x", color="k")
            ax[0].annotate(r["name"].split()[0], ((r["k"] + r["v"]) / 2, r["kl"]), fontsize=8)
    ax[0].set(xlabel="KV bits", ylabel="mean KL(dense ‖ quantized)", title="KL divergence")
    ax[1].set(xlabel="KV bits", ylabel="perplexity change (%)", title="Perplexity vs dense KV")
    for x in ax:
        x.grid(alpha=0.3)
        x.legend()
    fig.tight_layout()
    fig.savefig(a.out + ".png", dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ringlm", default=os.path.join(ROOT, "build", "ringlm"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "brown-15m-8bit"))
    ap.add_argument("--text", default=os.path.join(ROOT, "build-corpus", "test.txt"))
    ap.add_argument("--windows", type=int, default=32)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "kv-quality"))
    ap.add_argument("--render", action="store_true", help="redraw table and plot from OUT.json")
    a = ap.parse_args()
    if a.render:
        d = json.load(open(a.out + ".json"))
        for r in d["rows"]:
            r["command"] = r["command"].replace("/tmp/ref/ringlm", "ringlm").replace(ROOT + "/", "")
        json.dump(d, open(a.out + ".json", "w"), indent=1)
        ok = [r for r in d["rows"] if "error" not in r]
        plot(a, ok, d["dense_ppl"])
        write_table(a, d["rows"], d["dense_ppl"])
        return
    rows = []
    for name, k, v, g in CONFIGS:
        r = run_one(a, k, v, g)
        r.update(name=name, k=k, v=v, group=g)
        rows.append(r)
        if "error" in r:
            print(f"{name:10s} n/a: {r['error']}", flush=True)
            continue
        r["bytes_per_token"] = bytes_per_token(a, k, v, g)
        print(f"{name:10s} ppl {r['ppl']:.4f} (dense {r['dense_ppl']:.4f}) KL {r['kl']:.5f} "
              f"top-1 {r['top1']:.2f}% {r['bytes_per_token']:.0f} B/token", flush=True)
    ok = [r for r in rows if "error" not in r]
    dense = ok[0]["dense_ppl"]
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    json.dump({"dense_ppl": dense, "rows": rows}, open(a.out + ".json", "w"), indent=1)
    plot(a, ok, dense)
    write_table(a, rows, dense)
    print(f"wrote {a.out}.md")


if __name__ == "__main__":
    main()
