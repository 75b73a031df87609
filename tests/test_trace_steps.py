#!/usr/bin/env python3
"""test_trace_steps.py - bench/trace_steps.py charges each kernel of a
decode step its advance on the step's end, from a CUPTI timeline
(bench/cupti/cupti_trace.c's CSV). A synthetic timeline with known
overlaps: the advances, the span, kernels hidden under others, eager
kernels between steps, a second graph picked with --graph, and the same
timeline gzipped."""
import gzip
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pychecks  # noqa: E402
from pychecks import check  # noqa: E402

TOOL = os.path.join(HERE, "..", "bench", "trace_steps.py")
GEMV = "_Z13k_gemv_stagedILi0EEv4sgpi"
ATT = "_Z15k_attention_decILi128EEvPfPKf"



def step(t0, graph, kernels):
    """kernels: (name, start us, end us) relative to t0 (us)"""
    return [f"{int((t0 + s) * 1000)},{int((t0 + e) * 1000)},{graph},132,{n}" for n, s, e in kernels]


# embed 0-2; q/k/v GEMV 1-6 (advance 4); attention 5-9 (3); a GEMV that
# ends under the attention (0); a GEMV 8.6-12 (3): span 12 us
SHAPE = [("k_embed", 0, 2), (GEMV, 1, 6), (ATT, 5, 9), (GEMV, 8, 8.5), (GEMV, 8.6, 12)]
lines = []
t = 100.0
for i in range(5):
    lines += step(t, 7, SHAPE)
    lines += step(t + 13, 0, [("k_eager", 0, 1)])  # an eager kernel between steps
    t += 20
lines += step(t, 9, [("k_embed", 0, 1), (ATT, 0.5, 30)])  # another graph, once

with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
    f.write("\n".join(reversed(lines)) + "\n")  # the tool sorts by start
    path = f.name


def run(*args):
    return pychecks.run(TOOL, path, *args)


def row(out, name):
    m = re.search(r"^" + re.escape(name) + r"\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s", out, re.M)
    return (int(m.group(1)), float(m.group(2)), float(m.group(3))) if m else None


out = run()
check("the commonest has 5 kernels and 5 steps" in out, "5 steps of the commonest shape found")
check(re.search(r"mean span 12\.0 us", out) is not None, "the span of a step is 12 us")
check(re.search(r"idle between consecutive steps: median 8\.0 us", out) is not None,
      "8 us idle between steps")
check(row(out, "k_gemv_staged<0..>") == (3, 2.97, 7.0),
      f"three GEMVs of 5, 0.5 and 3.4 us, advance 4 + 0 + 3: {row(out, 'k_gemv_staged<0..>')}")
check(row(out, "k_attention_dec<128..>") == (1, 4.0, 3.0),
      f"the attention lasts 4 us and advances the step by 3: {row(out, 'k_attention_dec<128..>')}")
check(row(out, "k_embed") == (1, 2.0, 2.0), "the embedding advances it by its 2 us")
check(re.search(r"^total\s+12\.0$", out, re.M) is not None, "the advances add up to the span")
check("k_eager" not in out, "eager kernels are not part of a replayed step")

out = run("--graph", "9")
check("1 steps, 1 shapes" in out and "mean span 30.0 us" in out, "--graph 9 takes that graph's step")
check(row(out, "k_attention_dec<128..>") == (1, 29.5, 29.0), "and only its kernels")

# the same timeline gzipped, as it comes back from the GPU machine
with open(path, "rb") as f, gzip.open(path + ".gz", "wb") as g:
    g.write(f.read())
outz = pychecks.run(TOOL, path + ".gz")
check(outz == run(), "a gzipped timeline reads as the plain one")
os.unlink(path + ".gz")

os.unlink(path)
pychecks.done("test_trace_steps")
