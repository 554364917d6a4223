#!/usr/bin/env python3
"""gguf_ref.py -- an independent reference decoder for GGUF tensors.

Written from the GGUF format description (ggml's docs/gguf.md) and the
ggml block layouts (ggml-common.h, the dequantize_row_* functions of
ggml-quants.c), sharing no code with ringlm's C reader or converter
(src/model/gguf.c, gguf_quant.c). ringlm's tests compare its conversions
with this script bit for bit; the GGUF model tests take their reference
weights from it. Clarity first; numpy vectorizes over blocks.

Usage:
  gguf_ref.py FILE.gguf --list                  names, types, dims
  gguf_ref.py FILE.gguf --tensor NAME -o OUT.npy
  gguf_ref.py FILE.gguf -o OUTDIR               every tensor: OUTDIR/<name>.npy
  gguf_ref.py FILE.gguf --tensor NAME --tensor NAME2 -o OUTDIR

Output arrays are float32 with numpy's shape order, the reverse of GGUF's
dims (dims[0] varies fastest): a matrix with dims {cols, rows} is saved as
[rows, cols]. Types: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
Q5_K, Q6_K; any other type is an error naming it.

Arithmetic is float32 in the order ggml uses, so the values are ggml's:
  Q8_0  d*q                 Q4_0  d*(q-8)       Q4_1  d*q + m
  Q5_0  d*(q-16)            Q5_1  d*q + m
  Q4_K, Q5_K  (d*sc)*q - (dmin*m)   per sub-block of 32
  Q6_K  (d*sc)*(q-32)                per sub-block of 16
(d, dmin, m are f16 widened to f32; sc, m small integers.)

Requires numpy only. Exit status 0, or 1 with a message on stderr.
"""
import argparse
import os
import struct
import sys

import numpy as np

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# Metadata value types: id -> fixed size in bytes (None: string/array).
VALUE_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 8: None, 9: None, 10: 8, 11: 8, 12: 8}
UINT32 = 4

# ggml tensor types this script decodes: id -> (name, elements, bytes per block).
TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    30: ("BF16", 1, 2),
    8: ("Q8_0", 32, 34),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
}
# Names of the others, for messages.
OTHER_TYPES = {9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS",
               18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS",
               24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 34: "TQ1_0",
               35: "TQ2_0", 39: "MXFP4"}


class GGUFError(Exception):
    pass


# ---- the file ----------------------------------------------------------------

class Reader:
    """Little-endian fields from a bytes object, bounds-checked."""

    def __init__(self, data):
        self.data = data
        self.pos = 0

    def take(self, n):
        if n < 0 or self.pos + n > len(self.data):
            raise GGUFError("truncated file (at byte %d, %d more needed)" % (self.pos, n))
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def u32(self):
        return struct.unpack("<I", self.take(4))[0]

    def u64(self):
        return struct.unpack("<Q", self.take(8))[0]

    def string(self):
        return self.take(self.u64()).decode("utf-8")

    def value(self, vtype):
        """Reads one metadata value; returns it for the few keys we need."""
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, n = self.u32(), self.u64()
            if etype in (8, 9):
                return [self.value(etype) for _ in range(n)]
            size = VALUE_SIZES.get(etype)
            if size is None:
                raise GGUFError("unknown array element type %d" % etype)
            self.take(size * n)
            return None
        size = VALUE_SIZES.get(vtype)
        if size is None:
            raise GGUFError("unknown value type %d" % vtype)
        raw = self.take(size)
        if vtype == UINT32:
            return struct.unpack("<I", raw)[0]
        return None


class TensorInfo:
    def __init__(self, name, dims, ggml_type, offset):
        self.name = name
        self.dims = dims          # dims[0] varies fastest
        self.type = ggml_type
        self.offset = offset      # from the start of the data section

    def type_name(self):
        if self.type in TYPES:
            return TYPES[self.type][0]
        return OTHER_TYPES.get(self.type, "type %d" % self.type)

    def n_elements(self):
        n = 1
        for d in self.dims:
            n *= d
        return n


def parse(data):
    """Header, metadata (skipped but for general.alignment), tensor infos.
    Returns (tensor infos in file order, the data section's file offset)."""
    r = Reader(data)
    if r.take(4) != GGUF_MAGIC:
        raise GGUFError("not a GGUF file (bad magic)")
    version = r.u32()
    if version not in (2, 3):
        raise GGUFError("GGUF version %d (this script reads 2 and 3)" % version)
    n_tensors, n_kv = r.u64(), r.u64()
    alignment = DEFAULT_ALIGNMENT
    for _ in range(n_kv):
        key = r.string()
        v = r.value(r.u32())
        if key == "general.alignment" and v is not None:
            alignment = v
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.u32()
        dims = [r.u64() for _ in range(n_dims)]
        infos.append(TensorInfo(name, dims, r.u32(), r.u64()))
    data_start = (r.pos + alignment - 1) // alignment * alignment
    return infos, data_start


def tensor_bytes(info, data, data_start):
    if info.type not in TYPES:
        raise GGUFError("tensor '%s' has type %s, which this script does not decode"
                        % (info.name, info.type_name()))
    _, block, size = TYPES[info.type]
    n = info.n_elements()
    if info.dims[0] % block:
        raise GGUFError("tensor '%s': %d columns are not whole %d-element blocks"
                        % (info.name, info.dims[0], block))
    start = data_start + info.offset
    end = start + n // block * size
    if end > len(data):
        raise GGUFError("tensor '%s' runs past the end of the file" % info.name)
    return data[start:end]


# ---- the block formats ---------------------------------------------------------
# Each decoder takes the raw bytes as a [n_blocks, block_bytes] uint8 array
# and returns float32 [n_blocks, block_elements].

def f16(cols):
    """Two byte columns (little-endian) -> f16 widened to f32, shape [n]."""
    return np.ascontiguousarray(cols).view("<f2").reshape(-1).astype(np.float32)


def low_high(qs):
    """Bytes [n, k] -> (low nibbles, high nibbles), each [n, k] int32."""
    return (qs & 0x0F).astype(np.int32), (qs >> 4).astype(np.int32)


def dq_q8_0(b):
    d = f16(b[:, 0:2])[:, None]
    q = b[:, 2:34].view(np.int8).astype(np.float32)
    return q * d


def dq_q4_0(b):
    # 16 bytes: element j in the low nibble of byte j, j + 16 in its high one.
    d = f16(b[:, 0:2])[:, None]
    lo, hi = low_high(b[:, 2:18])
    q = np.concatenate([lo, hi], axis=1) - 8
    return q.astype(np.float32) * d


def dq_q4_1(b):
    d, m = f16(b[:, 0:2])[:, None], f16(b[:, 2:4])[:, None]
    lo, hi = low_high(b[:, 4:20])
    q = np.concatenate([lo, hi], axis=1).astype(np.float32)
    return q * d + m


def fifth_bits(qh_bytes):
    """4 bytes of qh (a little-endian u32) -> bit j for j < 32, [n, 32]."""
    qh = np.ascontiguousarray(qh_bytes).view("<u4").reshape(-1, 1)
    return ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int32)


def dq_q5_0(b):
    d = f16(b[:, 0:2])[:, None]
    lo, hi = low_high(b[:, 6:22])
    q = np.concatenate([lo, hi], axis=1) | (fifth_bits(b[:, 2:6]) << 4)
    return (q - 16).astype(np.float32) * d


def dq_q5_1(b):
    d, m = f16(b[:, 0:2])[:, None], f16(b[:, 2:4])[:, None]
    lo, hi = low_high(b[:, 8:24])
    q = np.concatenate([lo, hi], axis=1) | (fifth_bits(b[:, 4:8]) << 4)
    return q.astype(np.float32) * d + m


def k_scales_mins(s):
    """The 12 scale bytes [n, 12] -> 6-bit scales and mins, each [n, 8].
    Sub-blocks 0..3: low 6 bits of bytes j (scale) and j+4 (min).
    Sub-blocks 4..7: low nibble (scale) / high nibble (min) of byte j+4,
    with the top two bits from bits 6-7 of byte j-4 (scale) / byte j (min)."""
    s = s.astype(np.int32)
    sc = np.empty((s.shape[0], 8), np.int32)
    mn = np.empty((s.shape[0], 8), np.int32)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc, mn


def k_low4(qs):
    """128 bytes [n, 128] -> the 4-bit parts of 256 elements [n, 8, 32]:
    sub-block j uses bytes 32*(j//2) .. +32, low nibbles if j is even."""
    lo, hi = low_high(qs.reshape(-1, 4, 32))
    return np.stack([lo, hi], axis=2).reshape(-1, 8, 32)


def k_apply(b, q):
    d, dmin = f16(b[:, 0:2])[:, None], f16(b[:, 2:4])[:, None]
    sc, mn = k_scales_mins(b[:, 4:16])
    d1 = (d * sc.astype(np.float32))[:, :, None]       # [n, 8, 1]
    m1 = (dmin * mn.astype(np.float32))[:, :, None]
    return (d1 * q.astype(np.float32) - m1).reshape(-1, 256)


def dq_q4_k(b):
    return k_apply(b, k_low4(b[:, 16:144]))


def dq_q5_k(b):
    # qh[32]: bit j of qh[l] is the fifth bit of element 32*j + l.
    qh = b[:, 16:48].astype(np.int32)[:, None, :]      # [n, 1, 32]
    bit = (qh >> np.arange(8, dtype=np.int32)[None, :, None]) & 1
    return k_apply(b, k_low4(b[:, 48:176]) | (bit << 4))


def dq_q6_k(b):
    # Two halves of 128 elements, each with 64 bytes of ql and 32 of qh.
    # Within a half, element 32*i + l (i < 4): low 4 bits from
    # ql[32*(i % 2) + l] (low nibble for i < 2, high for i >= 2), high two
    # bits from bits 2i, 2i+1 of qh[l].
    n = b.shape[0]
    ql = b[:, 0:128].astype(np.int32).reshape(n, 2, 2, 32)    # [half, i % 2, l]
    qh = b[:, 128:192].astype(np.int32).reshape(n, 2, 1, 32)  # [half, -, l]
    low = np.concatenate([ql & 15, ql >> 4], axis=2)          # [n, half, i, l]
    high = (qh >> (2 * np.arange(4, dtype=np.int32))[None, None, :, None]) & 3
    q = (low | (high << 4)) - 32                               # [n, 2, 4, 32]
    sc = b[:, 192:208].view(np.int8).astype(np.float32)       # [n, 16]
    d = f16(b[:, 208:210])[:, None]
    scale = (d * sc).reshape(n, 16, 1)                         # sub-block k of 16
    return (scale * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, 256)


DECODERS = {"Q8_0": dq_q8_0, "Q4_0": dq_q4_0, "Q4_1": dq_q4_1, "Q5_0": dq_q5_0,
            "Q5_1": dq_q5_1, "Q4_K": dq_q4_k, "Q5_K": dq_q5_k, "Q6_K": dq_q6_k}


def dequantize(info, raw):
    """The tensor as float32 in numpy order (reversed dims)."""
    name, block, size = TYPES[info.type]
    buf = np.frombuffer(raw, dtype=np.uint8)
    if name == "F32":
        out = buf.view("<f4").astype(np.float32)
    elif name == "F16":
        out = buf.view("<f2").astype(np.float32)
    elif name == "BF16":
        out = (buf.view("<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        out = DECODERS[name](buf.reshape(-1, size)).reshape(-1)
    return out.reshape(tuple(reversed(info.dims)))


# ---- the command ---------------------------------------------------------------

def safe_name(name):
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--tensor", action="append", default=[], help="a tensor's name (repeatable)")
    ap.add_argument("-o", "--out", help="OUT.npy for one tensor, else a directory")
    ap.add_argument("--list", action="store_true", help="list the tensors and exit")
    a = ap.parse_args(argv)
    with open(a.file, "rb") as f:
        data = f.read()
    infos, data_start = parse(data)
    if a.list:
        for t in infos:
            print("%s\t%s\t%s" % (t.name, t.type_name(), "x".join(str(d) for d in t.dims)))
        return 0
    if not a.out:
        raise GGUFError("-o is required (or --list)")
    by_name = {t.name: t for t in infos}
    for n in a.tensor:
        if n not in by_name:
            raise GGUFError("no tensor '%s' in %s" % (n, a.file))
    chosen = [by_name[n] for n in a.tensor] if a.tensor else infos
    one_file = len(a.tensor) == 1 and a.out.endswith(".npy")
    if not one_file:
        os.makedirs(a.out, exist_ok=True)
    for t in chosen:
        with np.errstate(invalid="ignore", over="ignore"):  # inf/NaN scales decode as ggml's do
            arr = dequantize(t, tensor_bytes(t, data, data_start))
        path = a.out if one_file else os.path.join(a.out, safe_name(t.name) + ".npy")
        np.save(path, arr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (GGUFError, OSError, UnicodeDecodeError) as e:
        print("gguf_ref.py: %s" % e, file=sys.stderr)
        sys.exit(1)
