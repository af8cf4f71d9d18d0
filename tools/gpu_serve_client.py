#!/usr/bin/env python3
"""HTTP client of tools/gpu_serve.sh: drives a running `lily serve` (a full-size random-weight checkpoint on the
GPU) through the OpenAI-compatible API and prints what a client sees: decode speed from the server's `timings`
and from the stream's arrival times, prompt processing speed, logprobs, concurrency. A smoke test and a
measurement, not a correctness oracle (the weights are random: the text is noise). Standard library only.

usage: gpu_serve_client.py BASE_URL
"""
import json
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


def main():
    print("ready after %.1f s (load + warm-up)" % wait_ready())
    model = json.loads(get("/v1/models"))["data"][0]
    print(json.dumps(model))
    reps = max(10, min(270, (model["max_model_len"] - 800) // 15))  # ~15 tokens each: a ~4K-token prompt
    chat("warm up", max_tokens=16, temperature=0)
    report("greedy, short prompt", chat("Hello", temperature=0))
    report("greedy again (prefix cache)", chat("Hello", temperature=0))
    report("chat defaults (server's sampling)", chat("Write a poem about the sea."))
    r = chat("Hi", logprobs=True, top_logprobs=5, max_tokens=64)
    lp = r["choices"][0]["logprobs"]["content"]
    print("logprobs: %d entries, first token %r logprob %.4f, top %d" %
          (len(lp), lp[0]["token"], lp[0]["logprob"], len(lp[0]["top_logprobs"])))
    report("chat defaults + logprobs + top_logprobs 5", chat("Hi again", logprobs=True, top_logprobs=5))
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
    r = post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 64, "temperature": 0})
    print("/v1/completions: %d tokens, finish %s" % (r["usage"]["completion_tokens"], r["choices"][0]["finish_reason"]))
    for line in get("/metrics").splitlines():
        if line.startswith("lily_") and ("_sum " in line or "_count " in line or "requests_total" in line):
            print(line)


if __name__ == "__main__":
    main()
