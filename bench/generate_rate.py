#!/usr/bin/env python3
"""moe generate's decode rate as a streaming client sees it, to read moe serve's concurrency-1 figure
(bench/serve_compare.py) against (issue 36): greedy tokens after a prompt of 8 ids (serve_compare.py's
prompt I), printed by `moe generate --prompt-ids` one id at a time (flushed each), stamped as they come
through a pipe. Token k is printed after the forward of token k, the last one without a forward: the rate
is the tokens from the first to the next to last over that time (a forward and a sample each), as
serve_compare.py's is the events' from the first to the last. Prints one JSON line.
usage: generate_rate.py MOE MODEL THREADS MAX_TOKENS [I]"""
import json
import os
import subprocess
import sys
import time

MOE, MODEL, THREADS, N = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
I = int(sys.argv[5]) if len(sys.argv) > 5 else 0
prompt = [1 + (I * 7919 + j * 104729) % 31000 for j in range(8)]  # serve_compare.py's prompt(I)
p = subprocess.Popen([MOE, "generate", "--checkpoint", MODEL, "--prompt-ids", " ".join(map(str, prompt)),
                      "--max-tokens", str(N), "--temperature", "0", "--ignore-eos", "--threads", THREADS],
                     stdout=subprocess.PIPE, bufsize=0)
stamps, seen, text = [], 0, b""
while True:
    b = os.read(p.stdout.fileno(), 65536)
    if not b:
        break
    t = time.perf_counter()
    text += b
    ids = len(text.split())  # complete or not: each id is flushed whole
    stamps += [t] * (ids - seen)
    seen = ids
if p.wait() != 0 or len(stamps) != N:
    sys.exit("generate_rate: moe generate exited %d with %d of %d tokens" % (p.returncode, len(stamps), N))
rate = (N - 2) / (stamps[N - 2] - stamps[0]) if N > 2 and stamps[N - 2] > stamps[0] else None
print(json.dumps({"program": "generate", "tokens": N, "decode_tokens_per_s": round(rate, 1) if rate else None,
                  "ids": [int(x) for x in text.split()]}))
