#!/usr/bin/env python3
"""KV snapshot files against references no one here wrote: Hugging Face's
safetensors reader opens them, and the keys and values they store equal
the KV cache transformers computes for the same ids (dense: within float
rounding; 8-bit: dequantized with MLX's affine formula, within half a
quantization step). Also checks the CRC-32C with an independent bitwise
implementation and mlx-lm's metadata tree (class names, meta states).

Run where torch and transformers are installed (the GPU machine), on
files made by `ringlm cache-prompt -m tests/fixtures/models/ARCH --ids ...`:

    python3 scripts/check_snapshot_hf.py IDS DIR_OF_SNAPSHOTS

Each file is named ARCH.KIND.safetensors. Prints one line per file and
layer; exits 1 on any mismatch.
"""
import json
import os
import sys

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def check_crc(path):
    raw = bytearray(open(path, "rb").read())
    key = b'"1.ringlm_crc32c":"'
    at = raw.index(key) + len(key)
    want = int(raw[at:at + 8].decode(), 16)
    raw[at:at + 8] = b"00000000"
    return crc32c(bytes(raw)) == want


def dequant(packed, scales, biases, bits, group):
    """MLX affine: values packed from the low bits of each u32 word up."""
    w = packed.to(torch.int64) & 0xFFFFFFFF
    per = 32 // bits
    q = torch.stack([(w >> (bits * j)) & ((1 << bits) - 1) for j in range(per)], dim=-1)
    q = q.reshape(*packed.shape[:-1], packed.shape[-1] * per).to(torch.float64)
    s = scales.to(torch.float64).repeat_interleave(group, dim=-1)
    b = biases.to(torch.float64).repeat_interleave(group, dim=-1)
    return q * s + b, s


def mlx_quantize_codes(x, bits, group):
    """mx.quantize's affine codes as its Metal/CUDA kernels compute them
    (spec/mlx-semantics.md section 1.2), in float32."""
    n = float(2 ** bits - 1)
    g = x.to(torch.float32).reshape(*x.shape[:-1], x.shape[-1] // group, group)
    wmax = torch.clamp(g.max(dim=-1).values, min=0.0)
    wmin = g.min(dim=-1).values
    s = torch.clamp((wmax - wmin) / n, min=1e-7)
    side = wmin.abs() > wmax.abs()
    s = torch.where(side, s, -s)
    edge = torch.where(side, wmin, wmax)
    q0 = torch.round(edge / s)
    scale = torch.where(q0 != 0, edge / q0, s)
    bias = torch.where(q0 != 0, edge, torch.zeros_like(edge))
    q = torch.clamp(torch.round((g - bias[..., None]) / scale[..., None]), 0, n)
    return q.reshape(x.shape).to(torch.int64)


def hf_cache(arch, ids):
    model = AutoModelForCausalLM.from_pretrained(os.path.join(ROOT, "tests/fixtures/models", arch),
                                                 torch_dtype=torch.float32)
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
    pkv = out.past_key_values
    return [(layer.keys.double(), layer.values.double()) for layer in pkv.layers]


def stored_positions(L):
    n_sinks = min(L["keep"], L["offset"])
    return list(range(n_sinks)) + list(range(L["first"], L["offset"]))


def check_file(path, arch, ids, caches):
    ok = True
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
        assert meta["1.ringlm_format"] == "ringlm-kv-snapshot", path
        assert json.loads(meta["1.ringlm_tokens"]) == ids, "token ids"
        names = set(f.keys())
        crc_ok = check_crc(path)
        print(f"{os.path.basename(path)}: {len(names)} tensors, CRC-32C {'ok' if crc_ok else 'BAD'}")
        ok &= crc_ok
        for i in range(int(meta["1.ringlm_layers"])):
            L = json.loads(meta[f"1.ringlm_layer_{i}"])
            if "shares" in L:
                continue
            c = L["cache"]
            cls = meta[f"2.{c}"]
            pos = stored_positions(L)
            for t, which in ((0, "K"), (1, "V")):
                ref_all = caches[i][t][0]  # [H, L_hf, D]
                hf_first = L["offset"] - ref_all.shape[1]  # HF's sliding layers keep the newest
                idx = [p for p in range(len(pos)) if pos[p] >= hf_first]
                ref = ref_all[:, [pos[p] - hf_first for p in idx], :]
                if f"{c}.{t}" in names:
                    got = f.get_tensor(f"{c}.{t}").double()[0][:, idx, :]
                    err = (got - ref).abs().max().item()
                    tol = 1e-5 * max(1.0, ref.abs().max().item())
                else:
                    bits = int(meta[f"0.{c}.2"]) if cls == "QuantizedKVCache" else int(meta[f"0.{c}.5"])
                    group = int(meta[f"0.{c}.1"]) if cls == "QuantizedKVCache" else int(meta[f"0.{c}.4"])
                    got, s = dequant(f.get_tensor(f"{c}.{t}.0"), f.get_tensor(f"{c}.{t}.1"),
                                     f.get_tensor(f"{c}.{t}.2"), bits, group)
                    got, s = got[0][:, idx, :], s[0][:, idx, :]
                    if i > 0:  # fed by attention over quantized KV: not the dense cache
                        err = ((got - ref).abs() / (s.abs() + 1e-12)).max().item()
                        print(f"  layer {i} cache {c} {cls:24s} {which}: {err:.3g} steps from the dense "
                              f"cache (KV quantization upstream: not checked)")
                        continue
                    w = f.get_tensor(f"{c}.{t}.0").to(torch.int64) & 0xFFFFFFFF
                    per = 32 // bits
                    codes = torch.stack([(w >> (bits * j)) & ((1 << bits) - 1) for j in range(per)], -1)
                    codes = codes.reshape(*w.shape[:-1], w.shape[-1] * per)[0][:, idx, :]
                    want = mlx_quantize_codes(ref, bits, group)
                    diff = (codes - want).abs()
                    err = diff.max().item()  # codes apart (float rounding of the input may move one)
                    frac = (diff == 0).double().mean().item()
                    tol = 1
                    good = err <= tol and frac >= 0.99 and len(idx) > 0
                    ok &= good
                    print(f"  layer {i} cache {c} {cls:24s} {which}: codes vs mx.quantize(transformers' "
                          f"cache): {100 * frac:.2f}% equal, max {err} apart {'ok' if good else 'MISMATCH'}")
                    continue
                good = err <= tol and len(idx) > 0
                ok &= good
                print(f"  layer {i} cache {c} {cls:24s} {which}: {len(idx)} positions vs transformers, "
                      f"max err {err:.3g} (tol {tol:.3g}) {'ok' if good else 'MISMATCH'}")
            if cls in ("RotatingKVCache", "QuantizedRotatingKVCache"):
                keep, size, off, idx_ = (int(meta[f"0.{c}.{j}"]) for j in range(4))
                good = (keep, size, off, idx_) == (L["keep"], L["window"], L["offset"], L["stored"])
                ok &= good
                print(f"  layer {i} mlx-lm meta (keep, max_size, offset, _idx) = {(keep, size, off, idx_)} "
                      f"{'ok' if good else 'MISMATCH'}")
    return ok


def main():
    ids = [int(x) for x in sys.argv[1].split(",")]
    folder = sys.argv[2]
    ok = True
    caches = {}
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".safetensors"):
            continue
        arch = name.split(".")[0]
        if arch not in caches:
            caches[arch] = hf_cache(arch, ids)
        ok &= check_file(os.path.join(folder, name), arch, ids, caches[arch])
    print("all ok" if ok else "MISMATCHES")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
