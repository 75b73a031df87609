#!/usr/bin/env python3
"""tokenizer_seeds.py - writes fuzz_tokenizer_json's seed inputs: the small
trained tokenizers of tests/fixtures/tokenizers/components.json (WordPiece
and BPE), and each of its component variants (normalizers, pre-tokenizers,
added tokens, post-processors, decoders) patched onto the smallest one, so
the fuzzer starts from every kind of component the loader reads.
Usage: tokenizer_seeds.py DIR"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(HERE, "..", "fixtures", "tokenizers", "components.json")) as f:
        variants = json.load(f)
    whole = [v for v in variants if "tokenizer" in v]
    base = min(whole, key=lambda v: len(json.dumps(v["tokenizer"])))["tokenizer"]
    n = 0
    for v in variants:
        tj = v["tokenizer"] if "tokenizer" in v else dict(base, **v["patch"])
        with open(os.path.join(out, v["name"] + ".json"), "w") as f:
            json.dump(tj, f)
        n += 1
    print("wrote %d seeds to %s" % (n, out))


if __name__ == "__main__":
    main()
