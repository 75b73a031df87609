#!/usr/bin/env python3
"""sass_lines.py - how much code each profiled kernel runs, and where.

A decode kernel's code is fetched again at each launch, and what runs
after its programmatic-dependent-launch wait (the ACQBULK instruction) is
on the step's critical path (docs/benchmarks.md, eleventh pass). From
ncu's source page of a report with SourceCounters

    ncu -i REP --page source --csv --print-source sass > src.csv

this prints, per kernel: its SASS instructions, the distinct ones a launch
executed before and after the wait, the instructions a warp executed after
it, and the share of stall samples waiting for an instruction fetch. With
--sass, `nvdisasm -g` of the same module's cubins (a -lineinfo build for
source lines), each kernel is found there by its opcodes and the source
lines with the most distinct post-wait instructions are listed. With
--stalls N, the N instructions where warps were sampled stalled most.

Usage: sass_lines.py SRC_CSV [--sass NVDISASM_TXT] [--top N] [--stalls N]
(tests/gpu/code_profile.sh runs it on the GPU machine.)"""
import argparse
import collections
import csv
import re
import sys


def num(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return 0.0


def ncu_kernels(path):
    """[(name, [(address, opcode text, executed, samples, no_inst)])], one per
    result; a result repeated back to back (ncu prints some twice) once."""
    out, name, hdr, rows = [], None, None, None

    def close():
        if name is not None and rows:
            if not out or out[-1] != (name, rows):
                out.append((name, rows))

    with open(path, newline="") as f:
        for r in csv.reader(f):
            if not r:
                continue
            if r[0] == "Kernel Name":
                close()
                name, hdr, rows = r[1], None, []
            elif r[0] == "Address":
                hdr = {c: i for i, c in enumerate(r)}
            elif hdr is not None and name is not None:
                ex = hdr.get("Instructions Executed")
                smp = hdr.get("Warp Stall Sampling (All Samples)")
                ni = hdr.get("stall_no_inst")
                if ex is None:
                    sys.exit(f"{path}: no 'Instructions Executed' column (profile with --section SourceCounters)")
                rows.append((int(r[0], 16), r[1].strip(), num(r[ex]),
                             num(r[smp]) if smp is not None else 0.0,
                             num(r[ni]) if ni is not None else 0.0))
    close()
    return out


def sass_sections(path):
    """{section: [(offset, opcode text, (file, line) or None)]} of nvdisasm -g."""
    secs, cur, line = {}, None, None
    for l in open(path):
        m = re.search(r"\.section\s+\.text\.(\S+?),", l)
        if m:
            cur, line = m.group(1), None
            secs[cur] = []
            continue
        if cur is None:
            continue
        m = re.search(r'//## File "([^"]+)", line (\d+)', l)
        if m:
            line = (m.group(1).rsplit("/", 1)[-1], int(m.group(2)))
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", l)
        if m:
            secs[cur].append((int(m.group(1), 16), m.group(2), line))
    return secs


def opcode(text):
    """The mnemonic of an instruction, predicate and modifiers aside."""
    t = text.split()
    if t and t[0].startswith("@"):
        t = t[1:]
    return t[0].split(".")[0] if t else ""


def match(rows, secs):
    """The section whose opcodes are this kernel's, or None."""
    want = [opcode(r[1]) for r in rows]
    for name, ins in secs.items():
        if len(ins) == len(want) and all(opcode(i[1]) == w for i, w in zip(ins, want)):
            return name
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--sass")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--stalls", type=int, default=0)
    a = ap.parse_args()
    secs = sass_sections(a.sass) if a.sass else {}
    for name, rows in ncu_kernels(a.csv):
        acq = next((i for i, r in enumerate(rows) if r[1].startswith("ACQBULK")), 0)
        post = rows[acq:]
        warps = rows[0][2] or 1.0  # every warp runs the first instruction
        samples = sum(r[3] for r in post)
        print(f"{name[:100]}")
        print(f"  SASS {len(rows)}, executed distinct {sum(r[2] > 0 for r in rows)} "
              f"(before the wait {sum(r[2] > 0 for r in rows[:acq])}, after {sum(r[2] > 0 for r in post)}); "
              f"a warp ran {sum(r[2] for r in post) / warps:.0f} after the wait; "
              f"stall samples after it {samples:.0f}, instruction fetch "
              f"{100 * sum(r[4] for r in post) / samples if samples else 0:.0f}%")
        total = sum(r[3] for r in rows) or 1.0
        for r in sorted(rows, key=lambda r: -r[3])[: a.stalls]:
            print(f"  {r[3]:7.0f} {100 * r[3] / total:5.1f}%  {r[0] - rows[0][0]:6x}  {r[1][:90]}")
        if not secs:
            continue
        sec = match(rows, secs)
        if sec is None:
            print("  (no section of --sass has this kernel's instructions: another build?)")
            continue
        lines = collections.Counter(secs[sec][i][2] for i in range(acq, len(rows)) if rows[i][2] > 0)
        if list(lines) == [None]:
            print("  (no line info: build with -lineinfo)")
            continue
        for (where, n) in lines.most_common(a.top):
            print(f"  {n:5d}  {where[0]}:{where[1]}" if where else f"  {n:5d}  ?")


if __name__ == "__main__":
    main()
