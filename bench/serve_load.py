#!/usr/bin/env python3
"""serve_load.py - bounded HTTP load on a running `cllm serve` (or any
OpenAI-compatible server), standard library only (threading + http.client),
for the GPU machine, which has python3 but no internet and no node.

  python3 bench/serve_load.py --url http://127.0.0.1:8080 --streams 1,8,32,64 \\
      --prompt-tokens 512 --max-tokens 128 [--api completions|chat] [--reps 1]
  python3 bench/serve_load.py --url http://127.0.0.1:8080 --prefix-test 8192

For each S in --streams: S threads each send ONE streaming request (SSE,
stream_options.include_usage) with a distinct prompt, temperature 0,
max_tokens G and ignore_eos (a cllm extension: every stream decodes G tokens);
all S start together (a barrier). `completions` prompts are P random token
ids in [1000, 30000) (no prefix sharing); `chat` prompts are distinct random
words (the chat template decides the token count; usage reports it).

Per S one row: agg tok/s = the token chunks that arrive while all S streams
decode (from the last stream's first token to the first stream's last
token) over that window's length, the definition of `cllm bench --batch`
(src/cli/bench.c run_batch); the median over --reps; "-" when the S streams
never all decode at once (the server's --batch below S). e2e tok/s: all
completion tokens (usage) over the wall time. TTFT p50/p99 (ms) over every
request of every rep: from sending the request to its first token chunk.
wall s: from the first request sent to the last stream done (the median over
reps). prompt: usage.prompt_tokens per request (for `chat`, what the
template made of the words). tokens: completion tokens per rep. tok/chunk:
completion tokens per text chunk; the server sends one chunk per token that
yields text, so a value above 1.00 means some tokens had no text of their
own (a partial UTF-8 character, a hidden special token) and agg undercounts
by about that factor. Before the rows, one short untimed warm-up request.

--mixed P: what a long prompt arriving costs a stream already decoding, and
what its chunks take (cllm serve --prefill-chunk). One stream decodes
(--prompt-tokens, --max-tokens, which must outlast the long prompt's
prefill); after its 16th token a request with a P-token prompt and
max_tokens 1 arrives. Prints that request's TTFT and the decoding stream's
inter-token gaps before it (median) and while it was prefilled (from its
send to its first token: count, median, largest), per --reps.

--prefix-test P: one request with a P-token prompt and max_tokens 1, twice;
the second is a full prefix hit. Prints both TTFTs, their ratio and the
second's usage.prompt_tokens_details.cached_tokens. P is lowered to the
server's context minus one (from /stats) when it is larger.

Exits 1 with a message when the server is unreachable or a request fails.
"""
import argparse
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse


class LoadError(Exception):
    pass


class StatusError(LoadError):
    pass


def parse_url(url):
    u = urllib.parse.urlparse(url if "://" in url else "http://" + url)
    if u.scheme != "http":
        raise LoadError(f"--url {url}: only http:// is supported")
    return u.hostname or "127.0.0.1", u.port or 80, u.path.rstrip("/")


class Client:
    def __init__(self, url, timeout):
        self.host, self.port, self.base = parse_url(url)
        self.url = url
        self.timeout = timeout

    def conn(self):
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def request_json(self, method, path, body=None):
        """One request with a JSON reply; StatusError for a non-200 answer,
        LoadError when the server cannot be reached."""
        c = self.conn()
        try:
            if body is None:
                c.request(method, self.base + path)
            else:
                c.request(method, self.base + path, body=json.dumps(body),
                          headers={"content-type": "application/json"})
            r = c.getresponse()
            data = r.read()
            if r.status != 200:
                raise StatusError(f"{method} {path}: HTTP {r.status}: {data[:300]!r}")
            return json.loads(data)
        except (OSError, http.client.HTTPException) as ex:
            raise LoadError(f"{method} {path}: cannot reach the server at {self.url} "
                            f"({ex})") from None
        finally:
            c.close()

    def get_json(self, path):
        return self.request_json("GET", path)

    def post_json(self, path, body):
        return self.request_json("POST", path, body)


def request_body(api, prompt, max_tokens):
    body = {"model": "bench", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def chunk_text(obj):
    """The text a chunk carries ("" when none): completions text, chat delta content."""
    ch = obj.get("choices") or []
    if not ch:
        return ""
    c0 = ch[0]
    if "text" in c0:
        return c0.get("text") or ""
    d = c0.get("delta") or {}
    return (d.get("content") or "") + (d.get("reasoning_content") or "")


class Stream:
    """One streaming request: connect, wait at the barrier, send, read SSE."""

    def __init__(self, client, path, body, barrier):
        self.client, self.path, self.body, self.barrier = client, path, body, barrier
        self.t_send = None
        self.times = []      # arrival of every chunk that carries text
        self.t_first = None  # the first text chunk, else the finish chunk (a token with no text)
        self.usage = None
        self.finish = None
        self.error = None
        self.t_done = None
        self.stop_after = None  # set by another thread: stop at a text chunk past this time

    def run(self):
        c = None
        try:
            c = self.client.conn()
            c.connect()
            payload = json.dumps(self.body).encode()
            if self.barrier is not None:
                self.barrier.wait()
            self.t_send = time.perf_counter()
            c.request("POST", self.client.base + self.path, body=payload,
                      headers={"content-type": "application/json",
                               "accept": "text/event-stream"})
            r = c.getresponse()
            if r.status != 200:
                raise LoadError(f"HTTP {r.status}: {r.read()[:300]!r}")
            done = False
            while True:
                line = r.readline()  # one SSE line at a time, as it arrives
                if not line:
                    break
                t = time.perf_counter()
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                obj = json.loads(data)
                if "error" in obj and not obj.get("choices"):
                    raise LoadError(f"error event: {obj['error']}")
                ch = obj.get("choices") or []
                if chunk_text(obj):
                    self.times.append(t)
                    self.t_first = self.t_first or t
                if ch and ch[0].get("finish_reason"):
                    self.finish = ch[0]["finish_reason"]
                    self.t_first = self.t_first or t
                if obj.get("usage"):
                    self.usage = obj["usage"]
                stop = self.stop_after
                if stop is not None and self.times and self.times[-1] > stop:
                    done = True  # the caller has what it needs; closing cancels the rest
                    break
            if not done:
                raise LoadError("the stream ended without data: [DONE]")
            self.t_done = time.perf_counter()
        except Exception as ex:  # reported by the caller, never silently
            if isinstance(ex, threading.BrokenBarrierError):
                ex = LoadError("another stream failed before the start")
            elif self.barrier is not None and self.t_send is None:
                self.barrier.abort()
            self.error = str(ex) or type(ex).__name__
        finally:
            if c is not None:
                c.close()


def run_streams(client, path, bodies):
    barrier = threading.Barrier(len(bodies))
    streams = [Stream(client, path, b, barrier) for b in bodies]
    threads = [threading.Thread(target=s.run, daemon=True) for s in streams]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, s in enumerate(streams):
        if s.error:
            raise LoadError(f"stream {i + 1}/{len(streams)} failed: {s.error}")
        if s.t_first is None or not (s.usage or {}).get("completion_tokens"):
            raise LoadError(f"stream {i + 1}/{len(streams)}: no tokens "
                            f"(finish_reason {s.finish}, usage {s.usage})")
    return streams


def percentile(sorted_v, p):
    k = int((p / 100.0) * len(sorted_v) + 0.999999) - 1
    return sorted_v[max(0, min(len(sorted_v) - 1, k))]


def median(v):
    s = sorted(v)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


WORDS = ("apple river stone cloud garden silver lamp forest window candle paper ocean "
         "mountain bridge yellow quiet thunder pencil marble harbor").split()


def make_prompt(api, rng, n, vocab):
    if api == "chat":
        return " ".join(rng.choice(WORDS) for _ in range(n)) + f" #{rng.random():.12f}"
    hi = min(30000, vocab)
    lo = min(1000, hi - 1)
    return [rng.randrange(lo, hi) for _ in range(n)]


def load_rows(client, args, model):
    path = "/v1/chat/completions" if args.api == "chat" else "/v1/completions"
    vocab = (model or {}).get("vocab_size") or 32000
    rng = random.Random(args.seed)
    # warm-up (untimed): first-use costs (kernel loading, graphs) stay out of the rows
    warm = request_body(args.api, make_prompt(args.api, rng, min(args.prompt_tokens, 32), vocab), 2)
    run_streams(client, path, [warm])
    no_window = False
    print(f"{'streams':>7} {'agg tok/s':>10} {'e2e tok/s':>10} {'ttft p50 ms':>12} "
          f"{'ttft p99 ms':>12} {'wall s':>8} {'prompt':>7} {'tokens':>7} {'tok/chunk':>9}")
    for S in args.streams:
        aggs, walls, ttfts, e2e, n_tok, n_chunks, n_prompt = [], [], [], [], 0, 0, []
        for _ in range(args.reps):
            bodies = [request_body(args.api, make_prompt(args.api, rng, args.prompt_tokens, vocab),
                                   args.max_tokens) for _ in range(S)]
            st = run_streams(client, path, bodies)
            t0 = min(s.t_send for s in st)
            t_start = max(s.t_first for s in st)
            t_end = min(s.times[-1] if s.times else s.t_first for s in st)
            in_window = sum(1 for s in st for t in s.times if t_start < t <= t_end)
            aggs.append(in_window / (t_end - t_start) if t_end > t_start and in_window else None)
            walls.append(max(s.t_done for s in st) - t0)
            ttfts += [s.t_first - s.t_send for s in st]
            toks = sum(s.usage["completion_tokens"] for s in st)
            e2e.append(toks / walls[-1])
            n_tok += toks
            n_chunks += sum(len(s.times) for s in st)
            n_prompt += [(s.usage or {}).get("prompt_tokens", 0) for s in st]
        ttfts.sort()
        ok = [a for a in aggs if a is not None]
        if len(ok) < len(aggs):
            no_window = True
        agg = f"{median(ok):10.1f}" if ok else f"{'-':>10}"
        print(f"{S:>7} {agg} {median(e2e):>10.1f} {percentile(ttfts, 50) * 1e3:>12.1f} "
              f"{percentile(ttfts, 99) * 1e3:>12.1f} {median(walls):>8.2f} "
              f"{round(sum(n_prompt) / len(n_prompt)):>7} "
              f"{n_tok // args.reps:>7} {n_tok / max(1, n_chunks):>9.2f}", flush=True)
    if no_window:
        print("agg '-': the S streams never all decoded at once (the server's --batch is "
              "below S, or max_tokens is too small); e2e tok/s is completion tokens over wall")


def prefix_test(client, args, model):
    P = args.prefix_test
    ctx = (model or {}).get("ctx_len")
    if ctx and P >= ctx:
        print(f"note: --prefix-test {P} lowered to {ctx - 1} (the server's context is {ctx} "
              f"tokens)")
        P = ctx - 1
    vocab = (model or {}).get("vocab_size") or 32000
    path = "/v1/chat/completions" if args.api == "chat" else "/v1/completions"
    rng = random.Random(args.seed + 7 if args.seed is not None else None)
    prompt = make_prompt(args.api, rng, P, vocab)
    res = []
    for _ in range(2):
        body = request_body(args.api, prompt, 1)
        s = run_streams(client, path, [body])[0]
        res.append(s)
    t1, t2 = (s.t_first - s.t_send for s in res)
    u1, u2 = res[0].usage or {}, res[1].usage or {}
    cached = (u2.get("prompt_tokens_details") or {}).get("cached_tokens")
    print(f"prefix test: {u1.get('prompt_tokens', P)}-token prompt, max_tokens 1")
    print(f"  cold TTFT {t1 * 1e3:10.1f} ms (cached_tokens "
          f"{(u1.get('prompt_tokens_details') or {}).get('cached_tokens')})")
    print(f"  hit  TTFT {t2 * 1e3:10.1f} ms (cached_tokens {cached})")
    print(f"  ratio cold/hit {t1 / t2 if t2 > 0 else float('inf'):.1f}x")


def mixed_test(client, args, model):
    P = args.mixed
    vocab = (model or {}).get("vocab_size") or 32000
    path = "/v1/chat/completions" if args.api == "chat" else "/v1/completions"
    rng = random.Random(args.seed)
    run_streams(client, path, [request_body(args.api, make_prompt(args.api, rng, 32, vocab), 2)])
    print(f"mixed: one stream decoding ({args.prompt_tokens}-token prompt, max_tokens "
          f"{args.max_tokens}); a {P}-token prompt (max_tokens 1) arrives after its 16th token")
    print(f"{'rep':>3} {'long TTFT ms':>13} {'gap before ms':>14} {'gaps during':>12} "
          f"{'median ms':>10} {'largest ms':>11}")
    for rep in range(args.reps):
        a = Stream(client, path, request_body(args.api, make_prompt(args.api, rng,
                                                                    args.prompt_tokens, vocab),
                                              args.max_tokens), None)
        ta = threading.Thread(target=a.run, daemon=True)
        ta.start()
        while len(a.times) < 16 and ta.is_alive():
            time.sleep(0.002)
        if len(a.times) < 16:
            ta.join()
            raise LoadError(f"the decoding stream ended after {len(a.times)} tokens "
                            f"({a.error or a.finish})")
        b = Stream(client, path, request_body(args.api, make_prompt(args.api, rng, P, vocab), 1),
                   None)
        b.run()
        # stop the decoding stream at its first token past the long prompt's
        # (or at once, when that request failed)
        a.stop_after = b.t_first if b.t_first is not None else time.perf_counter()
        ta.join()
        if b.error or a.error or b.t_first is None:
            raise LoadError(f"long prompt: {b.error or 'no token'}; decoding stream: {a.error}")
        t0, t1 = b.t_send, b.t_first
        before = [y - x for x, y in zip(a.times, a.times[1:]) if y <= t0]
        during = [y - x for x, y in zip(a.times, a.times[1:]) if t0 < y <= t1]
        # the gap spanning the long prompt's first token counts too: it waited for it
        after = [t for t in a.times if t > t1]
        if not after:
            raise LoadError("the decoding stream ended before the long prompt's first token: "
                            "raise --max-tokens")
        prev = max([t for t in a.times if t <= t1], default=t0)
        during.append(after[0] - prev)
        print(f"{rep + 1:>3} {(t1 - t0) * 1e3:>13.1f} {median(before) * 1e3:>14.2f} "
              f"{len(during):>12} {median(during) * 1e3:>10.2f} {max(during) * 1e3:>11.2f}",
              flush=True)


def streams_list(s):
    try:
        v = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{s}' is not a list like 1,8,32") from None
    if not v or any(x < 1 or x > 4096 for x in v):
        raise argparse.ArgumentTypeError(f"'{s}': stream counts must be in [1, 4096]")
    return v


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--streams", type=streams_list, default=[1, 8, 32, 64])
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--api", choices=("completions", "chat"), default="completions")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds a connection may wait for data (default 600)")
    ap.add_argument("--seed", type=int, default=None,
                    help="prompt RNG seed (default: fresh prompts every run, so a previous "
                    "run's prompt cache gives no hits)")
    ap.add_argument("--prefix-test", type=int, nargs="?", const=8192, default=None,
                    metavar="P", help="prefix-cache TTFT test with a P-token prompt "
                    "(default 8192)")
    ap.add_argument("--mixed", type=int, default=None, metavar="P",
                    help="a P-token prompt arriving while one stream decodes: its TTFT and "
                    "the stream's token gaps meanwhile")
    args = ap.parse_args()
    if args.prompt_tokens < 1 or args.max_tokens < 1 or args.reps < 1 or \
            (args.prefix_test is not None and args.prefix_test < 1) or \
            (args.mixed is not None and args.mixed < 1):
        ap.error("--prompt-tokens, --max-tokens, --reps, --prefix-test and --mixed must be >= 1")
    try:
        client = Client(args.url, args.timeout)
        try:  # cllm's /stats: vocabulary and context; other servers: just reachable
            stats = client.get_json("/stats")
            model = stats.get("model") if isinstance(stats, dict) else None
        except StatusError:
            client.get_json("/v1/models")
            model = None
        if model:
            print(f"server {args.url}: model {model.get('id', '?')}, vocab "
                  f"{model.get('vocab_size')}, context {model.get('ctx_len')} tokens; "
                  f"api {args.api}")
        if args.prefix_test is not None:
            prefix_test(client, args, model)
        elif args.mixed is not None:
            mixed_test(client, args, model)
        else:
            what = "words + the chat template" if args.api == "chat" else "random token ids"
            print(f"prompt {args.prompt_tokens} {what}, max_tokens {args.max_tokens}, "
                  f"temperature 0, ignore_eos, reps {args.reps}; prompt/tokens columns: "
                  f"usage per request / completion tokens per rep")
            load_rows(client, args, model)
    except LoadError as ex:
        print(f"serve_load: {ex}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
