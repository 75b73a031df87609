#!/usr/bin/env python3
"""trace_steps.py - where a decode step's time goes in the pipeline, from a
kernel timeline written by bench/cupti/cupti_trace.c.

A step is a run of kernels replayed from one CUDA graph, cut at each
embedding gather (the step's first kernel). For the step shape seen most
often, each kernel is charged its advance: how far it moved the step's
latest end (end minus the latest end before it, not below 0), so the
advances of a step add up to its span and a kernel that ran hidden under
another costs nothing. Per kernel name: launches per step, mean duration,
mean advance per step. Also the idle time between consecutive steps.

Usage: trace_steps.py trace.csv[.gz] [--graph-only 0] [--graph ID] [--show N]
  --graph ID: only the kernels replayed from CUDA graph ID (a batched
  decode step's graph is another than a single decode step's; the
  commonest graph ids are printed first).
"""
import collections
import gzip
import re
import sys


def short(name):
    m = re.match(r"_Z(\d+)", name)
    if m:  # an Itanium-mangled name: its first identifier
        n = int(m.group(1))
        base = name[m.end():m.end() + n]
        tmpl = re.search(r"ILi(\d+)E", name)
        return base + (f"<{tmpl.group(1)}..>" if tmpl else "")
    return name.split("(")[0][:60]


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    show = 24
    graph_only = True
    graph = None
    path = args[0]
    for i, a in enumerate(args):
        if a == "--show":
            show = int(args[i + 1])
        if a == "--graph-only":
            graph_only = args[i + 1] != "0"
        if a == "--graph":
            graph = int(args[i + 1])
    rows = []
    # a timeline fetched from the GPU machine comes gzipped
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        for line in f:
            s, e, g, blocks, name = line.rstrip("\n").split(",", 4)
            rows.append((int(s), int(e), int(g), int(blocks), short(name)))
    rows.sort()
    ids = collections.Counter(r[2] for r in rows if r[2])
    print("kernels by graph id: " + ", ".join(f"{g}: {n}" for g, n in ids.most_common(6)))
    if graph is not None:
        rows = [r for r in rows if r[2] == graph]
    steps, cur = [], []
    for r in rows:
        if graph_only and r[2] == 0:
            if cur:
                steps.append(cur)
            cur = []
            continue
        if r[4].startswith("k_embed") and cur:
            steps.append(cur)
            cur = []
        cur.append(r)
    if cur:
        steps.append(cur)
    steps = [s for s in steps if s[0][4].startswith("k_embed")]
    if not steps:
        sys.exit("no steps starting with k_embed found")
    shapes = collections.Counter(tuple(r[4] for r in s) for s in steps)
    shape, n = shapes.most_common(1)[0]
    chosen = [s for s in steps if tuple(r[4] for r in s) == shape]
    # drop the first of a run (cold) when there are enough
    if len(chosen) > 4:
        chosen = chosen[1:]
    spans = [s[-1][1] - s[0][0] for s in chosen]
    print(f"{len(steps)} steps, {len(shapes)} shapes; the commonest has {len(shape)} kernels "
          f"and {n} steps; mean span {sum(spans) / len(spans) / 1e3:.1f} us "
          f"(min {min(spans) / 1e3:.1f}, max {max(spans) / 1e3:.1f})")
    gaps = []
    for a, b in zip(steps, steps[1:]):
        if tuple(r[4] for r in a) == shape and tuple(r[4] for r in b) == shape:
            gaps.append(b[0][0] - a[-1][1])
    if gaps:
        gaps.sort()
        print(f"idle between consecutive steps: median {gaps[len(gaps) // 2] / 1e3:.1f} us")
    k = len(shape)
    dur = [0.0] * k
    adv = [0.0] * k
    start = [0.0] * k
    for s in chosen:
        t0 = s[0][0]
        latest = t0
        for i, r in enumerate(s):
            dur[i] += r[1] - r[0]
            adv[i] += max(0, r[1] - latest)
            start[i] += r[0] - t0
            latest = max(latest, r[1])
    m = len(chosen)
    by = collections.OrderedDict()
    for i, name in enumerate(shape):
        d = by.setdefault(name, [0, 0.0, 0.0])
        d[0] += 1
        d[1] += dur[i] / m / 1e3
        d[2] += adv[i] / m / 1e3
    total = sum(adv) / m / 1e3
    print(f"\n{'kernel':40s} {'per step':>8s} {'mean us':>9s} {'advance us/step':>16s} {'share':>6s}")
    for name, (cnt, d, a) in sorted(by.items(), key=lambda x: -x[1][2]):
        print(f"{name:40s} {cnt:8d} {d / cnt:9.2f} {a:16.1f} {100 * a / total:5.1f}%")
    print(f"{'total':40s} {'':8s} {'':9s} {total:16.1f}")
    print(f"\nfirst {show} kernels of a step (mean start offset, duration, advance, us):")
    for i in range(min(show, k)):
        print(f"  {i:3d} {shape[i]:40s} {start[i] / m / 1e3:9.2f} {dur[i] / m / 1e3:8.2f} "
              f"{adv[i] / m / 1e3:8.2f}")


if __name__ == "__main__":
    main()
