#!/usr/bin/env python3
"""burst.py - many clients at once against a running `cllm serve`, checked
against each prompt's greedy answer alone.

First each prompt is asked alone (greedy, ignore_eos, so every answer is
max_tokens long). Then N requests from C client threads at once, each a
prompt over one of the OpenAI completions / chat, Anthropic messages or
Responses routes, streamed or not; every k-th streamed one is dropped
after its first events (the client closes the socket). Checks:
  - every request not dropped answers 200, well-formed, max_tokens tokens
    (usage), finish "length", its text the concatenation of its stream;
  - its text equals the prompt's answer alone (--exact: the CPU backend's
    batch invariance), or, on a GPU where a batched step's sums are ordered
    otherwise, at least its first word does, and the count of identical
    answers is reported;
  - afterwards /stats returns to idle: nothing running or waiting, every
    KV block free but the prompt cache's, every burst request counted and
    ended (completed, or cancelled if it was dropped: a drop whose last
    tokens went out before the server saw the close completes);
  - /health still answers.
Prints "burst: N passed, M failed" and exits non-zero on a failure. Only
the standard library: runs wherever python3 does (the GPU machine too).

  burst.py BASE_URL [--requests 96] [--clients 16] [--max-tokens 24]
           [--drop-every 5] [--exact] [--wait SECONDS]
  --wait: first poll /health that long for a server still starting.
"""
import argparse
import http.client
import json
import sys
import threading
import time
import urllib.parse

PROMPTS = [
    "Once upon a time, there was a little girl named Lily. She loved to",
    "Tom and his dog went to the park. They saw a big",
    "One day, a bird found a shiny",
    "The sun was hot and the children wanted to",
    "Sam had a red ball. He threw it",
    "Mom made a cake for the party. Everyone",
]

passed = failed = 0
lock = threading.Lock()


def check(cond, what):
    global passed, failed
    with lock:
        if cond:
            passed += 1
        else:
            failed += 1
            if failed <= 20:
                print(f"FAIL [burst]: {what}", file=sys.stderr)


def body_of(route, prompt, max_tokens, stream):
    common = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": stream}
    if route in ("/v1/completions", "/v1/chat/completions"):
        b = {"prompt": prompt} if route == "/v1/completions" else {
            "messages": [{"role": "user", "content": prompt}]}
        b.update(common)
        if stream:
            b["stream_options"] = {"include_usage": True}
        return b
    if route == "/v1/messages":
        return {"model": "m", "messages": [{"role": "user", "content": prompt}], **common}
    common.pop("max_tokens")
    return {"input": [{"role": "user", "content": prompt}], "max_output_tokens": max_tokens,
            **common}


def text_and_usage(route, j):
    """(text, completion tokens, finish) of a non-streamed answer."""
    if route == "/v1/completions":
        c = j["choices"][0]
        return c["text"], j["usage"]["completion_tokens"], c["finish_reason"]
    if route == "/v1/chat/completions":
        c = j["choices"][0]
        return c["message"]["content"], j["usage"]["completion_tokens"], c["finish_reason"]
    if route == "/v1/messages":
        t = "".join(b.get("text", "") for b in j["content"] if b["type"] == "text")
        fin = "length" if j["stop_reason"] == "max_tokens" else j["stop_reason"]
        return t, j["usage"]["output_tokens"], fin
    t = "".join(c.get("text", "") for o in j["output"] if o["type"] == "message"
                for c in o["content"])
    fin = "length" if j.get("incomplete_details") else j["status"]
    return t, j["usage"]["output_tokens"], fin


def stream_events(resp):
    """Yields the JSON payload of each SSE data line."""
    for raw in resp:
        line = raw.decode().rstrip("\r\n")
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


def text_of_stream(route, events):
    """(text, completion tokens, finish) from a whole stream's events."""
    text, ntok, fin = "", None, None
    for e in events:
        if route == "/v1/completions":
            for c in e.get("choices", []):
                text += c.get("text", "")
                fin = c.get("finish_reason") or fin
            if e.get("usage"):
                ntok = e["usage"]["completion_tokens"]
        elif route == "/v1/chat/completions":
            for c in e.get("choices", []):
                text += c.get("delta", {}).get("content") or ""
                fin = c.get("finish_reason") or fin
            if e.get("usage"):
                ntok = e["usage"]["completion_tokens"]
        elif route == "/v1/messages":
            if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta":
                text += e["delta"]["text"]
            if e["type"] == "message_delta":
                ntok = e["usage"]["output_tokens"]
                fin = "length" if e["delta"]["stop_reason"] == "max_tokens" else e["delta"]["stop_reason"]
        else:
            if e["type"] == "response.output_text.delta":
                text += e["delta"]
            if e["type"] in ("response.completed", "response.incomplete"):
                ntok = e["response"]["usage"]["output_tokens"]
                fin = "length" if e["type"] == "response.incomplete" else "completed"
    return text, ntok, fin


class Client:
    def __init__(self, base):
        u = urllib.parse.urlparse(base)
        self.host, self.port = u.hostname, u.port

    def post(self, route, body, drop_after=0):
        """(status, text, tokens, finish) or None when dropped on purpose."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=300)
        try:
            conn.request("POST", route, json.dumps(body), {"content-type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                return resp.status, resp.read().decode(), None, None
            if not body["stream"]:
                return (200,) + text_and_usage(route, json.loads(resp.read()))
            if drop_after:
                for i, _ in enumerate(stream_events(resp)):
                    if i + 1 >= drop_after:
                        break
                return None
            return (200,) + text_of_stream(route, stream_events(resp))
        finally:
            conn.close()

    def get(self, path):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read().decode()
        finally:
            conn.close()


ROUTES = ["/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/responses"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--drop-every", type=int, default=5)
    ap.add_argument("--exact", action="store_true")
    ap.add_argument("--wait", type=float, default=0)
    a = ap.parse_args()
    cl = Client(a.base)
    end = time.time() + a.wait
    while a.wait:
        try:
            if cl.get("/health")[0] == 200:
                break
        except OSError:
            pass
        if time.time() > end:
            break
        time.sleep(0.2)
    alone = {}
    for p in PROMPTS:
        for route in ROUTES:
            st, text, ntok, fin = cl.post(route, body_of(route, p, a.max_tokens, False))
            check(st == 200 and ntok == a.max_tokens, f"alone {route}: {st} {text} {ntok}")
            alone[(route, p)] = text

    _, s = cl.get("/stats")
    before = json.loads(s)["requests"]
    jobs = []
    for i in range(a.requests):
        route, p, stream = ROUTES[i % 4], PROMPTS[(i // 4) % len(PROMPTS)], i % 3 != 0
        drop = 2 if stream and a.drop_every and i % a.drop_every == a.drop_every - 1 else 0
        jobs.append((i, route, p, stream, drop))
    results = [None] * len(jobs)
    nxt = [0]

    def worker():
        while True:
            with lock:
                if nxt[0] >= len(jobs):
                    return
                j = jobs[nxt[0]]
                nxt[0] += 1
            i, route, p, stream, drop = j
            try:
                results[i] = ("ok", cl.post(route, body_of(route, p, a.max_tokens, stream), drop))
            except Exception as e:  # a broken connection is a failure, not a crash
                results[i] = ("error", repr(e))

    threads = [threading.Thread(target=worker) for _ in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    same = answered = drops = 0
    for (i, route, p, stream, drop), res in zip(jobs, results):
        what = f"request {i} ({route}, stream {stream})"
        if res is None or res[0] == "error":
            check(False, f"{what}: {res}")
            continue
        r = res[1]
        if drop:
            check(r is None, f"{what}: not dropped: {r}")
            drops += 1
            continue
        st, text, ntok, fin = r
        check(st == 200 and ntok == a.max_tokens and fin == "length",
              f"{what}: status {st}, tokens {ntok}, finish {fin}: {text!r}")
        answered += 1
        want = alone[(route, p)]
        same += text == want
        if a.exact:
            check(text == want, f"{what}: {text!r} alone {want!r}")
        else:
            check(text.split()[:1] == want.split()[:1], f"{what}: first word of {text!r} alone {want!r}")

    # back to idle: every burst request received and ended, completed or
    # (only the drops) cancelled, every block free but the cache's. A drop
    # may end as completed: its last tokens can be out before the server
    # sees the socket close.
    idle, stats = False, {}
    for _ in range(200):
        st, s = cl.get("/stats")
        stats = json.loads(s)
        kv, pc, rq = stats["kv"], stats["prompt_cache"], stats["requests"]
        got = rq["total"] - before["total"]
        done = rq["completed"] - before["completed"]
        cancelled = rq["cancelled"] - before["cancelled"]
        if (stats["running"] == 0 and stats["queue"]["waiting"] == 0 and
                kv["blocks_free"] + pc.get("blocks", 0) == kv["blocks_total"] and
                got == len(jobs) and done + cancelled == got and cancelled <= drops and
                done >= len(jobs) - drops):
            idle = True
            break
        time.sleep(0.05)
    check(idle, f"/stats not back to idle after the burst ({drops} drops): {json.dumps(stats)}")
    st, h = cl.get("/health")
    check(st == 200 and json.loads(h)["status"] == "ok", f"/health after the burst: {st} {h}")
    print(f"burst: {answered} answered ({same} identical to alone), {drops} dropped")
    print(f"burst: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
