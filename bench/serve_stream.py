#!/usr/bin/env python3
"""Streaming load for moe serve (bench/serve_load.sh): C clients, each sending streamed completions
one after another for SECONDS over asyncio streams (raw HTTP/1.0, server-sent events), measuring time to
first token and the time per token after it. Prints one JSON line: tokens/s, p50/p99 TTFT and per-token
latency (ms), requests. usage: serve_stream.py PORT C SECONDS MAX_TOKENS"""
import asyncio
import json
import sys
import time

PORT, C, SECONDS, MAX_TOKENS = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])


async def one(i, ttft, per_token, counts):
    body = json.dumps({"prompt": [1 + i % 50, 7, 3], "max_tokens": MAX_TOKENS, "temperature": 1.0,
                       "seed": i, "stream": True, "ignore_eos": True})  # a fixed load: no end of text
    t0 = time.perf_counter()
    r, w = await asyncio.open_connection("127.0.0.1", PORT)
    w.write(("POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
             % (len(body), body)).encode())
    await w.drain()
    first, last, n = None, None, 0
    while True:
        line = await r.readline()
        if not line:
            break
        if not line.startswith(b"data: {"):
            continue
        now = time.perf_counter()
        k = len(json.loads(line[6:])["choices"][0]["token_ids"])
        if first is None:
            first = now
            ttft.append(now - t0)
        elif k:
            per_token.append((now - last) / k)
        last, n = now, n + k
    w.close()
    counts.append(n)


async def client(i, end, ttft, per_token, counts):
    j = 0
    while time.perf_counter() < end:
        await one(i * 100000 + j, ttft, per_token, counts)
        j += 1


def pct(v, q):
    v = sorted(v)
    return 1000 * v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


async def main():
    ttft, per_token, counts = [], [], []
    t0 = time.perf_counter()
    await asyncio.gather(*(client(i, t0 + SECONDS, ttft, per_token, counts) for i in range(C)))
    wall = time.perf_counter() - t0
    print(json.dumps({"concurrency": C, "requests": len(counts), "tokens_per_s": round(sum(counts) / wall, 1),
                      "ttft_p50_ms": round(pct(ttft, 0.5), 1), "ttft_p99_ms": round(pct(ttft, 0.99), 1),
                      "token_p50_ms": round(pct(per_token, 0.5), 2), "token_p99_ms": round(pct(per_token, 0.99), 2)}))


asyncio.run(main())
