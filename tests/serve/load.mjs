// load.mjs - a bounded load run against a cllm serve on loopback: N requests
// from C concurrent clients over all four generation APIs, streamed and not,
// some dropped mid-flight. Checks that the server survives, that every
// completed response is well-formed, that /stats returns to idle (no stuck
// slot, KV blocks all free) and that RSS stays flat after a warm-up.
//
//   node load.mjs <base url> <server pid> [requests=200] [clients=16]
import fs from 'node:fs';
import http from 'node:http';

const [base, pid, nArg = '200', cArg = '16'] = process.argv.slice(2);
const N = +nArg, C = +cArg, WARMUP = Math.min(40, N >> 2);
const url = new URL(base);
const agent = new http.Agent({ keepAlive: true, maxSockets: C });
let pass = 0, fail = 0;
const check = (cond, what) => { if (cond) pass++; else { fail++; if (fail < 20) console.error(`FAIL [load]: ${what}`); } };

let seed = 12345;
const rand = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 4294967296);
const pick = (a) => a[Math.floor(rand() * a.length)];

function rss() {
  const m = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/);
  return m ? +m[1] * 1024 : 0;
}

function send(method, path, body, abortMs) {
  return new Promise((resolve) => {
    const data = body ? JSON.stringify(body) : null;
    const req = http.request({ host: url.hostname, port: url.port, path, method, agent,
      headers: data ? { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) } : {} }, (res) => {
      const parts = [];
      res.on('data', (d) => parts.push(d));
      res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(parts).toString('utf8') }));
      res.on('error', () => resolve({ aborted: true }));
      res.on('aborted', () => resolve({ aborted: true }));
    });
    req.on('error', () => resolve({ aborted: true }));
    if (abortMs !== undefined) setTimeout(() => { req.destroy(); resolve({ aborted: true }); }, abortMs);
    if (data) req.write(data);
    req.end();
  });
}

function sse(text) {
  const events = [];
  for (const block of text.split('\n\n')) {
    if (!block.trim()) continue;
    let name = null, data = null;
    for (const line of block.split('\n')) {
      if (line.startsWith('event: ')) name = line.slice(7);
      else if (line.startsWith('data: ')) data = line.slice(6);
    }
    if (data === null) return null;
    if (data === '[DONE]') { events.push({ name, done: true }); continue; }
    try { events.push({ name, data: JSON.parse(data) }); } catch { return null; }
  }
  return events;
}

const apis = {
  chat: (mt, stream) => ['/v1/chat/completions', { model: 'm', messages: [{ role: 'user', content: 'Once upon a time' }],
    max_tokens: mt, stream, temperature: rand() }],
  completions: (mt, stream) => ['/v1/completions', { model: 'm', prompt: 'Once upon a time', max_tokens: mt, stream }],
  messages: (mt, stream) => ['/v1/messages', { model: 'm', max_tokens: mt, stream,
    messages: [{ role: 'user', content: [{ type: 'text', text: 'Once upon a time' }] }] }],
  responses: (mt, stream) => ['/v1/responses', { model: 'm', input: 'Once upon a time', max_output_tokens: mt, stream, store: false }],
};

function wellFormed(api, stream, mt, r) {
  if (r.status !== 200) return `status ${r.status}: ${r.body.slice(0, 200)}`;
  if (!stream) {
    let j;
    try { j = JSON.parse(r.body); } catch { return 'body is not JSON'; }
    const u = j.usage;
    if (api === 'chat') return typeof j.choices?.[0]?.message?.content === 'string' && u.completion_tokens <= mt ? null : 'chat shape';
    if (api === 'completions') return typeof j.choices?.[0]?.text === 'string' && u.completion_tokens <= mt ? null : 'completion shape';
    if (api === 'messages') return typeof j.content?.[0]?.text === 'string' && u.output_tokens <= mt ? null : 'message shape';
    return typeof j.output?.[0]?.content?.[0]?.text === 'string' && u.output_tokens <= mt ? null : 'response shape';
  }
  const ev = sse(r.body);
  if (!ev || !ev.length) return 'bad SSE';
  if (api === 'chat' || api === 'completions') return ev.at(-1).done && ev.slice(0, -1).every((e) => e.data?.choices) ? null : 'openai stream';
  if (api === 'messages') return ev[0].name === 'message_start' && ev.at(-1).name === 'message_stop' &&
    ev.every((e) => e.data?.type === e.name) ? null : 'anthropic stream';
  const seqOk = ev.every((e, i) => e.data?.sequence_number === i && e.data.type === e.name);
  return seqOk && ev[0].name === 'response.created' && /response\.(completed|incomplete)/.test(ev.at(-1).name) ? null : 'responses stream';
}

let next = 0, done = 0, aborted = 0, rssWarm = 0;
async function client() {
  for (;;) {
    const i = next++;
    if (i >= N) return;
    const api = pick(Object.keys(apis)), stream = rand() < 0.5, mt = 1 + Math.floor(rand() * 12);
    const [path, body] = apis[api](mt, stream);
    const drop = rand() < 0.2 ? Math.floor(rand() * 15) : undefined;
    const r = await send('POST', path, body, drop);
    if (r.aborted) aborted++;
    else { const bad = wellFormed(api, stream, mt, r); check(!bad, `${api} stream=${stream}: ${bad}`); }
    if (++done === WARMUP) rssWarm = rss();
  }
}

// idle KV: every block is free or held only by the prefix cache's index
const idleKV = (st) => st.kv.blocks_free + st.prompt_cache.blocks_idle === st.kv.blocks_total &&
  st.prompt_cache.blocks === st.prompt_cache.blocks_idle;
const t0 = Date.now();
await Promise.all(Array.from({ length: C }, client));
const secs = (Date.now() - t0) / 1000;
// idle again: nothing running or queued, every KV block free
let stats = null;
for (let k = 0; k < 100; k++) {
  const r = await send('GET', '/stats');
  stats = r.status === 200 ? JSON.parse(r.body) : null;
  if (stats && stats.running === 0 && stats.queue.waiting === 0 && stats.http.in_flight === 0 &&
      idleKV(stats)) break;
  await new Promise((res) => setTimeout(res, 50));
}
check(stats && stats.running === 0 && stats.queue.waiting === 0 && stats.http.in_flight === 0, `stats not idle: ${JSON.stringify(stats)}`);
check(stats && idleKV(stats), `KV blocks leaked: ${JSON.stringify(stats && [stats.kv, stats.prompt_cache])}`);
const health = await send('GET', '/health');
check(health.status === 200, 'server alive');
const rssEnd = rss();
const grow = (rssEnd - rssWarm) / 1048576;
check(grow < 24, `RSS grew ${grow.toFixed(1)} MiB after warm-up`);
console.log(`load: ${N} requests (${aborted} dropped by the client) from ${C} clients in ${secs.toFixed(1)} s; ` +
  `RSS ${(rssWarm / 1048576).toFixed(1)} -> ${(rssEnd / 1048576).toFixed(1)} MiB; ${pass} passed, ${fail} failed`);
agent.destroy();
process.exit(fail ? 1 : 0);
