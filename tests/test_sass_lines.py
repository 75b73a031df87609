#!/usr/bin/env python3
"""test_sass_lines.py - bench/sass_lines.py sums ncu's executed-instruction
counts of each kernel before and after its PDL wait (ACQBULK) and, given
nvdisasm -g text, finds the kernel's section by its opcodes and ranks the
source lines of what ran after the wait. Synthetic inputs with known
answers: a kernel (printed once though ncu listed it twice), one whose
code is in no section, a section of the same length but other opcodes,
a build without line info, and the most stalled instructions."""
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pychecks  # noqa: E402
from pychecks import check  # noqa: E402

TOOL = os.path.join(HERE, "..", "bench", "sass_lines.py")

HDR = ('"Address","Source","Warp Stall Sampling (All Samples)",'
       '"Instructions Executed","stall_no_inst"')


def kernel(name, rows):
    """rows: (opcode text, executed, samples, no_inst samples)"""
    out = [f'"Kernel Name","{name}",', HDR]
    for i, (t, ex, smp, ni) in enumerate(rows):
        out.append(f'"0x{0x7f0000001000 + 16 * i:x}","      {t}","{smp}","{ex}","{ni}"')
    return out


A = [("LDC R1, c[0x0][0x28]", 64, 5, 5), ("S2R R0, SR_TID.X", 64, 1, 0),
     ("ACQBULK", 64, 10, 2), ("FFMA R2, R3, R4, R2", 64, 6, 3),
     ("@P0 FFMA R2, R3, R4, R2", 0, 0, 0), ("EXIT", 64, 4, 0)]
B = [("LDC R1, c[0x0][0x28]", 32, 0, 0), ("ACQBULK", 32, 0, 0), ("IMAD R1, R2, R3, R4", 32, 0, 0),
     ("EXIT", 32, 0, 0)]
lines = kernel("void k_a<(int)1>(int)", A) + kernel("void k_a<(int)1>(int)", A) + \
    kernel("void k_b(float *)", B)

SASS = """\t.section\t.text._Z3k_bPf,"ax",@progbits
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   ACQBULK ;
        /*0020*/                   FFMA R1, R2, R3, R4 ;
        /*0030*/                   EXIT ;
\t.section\t.text._Z3k_aILi1EEvi,"ax",@progbits
\t//## File "/src/a.cu", line 10
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_TID.X ;
\t//## File "/src/a.cu", line 12
        /*0020*/                   ACQBULK ;
\t//## File "/src/common.cuh", line 20
        /*0030*/                   FFMA R2, R3, R4, R2 ;
        /*0040*/              @P0 FFMA R2, R3, R4, R2 ;
\t//## File "/src/a.cu", line 12
        /*0050*/                   EXIT ;
"""
tmp = tempfile.mkdtemp()
csv_path, sass_path, bare_path = (os.path.join(tmp, n) for n in ("src.csv", "k.sass", "bare.sass"))
open(csv_path, "w").write("\n".join(lines) + "\n")
open(sass_path, "w").write(SASS)
open(bare_path, "w").write(re.sub(r".*//## File.*\n", "", SASS))


def run(*args):
    return pychecks.run(TOOL, csv_path, *args)


out = run()
check(out.count("k_a<(int)1>") == 1, "a kernel ncu listed twice back to back is printed once")
check("SASS 6, executed distinct 5 (before the wait 2, after 3)" in out,
      "6 instructions, 5 executed: 2 before ACQBULK, 3 from it on")
check("a warp ran 3 after the wait" in out, "64 warps ran 3 x 64 instructions after the wait")
check("stall samples after it 20, instruction fetch 25%" in out,
      "20 samples after the wait, 5 of them instruction fetch")
check("SASS 4, executed distinct 4 (before the wait 1, after 3)" in out, "the second kernel")

out = run("--sass", sass_path)
a_part = out.split("k_b")[0]
check(re.search(r"^\s+2\s+a\.cu:12$", a_part, re.M) is not None,
      "a.cu:12 has 2 executed instructions after the wait (ACQBULK, EXIT)")
check(re.search(r"^\s+1\s+common\.cuh:20$", a_part, re.M) is not None,
      "common.cuh:20 has 1 (the predicated-off FFMA did not run)")
check("a.cu:10" not in a_part, "lines before the wait are not listed")
check("no section of --sass has this kernel's instructions" in out.split("k_b")[1],
      "k_b's opcodes (IMAD) are in no section of the same length")

out = run("--stalls", "2")
a_part = out.split("k_b")[0]
check(re.search(r"^\s+10\s+38\.5%\s+20\s+ACQBULK$", a_part, re.M) is not None and
      re.search(r"^\s+6\s+23\.1%\s+30\s+FFMA", a_part, re.M) is not None and
      "LDC" not in a_part.split("SASS 6")[1],
      "--stalls 2: the two most sampled instructions, their share of 26 samples, their offsets")

out = run("--sass", bare_path)
check("no line info: build with -lineinfo" in out, "a build without line info says so")

pychecks.done("test_sass_lines")
