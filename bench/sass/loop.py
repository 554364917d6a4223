#!/usr/bin/env python3
"""The main loop of CUDA kernels, counted from their sm_90 machine code.

    bench/sass/loop.py OBJECT REGEX

OBJECT: an nvcc object built with --no-compress (the command from
`ninja -t commands` in build-cuda/, its -o changed and --no-compress
added). REGEX: matched against the kernels' mangled names. For each match,
the loop that holds the kernel's mma instructions (from the last block
barrier before the first mma to the end of the loop, the target of the
branch that skips it) and its instructions by opcode. A kernel bound by
issue takes about (warps x loop instructions) / (4 a cycle an SM) a trip.

Needs nvdisasm (bench/sass/setup.sh, or $NVDISASM). The 11.8 nvdisasm
reads CUDA 13's cubins once their ELF header carries the old ABI's flags
(e_flags 0x005a055a, EI_ABIVERSION 7), which is all this rewrites.
"""
import collections
import os
import re
import struct
import subprocess
import sys


def cubins(blob):
    """Each EM_CUDA (190) ELF64 image in the object, from its start."""
    out, i = [], 0
    while True:
        i = blob.find(b"\x7fELF", i + 1)
        if i < 0:
            return out
        if blob[i + 4] == 2 and struct.unpack_from("<H", blob, i + 18)[0] == 190:
            out.append(bytearray(blob[i:]))


def disassemble(image, nvdisasm):
    struct.pack_into("<I", image, 0x30, 0x005A055A)  # sm_90 in the old ABI's flags
    image[8] = 7
    path = "/tmp/ringlm-sass-%d.cubin" % os.getpid()
    with open(path, "wb") as f:
        f.write(image)
    try:
        return subprocess.run([nvdisasm, "-c", path], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(path)


def instructions(body):
    """(address, opcode, line) of each instruction; label -> address."""
    rows, labels, pending = [], {}, []
    for line in body.split("\n"):
        m = re.match(r"^\s*\.(L_x_\d+):", line)
        if m:
            pending.append(m.group(1))
            continue
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)", line)
        if m:
            addr = int(m.group(1), 16)
            for p in pending:
                labels[p] = addr
            pending = []
            rows.append((addr, m.group(3), line))
    return rows, labels


def main_loop(rows, labels):
    mma = [a for a, op, _ in rows if op in ("IMMA", "HMMA", "HGMMA", "IGMMA")]
    if not mma:
        return None
    bars = [a for a, op, _ in rows if op == "BAR" and a < min(mma)]
    top = max(bars) if bars else min(mma)
    ends = []
    for a, op, line in rows:
        m = re.search(r"BRA `\(\.(L_x_\d+)\)", line)
        if op == "BRA" and a < top and m and labels.get(m.group(1), -1) > max(mma):
            ends.append(labels[m.group(1)])
    end = min(ends) if ends else max(mma)
    return [r for r in rows if top <= r[0] < end], len(mma)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: bench/sass/loop.py OBJECT REGEX")
    nvdisasm = os.environ.get("NVDISASM") or subprocess.run(
        ["bash", os.path.join(os.path.dirname(__file__), "setup.sh")], capture_output=True, text=True, check=True
    ).stdout.strip()
    images = cubins(open(sys.argv[1], "rb").read())
    if not images:
        sys.exit("%s: no sm_90 cubin (built without --no-compress?)" % sys.argv[1])
    text = disassemble(images[0], nvdisasm)
    parts = re.split(r"//-+ (\.text\.\S+) -+", text)
    for name, body in zip(parts[1::2], parts[2::2]):
        if not re.search(sys.argv[2], name):
            continue
        rows, labels = instructions(body)
        loop = main_loop(rows, labels)
        if loop is None:
            print("%s: no mma" % name[6:])
            continue
        body_rows, n_mma = loop
        ops = collections.Counter(op for _, op, _ in body_rows)
        print("%s\n  loop: %d instructions, %d mma (of %d in the kernel)" % (
            name[6:], len(body_rows), ops["IMMA"] + ops["HMMA"], n_mma))
        print("  " + ", ".join("%s %d" % kv for kv in ops.most_common(16)))


if __name__ == "__main__":
    main()
