// gen_fixture.mjs - writes a tiny random-weight Qwen3 model whose vocabulary
// is the real Qwen3 tokenizer's (151936 ids), so serve tests exercise a real
// tokenizer and chat template with a model that answers in milliseconds.
// Output is gibberish; token counts, streaming, stops and templates are real.
//
//   node gen_fixture.mjs <shared dir> <out dir> [--script ID,ID,...]
//
// --script: a model that writes a known text instead (tool-call and
// reasoning tests): its layers are zeros, so the residual stream is the
// current token's embedding, and the LM head (untied) maps each id of the
// list to the id after it. Ids that come before another must be distinct
// (at most 64 of them; each gets its own embedding axis, the head row of
// its successor that axis times 4: logit 32 against 0 for every other id).
// The first id is the prompt's last (the generation prompt's), the last the
// one the text ends on (EOS).
//
// Writes config.json, generation_config.json, model.safetensors (bf16,
// hidden 64, 2 layers, ~20 MB) and copies tokenizer.json +
// tokenizer_config.json from <shared>/tokenizers/qwen3. Deterministic.
import fs from 'node:fs';
import path from 'node:path';

const [shared, out, flag, list] = process.argv.slice(2);
if (!shared || !out || (flag !== undefined && (flag !== '--script' || !list))) {
  console.error('usage: node gen_fixture.mjs <shared dir> <out dir> [--script ID,ID,...]');
  process.exit(2);
}
const V = 151936, D = 64, I = 128, L = 2, H = 4, KV = 2, HD = 16;
const script = flag ? list.split(',').map(Number) : null;
if (script && (script.length < 2 || !script.every(x => Number.isInteger(x) && x >= 0 && x < V))) {
  console.error(`gen_fixture: --script needs two or more ids in [0, ${V})`);
  process.exit(2);
}
const axis = new Map(); // predecessor id -> its embedding axis
if (script) {
  for (let i = 0; i + 1 < script.length; i++) {
    if (axis.has(script[i])) {
      console.error(`gen_fixture: id ${script[i]} comes before two ids in the script`);
      process.exit(2);
    }
    axis.set(script[i], axis.size);
  }
}
if (axis.size > D) {
  console.error(`gen_fixture: a script of at most ${D} steps`);
  process.exit(2);
}
fs.mkdirSync(out, { recursive: true });
for (const f of ['tokenizer.json', 'tokenizer_config.json'])
  fs.copyFileSync(path.join(shared, 'tokenizers', 'qwen3', f), path.join(out, f));
fs.writeFileSync(path.join(out, 'config.json'), JSON.stringify({
  architectures: ['Qwen3ForCausalLM'], model_type: 'qwen3', hidden_size: D,
  intermediate_size: I, num_hidden_layers: L, num_attention_heads: H,
  num_key_value_heads: KV, head_dim: HD, vocab_size: V, max_position_embeddings: 8192,
  rms_norm_eps: 1e-6, rope_theta: 1000000, tie_word_embeddings: !script,
  attention_bias: false, torch_dtype: 'bfloat16', bos_token_id: 151643,
  eos_token_id: 151645, hidden_act: 'silu',
}, null, 1));
// Qwen3's own sampling defaults: the server applies them below its flags.
fs.writeFileSync(path.join(out, 'generation_config.json'), JSON.stringify({
  do_sample: true, temperature: 0.6, top_p: 0.95, top_k: 20,
  eos_token_id: [151645, 151643], bos_token_id: 151643,
}, null, 1));

const tensors = [['model.embed_tokens.weight', [V, D], 'rand'], ['model.norm.weight', [D], 'one']];
for (let l = 0; l < L; l++) {
  const p = `model.layers.${l}.`;
  tensors.push([p + 'input_layernorm.weight', [D], 'one'],
    [p + 'post_attention_layernorm.weight', [D], 'one'],
    [p + 'self_attn.q_proj.weight', [H * HD, D], 'rand'],
    [p + 'self_attn.k_proj.weight', [KV * HD, D], 'rand'],
    [p + 'self_attn.v_proj.weight', [KV * HD, D], 'rand'],
    [p + 'self_attn.o_proj.weight', [D, H * HD], 'rand'],
    [p + 'self_attn.q_norm.weight', [HD], 'one'],
    [p + 'self_attn.k_norm.weight', [HD], 'one'],
    [p + 'mlp.gate_proj.weight', [I, D], 'rand'],
    [p + 'mlp.up_proj.weight', [I, D], 'rand'],
    [p + 'mlp.down_proj.weight', [D, I], 'rand']);
}
if (script) {
  tensors.push(['lm_head.weight', [V, D], 'head']);
  for (const t of tensors)
    if (t[2] === 'rand' && t[0] !== 'model.embed_tokens.weight') t[2] = 'zero';
}
// xorshift32: the same file every time
let s = 0x9e3779b9;
const next = () => { s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0; return s; };
const header = {};
let off = 0;
const bufs = [];
for (const [name, shape, kind] of tensors) {
  const n = shape.reduce((a, b) => a * b, 1);
  const b = Buffer.alloc(n * 2);
  if (kind === 'one' || kind === 'rand')
    for (let i = 0; i < n; i++) {
      // bf16: 1.0 for norms; else sign, exponent 2^-6..2^-5 and a random mantissa (|w| ~ 0.02)
      const v = kind === 'one' ? 0x3f80 : (((next() & 1) << 15) | (0x3c << 7) | (next() & 0x7f));
      b.writeUInt16LE(v, i * 2);
    }
  if (script && name === 'model.embed_tokens.weight') // a predecessor's row: its axis, 1.0
    for (const [id, ax] of axis) {
      b.fill(0, id * D * 2, (id + 1) * D * 2);
      b.writeUInt16LE(0x3f80, (id * D + ax) * 2);
    }
  if (kind === 'head') // the successor's row: 4.0 on its predecessor's axis
    for (let i = 0; i + 1 < script.length; i++)
      b.writeUInt16LE(0x4080, (script[i + 1] * D + axis.get(script[i])) * 2);
  header[name] = { dtype: 'BF16', shape, data_offsets: [off, off + b.length] };
  off += b.length;
  bufs.push(b);
}
let h = Buffer.from(JSON.stringify(header));
const pad = (8 - (h.length % 8)) % 8;
h = Buffer.concat([h, Buffer.alloc(pad, 0x20)]);
const len = Buffer.alloc(8);
len.writeBigUInt64LE(BigInt(h.length));
const fd = fs.openSync(path.join(out, 'model.safetensors'), 'w');
fs.writeSync(fd, len);
fs.writeSync(fd, h);
for (const b of bufs) fs.writeSync(fd, b);
fs.closeSync(fd);
