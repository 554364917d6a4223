#!/usr/bin/env python3
"""ringlm against llama.cpp, side by side on one machine: llama-bench and
`ringlm bench` run alternately, test by test, on the same model (the
weights of scripts/make_bench_models.py), the same thread count and the
same context depths, and the table shows tokens/s for both and the ratio
ringlm / llama.cpp, plus each process's peak RSS.

    LLAMA_BENCH=/path/to/llama.cpp/build/bin/llama-bench \\
    python3 bench/vs_llamacpp.py --model gemma3-1b --weights q4 -t 2

llama.cpp is never built or vendored here: build it outside from its public
source and point LLAMA_BENCH at its llama-bench. Models come from
build-bench/ (scripts/make_bench_models.py, then `ringlm quantize` and
`llama-quantize` as printed by --help-models).

Weights: q4 = MLX 4-bit g64 (ringlm) vs Q4_0 (llama.cpp); q8 = MLX 8-bit
vs Q8_0; f16 = bf16 safetensors vs F16 GGUF. --same-file: ringlm runs the
very GGUF file llama-bench runs (issue 18; q4_k_m is only that way). KV: f16 (ringlm: the model's
dtype) and 8/4 bits (llama.cpp: q8_0/q4_0 K and V with flash attention,
which its quantized V cache needs).

--rounds N runs each test N times over, llama.cpp then ringlm each time,
and gives each engine's median and the median of the N rounds' ratios
with their range: this VM's speed drifts by a tenth or more over minutes
(docs/performance.md), which a single pair of runs lands on one engine.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GGUF = {"q4": "q4_0", "q8": "q8_0", "f16": "f16", "q4_k_m": "q4_k_m"}
RINGLM_DIR = {"q4": "{m}-4bit", "q8": "{m}-8bit", "f16": "{m}"}
LLAMA_KV = {"f16": "f16", "8": "q8_0", "4": "q4_0"}


# ggml tensor types: (block elements, block bytes), for the GGUF's tensor bytes.
GGML_TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
              7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84),
              11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
              15: ("Q8_K", 256, 292), 30: ("BF16", 1, 2)}


def gguf_tensor_bytes(path):
    """(total bytes, {type name: bytes}) of a GGUF file's tensors, from its
    tensor infos (GGUF v2/v3: header, key-value pairs skipped, infos)."""
    import struct
    f = open(path, "rb")

    def rd(fmt):
        return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]

    def skip_value(vt):
        sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
        if vt == 8:
            f.seek(rd("Q"), 1)
        elif vt == 9:
            et, n = rd("I"), rd("Q")
            if et == 8:
                for _ in range(n):
                    f.seek(rd("Q"), 1)
            else:
                f.seek(sizes[et] * n, 1)
        else:
            f.seek(sizes[vt], 1)

    if f.read(4) != b"GGUF":
        sys.exit(f"vs_llamacpp: {path}: not a GGUF file")
    rd("I")  # version
    n_tensors, n_kv = rd("Q"), rd("Q")
    for _ in range(n_kv):
        f.seek(rd("Q"), 1)
        skip_value(rd("I"))
    total, by = 0, {}
    for _ in range(n_tensors):
        f.seek(rd("Q"), 1)
        n = 1
        for _ in range(rd("I")):
            n *= rd("Q")
        name, blk, size = GGML_TYPES.get(rd("I"), ("?", 1, 0))
        rd("Q")  # offset
        b = n // blk * size
        total += b
        by[name] = by.get(name, 0) + b
    return total, by


def safetensors_tensor_bytes(folder):
    """(total bytes, {dtype: bytes}) of a Hugging Face folder's tensors
    (model.safetensors or the shards of its index)."""
    import struct
    index = os.path.join(folder, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    total, by = 0, {}
    for name in files:
        with open(os.path.join(folder, name), "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        for k, v in header.items():
            if k != "__metadata__":
                b = v["data_offsets"][1] - v["data_offsets"][0]
                total += b
                by[v["dtype"]] = by.get(v["dtype"], 0) + b
    return total, by


def print_bytes(a):
    """Both files' tensor bytes, so that a comparison that is not like for
    like shows (issue 16: a 4-bit embedding against Q8_0 inflated a ratio
    by 1.27x)."""
    gguf = os.path.join(a.models, f"{a.model}-{GGUF[a.weights]}.gguf")
    if a.same_file:
        lt, lby = gguf_tensor_bytes(gguf)
        print(f"tensor bytes: {os.path.basename(gguf)} {lt / 1e6:.1f} MB, the same file for both "
              f"(ringlm converts it at load: see `ringlm inspect -m`)")
        return lt, lt
    folder = os.path.join(a.models, RINGLM_DIR[a.weights].format(m=a.model))
    lt, lby = gguf_tensor_bytes(gguf)
    rt, rby = safetensors_tensor_bytes(folder)

    def parts(by):
        return ", ".join(f"{k} {v / 1e6:.1f}" for k, v in sorted(by.items(), key=lambda kv: -kv[1]))

    print(f"tensor bytes: llama.cpp {os.path.basename(gguf)} {lt / 1e6:.1f} MB ({parts(lby)}); "
          f"ringlm {os.path.basename(folder)} {rt / 1e6:.1f} MB ({parts(rby)}); ringlm / llama.cpp {rt / lt:.3f}")
    if abs(rt / lt - 1) > 0.01:
        print(f"WARNING: the two files differ by {100 * (rt / lt - 1):+.1f}% in tensor bytes: not like for like "
              f"(give ringlm the GGUF's bits tensor by tensor: ringlm quantize --override)")
    return lt, rt


def child_peak_rss(cmd):
    """Runs cmd, returning (stdout, peak RSS bytes) via wait4's rusage."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = p.stdout.read()
    errtext = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        sys.exit(f"vs_llamacpp: {' '.join(cmd)} failed:\n{errtext.decode(errors='replace')[-2000:]}")
    return out.decode(), ru.ru_maxrss * 1024


def llama(a, test, depth, kv):
    gguf = os.path.join(a.models, f"{a.model}-{GGUF[a.weights]}.gguf")
    n_p, n_g = (a.p, 0) if test == "pp" else (0, a.n)
    cmd = [a.llama_bench, "-m", gguf, "-p", str(n_p), "-n", str(n_g), "-d", str(depth), "-t", str(a.threads),
           "-r", str(a.reps), "-o", "json", "-ctk", LLAMA_KV[kv], "-ctv", LLAMA_KV[kv],
           "-fa", "1" if kv != "f16" or a.flash_f16 else "0"]
    out, rss = child_peak_rss(cmd)
    r = json.loads(out)[0]
    return r["avg_ts"], r.get("stddev_ts", 0.0), rss


def ringlm(a, test, depth, kv):
    if a.same_file:
        d = os.path.join(a.models, f"{a.model}-{GGUF[a.weights]}.gguf")
    else:
        d = os.path.join(a.models, RINGLM_DIR[a.weights].format(m=a.model))
    n_p, n_g = (a.p, 0) if test == "pp" else (0, a.n)
    cmd = [a.ringlm, "bench", "-m", d, "-p", str(n_p), "-n", str(n_g), "-d", str(depth), "-t", str(a.threads),
           "-r", str(a.reps), "--json", "--act-bits", str(a.act_bits)]
    if kv != "f16":
        cmd += ["--kv-bits", kv]
    out, rss = child_peak_rss(cmd)
    r = next(x for x in json.loads(out)["results"] if x["test"].startswith(test))
    return r["tokens_per_s"], r["sd"], rss


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH"))
    ap.add_argument("--ringlm", default=os.path.join(ROOT, "build", "ringlm"))
    ap.add_argument("--models", default=os.path.join(ROOT, "build-bench"))
    ap.add_argument("--model", default="gemma3-1b")
    ap.add_argument("--weights", default="q4", choices=sorted(GGUF))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("-r", "--reps", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1,
                    help="run each test this many times, the two engines in turn; median ratio and range")
    ap.add_argument("--depths", default="0,4096,16384")
    ap.add_argument("--kv", default="f16,8,4", help="KV configurations: f16, 8, 4")
    ap.add_argument("--tests", default="pp,tg", help="pp (prefill -p) at depth 0 only, tg (decode) at every depth")
    ap.add_argument("--act-bits", type=int, default=8,
                    help="ringlm's decode activations: 8 = int8 as llama.cpp's Q8_0 (default), 0 = exact f32")
    ap.add_argument("--flash-f16", action="store_true", help="llama.cpp flash attention with f16 KV too")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--bytes-only", action="store_true", help="print the two files' tensor bytes and stop")
    ap.add_argument("--same-file", action="store_true", help="ringlm runs the GGUF file llama-bench runs")
    ap.add_argument("--llama-commit", default=os.environ.get("LLAMA_CPP_COMMIT"),
                    help="llama.cpp commit to print (default: git of the build's source tree, if it is one)")
    a = ap.parse_args()
    a.rounds = max(1, a.rounds)
    if a.weights not in RINGLM_DIR and not a.same_file:
        sys.exit(f"vs_llamacpp: --weights {a.weights} needs --same-file")
    if a.bytes_only:
        print_bytes(a)
        return
    if not a.llama_bench:
        sys.exit("vs_llamacpp: set LLAMA_BENCH to a llama.cpp build's llama-bench (built outside this repo)")
    commit = a.llama_commit or subprocess.run(
        ["git", "-C", os.path.dirname(os.path.dirname(os.path.dirname(a.llama_bench))), "rev-parse", "--short",
         "HEAD"], capture_output=True, text=True).stdout.strip()
    bytes_llama, bytes_ringlm = print_bytes(a)
    rows = []
    print(f"| test | KV | llama.cpp t/s | ringlm t/s | ringlm / llama.cpp | llama.cpp RSS MB | ringlm RSS MB |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for kv in a.kv.split(","):
        for test in a.tests.split(","):
            for depth in ([0] if test == "pp" else [int(d) for d in a.depths.split(",")]):
                runs = []
                for _ in range(a.rounds):
                    lt, lsd, lrss = llama(a, test, depth, kv)   # alternate: one engine, then the other
                    rt, rsd, rrss = ringlm(a, test, depth, kv)
                    runs.append((lt, lsd, lrss, rt, rsd, rrss))
                ratios = [r[3] / r[0] for r in runs]
                ratio = statistics.median(ratios)
                lt, rt = statistics.median(r[0] for r in runs), statistics.median(r[3] for r in runs)
                lrss, rrss = max(r[2] for r in runs), max(r[5] for r in runs)
                name = f"{test}{a.p if test == 'pp' else a.n} @ d{depth}"
                row = dict(test=name, kv=kv, llama_ts=lt, llama_sd=runs[0][1], ringlm_ts=rt, ringlm_sd=runs[0][4],
                           ratio=ratio, llama_rss=lrss, ringlm_rss=rrss)
                spread = ""
                if len(runs) > 1:
                    row.update(rounds=[dict(llama_ts=r[0], ringlm_ts=r[3], ratio=r[3] / r[0]) for r in runs],
                               ratio_min=min(ratios), ratio_max=max(ratios))
                    spread = f" ({min(ratios):.2f}-{max(ratios):.2f})"
                rows.append(row)
                print(f"| {name} | {kv} | {lt:.2f} | {rt:.2f} | {ratio:.2f}x{spread} | {lrss / 2**20:.0f} | "
                      f"{rrss / 2**20:.0f} |", flush=True)
    ours = "the same GGUF" if a.same_file else "bf16 safetensors" if a.weights == "f16" else "MLX g64"
    print(f"\nmodel {a.model}, weights {a.weights} (ringlm {ours} / llama.cpp {GGUF[a.weights]}), "
          f"{a.threads} threads, llama.cpp {commit or '(commit unknown)'}"
          + (f"; {a.rounds} rounds: each engine's median t/s, the median of the rounds' ratios (range)"
             if a.rounds > 1 else ""))
    if a.json:
        json.dump({"model": a.model, "weights": a.weights, "threads": a.threads, "rounds": a.rounds,
                   "llama_cpp_commit": commit,
                   "tensor_bytes": {"llama_cpp": bytes_llama, "ringlm": bytes_ringlm}, "rows": rows},
                  open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
