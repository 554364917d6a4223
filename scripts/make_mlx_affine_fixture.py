#!/usr/bin/env python3
"""Reference fixture for MLX affine quantization, computed independently of
ringlm's C code.

It implements the per-group arithmetic of MLX's GPU quantize kernels
(mlx/backend/cuda/quantized/affine_quantize.cu and the Metal kernel in
mlx/backend/metal/kernels/quantized.h: w_max starts at 0, float32 math,
round half away from zero, codes clamped to n_bins, scales/biases cast to
the input dtype after coding) in torch float32 -- on the GPU when there is
one, and again on the CPU; the two must agree bit for bit -- and packs codes
LSB-first into uint32 words with its own bit arithmetic.

Writes two files into OUT_DIR (default tests/fixtures/mlx_affine):
  input.safetensors     tensors "f32.weight", "bf16.weight", "f16.weight"
                        ([8, 384]: normal, small, all-negative, constant,
                        zero, tiny, huge/±65504, exact ties)
  expected.safetensors  for every bits in 2,3,4,5,6,8 and group size in
                        32,64,128: "b{B}g{G}.{dt}.weight" (U32),
                        ".scales", ".biases" (input dtype)
Run: python3 scripts/make_mlx_affine_fixture.py [OUT_DIR]   (needs torch)
"""
import json
import struct
import sys

import torch

ROWS, COLS = 8, 384


def make_input():
    g = torch.Generator().manual_seed(20261129)
    x = torch.empty(ROWS, COLS, dtype=torch.float32)
    x[0] = torch.randn(COLS, generator=g)
    x[1] = torch.randn(COLS, generator=g) * 1e-3
    x[2] = torch.randn(COLS, generator=g) - 5.0                # all negative
    x[3] = 1.0                                                  # constant
    x[4] = 0.0                                                  # all zero
    x[5] = torch.randn(COLS, generator=g) * 1e-9                # below eps
    x[6] = torch.randn(COLS, generator=g) * 1e4
    x[6, ::7] = 65504.0
    x[6, 3::7] = -65504.0
    x[7] = (torch.arange(COLS) % 31).float() * 0.25             # exact ties
    return x


def round_away(v):
    # torch.round is half-to-even; MLX's GPU kernels use round(): half away
    # from zero. Exact in float64 for any float32 v.
    d = v.double()
    return (torch.sign(d) * torch.floor(d.abs() + 0.5)).float()


def quantize(w, bits, gs):
    """w: float32 [R, C] (the input values widened exactly)."""
    r, c = w.shape
    grp = w.reshape(r, c // gs, gs)
    n_bins = torch.tensor(float(2 ** bits - 1), dtype=torch.float32, device=w.device)
    eps = torch.tensor(1e-7, dtype=torch.float32, device=w.device)
    zero = torch.zeros((), dtype=torch.float32, device=w.device)
    w_max = torch.maximum(grp.amax(-1), zero)                   # starts at 0
    w_min = grp.amin(-1)
    scale = torch.maximum((w_max - w_min) / n_bins, eps)
    side = w_min.abs() > w_max.abs()
    scale = torch.where(side, scale, -scale)
    edge = torch.where(side, w_min, w_max)
    q0 = round_away(edge / scale)
    at_zero = q0 == 0
    scale = torch.where(at_zero, scale, edge / q0)
    bias = torch.where(at_zero, zero, edge)
    q = round_away((grp - bias[..., None]) / scale[..., None])
    q = torch.minimum(q, n_bins).clamp(min=0)                   # uint8 cast saturates at 0
    return q.reshape(r, c).long().cpu(), scale.cpu(), bias.cpu()


def pack(codes, bits):
    r, c = codes.shape
    shifts = torch.arange(bits)
    stream = ((codes[..., None] >> shifts) & 1).reshape(r, c * bits)
    stream = stream.reshape(r, c * bits // 32, 32)
    words = (stream << torch.arange(32)).sum(-1)                # int64, < 2^32
    return words


ST_NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def raw_bytes(t):
    if t.dtype == torch.int64:                                  # packed words
        return b"".join(struct.pack("<I", int(v)) for v in t.flatten().tolist())
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.contiguous().view(torch.int16).numpy().tobytes()
    return t.contiguous().numpy().tobytes()


def save(path, tensors):
    """A minimal safetensors writer (name order, 8-aligned header)."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name]
        b = raw_bytes(t)
        dt = "U32" if t.dtype == torch.int64 else ST_NAMES[t.dtype]
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "mlx", "source": "scripts/make_mlx_affine_fixture.py"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/mlx_affine"
    x = make_input()
    inputs = {
        "f32": x,
        "bf16": x.to(torch.bfloat16),
        "f16": x.clamp(-65504, 65504).to(torch.float16),
    }
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    expected = {}
    for dt, xin in inputs.items():
        w = xin.float()
        for bits in (2, 3, 4, 5, 6, 8):
            for gs in (32, 64, 128):
                runs = [quantize(w.to(d), bits, gs) for d in devices]
                for other in runs[1:]:
                    for a, b in zip(runs[0], other):
                        assert torch.equal(a, b), f"cpu and cuda disagree: {dt} b{bits} g{gs}"
                q, s, b = runs[0]
                p = f"b{bits}g{gs}.{dt}"
                expected[p + ".weight"] = pack(q, bits)
                expected[p + ".scales"] = s.reshape(ROWS, -1).to(xin.dtype)
                expected[p + ".biases"] = b.reshape(ROWS, -1).to(xin.dtype)
    save(f"{out}/input.safetensors", {f"{k}.weight": v for k, v in inputs.items()})
    save(f"{out}/expected.safetensors", expected)
    print(f"devices: {devices}; wrote {len(expected)} expected tensors to {out}")


if __name__ == "__main__":
    main()
