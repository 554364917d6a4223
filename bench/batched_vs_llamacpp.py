#!/usr/bin/env python3
"""ringlm against llama.cpp on batched decoding: llama-batched-bench and
`ringlm bench --batch` run alternately on the same weights (the model of
scripts/make_bench_models.py) and the same thread count, and the table
shows, per batch size B, the aggregate decode and prefill tokens/s of both
and the ratio ringlm / llama.cpp.

    LLAMA_BATCHED_BENCH=/path/to/llama.cpp/build/bin/llama-batched-bench \\
    python3 bench/batched_vs_llamacpp.py --batch 1,4,8,16 -p 128 -n 64 -t 2

What is measured is llama-batched-bench's test (tools/batched-bench,
`-npp P -ntg T -npl B`, prompt not shared): B sequences each get their own
P random tokens, decoded together in n_batch-token batches (S_PP = B*P /
T_PP); then T decode steps of B tokens, one per sequence (S_TG = B*T /
T_TG). `ringlm bench --batch B --json` prints one JSON line per B with the
same keys (pp, tg, pl, n_kv, t_pp, speed_pp, t_tg, speed_tg, t, speed) and
"impl": "ringlm". Each round runs, for each B, one process of each engine,
llama.cpp first in even rounds and ringlm first in odd ones; the table
gives per-B medians over the rounds of each engine's tokens/s and of the
per-round ratio.

llama.cpp is never built or vendored here: build it outside from its public
source and point LLAMA_BATCHED_BENCH at its llama-batched-bench. It runs
with f16 KV and flash attention off (`-fa off`: its default is auto, which
turns it on for the CPU), against ringlm's dense KV in the model's dtype.
Weights: MLX 4-bit g64 with 8-bit embeddings (ringlm) against Q4_0, whose
tied embedding llama-quantize makes Q8_0; --help-models says how to make
both. --dry-run prints the commands instead of running them.
"""
import argparse
import json
import shlex
import os
import statistics
import subprocess
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYS = ("pp", "tg", "pl", "n_kv", "t_pp", "speed_pp", "t_tg", "speed_tg", "t", "speed")

HELP_MODELS = """\
The weights, under build-bench/ (nothing there is committed):

    python3 scripts/make_bench_models.py build-bench gemma3-1b
        # build-bench/gemma3-1b/ (bf16 safetensors) and gemma3-1b-f16.gguf,
        # the same random weights
    build/ringlm quantize build-bench/gemma3-1b build-bench/gemma3-1b-4bit \\
        --bits 4 --group-size 64 --quantize-embeddings --override embed_tokens=8
    /path/to/llama.cpp/build/bin/llama-quantize \\
        build-bench/gemma3-1b-f16.gguf build-bench/gemma3-1b-q4_0.gguf Q4_0

llama-quantize makes the tied 262144 x 1152 token_embd Q8_0 (1152 is no
multiple of 256, so no Q6_K), hence embed_tokens=8 on the ringlm side:
8.5 bits per weight for that tensor on both, 4.5 for the others.
"""


def run_peak(cmd):
    """Runs cmd, returning (its stdout and stderr, its own peak RSS bytes)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # Read stderr on the side, or a chatty child (llama.cpp logs on stderr)
    # fills its pipe and blocks while we wait on stdout.
    errbuf = []
    t = threading.Thread(target=lambda: errbuf.append(p.stderr.read()))
    t.start()
    out = p.stdout.read()
    t.join()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    errtext = errbuf[0].decode(errors="replace")
    if p.returncode:
        sys.exit(f"batched_vs_llamacpp: {' '.join(cmd)} failed ({p.returncode}):\n{errtext[-2000:]}")
    return out.decode(errors="replace") + "\n" + errtext, ru.ru_maxrss * 1024


def cells(text, who, cmd, a, b):
    """The one result line of batch size b in a child's output, checked."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and '"speed_tg"' in line:
            rows.append(json.loads(line))
    rows = [r for r in rows if r.get("pl") == b]
    if len(rows) != 1:
        # llama-batched-bench silently skips a B whose B*(P+T) exceeds -c.
        sys.exit(f"batched_vs_llamacpp: {who}: {len(rows)} result lines for B={b} from {' '.join(cmd)}")
    r = rows[0]
    missing = [k for k in KEYS if k not in r]
    if missing:
        sys.exit(f"batched_vs_llamacpp: {who}: B={b} line lacks {', '.join(missing)}")
    if (r["pp"], r["tg"]) != (a.p, a.n):
        sys.exit(f"batched_vs_llamacpp: {who}: B={b} ran pp {r['pp']} tg {r['tg']}, asked {a.p} and {a.n}")
    if r.get("n_threads", a.threads) != a.threads:   # llama.cpp's line says; ringlm's need not
        sys.exit(f"batched_vs_llamacpp: {who}: B={b} ran {r['n_threads']} threads, asked {a.threads}")
    return r


def llama_cmd(a, b):
    # -c B*(P+T): llama.cpp gives each of the B sequences n_ctx/B cells
    # (padded to 256), the KV of one prompt and its T decoded tokens.
    return [a.llama_batched_bench, "-m", a.gguf, "-t", str(a.threads), "-npp", str(a.p), "-ntg", str(a.n),
            "-npl", str(b), "-c", str(b * (a.p + a.n)), "-fa", "off", "-ctk", "f16", "-ctv", "f16",
            "--output-format", "jsonl"]


def ringlm_cmd(a, b):
    return [a.ringlm, "bench", "-m", a.model_dir, "--batch", str(b), "-p", str(a.p), "-n", str(a.n),
            "-t", str(a.threads), "--act-bits", str(a.act_bits), "--json"]


def run_one(a, impl, b):
    cmd = llama_cmd(a, b) if impl == "llama.cpp" else ringlm_cmd(a, b)
    text, rss = run_peak(cmd)
    r = cells(text, impl, cmd, a, b)
    return dict(r, impl=impl, rss=rss)


def summarize(a, raw):
    """Per-B medians over rounds: each engine's t/s and the per-round ratio."""
    out = []
    for b in a.batch:
        row = {"pl": b}
        for test in ("tg", "pp"):
            key = "speed_" + test
            lt, rt, ratio = [], [], []
            for rnd in range(a.rounds):
                pair = {c["impl"]: c[key] for c in raw if c["round"] == rnd and c["pl"] == b}
                lt.append(pair["llama.cpp"])
                rt.append(pair["ringlm"])
                ratio.append(pair["ringlm"] / pair["llama.cpp"])
            row.update({f"llama_{test}": statistics.median(lt), f"ringlm_{test}": statistics.median(rt),
                        f"ratio_{test}": statistics.median(ratio),
                        f"ratio_{test}_min": min(ratio), f"ratio_{test}_max": max(ratio)})
        for impl in ("llama.cpp", "ringlm"):
            row[f"rss_{impl}"] = max(c["rss"] for c in raw if c["pl"] == b and c["impl"] == impl)
        out.append(row)
    return out


def print_table(a, rows, commit):
    print(f"| B | llama.cpp tg t/s | ringlm tg t/s | ringlm / llama.cpp tg | llama.cpp pp t/s | ringlm pp t/s | "
          f"ringlm / llama.cpp pp | llama.cpp RSS MB | ringlm RSS MB |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['pl']} | {r['llama_tg']:.2f} | {r['ringlm_tg']:.2f} | {r['ratio_tg']:.2f}x "
              f"({r['ratio_tg_min']:.2f}-{r['ratio_tg_max']:.2f}) | {r['llama_pp']:.2f} | {r['ringlm_pp']:.2f} | "
              f"{r['ratio_pp']:.2f}x ({r['ratio_pp_min']:.2f}-{r['ratio_pp_max']:.2f}) | "
              f"{r['rss_llama.cpp'] / 2**20:.0f} | {r['rss_ringlm'] / 2**20:.0f} |")
    print(f"\npp {a.p} tokens and tg {a.n} steps per sequence, B sequences; aggregate t/s (B*tokens / time), "
          f"medians of {a.rounds} rounds (ratio: median of per-round ratios, min-max in brackets); "
          f"{a.threads} threads; ringlm {os.path.basename(a.model_dir)} --act-bits {a.act_bits}, dense KV; "
          f"llama.cpp {os.path.basename(a.gguf)}, f16 KV, no flash attention, {commit or '(commit unknown)'}")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-batched-bench", default=os.environ.get("LLAMA_BATCHED_BENCH"),
                    help="llama.cpp's llama-batched-bench (default: $LLAMA_BATCHED_BENCH)")
    ap.add_argument("--ringlm", default=os.path.join(ROOT, "build", "ringlm"))
    ap.add_argument("--model-dir", default=os.path.join(ROOT, "build-bench", "gemma3-1b-4bit"),
                    help="ringlm's model folder")
    ap.add_argument("--gguf", default=os.path.join(ROOT, "build-bench", "gemma3-1b-q4_0.gguf"),
                    help="llama.cpp's model file")
    ap.add_argument("--batch", default="1,4,8,16", help="batch sizes B (parallel sequences)")
    ap.add_argument("-p", type=int, default=128, help="prompt tokens per sequence")
    ap.add_argument("-n", type=int, default=64, help="decode steps (tokens per sequence)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of alternating runs; medians over them")
    ap.add_argument("--act-bits", type=int, default=8,
                    help="ringlm's activations: 8 = int8 as llama.cpp's Q8_0 (default; AVX2 or AVX-512 "
                         "VNNI kernels), 0 = exact f32")
    ap.add_argument("--json", help="also write every raw cell and the per-B medians to this file")
    ap.add_argument("--llama-commit", default=os.environ.get("LLAMA_CPP_COMMIT"),
                    help="llama.cpp commit to print (default: git of the build's source tree, if it is one)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, in order, and run nothing")
    ap.add_argument("--help-models", action="store_true", help="say how to make the two models, and exit")
    a = ap.parse_args()
    if a.help_models:
        print(HELP_MODELS, end="")
        sys.exit(0)
    try:
        a.batch = [int(x) for x in a.batch.split(",")]
    except ValueError:
        ap.error(f"--batch expects B1,B2,... got '{a.batch}'")
    if min(a.batch) < 1 or a.p < 1 or a.n < 1 or a.rounds < 1 or a.threads < 1:
        ap.error("--batch, -p, -n, --rounds and -t must be positive")
    if not a.llama_batched_bench:
        if not a.dry_run:
            sys.exit("batched_vs_llamacpp: set LLAMA_BATCHED_BENCH to a llama.cpp build's llama-batched-bench "
                     "(built outside this repo)")
        a.llama_batched_bench = "llama-batched-bench"
    return a


def main():
    a = parse_args()
    order = ("llama.cpp", "ringlm")
    if a.dry_run:
        for rnd in range(a.rounds):
            for b in a.batch:
                for impl in order if rnd % 2 == 0 else order[::-1]:
                    cmd = llama_cmd(a, b) if impl == "llama.cpp" else ringlm_cmd(a, b)
                    print(f"# round {rnd} B={b} {impl}\n{shlex.join(cmd)}")
        return
    for path in (a.gguf, a.model_dir):
        if not os.path.exists(path):
            sys.exit(f"batched_vs_llamacpp: {path} is missing (see --help-models)")
    commit = a.llama_commit or subprocess.run(
        ["git", "-C", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(a.llama_batched_bench)))),
         "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    raw = []
    for rnd in range(a.rounds):
        for b in a.batch:
            for impl in order if rnd % 2 == 0 else order[::-1]:   # alternate who goes first
                c = run_one(a, impl, b)
                raw.append(dict(c, round=rnd))
                print(f"round {rnd} B={b} {impl}: tg {c['speed_tg']:.2f} t/s, pp {c['speed_pp']:.2f} t/s",
                      file=sys.stderr, flush=True)
    rows = summarize(a, raw)
    print_table(a, rows, commit)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"p": a.p, "n": a.n, "threads": a.threads, "rounds": a.rounds, "act_bits": a.act_bits,
                       "model_dir": a.model_dir, "gguf": a.gguf, "llama_cpp_commit": commit,
                       "medians": rows, "cells": raw}, f, indent=1)


if __name__ == "__main__":
    main()
