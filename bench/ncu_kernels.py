#!/usr/bin/env python3
"""One decode token's kernels, each timed alone by Nsight Compute: the
breakdown issue 17 asks for where a speed goal is not met.

  ncu --clock-control none --cache-control none \
      --metrics gpu__time_duration.sum --csv --print-units base \
      build-cuda/ringlm bench -m MODEL --device cuda --no-graph -p 0 -n 2 -r 1 \
      > kernels.csv
  bench/ncu_kernels.py kernels.csv[.xz] [--bytes-per-token B --copy-gbs G]

Kernels are grouped by name (template arguments kept: they tell the
instances apart), grid, and the names of the --context kernels launched
before (default 3): Llama's o and down products are one instance on one
grid, one after the attention, the other after the gate and up product;
a 4-bit q, k, v and gate, up are one instance on one persistent grid,
both after an add and norm, which follows the down product for the one
and the o product for the other. A token is one embedding launch (every
decode pass starts with one), so the table gives each group's launches
and microseconds per token, and its share of the token's kernel time.
ncu runs kernels one at a time, so each time includes the launch's ramp
and tail that a graph with programmatic dependent launch partly
overlaps: the sum is usually more than the token takes, not the token.
With the bytes a token reads and the copy bandwidth, it also prints the
floor and the share of it that the kernels' sum reaches."""
import argparse
import collections
import csv
import lzma
import sys


def short_name(full):
    """The kernel's name and template arguments, without 'void', the
    anonymous namespace or the parameter list."""
    s = full.replace('<unnamed>::', '').replace('(anonymous namespace)::', '')
    if s.startswith('void '):
        s = s[5:]
    depth = 0
    for i, c in enumerate(s):
        if c == '<':
            depth += 1
        elif c == '>':
            depth -= 1
        elif c == '(' and depth == 0:
            return s[:i]
    return s


def read_rows(path):
    opener = lzma.open if path.endswith('.xz') else open
    try:
        with opener(path, 'rt', errors='replace') as fh:
            lines = [l for l in fh if l.startswith('"')]  # ncu's own lines start with ==
    except (OSError, lzma.LZMAError) as e:
        sys.exit(f'ncu_kernels: {path}: {getattr(e, "strerror", None) or e}')
    if not lines:
        sys.exit(f'ncu_kernels: {path}: no CSV rows (was ncu run with --csv?)')
    rows = []
    for r in csv.DictReader(lines):
        if r.get('Metric Name') != 'gpu__time_duration.sum':
            continue
        unit = r.get('Metric Unit', 'ns')
        scale = {'ns': 1e-3, 'nsecond': 1e-3, 'us': 1.0, 'usecond': 1.0, 'ms': 1e3, 'msecond': 1e3}.get(unit)
        if scale is None:
            sys.exit(f'ncu_kernels: {path}: unknown time unit "{unit}" (pass --print-units base)')
        rows.append((short_name(r['Kernel Name']), r['Grid Size'].replace(' ', ''),
                     float(r['Metric Value'].replace(',', '')) * scale))
    if not rows:
        sys.exit(f'ncu_kernels: {path}: no gpu__time_duration.sum rows')
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('csv')
    ap.add_argument('--bytes-per-token', type=float, help='weight and KV bytes one token reads')
    ap.add_argument('--copy-gbs', type=float, help='device-to-device copy bandwidth, GB/s')
    ap.add_argument('--top', type=int, default=40)
    ap.add_argument('--context', type=int, default=3, help='kernels before a launch that tell its group')
    a = ap.parse_args()
    rows = read_rows(a.csv)
    tokens = sum(1 for n, _, _ in rows if n.startswith('embed'))
    if tokens == 0:
        sys.exit(f'ncu_kernels: {a.csv}: no embedding launch, so no token to divide by')
    groups = collections.defaultdict(list)
    before = []
    for n, g, t in rows:
        groups[(n, g, ' < '.join(before) or '(none)')].append(t)
        before = ([n.split('<')[0]] + before)[:a.context]
    total = sum(t for _, _, t in rows) / tokens
    print(f'{len(rows)} launches, {tokens} tokens: {total:,.1f} us of kernels a token (each timed alone)')
    print(f'| kernel | grid | after | launches a token | us a launch | us a token | share |')
    print(f'| --- | --- | --- | ---: | ---: | ---: | ---: |')
    ordered = sorted(groups.items(), key=lambda kv: -sum(kv[1]))
    for (n, g, b), ts in ordered[:a.top]:
        per = sum(ts) / tokens
        print(f'| `{n}` | {g} | {b} | {len(ts) / tokens:g} | {sum(ts) / len(ts):,.2f} | {per:,.1f} | {100 * per / total:.1f}% |')
    if len(ordered) > a.top:
        rest = sum(sum(ts) for _, ts in ordered[a.top:]) / tokens
        print(f'| ({len(ordered) - a.top} more) | | | | | {rest:,.1f} | {100 * rest / total:.1f}% |')
    if a.bytes_per_token and a.copy_gbs:
        floor = a.bytes_per_token / (a.copy_gbs * 1e3)  # bytes / (GB/s) in us
        print(f'floor {floor:,.1f} us a token; the kernels alone reach {100 * floor / total:.1f}% of it')


if __name__ == '__main__':
    main()
