// serve_bench.mjs - what the HTTP server costs on top of the engine:
// decode speed of `cllm run` vs the same greedy tokens streamed (SSE) and
// not streamed through `cllm serve`, the per-token difference, and
// requests/s for one-token requests from concurrent keep-alive clients.
//
//   node bench/serve_bench.mjs <cllm binary> <model> [tokens=500] [port=18555]
//
// The engine gets one thread (-t 1) so the HTTP threads have a core of their
// own, as on any machine with more cores than engine threads.
import { spawn, spawnSync } from 'node:child_process';
import http from 'node:http';

const [cllm, model, nArg = '500', portArg = '18555'] = process.argv.slice(2);
if (!cllm || !model) {
  console.error('usage: node bench/serve_bench.mjs <cllm> <model> [tokens] [port]');
  process.exit(2);
}
const N = +nArg, port = +portArg, REPS = 7;
const median = (a) => [...a].sort((x, y) => x - y)[a.length >> 1];
const agent = new http.Agent({ keepAlive: true, maxSockets: 16 });

function post(path, body, onChunk) {
  return new Promise((resolve, reject) => {
    const data = JSON.stringify(body);
    const req = http.request({ host: '127.0.0.1', port, path, method: 'POST', agent,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) } }, (res) => {
      const parts = [];
      res.on('data', (d) => { parts.push(d); if (onChunk) onChunk(d); });
      res.on('end', () => resolve(Buffer.concat(parts).toString()));
    });
    req.on('error', reject);
    req.end(data);
  });
}

// 1. the engine alone: cllm run's decode rate
const runTps = [];
for (let i = 0; i < REPS; i++) {
  const r = spawnSync(cllm, ['run', model, '-p', 'Zoo', '-n', String(N), '--temp', '0', '--ignore-eos', '-t', '1'],
    { encoding: 'utf8' });
  runTps.push(+/decode: .* ([\d.]+) tok\/s/.exec(r.stderr)[1]);
}

const srv = spawn(cllm, ['serve', model, '--port', String(port), '-t', '1'], { stdio: ['ignore', 'ignore', 'inherit'] });
for (let i = 0; i < 100; i++) {
  try { await new Promise((ok, no) => http.get(`http://127.0.0.1:${port}/health`, (r) => { r.resume(); r.on('end', ok); }).on('error', no)); break; }
  catch { await new Promise((r) => setTimeout(r, 100)); }
}

// 2. the same tokens through the server, streamed and not
const body = { prompt: 'Zoo', max_tokens: N, temperature: 0, ignore_eos: true };
const streamTps = [], plainTps = [], gaps = [];
for (let i = 0; i < REPS; i++) {
  let first = 0, last = 0, prev = 0;
  await post('/v1/completions', { ...body, stream: true }, () => {
    const t = performance.now();
    if (!first) first = t; else gaps.push(t - prev);
    prev = last = t;
  });
  streamTps.push((N - 1) / ((last - first) / 1000));
  const t0 = performance.now();
  await post('/v1/completions', body);
  plainTps.push(N / ((performance.now() - t0) / 1000));
}

// 3. one-token requests from 16 keep-alive clients
const R = 2000;
let next = 0;
const t0 = performance.now();
await Promise.all(Array.from({ length: 16 }, async () => {
  while (next++ < R) await post('/v1/completions', { prompt: 'Zoo', max_tokens: 1, temperature: 0 });
}));
const rps = R / ((performance.now() - t0) / 1000);
srv.kill('SIGTERM');
agent.destroy();

const run = median(runTps), st = median(streamTps), pl = median(plainTps);
const stepUs = 1e6 / run;
console.log(`model ${model}, ${N} greedy tokens, median of ${REPS}`);
console.log(`cllm run decode:         ${run.toFixed(0)} tok/s (${stepUs.toFixed(1)} us/step)`);
console.log(`serve, not streamed:     ${pl.toFixed(0)} tok/s (incl. prefill and HTTP round trip)`);
console.log(`serve, streamed (SSE):   ${st.toFixed(0)} tok/s; client-side gap between chunks median ${(median(gaps) * 1000).toFixed(1)} us`);
console.log(`per-token cost of serving a stream vs cllm run: ${(1e6 / st - stepUs).toFixed(1)} us ` +
  `(${(100 * (1e6 / st - stepUs) / stepUs).toFixed(1)}% of a decode step)`);
console.log(`one-token requests, 16 clients: ${rps.toFixed(0)} req/s`);
