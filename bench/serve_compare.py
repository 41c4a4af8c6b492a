#!/usr/bin/env python3
"""One load run against an OpenAI-style completions server (bench/vs_llama_server.sh): R requests, C at a
time, each a distinct prompt of 8 token ids and MAX_TOKENS greedy tokens streamed (ignore_eos, so every
request is MAX_TOKENS long), over raw HTTP/1.1 on asyncio streams. Prints one JSON line: tokens/s over
the run's wall time, time to first token (p50, p95) and request latency (p50, p95) in ms, and the
decode rate of the requests after their first token (tokens/s per request, median: the MAX_TOKENS - 1
tokens after the first over the time from the first event with text to the last, whether a server
sends a token an event or, when the client lags, several).
usage: serve_compare.py PORT KIND C R MAX_TOKENS   (KIND: moe or llama, for the body's extra fields)
       serve_compare.py PORT KIND --texts N MAX_TOKENS: the texts of N greedy requests, one JSON list"""
import asyncio
import json
import sys
import time

PORT, KIND = int(sys.argv[1]), sys.argv[2]


def prompt(i):
    return [1 + (i * 7919 + j * 104729) % 31000 for j in range(8)]  # distinct: no prompt cache helps


def body(i, max_tokens, stream):
    b = {"prompt": prompt(i), "max_tokens": max_tokens, "temperature": 0, "stream": stream, "ignore_eos": True}
    if KIND == "llama":
        b["cache_prompt"] = False
    return json.dumps(b)


async def post(i, max_tokens, stream):
    """(t0, times of the events with text, the whole text)"""
    data = body(i, max_tokens, stream)
    t0 = time.perf_counter()
    r, w = await asyncio.open_connection("127.0.0.1", PORT)
    w.write(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
             "Content-Length: %d\r\n\r\n%s" % (len(data), data)).encode())
    await w.drain()
    times, text, raw = [], [], b""
    while True:
        line = await r.readline()
        if not line:
            break
        if stream and line.startswith(b"data: {"):
            t = json.loads(line[6:])["choices"][0].get("text", "")
            if t:
                times.append(time.perf_counter())
                text.append(t)
        raw += line
    w.close()
    if not stream:
        text = [json.loads(raw[raw.index(b"\r\n\r\n") + 4:])["choices"][0]["text"]]
    return t0, times, "".join(text)


def pct(v, q):
    v = sorted(v)
    return round(1000 * v[min(len(v) - 1, int(q * len(v)))], 1) if v else None


async def load(c, n, max_tokens):
    queue = list(range(n))
    ttft, lat, rate = [], [], []

    async def client():
        while queue:
            t0, times, _ = await post(queue.pop(0), max_tokens, True)
            end = time.perf_counter()
            if times:
                ttft.append(times[0] - t0)
                if len(times) > 1:  # every request is max_tokens long (ignore_eos): an event may carry more than one
                    rate.append((max_tokens - 1) / (times[-1] - times[0]))
            lat.append(end - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(c)))
    wall = time.perf_counter() - t0
    rate.sort()
    print(json.dumps({"server": KIND, "concurrency": c, "requests": n, "tokens_per_s": round(n * max_tokens / wall, 1),
                      "ttft_p50_ms": pct(ttft, 0.5), "ttft_p95_ms": pct(ttft, 0.95), "latency_p50_ms": pct(lat, 0.5),
                      "latency_p95_ms": pct(lat, 0.95),
                      "decode_tokens_per_s_per_request": round(rate[len(rate) // 2], 1) if rate else None}))


async def texts(n, max_tokens):
    out = [(await post(i, max_tokens, False))[2] for i in range(n)]
    print(json.dumps(out))


if sys.argv[3] == "--texts":
    asyncio.run(texts(int(sys.argv[4]), int(sys.argv[5])))
else:
    asyncio.run(load(int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])))
