#!/usr/bin/env python3
"""model_seeds.py - writes fuzz_model's seed inputs: one tiny model (hidden
8, one layer, vocab 16) in each format the loader reads (the GGUF also
with a SentencePiece and a byte-level BPE vocabulary), framed as
fuzz_model.c expects (a format byte, then the file; for a Hugging Face
directory two length bytes and config.json before model.safetensors).
Usage: model_seeds.py DIR"""
import json
import math
import os
import struct
import sys

DIM, HID, HEADS, KVH, HD, VOCAB, CTX = 8, 16, 2, 1, 4, 16, 64


def floats(n, k):
    return [((i * 7 + k * 13) % 17 - 8) / 64.0 for i in range(n)]


def gguf(vocab=None):
    def s(x):
        b = x.encode()
        return struct.pack("<Q", len(b)) + b

    def arr(etype, items):  # GGUF array: element type, count, elements
        return struct.pack("<IQ", etype, len(items)) + b"".join(items)

    kv = [("general.architecture", 8, s("qwen3")),
          ("qwen3.embedding_length", 4, struct.pack("<I", DIM)),
          ("qwen3.feed_forward_length", 4, struct.pack("<I", HID)),
          ("qwen3.block_count", 4, struct.pack("<I", 1)),
          ("qwen3.attention.head_count", 4, struct.pack("<I", HEADS)),
          ("qwen3.attention.head_count_kv", 4, struct.pack("<I", KVH)),
          ("qwen3.attention.key_length", 4, struct.pack("<I", HD)),
          ("qwen3.context_length", 4, struct.pack("<I", CTX)),
          ("qwen3.attention.layer_norm_rms_epsilon", 6, struct.pack("<f", 1e-6)),
          ("qwen3.rope.freq_base", 6, struct.pack("<f", 10000.0)),
          ("tokenizer.ggml.eos_token_id", 4, struct.pack("<I", 2))]
    if vocab == "llama":  # SentencePiece: pieces, scores, types (2 unk, 3 control, 6 byte)
        toks = ["<unk>", "<s>", "</s>", "<0x0A>", "\u2581", "\u2581a", "a", "b", "ab", "\u2581ab",
                "c", "d", "cd", "\u2581c", "e", "\u2581e"]
        types = [2, 3, 3, 6] + [1] * 12
        kv += [("tokenizer.ggml.model", 8, s("llama")),
               ("tokenizer.ggml.tokens", 9, arr(8, [s(t) for t in toks])),
               ("tokenizer.ggml.scores", 9, arr(6, [struct.pack("<f", -i) for i in range(16)])),
               ("tokenizer.ggml.token_type", 9, arr(5, [struct.pack("<i", t) for t in types])),
               ("tokenizer.ggml.bos_token_id", 4, struct.pack("<I", 1)),
               ("tokenizer.ggml.add_bos_token", 7, b"\1")]
    elif vocab == "gpt2":  # byte-level BPE with merges and a pre-tokenizer name
        toks = ["a", "b", "c", "\u0120", "ab", "\u0120a", "\u0120ab", "cc", "<|end|>", "<|start|>",
                "d", "e", "de", "\u010a", "f", "g"]
        types = [1] * 8 + [3, 3] + [1] * 6
        kv += [("tokenizer.ggml.model", 8, s("gpt2")), ("tokenizer.ggml.pre", 8, s("llama-bpe")),
               ("tokenizer.ggml.tokens", 9, arr(8, [s(t) for t in toks])),
               ("tokenizer.ggml.token_type", 9, arr(5, [struct.pack("<i", t) for t in types])),
               ("tokenizer.ggml.merges", 9, arr(8, [s(m) for m in
                                                     ["a b", "\u0120 a", "\u0120a b", "c c", "d e"]]))]
    # name, ne (cols first), type (0 f32, 1 f16)
    ts = [("token_embd.weight", [DIM, VOCAB], 0), ("output_norm.weight", [DIM], 0),
          ("blk.0.attn_norm.weight", [DIM], 0), ("blk.0.attn_q.weight", [DIM, HEADS * HD], 1),
          ("blk.0.attn_k.weight", [DIM, KVH * HD], 0), ("blk.0.attn_v.weight", [DIM, KVH * HD], 0),
          ("blk.0.attn_output.weight", [HEADS * HD, DIM], 0),
          ("blk.0.attn_q_norm.weight", [HD], 0), ("blk.0.attn_k_norm.weight", [HD], 0),
          ("blk.0.ffn_norm.weight", [DIM], 0), ("blk.0.ffn_gate.weight", [DIM, HID], 1),
          ("blk.0.ffn_up.weight", [DIM, HID], 0), ("blk.0.ffn_down.weight", [HID, DIM], 0)]
    out = b"GGUF" + struct.pack("<IQQ", 3, len(ts), len(kv))
    for k, t, v in kv:
        out += s(k) + struct.pack("<I", t) + v
    data, offs = b"", []
    for i, (name, ne, ty) in enumerate(ts):
        n = math.prod(ne)
        while len(data) % 32:
            data += b"\0"
        offs.append(len(data))
        vals = floats(n, i)
        data += struct.pack("<%d%s" % (n, "f" if ty == 0 else "e"), *vals)
    for (name, ne, ty), off in zip(ts, offs):
        out += s(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne)
        out += struct.pack("<IQ", ty, off)
    while len(out) % 32:
        out += b"\0"
    return out + data


def llama2c(shared):
    kv = KVH * HD
    n = (VOCAB * DIM + DIM * 2 + DIM * DIM * 2 + kv * DIM * 2 + HID * DIM * 3 + DIM +
         CTX * HD + (0 if shared else VOCAB * DIM))
    h = struct.pack("<7i", DIM, HID, 1, HEADS, KVH, VOCAB if shared else -VOCAB, CTX)
    return h + struct.pack("<%df" % n, *floats(n, 1))


def hf():
    cfg = {"model_type": "qwen3", "hidden_size": DIM, "intermediate_size": HID,
           "num_hidden_layers": 1, "num_attention_heads": HEADS, "num_key_value_heads": KVH,
           "head_dim": HD, "vocab_size": VOCAB, "max_position_embeddings": CTX,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": True,
           "eos_token_id": 2}
    p = "model.layers.0."
    ts = [("model.embed_tokens.weight", [VOCAB, DIM], "F32"), ("model.norm.weight", [DIM], "F32"),
          (p + "input_layernorm.weight", [DIM], "F32"),
          (p + "self_attn.q_proj.weight", [HEADS * HD, DIM], "BF16"),
          (p + "self_attn.k_proj.weight", [KVH * HD, DIM], "F32"),
          (p + "self_attn.v_proj.weight", [KVH * HD, DIM], "F16"),
          (p + "self_attn.o_proj.weight", [DIM, HEADS * HD], "F32"),
          (p + "self_attn.q_norm.weight", [HD], "F32"), (p + "self_attn.k_norm.weight", [HD], "F32"),
          (p + "post_attention_layernorm.weight", [DIM], "F32"),
          (p + "mlp.gate_proj.weight", [HID, DIM], "F32"), (p + "mlp.up_proj.weight", [HID, DIM], "F32"),
          (p + "mlp.down_proj.weight", [DIM, HID], "F32")]
    head, data = {"__metadata__": {"format": "pt"}}, b""
    for i, (name, shape, dt) in enumerate(ts):
        n = math.prod(shape)
        vals = floats(n, i)
        if dt == "F32":
            b = struct.pack("<%df" % n, *vals)
        elif dt == "F16":
            b = struct.pack("<%de" % n, *vals)
        else:  # bf16: the top half of each f32
            b = b"".join(struct.pack("<f", v)[2:] for v in vals)
        head[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    hj = json.dumps(head).encode()
    st = struct.pack("<Q", len(hj)) + hj + data
    cj = json.dumps(cfg).encode()
    return struct.pack("<H", len(cj)) + cj + st


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    d = sys.argv[1]
    os.makedirs(d, exist_ok=True)
    seeds = {"gguf": b"\0" + gguf(), "gguf_spm": b"\0" + gguf("llama"),
             "gguf_bpe": b"\0" + gguf("gpt2"), "llama2c_shared": b"\1" + llama2c(True),
             "llama2c_head": b"\1" + llama2c(False), "hf": b"\2" + hf()}
    for name, b in seeds.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(b)
        print("%s: %d bytes" % (name, len(b)))


if __name__ == "__main__":
    main()
