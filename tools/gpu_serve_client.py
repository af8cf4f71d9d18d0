#!/usr/bin/env python3
"""HTTP client of tools/gpu_serve.sh: drives a running `lily serve` (a full-size random-weight checkpoint on the
GPU) through the OpenAI-compatible API and prints what a client sees: decode speed from the server's `timings`
and from the stream's arrival times, prompt processing speed, logprobs, concurrency; then checks the paths a
request can end by (robustness(); exit status 1 when one fails). A smoke test and a measurement, not an oracle of
the model's output (the weights are random: the text is noise). Standard library only.

usage: gpu_serve_client.py BASE_URL  (environment: LILY_PROMPT_LENGTHS, LILY_GAP_PROMPT, LILY_CANCEL_PROMPT,
LILY_CLIENTS, LILY_CLIENTS_ONLY, LILY_QUICK: stop after the json_schema ratio; tools/gpu_serve.sh)
"""
import json
import os
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request

BASE = sys.argv[1].rstrip("/")


def post(path, body):
    req = urllib.request.Request(BASE + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise SystemExit("%s -> HTTP %d: %s" % (path, e.code, e.read().decode()[:500]))


def get(path):
    with urllib.request.urlopen(BASE + path, timeout=60) as r:
        return r.read().decode()


def wait_ready(limit_s=300):
    t0 = time.time()
    while time.time() - t0 < limit_s:
        try:
            get("/health")
            return time.time() - t0
        except Exception:
            time.sleep(0.2)
    raise SystemExit("server not ready after %d s" % limit_s)


def report(name, r):
    t = r["timings"]
    u = r["usage"]
    dec = t["predicted_n"] / (t["predicted_ms"] / 1e3) if t["predicted_ms"] > 0 else 0
    pre = t["prompt_n"] / (t["prompt_ms"] / 1e3) if t["prompt_ms"] > 0 else 0
    print("%-44s prompt %5d (cached %5d) %8.1f ms %8.1f tok/s | generated %4d %8.1f ms %7.1f tok/s | finish %s" %
          (name, u["prompt_tokens"], t["cache_n"], t["prompt_ms"], pre, t["predicted_n"], t["predicted_ms"], dec,
           r["choices"][0]["finish_reason"]))
    return dec


def chat(content, **kw):
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 256}
    body.update(kw)
    return post("/v1/chat/completions", body)


def stream(content, **kw):
    """Chunk arrival times of a streamed chat completion (one content/reasoning delta per token)."""
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 256, "stream": True,
            "stream_options": {"include_usage": True}}
    body.update(kw)
    req = urllib.request.Request(BASE + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    times, usage = [], None
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            if ev.get("choices") and ev["choices"][0].get("delta"):
                d = ev["choices"][0]["delta"]
                if d.get("content") or d.get("reasoning_content"):
                    times.append(time.time())
    return t0, times, usage


def content_delta(line):
    """Whether an SSE line carries generated text (the first chunk's role-only delta, content "", does not: counting it
    put the prompt's processing into the first gap between tokens)."""
    if not line.startswith(b"data: {"):
        return False
    ev = json.loads(line[6:])
    d = ev["choices"][0].get("delta", {}) if ev.get("choices") else {}
    return bool(d.get("content") or d.get("reasoning_content"))


def check(ok, what):
    print("%s %s" % ("ok  " if ok else "FAIL", what))
    if not ok:
        global failures
        failures += 1


failures = 0
# no reasoning block, and earlier turns rendered as generated: the next turn's prompt then starts with the
# tokens the server holds after a stop id (prompt, reply, <|im_end|>, newline)
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False, "preserve_thinking": True}}


def text(r):
    m = r["choices"][0]["message"]
    return (m.get("reasoning_content") or "") + (m.get("content") or "")


def robustness():
    """Paths the queued decode steps and the device-resident prefix cache change: seeded determinism, a stop id
    (its step ran ahead), a stop string and a dropped stream (the host ends the generation), tiny max_tokens, and
    the next turn after a stop id resuming from the snapshot taken after the turn tail."""
    for kw in ({"temperature": 0}, {"temperature": 0.8, "top_p": 0.95, "seed": 42},
               {"temperature": 1.0, "top_p": 0.95, "top_k": -1, "seed": 7}):  # top_k off: the full sampler path
        a, b = chat("Determinism check", max_tokens=96, **kw), chat("Determinism check", max_tokens=96, **kw)
        check(text(a) == text(b) and a["usage"]["completion_tokens"] == b["usage"]["completion_tokens"],
              "same output twice for %s" % json.dumps(kw))
    for n in (1, 2, 3):
        r = chat("Tiny", max_tokens=n, temperature=0)
        check(r["usage"]["completion_tokens"] == n and r["choices"][0]["finish_reason"] == "length",
              "max_tokens %d -> %d tokens, %s" % (n, r["usage"]["completion_tokens"], r["choices"][0]["finish_reason"]))
    # a stop id, then the next turn: greedy with logit_bias making the reply "Hello" then <|im_end|> (the weights
    # are random: only forced tokens give a reply whose text re-encodes to the same ids); the repetition penalty
    # halves both (<|im_end|> is in the prompt), so "Hello" (60 vs 80 / 2) comes first and once (30 vs 40)
    tok = lambda text: post("/tokenize", {"content": text})["tokens"]
    im_end, hello = tok("<|im_end|>")[-1], tok("Hello")[-1]
    q1 = "First question?"
    r1 = chat(q1, max_tokens=50, temperature=0, repetition_penalty=2.0,
              logit_bias={str(hello): 60.0, str(im_end): 80.0}, **NO_THINK)
    fin, reply = r1["choices"][0]["finish_reason"], r1["choices"][0]["message"].get("content") or ""
    check(fin == "stop" and reply == "Hello", "stop id sampled: finish %s, reply %r" % (fin, reply))
    first = post("/apply-template", dict({"messages": [{"role": "user", "content": q1}], "add_generation_prompt": True},
                                         **NO_THINK))["prompt"]
    held = len(tok(first)) + 3  # + Hello, <|im_end|> (consumed by its queued step), newline (the turn tail)
    second = {"messages": [{"role": "user", "content": q1}, {"role": "assistant", "content": reply},
                           {"role": "user", "content": "Second question?"}], "max_tokens": 32, "temperature": 0,
              "logprobs": True, "top_logprobs": 2}
    r2 = post("/v1/chat/completions", dict(second, **NO_THINK))
    c2, p2 = r2["usage"]["prompt_tokens_details"]["cached_tokens"], r2["usage"]["prompt_tokens"]
    check(c2 == held, "the next turn resumes after the turn tail: %d of %d prompt tokens cached (expected %d), "
          "prefill %.1f ms" % (c2, p2, held, r2["timings"]["prompt_ms"]))
    # the same request from scratch (an unrelated request in between replaces the resident KV, so no snapshot
    # applies) gives the same greedy reply only if the resumed state was right (the stop id consumed once)
    chat("Something unrelated", max_tokens=8, temperature=0)
    r3 = post("/v1/chat/completions", dict(second, **NO_THINK))
    # The two take different ways through the layers: the resumed turn's new tokens the decode step, the request
    # from scratch (from 16 tokens) the chunked prompt path, whose logits agree with the decode step's to ~1e-3
    # relative (0.03-0.06 in log-probability here, random weights). So the replies match token for token with
    # log-probabilities within 0.25 up to where they part, and they may part only at a near tie (each reply's token
    # the other's runner-up, top-2 gaps under 0.1); a wrong resumed state (the stop id consumed twice, say) is
    # another context altogether.
    lp2, lp3 = (r["choices"][0]["logprobs"]["content"] for r in (r2, r3))
    n_common = min(len(lp2), len(lp3))
    part = next((i for i in range(n_common) if lp2[i]["token"] != lp3[i]["token"]), None)
    upto = n_common if part is None else part
    worst = max([abs(lp2[i]["logprob"] - lp3[i]["logprob"]) for i in range(upto)] or [0.0])
    top2 = lambda lp: lp["top_logprobs"][:2] if len(lp["top_logprobs"]) >= 2 else None
    gap = lambda lp: top2(lp)[0]["logprob"] - top2(lp)[1]["logprob"] if top2(lp) else float("inf")
    # a near tie: the two replies' tokens there are each other's runner-up, both by a small margin
    runner_up = lambda lp: top2(lp)[1]["token"] if top2(lp) else None
    tie = (part is not None and runner_up(lp2[part]) == lp3[part]["token"] and
           runner_up(lp3[part]) == lp2[part]["token"] and max(gap(lp2[part]), gap(lp3[part])) < 0.1)
    check(worst < 0.25 and (text(r3) == text(r2) or tie),
          "the resumed turn equals the same request from scratch (cached %d): %s, log-probabilities within %.2g%s" %
          (r3["usage"]["prompt_tokens_details"]["cached_tokens"],
           "the same reply" if text(r3) == text(r2) else "parting at token %s" % part, worst,
           ", a near tie there (top-2 gaps %.3g / %.3g)" % (gap(lp2[part]), gap(lp3[part]))
           if part is not None else ""))
    # a stop string: the host ends the generation (its queued step is drained)
    r = chat("Stop string", max_tokens=300, temperature=0.9, seed=3, stop=["e"], **NO_THINK)
    check(r["choices"][0]["finish_reason"] == "stop" and "e" not in (r["choices"][0]["message"]["content"] or ""),
          "stop string: finish %s after %d tokens" % (r["choices"][0]["finish_reason"],
                                                     r["usage"]["completion_tokens"]))
    # a stream dropped after a few chunks: the server cancels it; the next request is served normally
    body = {"messages": [{"role": "user", "content": "Long story"}], "max_tokens": 2000, "stream": True,
            "temperature": 0}
    req = urllib.request.Request(BASE + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    resp = urllib.request.urlopen(req, timeout=60)
    for _ in range(5):
        resp.readline()
    resp.close()
    t0 = time.time()
    r = chat("After a dropped stream", max_tokens=32, temperature=0)
    check(r["usage"]["completion_tokens"] == 32, "served after a dropped stream (%.0f ms)" % ((time.time() - t0) * 1e3))
    a = chat("Determinism check", max_tokens=96, temperature=0)
    b = chat("Determinism check", max_tokens=96, temperature=0)
    check(text(a) == text(b), "greedy still deterministic after all that")


def prompt_times(lengths):
    """Fresh prompts of `lengths` tokens (random ids: nothing cached) through /v1/completions, 1 token each:
    timings.prompt_ms as the client receives it, twice per length (the second after the first has warmed up)."""
    import random
    rng = random.Random(7)
    for n in lengths:
        ms = []
        for _ in range(2):
            ids = [rng.randrange(1000, 150000) for _ in range(n)]
            r = post("/v1/completions", {"prompt": ids, "max_tokens": 1, "temperature": 0})
            ms.append(r["timings"]["prompt_ms"])
        print("prompt of %6d tokens: prompt_ms %8.1f / %8.1f (%.0f tok/s), cached %d" %
              (n, ms[0], ms[1], n / (ms[1] / 1e3), r["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)))


def gap_during_prompt(n):
    """Issue 29's gap: a streaming client decodes while a fresh n-token prompt arrives; the longest wait between two
    of its deltas while that prompt is processed, and the prompt's own prompt_ms."""
    import random
    rng = random.Random(11)
    times, box = [], {}

    def streamer():
        body = {"messages": [{"role": "user", "content": "tell me about the sea " * 10}], "max_tokens": 1024,
                "stream": True, "logit_bias": {"151643": -100, "151645": -100},
                "chat_template_kwargs": {"enable_thinking": False}}
        req = urllib.request.Request(BASE + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as resp:
            for line in resp:
                if content_delta(line):
                    times.append(time.time())
                if "done" in box:
                    break

    th = threading.Thread(target=streamer)
    th.start()
    while len(times) < 20:
        time.sleep(0.01)
    t0 = time.time()
    r = post("/v1/completions", {"prompt": [rng.randrange(1000, 150000) for _ in range(n)], "max_tokens": 1,
                                 "temperature": 0})
    t1 = time.time()
    box["done"] = True
    th.join()
    during = [b - a for a, b in zip(times, times[1:]) if b > t0 and a < t1]
    print("gap while a %d-token prompt is processed: worst %.1f ms over %d deltas (prompt_ms %.1f, request %.1f ms)" %
          (n, max(during or [0]) * 1e3, len(during), r["timings"]["prompt_ms"], (t1 - t0) * 1e3))


def running():
    for line in get("/metrics").splitlines():
        if line.startswith("lily_requests_running "):
            return float(line.split()[1])
    return -1


def cancel_during_prompt(n):
    """Issue 28: a streamed request with a fresh n-token prompt is dropped by its client while the prompt is
    processed; how long until the server has stopped it (lily_requests_running back to 0, polled every ~2 ms), and
    how long /health and /metrics take meanwhile."""
    import http.client
    import random
    import urllib.parse
    rng = random.Random(13)
    u = urllib.parse.urlparse(BASE)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = json.dumps({"prompt": [rng.randrange(1000, 150000) for _ in range(n)], "max_tokens": 1, "stream": True})
    t_sent = time.time()
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    while running() < 1 and time.time() - t_sent < 30:
        time.sleep(0.002)
    health, metrics = [], []
    t_run = time.time()
    while time.time() - t_run < 0.15:  # into the prompt, probing the other endpoints
        t = time.time()
        get("/health")
        health.append(time.time() - t)
        t = time.time()
        running()
        metrics.append(time.time() - t)
    t_close = time.time()
    conn.sock.shutdown(2)
    conn.close()
    while running() > 0 and time.time() - t_close < 30:
        time.sleep(0.002)
    t_stop = time.time()
    print("cancel while a %d-token prompt is processed: stopped %.1f ms after the client closed (%.0f ms into the "
          "request); during it /health %.1f ms median, %.1f max, /metrics %.1f / %.1f ms (%d probes)" %
          (n, (t_stop - t_close) * 1e3, (t_close - t_sent) * 1e3, statistics.median(health) * 1e3,
           max(health) * 1e3, statistics.median(metrics) * 1e3, max(metrics) * 1e3, len(health)))


def concurrency(levels):
    """Issue 29's table: C clients at once, each a ~100-token prompt and 256 generated tokens (end-of-text ids
    biased away), chat defaults without thinking; total tok/s = all completion tokens / wall time, per-stream =
    median of each stream's tokens / (last delta - first delta)."""
    no_eos = {"151643": -100, "151645": -100}
    for c in levels:
        res = [None] * c

        def client(i):
            body = {"messages": [{"role": "user", "content": ("Client %d: " % i) + "tell me about the sea " * 18}],
                    "max_tokens": 256, "stream": True, "logit_bias": no_eos,
                    "chat_template_kwargs": {"enable_thinking": False}}
            req = urllib.request.Request(BASE + "/v1/chat/completions", data=json.dumps(body).encode(),
                                         method="POST", headers={"Content-Type": "application/json"})
            times = []
            with urllib.request.urlopen(req, timeout=600) as resp:
                for line in resp:
                    if content_delta(line):
                        times.append(time.time())
            res[i] = times

        t0 = time.time()
        th = [threading.Thread(target=client, args=(i,)) for i in range(c)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        wall = time.time() - t0
        total = sum(len(r) for r in res)
        rates = [(len(r) - 1) / (r[-1] - r[0]) for r in res if len(r) > 1 and r[-1] > r[0]]
        gaps = [b - a for r in res for a, b in zip(r, r[1:])]
        print("%3d clients: total %7.1f tok/s, per stream %6.1f tok/s (median), TTFT median %6.1f ms, worst gap "
              "%6.1f ms" % (c, total / wall, statistics.median(rates) if rates else 0,
                            statistics.median([r[0] - t0 for r in res if r]) * 1e3, max(gaps or [0]) * 1e3))


def schema_ratio():
    """Issue 30: decode tok/s of chat-default requests with and without a json_schema, alternating, 3 each."""
    schema = {"type": "json_schema", "json_schema": {"name": "poem", "schema": {
        "type": "object", "properties": {"title": {"type": "string"}, "lines": {"type": "array", "items": {
            "type": "string"}}}, "required": ["title", "lines"]}}}
    free, constrained = [], []
    for i in range(3):
        free.append(report("chat defaults (server's sampling)", chat("Write a poem about the sea %d." % i)))
        constrained.append(report("chat defaults + json_schema", chat("Write a poem about the sea %d as JSON." % i,
                                                                      response_format=schema)))
    print("json_schema decode: %.1f %% of the unconstrained tok/s (medians %.1f / %.1f)" %
          (100 * statistics.median(constrained) / statistics.median(free), statistics.median(constrained),
           statistics.median(free)))


def main():
    print("ready after %.1f s (load + warm-up)" % wait_ready())
    lengths = [int(x) for x in os.environ.get("LILY_PROMPT_LENGTHS", "").split(",") if x]
    if lengths:
        prompt_times(lengths)
    if os.environ.get("LILY_GAP_PROMPT"):
        gap_during_prompt(int(os.environ["LILY_GAP_PROMPT"]))
    if os.environ.get("LILY_CANCEL_PROMPT"):
        cancel_during_prompt(int(os.environ["LILY_CANCEL_PROMPT"]))
    levels = [int(x) for x in os.environ.get("LILY_CLIENTS", "").split(",") if x]
    if levels:
        concurrency(levels)
        if os.environ.get("LILY_CLIENTS_ONLY"):
            return
    model = json.loads(get("/v1/models"))["data"][0]
    print(json.dumps(model))
    reps = max(10, min(270, (model["max_model_len"] - 800) // 15))  # ~15 tokens each: a ~4K-token prompt
    chat("warm up", max_tokens=16, temperature=0)
    report("greedy, short prompt", chat("Hello", temperature=0))
    report("greedy again (prefix cache)", chat("Hello", temperature=0))
    schema_ratio()
    if os.environ.get("LILY_QUICK"):
        return
    r = chat("Hi", logprobs=True, top_logprobs=5, max_tokens=64)
    lp = r["choices"][0]["logprobs"]["content"]
    if lp:
        print("logprobs: %d entries, first token %r logprob %.4f, top %d" %
              (len(lp), lp[0]["token"], lp[0]["logprob"], len(lp[0]["top_logprobs"])))
    else:  # random weights: all 64 ids can be reasoning, which carries no logprobs
        print("logprobs: no content tokens (reasoning only: %r...)" % text(r)[:40])
    report("chat defaults + logprobs + top_logprobs 5", chat("Hi again", logprobs=True, top_logprobs=5))
    report("top-p 0.95 alone (top_k -1, T 1)", chat("Write a poem about the sea.", top_k=-1, top_p=0.95,
                                                    temperature=1.0))
    long_text = " ".join("The quick brown fox number %d jumps over the lazy dog." % i for i in range(reps))
    report("long prompt, greedy", chat(long_text, temperature=0, max_tokens=128))
    report("same prompt + one more turn (prefix cache)", post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": long_text}, {"role": "assistant", "content": "ok"},
                     {"role": "user", "content": "Summarise."}], "max_tokens": 128, "temperature": 0}))

    t0, times, usage = stream("Tell me a story.", temperature=0)
    gaps = [b - a for a, b in zip(times, times[1:])]
    print("stream: %d deltas, first after %.1f ms, median gap %.3f ms, mean %.3f ms (%.1f tok/s as the client sees "
          "it), usage %s" % (len(times), (times[0] - t0) * 1e3, statistics.median(gaps) * 1e3,
                             statistics.mean(gaps) * 1e3, 1 / statistics.mean(gaps), json.dumps(usage)))

    results = [None] * 4

    def worker(i):
        results[i] = chat("Concurrent request %d" % i, temperature=0, max_tokens=64)

    t0 = time.time()
    th = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    print("4 concurrent requests: all completed in %.2f s, completion tokens %s" %
          (time.time() - t0, [r["usage"]["completion_tokens"] for r in results]))
    robustness()
    r = post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 64, "temperature": 0})
    print("/v1/completions: %d tokens, finish %s" % (r["usage"]["completion_tokens"], r["choices"][0]["finish_reason"]))
    print("robustness checks failed: %d" % failures)
    for line in get("/metrics").splitlines():
        if line.startswith("lily_") and ("_sum " in line or "_count " in line or "requests_total" in line):
            print(line)


if __name__ == "__main__":
    main()
    sys.exit(1 if failures else 0)
