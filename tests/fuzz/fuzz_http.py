#!/usr/bin/env python3
"""fuzz_http.py - mutation fuzzing of a running `cllm serve` over HTTP.

Each request is a valid body of one endpoint (OpenAI chat and completions,
Anthropic messages and count_tokens, Responses; with tools, tool calls and
tool results, multi-part content, streaming, forced tool calls,
structured-output formats and regular expressions, logprobs, echo, several
choices, logit bias and penalties) mutated at random: fields
dropped or replaced by values of the wrong type, odd numbers and strings,
nested containers, bodies cut short. The server must answer every one with
a 2xx or a 4xx and keep serving: a 5xx, a dropped connection or a server
that stops answering is a finding, printed with the body that caused it.
Python standard library only; not part of ctest (docs/testing.md).

  python3 tests/fuzz/fuzz_http.py --url http://127.0.0.1:8080 [--n 2000] [--seed 1]
"""
import argparse
import http.client
import json
import random
import sys
import time
import urllib.parse
from collections import Counter

BASE = {
    '/v1/chat/completions': {
        "model": "m", "max_tokens": 4, "temperature": 0, "stream": False, "top_p": 0.9, "seed": 1,
        "stop": ["x"], "stream_options": {"include_usage": True}, "n": 2, "logprobs": True,
        "top_logprobs": 3, "logit_bias": {"5": -2, "7": 1.5}, "presence_penalty": 0.5,
        "repetition_penalty": 1.1, "repetition_context_size": 8,
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "r"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {
            "type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", 1]}},
            "required": ["a"], "additionalProperties": False}}}},
    '/v1/completions': {"model": "m", "prompt": ["Once", [1, 5, 9]], "max_tokens": 4, "temperature": 0,
                        "stream": False, "stop": "\n", "echo": True, "logprobs": 2,
                        "frequency_penalty": 0.3, "guided_regex": "[a-z]{1,3}(-\\d)?"},
    # one constraint a body: the server refuses two at once (400)
    '/v1/completions#2': {"model": "m", "prompt": "Once", "max_tokens": 4, "n": 2, "seed": 3,
                          "structured_outputs": {"regex": "(a|b)+", "json": None}},
    '/v1/completions#3': {"model": "m", "prompt": "Once", "max_tokens": 4, "guided_choice": ["yes", "no"]},
    '/v1/completions#4': {"model": "m", "prompt": "Once", "max_tokens": 4, "n": 2,
                          "guided_grammar": "root ::= [a-z]{1,3}"},
    '/v1/messages': {
        "model": "m", "max_tokens": 4, "stream": False, "thinking": {"type": "disabled"},
        "metadata": {"user_id": "u"},
        "system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}},
                                              {"type": "server_tool_use", "id": "s1", "name": "web_search",
                                               "input": {"query": "q"}},
                                              {"type": "web_search_tool_result", "tool_use_id": "s1",
                                               "content": []}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                          "content": [{"type": "text", "text": "r"}]},
                                         {"type": "document", "title": "t",
                                          "source": {"type": "text", "data": "d"}},
                                         {"type": "search_result", "source": "s", "title": "t",
                                          "content": [{"type": "text", "text": "c"}]}]}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "output_format": {"type": "json_schema", "schema": {"type": "array", "items": {"type": "boolean"},
                                                            "maxItems": 2}}},
    '/v1/messages/count_tokens': {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    '/v1/responses': {
        "model": "m", "max_output_tokens": 4, "stream": False, "instructions": "be brief",
        "reasoning": {"effort": "low"},
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                  {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": "c", "output": "r"},
                  {"type": "custom_tool_call", "call_id": "d", "name": "p", "input": "*** Begin"},
                  {"type": "custom_tool_call_output", "call_id": "d",
                   "output": [{"type": "input_text", "text": "ok"}]},
                  {"type": "local_shell_call", "call_id": "e", "status": "completed",
                   "action": {"type": "exec", "command": ["ls"], "timeout_ms": 5}},
                  {"type": "local_shell_call_output", "call_id": "e", "output": "x"}],
        "tools": [{"type": "function", "name": "f", "parameters": {}},
                  {"type": "custom", "name": "p", "format": {"type": "grammar", "syntax": "lark",
                                                            "definition": "start: /.+/"}},
                  {"type": "local_shell"}],
        "tool_choice": "required", "parallel_tool_calls": False, "truncation": "auto",
        "text": {"format": {"type": "json_object"}},
        "include": ["message.output_text.logprobs"], "top_logprobs": 2},
}
# The server refuses a forced tool call together with a structured output
# format (400), so each body that has both is split in two valid ones: the
# forced call without the format, and the format with the choice left to
# the model. A base body that is refused would fuzz little but that refusal.
FORMAT_KEYS = ("response_format", "output_format", "text")
for key in [k for k in BASE if any(f in BASE[k] for f in FORMAT_KEYS) and "tool_choice" in BASE[k]]:
    forced = {k: v for k, v in BASE[key].items() if k not in FORMAT_KEYS}
    formatted = dict(BASE[key])
    formatted["tool_choice"] = {"type": "auto"} if key == '/v1/messages' else "auto"
    BASE[key] = forced
    BASE[key + "#format"] = formatted
ODD = [None, True, False, 0, -1, 1, 2**31, 2**63, -2**63, 1e308, -1e308, 1.5, 1e-7, -0.0, "", "x",
       "\u0000", "\ud7ff\ue000", "a" * 5000, [], {}, [[[]]], {"a": {"b": {}}}, [None], ["x"], [1, 2],
       {"type": "text"}, {"type": "text", "text": None}, "NaN"]
KEYS = ["type", "role", "content", "text", "name", "stream", "max_tokens", "n", "logprobs",
        "response_format", "tool_choice", "input", "prompt", "id", "arguments", "cache_control",
        "stop", "top_k", "min_p", "logit_bias", "echo", "top_logprobs", "guided_regex",
        "structured_outputs", "presence_penalty", "pattern", "input", "action", "command",
        "source", "data", "format", "definition", "output", "call_id"]


def mutate(rnd, v):
    if rnd.random() < 0.08:
        return rnd.choice(ODD)
    if isinstance(v, dict):
        v = dict(v)
        for _ in range(rnd.randint(0, 2)):
            ks, op = list(v), rnd.random()
            if ks and op < 0.3:
                v.pop(rnd.choice(ks))
            elif ks and op < 0.8:
                k = rnd.choice(ks)
                v[k] = mutate(rnd, v[k])
            else:
                v[rnd.choice(KEYS)] = rnd.choice(ODD)
        return v
    if isinstance(v, list):
        v, op = list(v), rnd.random()
        if v and op < 0.3:
            v.pop(rnd.randrange(len(v)))
        elif v and op < 0.7:
            i = rnd.randrange(len(v))
            v[i] = mutate(rnd, v[i])
        elif v and op < 0.85:
            v.append(mutate(rnd, rnd.choice(v)))
        else:
            v.append(rnd.choice(ODD))
        return v
    return rnd.choice(ODD) if rnd.random() < 0.5 else v


def post(host, port, path, body):
    c = http.client.HTTPConnection(host, port, timeout=120)
    try:
        c.request('POST', path, body=body, headers={'Content-Type': 'application/json'})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--url', default='http://127.0.0.1:8080')
    ap.add_argument('--n', type=int, default=2000, help='requests to send')
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--max-tokens', type=int, default=8, help='cap on a mutated token limit')
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.url)
    host, port = u.hostname, u.port or 80
    rnd = random.Random(a.seed)
    seen, findings, t0 = Counter(), 0, time.time()
    # Unmutated, each base body should be answered 200. One the server
    # refuses for this model (e.g. a forced tool call where the chat template
    # shows no tool-call format) is not a finding, but its mutations then
    # mostly test that refusal, so say so; a 5xx or no answer is a finding.
    for key, b in BASE.items():
        path = key.split('#')[0]
        try:
            status, data = post(host, port, path, json.dumps(b).encode())
        except Exception as ex:
            status, data = 0, repr(ex).encode()
        if not 200 <= status < 500:
            findings += 1
            print(f"FINDING: base body {key} answered {status}: {data[:300]!r}")
        elif status != 200:
            print(f"note: base body {key} refused by this server ({status}): {data[:200]!r}")
    for i in range(a.n):
        key = rnd.choice(list(BASE))
        path, b = key.split('#')[0], BASE[key]  # "#...": another body for the same route
        for _ in range(rnd.randint(1, 4)):
            b = mutate(rnd, b)
        if isinstance(b, dict):
            if rnd.random() < 0.3:
                b["stream"] = True
            for k in ("max_tokens", "max_output_tokens"):  # keep generation short
                if isinstance(b.get(k), int) and b[k] > a.max_tokens:
                    b[k] = a.max_tokens
        body = json.dumps(b).encode()
        if rnd.random() < 0.05:
            body = body[:rnd.randrange(len(body) + 1)]
        try:
            status, data = post(host, port, path, body)
        except Exception as ex:  # a dropped connection: is the server still there?
            findings += 1
            print(f"FINDING: request {i} {path}: {ex!r}\n  body: {body[:500]!r}")
            try:
                c = http.client.HTTPConnection(host, port, timeout=10)
                c.request('GET', '/health')
                c.getresponse().read()
            except Exception:
                print("the server no longer answers: stopping")
                return 1
            continue
        seen[(path, status)] += 1
        if not 200 <= status < 500:
            findings += 1
            print(f"FINDING: request {i} {path}: status {status}\n  body: {body[:500]!r}\n"
                  f"  answer: {data[:300]!r}")
    for (path, status), n in sorted(seen.items()):
        print(f"  {path} {status}: {n}")
    print(f"fuzz_http: {a.n} requests in {time.time() - t0:.1f} s, {findings} findings")
    return 1 if findings else 0


if __name__ == '__main__':
    sys.exit(main())
