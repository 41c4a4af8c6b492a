"""moe serve's tests as a real HTTP client (http.client and raw sockets): starts `MOE serve --checkpoint
CK --port 0 EXTRA...`, reads the port it prints, runs one scenario and stops it with SIGTERM, checking
that it exits 0. Prints what differs and exits 1 on a failure.
usage: serve_client.py MOE CK SCENARIO [EXTRA...]; scenarios: match, ids (token-id prompts only), busy, bad, sigterm, full (EXTRA
--max-connections 4 --timeout 2), drain (EXTRA --timeout 2), eos (on a copy of CK whose end of text is a
token greedy decoding reaches), stop, metrics, chat (on a copy of CK with a chat template), loading (the
server held mid-load), pieces (CK with Llama 2's SentencePiece tokenizer), expert_bytes (every expert
resident: /metrics' expert bytes are $MOE_WANT_EXPERT_BYTES)."""
import fcntl
import http.client
import json
import os
import shutil
import resource
import signal
import socket
import subprocess
import sys
import threading
import time

MOE, CK, SCENARIO, EXTRA = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def start(ck):
    p = subprocess.Popen([MOE, "serve", "--checkpoint", ck, "--port", "0", "--max-batch", "8",
                          "--threads", "1"] + EXTRA,
                         stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()  # printed once it listens
    if "listening on http://" not in line:
        sys.exit("the server did not start: %r (exit %s)" % (line, p.wait()))
    return p, int(line.rsplit(":", 1)[1])


def request(port, method, path, body=None, raw=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    data = raw if raw is not None else (json.dumps(body) if body is not None else None)
    c.request(method, path, body=data, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    out = r.status, r.getheader("Content-Type"), r.read().decode("utf-8")
    c.close()
    return out


def complete(port, body, finish=None):
    """(ids, text) of a completion; streamed: the events' token_ids and text joined. With finish: checks
    that the (last) choice's finish_reason is it, and streamed that the others' are null."""
    status, ctype, text = request(port, "POST", "/v1/completions", body)
    check(status == 200, "%s -> %d %s" % (body, status, text))
    if status != 200:
        return None, None
    if not body.get("stream"):
        ch = json.loads(text)["choices"][0]
        check(finish is None or ch["finish_reason"] == finish, "%s: finish_reason %s, want %s" % (body, ch["finish_reason"], finish))
        return ch["token_ids"], ch["text"]
    check(ctype == "text/event-stream", "stream content type %s" % ctype)
    events = [e[len("data: "):] for e in text.split("\n\n") if e]
    check(events[-1] == "[DONE]", "the stream ends with %r" % events[-1:])
    ids, out = [], ""
    for i, e in enumerate(events[:-1]):
        ch = json.loads(e)["choices"][0]
        ids += ch["token_ids"]
        out += ch["text"]
        want = finish if i == len(events) - 2 else None
        check(finish is None or ch["finish_reason"] == want, "%s: event %d finish_reason %s, want %s" % (body, i, ch["finish_reason"], want))
    return ids, out


def generate(body, ck=CK):
    """moe generate --json with the request's prompt and parameters."""
    p = body["prompt"]
    args = [MOE, "generate", "--checkpoint", ck, "--json", "--threads", "1", "--max-tokens", str(body["max_tokens"])]
    args += ["--prompt", p] if isinstance(p, str) else ["--prompt-ids", " ".join(map(str, p))]
    args += ["--ignore-eos"] if body.get("ignore_eos") else []
    for k, flag in (("temperature", "--temperature"), ("top_p", "--top-p"), ("seed", "--seed")):
        if k in body:
            args += [flag, str(body[k])]
    return json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)


REQUESTS = [
    {"prompt": "the cat sat", "max_tokens": 12, "temperature": 0.8, "top_p": 0.9, "seed": 3},
    {"prompt": "experts route", "max_tokens": 20, "temperature": 0},
    {"prompt": [5, 9, 1, 200], "max_tokens": 16, "temperature": 1.3, "seed": 11},
    {"prompt": "a", "max_tokens": 1, "temperature": 1.0, "top_p": 0.5, "seed": 2},
]


def match(port):
    for body in REQUESTS:
        want = generate(body)
        for stream in (False, True):
            ids, text = complete(port, dict(body, stream=stream))
            check(ids == want["ids"], "%s stream=%s: ids %s, moe generate %s" % (body, stream, ids, want["ids"]))
            if "text" in want:
                check(text == want["text"], "%s stream=%s: text %r, moe generate %r" % (body, stream, text, want["text"]))
    if "--cache" in EXTRA:  # one expert of four resident: a quarter of the bytes, some misses
        m = dict(l.rsplit(" ", 1) for l in request(port, "GET", "/metrics")[2].splitlines() if not l.startswith("#"))
        resident, every = int(m["moe_serve_resident_expert_bytes"]), int(m["moe_serve_all_expert_bytes"])
        check(4 * resident == every, "resident expert bytes %d of %d" % (resident, every))
        check(0 <= float(m['moe_serve_expert_cache_hit_rate{layer="1"}']) < 1, "hit rate %s" % m)
    if "--pin-from" in EXTRA:  # --pin 1: one pinned expert a layer, where it has a slot for the others too
        m = dict(l.rsplit(" ", 1) for l in request(port, "GET", "/metrics")[2].splitlines() if not l.startswith("#"))
        slots = [int(m['moe_serve_expert_cache_slots{layer="%d"}' % i]) for i in (0, 1)]
        pinned = [int(m['moe_serve_expert_cache_pinned{layer="%d"}' % i]) for i in (0, 1)]
        check(sum(slots) == 4 and pinned == [min(1, k - 1) for k in slots], "slots %s, pinned %s" % (slots, pinned))


def ids(port):
    """Token-id prompts only (a checkpoint without a tokenizer: the fixtures of every family), greedy and
    sampled, against moe generate without EXTRA (every expert resident)."""
    for body in ({"prompt": [1, 2, 3], "max_tokens": 10, "temperature": 0},
                 {"prompt": [5, 9, 1, 7], "max_tokens": 8, "temperature": 1.1, "seed": 4}):
        want = generate(body)
        for stream in (False, True):
            got, _ = complete(port, dict(body, stream=stream))
            check(got == want["ids"], "%s stream=%s: ids %s, moe generate %s" % (body, stream, got, want["ids"]))
    if "--cache" in EXTRA:  # fewer expert bytes resident than the whole model's, and some misses
        m = dict(l.rsplit(" ", 1) for l in request(port, "GET", "/metrics")[2].splitlines() if not l.startswith("#"))
        resident, every = int(m["moe_serve_resident_expert_bytes"]), int(m["moe_serve_all_expert_bytes"])
        check(0 < resident < every, "resident expert bytes %d of %d" % (resident, every))


def busy(port):
    greedy = [{"prompt": [i, 7, 3 * i], "max_tokens": 24, "temperature": 0} for i in range(1, 5)]
    alone = [complete(port, b)[0] for b in greedy]
    results = {}

    def run(k, b):
        results[k] = complete(port, b)[0]
    # the same greedy requests among 24 sampled ones, all at once, streamed and not
    jobs = [(("g", i), dict(b, stream=i % 2 == 1)) for i, b in enumerate(greedy)]
    jobs += [(("s", i), {"prompt": [i + 1], "max_tokens": 30, "seed": i, "stream": i % 3 == 0}) for i in range(24)]
    threads = [threading.Thread(target=run, args=j) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(len(greedy)):
        check(results[("g", i)] == alone[i], "greedy %d: %s in the busy batch, %s alone" % (i, results[("g", i)], alone[i]))
    metrics = request(port, "GET", "/metrics")[2]
    steps = [l for l in metrics.splitlines() if l.startswith("moe_serve_batch_size_bucket")]
    print("decode steps by batch size:", steps, file=sys.stderr)


def bad(port):
    cases = [
        ("{", 400, "not valid JSON"),
        ("[1, 2]", 400, "JSON object"),
        ('{"max_tokens": 3}', 400, '"prompt" is required'),
        ('{"prompt": 5}', 400, '"prompt" must be'),
        ('{"prompt": []}', 400, "empty"),
        ('{"prompt": [1, 100000]}', 400, '"prompt"[1] is not a token id'),
        ('{"prompt": [1.5]}', 400, "not a token id"),
        ('{"prompt": "hi", "max_tokens": 0}', 400, '"max_tokens" must be in [1'),
        ('{"prompt": "hi", "max_tokens": 1e12}', 400, '"max_tokens" must be in [1'),
        ('{"prompt": "hi", "max_tokens": "3"}', 400, '"max_tokens" must be a number'),
        ('{"prompt": "hi", "temperature": -1}', 400, '"temperature"'),
        ('{"prompt": "hi", "top_p": 0}', 400, '"top_p"'),
        ('{"prompt": "hi", "top_p": 5e-324}', 400, '"top_p"'),  # > 0 as a double, 0 as the engine's float
        ('{"prompt": "hi", "top_p": 5e-324, "stream": true}', 400, '"top_p"'),
        ('{"prompt": "hi", "seed": -2}', 400, '"seed"'),
        ('{"prompt": "hi", "stream": "yes"}', 400, '"stream" must be true or false'),
        (json.dumps({"prompt": "the cat " * 200}), 400, "exceed the model's context"),
        (json.dumps({"prompt": [1] * 60, "max_tokens": 10}), 400, "exceed the model's context"),
        ("x" * (1 << 21), 413, "larger than 1 MiB"),
        # OpenAI's fields the server does not implement: refused by name and value unless turned off
        ('{"prompt": "hi", "n": 2}', 400, '"n" 2 is not implemented by this server (only 1)'),
        ('{"prompt": "hi", "best_of": 3}', 400, '"best_of" 3 is not implemented'),
        ('{"prompt": "hi", "logprobs": 6}', 400, '"logprobs" must be in [0, 5]'),
        ('{"prompt": "hi", "echo": 1}', 400, '"echo" must be true or false'),
        ('{"prompt": "hi", "max_tokens": 0}', 400, '"max_tokens" must be in [1'),
        ('{"prompt": "hi", "suffix": "end"}', 400, '"suffix" "end" is not implemented'),
        ('{"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}', 400, '"stop" must be a string or an array of at most 4'),
        ('{"prompt": "hi", "stop": 5}', 400, '"stop" must be a string or an array'),
        ('{"prompt": "hi", "stop": ""}', 400, '"stop"[0] must be a string of 1 to 256 bytes'),
        ('{"prompt": "hi", "stop": ["a", 5]}', 400, '"stop"[1] must be a string of 1 to 256 bytes'),
        (json.dumps({"prompt": "hi", "stop": ["a", "x" * 257]}), 400, '"stop"[1] must be a string of 1 to 256 bytes'),
        ('{"prompt": "hi", "logit_bias": {"5": 100}}', 400, '"logit_bias" {"5":100} is not implemented'),
        ('{"prompt": "hi", "presence_penalty": 0.5}', 400, '"presence_penalty" 0.5 is not implemented'),
        ('{"prompt": "hi", "frequency_penalty": -1}', 400, '"frequency_penalty" -1 is not implemented'),
        ('{"prompt": "hi", "stream_options": {"include_usage": true}}', 400, 'unknown field "stream_options"'),
        ('{"prompt": "hi", "temprature": 0}', 400, 'unknown field "temprature"'),
        ('{"prompt": "hi", "ignore_eos": 1}', 400, '"ignore_eos" must be true or false'),
        ('{"prompt": "hi", "user": 5}', 400, '"user" must be a string'),
        (json.dumps({"prompt": "hi", "max_tokens": 2, "model": "moe", "user": "u1", "n": 1, "best_of": 1,
                     "logprobs": None, "echo": False, "suffix": None, "stop": [], "logit_bias": {},
                     "presence_penalty": 0, "frequency_penalty": 0.0, "ignore_eos": False}), 200, None),
        ('{"prompt": "The\\u0000 jury said more words"}', 400, "\\u0000"),  # cJSON's strings end at the NUL
    ]
    for raw, want, msg in cases:
        status, ctype, text = request(port, "POST", "/v1/completions", raw=raw)
        check(status == want, "%.60r -> %d, want %d: %s" % (raw, status, want, text))
        if want != 200:
            check(ctype == "application/json" and msg in json.loads(text)["error"]["message"],
                  "%.60r: the error %s (%s) does not say %r" % (raw, text, ctype, msg))
    status, _, text = request(port, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    check(status == 400 and "tokenizer_config.json" in text, "chat without a template -> %d %s" % (status, text))
    for method, path, want in (("GET", "/v1/completions", 405), ("POST", "/health", 405), ("GET", "/nope", 404),
                               ("GET", "/v1/chat/completions", 405), ("POST", "/v1/models", 405)):
        status, _, text = request(port, method, path)
        check(status == want and "error" in json.loads(text), "%s %s -> %d %s" % (method, path, status, text))
    # a client that leaves mid-stream: the server goes on serving the others
    for _ in range(3):
        s = raw_post(port, json.dumps({"prompt": [1, 2], "max_tokens": 60, "stream": True}))
        head = read_all(s, b"data: ")
        check(head.split(b" ")[1] == b"200", "a stream that its client leaves: %r" % head[:60])
        s.close()
    # 1,000 connections open at once, each then asking for /health
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    socks = [socket.create_connection(("127.0.0.1", port), timeout=300) for _ in range(1000)]
    for s in socks:
        s.sendall(b"GET /health HTTP/1.0\r\n\r\n")
    ok = 0
    for s in socks:
        data = b""
        while True:
            k = s.recv(4096)
            if not k:
                break
            data += k
        ok += data.startswith(b"HTTP/1.0 200") or data.startswith(b"HTTP/1.1 200")
        s.close()
    check(ok == 1000, "1,000 connections at once: %d answered 200" % ok)
    ids, _ = complete(port, {"prompt": [3], "max_tokens": 5})
    check(ids is not None and len(ids) == 5, "a completion after the bad requests: %s" % ids)
    # the clients that left are dropped: nothing stays running
    for _ in range(10000):
        m = request(port, "GET", "/metrics")[2]
        if "moe_serve_running 0" in m and "moe_serve_queue_length 0" in m:
            break
    check("moe_serve_running 0" in m, "requests still running after their clients left")
    check('moe_serve_requests_total{code="4xx"} ' in m, "the metrics count the 4xx")


def raw_post(port, body, send=None):
    """A socket with a POST /v1/completions sent over HTTP/1.0 (the body ends with the connection); only
    the first `send` bytes of the body when given."""
    s = socket.create_connection(("127.0.0.1", port), timeout=300)
    head = "POST /v1/completions HTTP/1.0\r\nContent-Length: %d\r\n\r\n" % len(body)
    s.sendall((head + body[:send]).encode())
    return s


def read_all(s, until=None):
    data = b""
    while until is None or until not in data:
        k = s.recv(65536)
        if not k:
            break
        data += k
    return data


def sigterm(port, p):
    s1 = raw_post(port, json.dumps({"prompt": [4, 4], "max_tokens": 50, "stream": True}))
    first = read_all(s1, b"\n\n{")  # the first event: the stream is under way
    first += read_all(s1, b"\n\n") if not first.endswith(b"\n\n") else b""
    c2 = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    c2.request("POST", "/v1/completions", body=json.dumps({"prompt": [9], "max_tokens": 40}))
    for _ in range(100000):  # until the engine has it
        if "moe_serve_admitted_total 2" in request(port, "GET", "/metrics")[2]:
            break
    half = json.dumps({"prompt": [1], "max_tokens": 2})
    s3 = socket.create_connection(("127.0.0.1", port), timeout=300)  # a request whose body has not all come
    s3.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nExpect: 100-continue\r\n"
                "Content-Length: %d\r\n\r\n" % len(half)).encode())
    cont = read_all(s3, b"\r\n\r\n")  # 100 Continue: its handler runs, so the server waits for it
    check(b" 100 " in cont, "Expect: 100-continue -> %r" % cont)
    s3.sendall(half[:5].encode())
    p.send_signal(signal.SIGTERM)
    for _ in range(100000):  # /health says 503 once SIGTERM is taken
        status, _, text = request(port, "GET", "/health")
        if status != 200:
            break
    check(status == 503 and json.loads(text)["status"] == "draining", "/health after SIGTERM: %d %s" % (status, text))
    status, _, text = request(port, "POST", "/v1/completions", {"prompt": [1], "max_tokens": 2})
    check(status == 503 and "shutting down" in text, "a request after SIGTERM -> %d %s" % (status, text))
    s3.sendall(half[5:].encode())
    reply = read_all(s3)
    check(reply.split(b" ")[1:2] == [b"503"], "a body completed after SIGTERM: %r" % reply[:80])
    rest = read_all(s1)
    body = (first + rest).split(b"\r\n\r\n", 1)[1]
    events = [e[len(b"data: "):] for e in body.split(b"\n\n") if e]
    ids = sum((json.loads(e)["choices"][0]["token_ids"] for e in events[:-1]), [])
    check(events[-1] == b"[DONE]" and len(ids) == 50, "the stream under way at SIGTERM: %d tokens, last %r" % (len(ids), events[-1:]))
    r2 = c2.getresponse()
    out = json.loads(r2.read())
    check(r2.status == 200 and len(out["choices"][0]["token_ids"]) == 40, "the request under way at SIGTERM: %d" % r2.status)


def full(port):
    """--max-connections 4 --timeout 2: with 5 idle connections /health answers and a completion gets
    503; the idle ones are closed by the timeout, and then a completion is served."""
    idle = [socket.create_connection(("127.0.0.1", port), timeout=300) for _ in range(5)]
    for _ in range(100000):  # the server counts a connection once its thread starts
        status, _, text = request(port, "POST", "/v1/completions", {"prompt": [1], "max_tokens": 2})
        if status != 200:
            break
    check(status == 503 and "full" in json.loads(text)["error"]["message"], "a completion when full -> %d %s" % (status, text))
    status, _, text = request(port, "GET", "/health")
    check(status == 200 and json.loads(text)["status"] == "ok", "/health when full -> %d %s" % (status, text))
    for s in idle:  # closed by the server: recv sees the end
        check(read_all(s) == b"", "an idle connection got data")
        s.close()
    # the server counts a connection gone once its thread has ended, which may be after the client
    # sees the socket closed: "full" until then, served after
    for _ in range(600):
        full = request(port, "POST", "/v1/completions", {"prompt": [3], "max_tokens": 1})[0] == 503
        if not full:
            break
        time.sleep(0.05)
    ids, _ = complete(port, {"prompt": [3], "max_tokens": 5})
    check(ids is not None and len(ids) == 5, "a completion after the idle connections left: %s" % ids)


def drain(port, p):
    """--timeout 2: a request whose body never comes does not hold SIGTERM's drain."""
    s = socket.create_connection(("127.0.0.1", port), timeout=300)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 100\r\n\r\n")
    check(b" 100 " in read_all(s, b"\r\n\r\n"), "Expect: 100-continue")  # its handler has run: it counts
    s.sendall(b'{"prompt"')
    p.send_signal(signal.SIGTERM)
    check(read_all(s) == b"", "the request without its body is closed")
    s.close()


GREEDY = {"prompt": [5, 9, 1], "max_tokens": 12, "temperature": 0, "ignore_eos": True}


def linked_copy(suffix, own=None):
    """A directory CK + suffix linking to each of CK's files but own (its caller writes that one)."""
    d = CK.rstrip("/") + suffix
    shutil.rmtree(d, ignore_errors=True)
    os.mkdir(d)
    for f in os.listdir(CK):
        if f != own:
            os.symlink(os.path.join(os.path.abspath(CK), f), os.path.join(d, f))
    return d


def eos_checkpoint():
    """A copy of CK (links to its files) whose config.json's eos_token_id is the first token of GREEDY's
    answer, from the third on, not among those before it: (the directory, the answer, that token's index)."""
    want = generate(GREEDY)["ids"]
    i = next((i for i in range(2, len(want)) if want[i] not in want[:i]), None)
    if i is None:
        sys.exit("greedy decoding repeats its first two tokens: %s" % want)
    d = linked_copy("_eos", "config.json")
    with open(os.path.join(CK, "config.json")) as f:
        config = json.load(f)
    config["eos_token_id"] = want[i]
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    return d, want, i


def eos(port, ck, want, i):
    """Generation stops at the end of text (not returned, finish_reason "stop"), as moe generate does;
    ignore_eos goes on to max_tokens ("length")."""
    stop = dict(GREEDY, ignore_eos=False)
    check(generate(stop, ck)["ids"] == want[:i], "moe generate: %s, want %s" % (generate(stop, ck)["ids"], want[:i]))
    check(generate(GREEDY, ck)["ids"] == want, "moe generate --ignore-eos: %s, want %s" % (generate(GREEDY, ck)["ids"], want))
    first = dict(stop, prompt=stop["prompt"] + want[:i])  # the end of text is its first token
    for stream in (False, True):
        for body, ids, finish in ((stop, want[:i], "stop"), (GREEDY, want, "length"), (first, [], "stop")):
            got, _ = complete(port, dict(body, stream=stream), finish)
            check(got == ids, "%s stream=%s: %s, want %s" % (body, stream, got, ids))
    sampled = {"prompt": "the cat sat", "max_tokens": 30, "temperature": 1.5, "seed": 4}
    for seed in range(4):  # sampled: the same tokens as moe generate, whether the end of text comes or not
        body = dict(sampled, seed=seed)
        want = generate(body, ck)
        got, text = complete(port, body, "stop" if len(want["ids"]) < 30 else "length")
        check((got, text) == (want["ids"], want["text"]), "%s: %s %r, moe generate %s" % (body, got, text, want))


def stop(port):
    """Stop strings cut the text where the first found starts (finish_reason "stop"), streamed or not,
    the tokens those of the request without them up to the one that completes it; none found: "length"."""
    base = {"prompt": "the cat sat", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    full, text = complete(port, base, "length")
    # strings first found at i, without U+FFFD (where bytes were not UTF-8): found in the bytes there
    utf = lambda i, k: "\ufffd" not in text[i:i + k] and text.find(text[i:i + k]) == i
    i = next((i for i in range(2, len(text) - 3) if utf(i, 3)), len(text))
    j = next((j for j in range(i + 1, len(text) - 2) if utf(j, 2)), None)  # a later one
    check(j is not None and utf(0, 1), "no stop strings to take from %r" % text)
    if j is None or not utf(0, 1):
        return
    never = "\u00a7never"
    for stops, cut in ((text[i:i + 3], i), ([never, text[j:j + 2], text[i:i + 3]], i), (text[:1], 0),
                       (text[j:j + 2], j), ([never], None)):
        for stream in (False, True):
            body = dict(base, stop=stops, stream=stream)
            ids, got = complete(port, body, "length" if cut is None else "stop")
            check(got == text[:cut], "%s: %r, want %r" % (body, got, text[:cut]))
            check(ids == full[:len(ids)] and (cut is not None or ids == full), "%s: tokens %s of %s" % (body, ids, full))


def metrics(port):
    """After 3 requests one after another (ignoring the end of text: known token counts) and a bad one,
    each metric says what the server did."""
    bodies = [{"prompt": [1, 2, 3], "max_tokens": 5}, {"prompt": [4, 5], "max_tokens": 7, "stream": True},
              {"prompt": "the cat sat", "max_tokens": 3}]
    prompt = 5 + json.loads(request(port, "POST", "/v1/completions", dict(bodies[2], ignore_eos=True))[2])["usage"]["prompt_tokens"]
    for b in bodies[:2]:
        complete(port, dict(b, ignore_eos=True), "length")
    request(port, "POST", "/v1/completions", {"prompt": "hi", "n": 2})
    m = dict(l.rsplit(" ", 1) for l in request(port, "GET", "/metrics")[2].splitlines() if not l.startswith("#"))
    m = {k: float(v) for k, v in m.items()}
    steps = 15 - 3  # each request: its first token from the prompt, each other one a decode step
    want = {'moe_serve_requests_total{code="2xx"}': 4, 'moe_serve_requests_total{code="4xx"}': 1,  # /health too
            'moe_serve_requests_total{code="5xx"}': 0, "moe_serve_admitted_total": 3,
            "moe_serve_prompt_tokens_total": prompt, "moe_serve_generated_tokens_total": 15,
            "moe_serve_prefills_total": 3,  # one forward a prompt: they came one after another
            "moe_serve_forwards_total": 15,  # one a token: each request's first from its prompt's
            "moe_serve_queue_length": 0, "moe_serve_running": 0,
            "moe_serve_batch_size_count": steps, "moe_serve_batch_size_sum": steps,  # one at a time: batches of 1
            'moe_serve_batch_size_bucket{le="1"}': steps, 'moe_serve_batch_size_bucket{le="+Inf"}': steps,
            "moe_serve_ttft_seconds_count": 3, "moe_serve_request_seconds_count": 3,
            'moe_serve_expert_cache_hit_rate{layer="0"}': 1, 'moe_serve_expert_cache_hit_rate{layer="1"}': 1,
            "moe_serve_all_expert_bytes": 2 * 4 * 3 * 32 * 32 * 4, "moe_serve_resident_expert_bytes": 2 * 4 * 3 * 32 * 32 * 4}
    for k, v in want.items():
        check(m.get(k) == v, "%s %s, want %s" % (k, m.get(k), v))
    for k in ("moe_serve_tokens_per_second", "moe_serve_uptime_seconds", "moe_serve_ttft_seconds_sum",
              "moe_serve_request_seconds_sum"):
        check(m.get(k, 0) > 0, "%s %s, want > 0" % (k, m.get(k)))
    check(m["moe_serve_ttft_seconds_sum"] <= m["moe_serve_request_seconds_sum"], "time to first token past the requests'")


# compact (the test model's context is 64 tokens): the role's initial, the content, a newline
TEMPLATE = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}a:{% endif %}")


def expert_bytes(port):
    """Every expert resident: the whole model's expert bytes, and the resident ones, are those the caller
    counted in the file (quantized experts in their types, not fp32)."""
    m = dict(l.rsplit(" ", 1) for l in request(port, "GET", "/metrics")[2].splitlines() if not l.startswith("#"))
    want = int(os.environ["MOE_WANT_EXPERT_BYTES"])
    for k in ("moe_serve_all_expert_bytes", "moe_serve_resident_expert_bytes"):
        check(int(m[k]) == want, "%s %s, want %d" % (k, m[k], want))


def chat_checkpoint():
    """A copy of CK (links to its files) with a tokenizer_config.json holding TEMPLATE."""
    d = linked_copy("_chat")
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": TEMPLATE, "eos_token": "<|endoftext|>"}, f)
    return d


def chat_json(port, body):
    """(content, finish_reason, usage) of a chat completion; streamed: the deltas joined, checking the
    chunks' shape (the role in the first, finish_reason in the last only, [DONE] at the end)."""
    status, ctype, text = request(port, "POST", "/v1/chat/completions", body)
    check(status == 200, "%s -> %d %s" % (body, status, text))
    if status != 200:
        return None, None, None
    if not body.get("stream"):
        o = json.loads(text)
        check(o["object"] == "chat.completion" and o["id"].startswith("chatcmpl-"), "chat object %s" % o)
        ch = o["choices"][0]
        check(ch["message"]["role"] == "assistant", "chat role %s" % ch)
        return ch["message"]["content"], ch["finish_reason"], o["usage"]
    check(ctype == "text/event-stream", "chat stream content type %s" % ctype)
    events = [e[len("data: "):] for e in text.split("\n\n") if e]
    check(events[-1] == "[DONE]", "the chat stream ends with %r" % events[-1:])
    out, finish = "", None
    for i, e in enumerate(events[:-1]):
        o = json.loads(e)
        ch = o["choices"][0]
        check(o["object"] == "chat.completion.chunk", "chunk object %s" % o["object"])
        check(("role" in ch["delta"]) == (i == 0), "chunk %d delta %s" % (i, ch["delta"]))
        out += ch["delta"].get("content", "")
        last = i == len(events) - 2
        check((ch["finish_reason"] is not None) == last, "chunk %d finish_reason %s" % (i, ch["finish_reason"]))
        finish = ch["finish_reason"]
    return out, finish, None


def logprobs(port):
    """Completions' logprobs (OpenAI's legacy shape) and chat's (content entries): greedy, each token is
    its step's most probable; streamed or not, and chat or completion of the same prompt, the same values."""
    body = {"prompt": "s:be brief\nu:a dog\na:", "max_tokens": 6, "temperature": 0, "ignore_eos": True, "logprobs": 3}
    o = json.loads(request(port, "POST", "/v1/completions", body)[2])["choices"][0]
    lp = o["logprobs"]
    n = len(o["token_ids"])
    check(n == 6 and all(len(x) == n for x in (lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], lp["text_offset"])),
          "completion logprobs %s" % lp)
    for i in range(n):
        tops = lp["top_logprobs"][i]
        check(1 <= len(tops) <= 3 and max(tops.values()) == lp["token_logprobs"][i] <= 0,
              "token %d: logprob %s, alternatives %s" % (i, lp["token_logprobs"][i], tops))
    check(lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0, "offsets %s" % lp["text_offset"])
    status, _, text = request(port, "POST", "/v1/completions", dict(body, stream=True))
    streamed = []
    for e in [e[len("data: "):] for e in text.split("\n\n") if e][:-1]:
        c = json.loads(e)["choices"][0]
        streamed += c["logprobs"]["token_logprobs"] if c["logprobs"] else []
    check(streamed == lp["token_logprobs"], "streamed logprobs %s, not %s" % (streamed, lp["token_logprobs"]))
    echo_checks(port, body, o)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a dog"}]
    c = json.loads(request(port, "POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 6, "temperature": 0,
                                                                   "ignore_eos": True, "logprobs": True,
                                                                   "top_logprobs": 2})[2])["choices"][0]
    content = c["logprobs"]["content"]
    check([x["logprob"] for x in content] == lp["token_logprobs"], "chat logprobs %s, completion %s" % (content, lp))
    check(all(len(x["top_logprobs"]) == 2 and x["top_logprobs"][0]["logprob"] == x["logprob"] for x in content),
          "chat top_logprobs %s" % content)


def echo_checks(port, body, o):
    """echo (what lm-evaluation-harness asks a completions server for): the prompt's text and ids before
    the answer's, its tokens' logprobs first (the first null), streamed or not; scoring the prompt and
    the answer's ids with max_tokens 0 gives the answer's tokens the logprobs they were sampled with."""
    prompt_ids = json.loads(request(port, "POST", "/tokenize", {"prompt": body["prompt"]})[2])["tokens"]
    n, p = len(o["token_ids"]), len(prompt_ids)
    e = json.loads(request(port, "POST", "/v1/completions", dict(body, echo=True))[2])["choices"][0]
    check(e["text"] == body["prompt"] + o["text"] and e["token_ids"] == prompt_ids + o["token_ids"], "echo %s" % e)
    lp = e["logprobs"]
    check(all(len(x) == p + n for x in (lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], lp["text_offset"])),
          "echo logprobs lengths %s" % lp)
    check(lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None and
          all(x is not None and x <= 0 for x in lp["token_logprobs"][1:]), "echo prompt logprobs %s" % lp)
    check(lp["token_logprobs"][p:] == o["logprobs"]["token_logprobs"], "echo answer logprobs %s, not %s" %
          (lp["token_logprobs"][p:], o["logprobs"]["token_logprobs"]))
    check(lp["text_offset"][0] == 0 and lp["text_offset"][p] == len(body["prompt"].encode()), "echo offsets %s" % lp)
    status, _, text = request(port, "POST", "/v1/completions", dict(body, echo=True, stream=True))
    events = [json.loads(x[len("data: "):])["choices"][0] for x in [x for x in text.split("\n\n") if x][:-1]]
    check("".join(c["text"] for c in events) == e["text"] and events[0]["text"].startswith(body["prompt"]),
          "echo streamed %s" % events)
    scored = json.loads(request(port, "POST", "/v1/completions", {"prompt": prompt_ids + o["token_ids"], "max_tokens": 0,
                                                                  "echo": True, "logprobs": 1})[2])["choices"][0]
    got, want = scored["logprobs"]["token_logprobs"][p:], o["logprobs"]["token_logprobs"]
    check(scored["token_ids"] == prompt_ids + o["token_ids"] and scored["finish_reason"] == "length" and
          len(got) == n and all(abs(a - b) < 1e-4 for a, b in zip(got, want)), "scored %s, sampled %s" % (got, want))


def chat(port):
    """A chat request answers what a completion of its messages rendered by the template (here by hand)
    answers, streamed or not; /v1/models lists the model; bad messages and fields are 400s naming them."""
    convs = [[{"role": "user", "content": "the cat sat"}],
             [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a dog"},
              {"role": "assistant", "content": "the mat"}, {"role": "user", "content": "caf\u00e9"}]]
    for msgs in convs:
        prompt = "".join("%s:%s\n" % (m["role"][0], m["content"]) for m in msgs) + "a:"
        base = {"max_tokens": 10, "temperature": 0, "ignore_eos": True}
        status, _, text = request(port, "POST", "/v1/completions", dict(base, prompt=prompt))
        want = json.loads(text)
        for stream in (False, True):
            content, finish, usage = chat_json(port, dict(base, messages=msgs, stream=stream))
            check(content == want["choices"][0]["text"], "chat %s stream=%s: %r, completion %r" %
                  (msgs, stream, content, want["choices"][0]["text"]))
            check(finish == "length", "chat finish_reason %s" % finish)
            if usage:
                check(usage == want["usage"], "chat usage %s, completion %s" % (usage, want["usage"]))
        sampled = dict(base, temperature=0.9, seed=7, max_completion_tokens=6)
        del sampled["max_tokens"]
        content, _, usage = chat_json(port, dict(sampled, messages=msgs))
        want = json.loads(request(port, "POST", "/v1/completions", dict(base, prompt=prompt, temperature=0.9, seed=7,
                                                                     max_tokens=6))[2])
        check(content == want["choices"][0]["text"], "sampled chat %r, completion %r" % (content, want["choices"][0]["text"]))
    logprobs(port)
    for text in ("the cat sat on the mat", "caf\u00e9 <|endoftext|> na\u00efve"):  # /tokenize and /detokenize
        status, _, out = request(port, "POST", "/tokenize", {"prompt": text, "model": "moe"})
        o = json.loads(out)
        check(status == 200 and o["count"] == len(o["tokens"]) and o["max_model_len"] == 64, "/tokenize %s" % out)
        status, _, out = request(port, "POST", "/detokenize", {"tokens": o["tokens"]})
        check(status == 200 and json.loads(out)["prompt"] == text, "/detokenize %s, want %r" % (out, text))
    plain = json.loads(request(port, "POST", "/tokenize", {"prompt": "the cat"})[2])["tokens"]
    want = json.loads(request(port, "POST", "/v1/completions", {"prompt": "the cat", "max_tokens": 1})[2])["usage"]
    check(len(plain) == want["prompt_tokens"], "/tokenize %s, the completion's prompt %s" % (plain, want))
    for path, body, msg in (("/tokenize", {"prompt": 5}, '"prompt" must be a string'),
                            ("/tokenize", {"prompt": "x", "extra": 1}, 'unknown field "extra"'),
                            ("/detokenize", {"tokens": [1, 100000]}, '"tokens"[1] is not a token id'),
                            ("/detokenize", {"tokens": "x"}, '"tokens" must be a list')):
        status, _, out = request(port, "POST", path, body)
        check(status == 400 and msg in json.loads(out)["error"]["message"], "%s %s -> %d %s" % (path, body, status, out))
    status, _, text = request(port, "GET", "/v1/models")
    check(status == 200 and json.loads(text)["data"][0]["id"] == "moe", "/v1/models -> %d %s" % (status, text))
    user = [{"role": "user", "content": "hi"}]
    for body, msg in (({"max_tokens": 2}, '"messages" must be a non-empty list'),
                      ({"messages": []}, '"messages" must be a non-empty list'),
                      ({"messages": [{"role": "wizard", "content": "x"}]}, 'role "wizard"'),
                      ({"messages": [{"role": "user", "content": 5}]}, '"messages"[0]: "content"'),
                      ({"messages": [{"content": "x"}]}, '"messages"[0] must be an object with a "role"'),
                      ({"messages": user, "top_logprobs": 2}, '"top_logprobs" needs "logprobs": true'),
                      ({"messages": user, "logprobs": True, "top_logprobs": 21}, '"top_logprobs" must be in [0, 20]'),
                      ({"messages": user, "logprobs": False, "top_p": 2}, '"top_p" must be in [0, 1]'),
                      ({"messages": user, "prompt": "x"}, 'unknown field "prompt"'),
                      ({"messages": user, "n": 3}, '"n" 3 is not implemented')):
        status, _, text = request(port, "POST", "/v1/chat/completions", body)
        check(status == 400 and msg in json.loads(text)["error"]["message"], "%s -> %d %s (want %r)" % (body, status, text, msg))


def loading():
    """While the model loads, /health is 503 "loading" and everything else a 503 JSON error; then the
    server answers as usual. The load is held deterministically: the checkpoint's tokenizer.json (read
    after the weights, once the server listens) is a copy on which this process holds a write lease, so
    the server's open() waits until the lease is let go."""
    d = linked_copy("_loading", "tokenizer.json")
    shutil.copy(os.path.join(CK, "tokenizer.json"), os.path.join(d, "tokenizer.json"))
    signal.signal(signal.SIGIO, signal.SIG_IGN)  # the kernel's note that the lease is wanted
    fd = os.open(os.path.join(d, "tokenizer.json"), os.O_RDONLY)
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
    except OSError as e:
        print("SKIP: this file system takes no write lease (%s), so the load cannot be held" % e, file=sys.stderr)
        sys.exit(77)
    p = subprocess.Popen([MOE, "serve", "--checkpoint", d, "--port", "0", "--threads", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stderr.readline()  # "moe serve: http://HOST:PORT answers 503 until the model is loaded"
        if "answers 503" not in line:
            sys.exit("the server did not listen while loading: %r (exit %s)" % (line, p.wait()))
        port = int(line.split("http://", 1)[1].split(" ", 1)[0].rsplit(":", 1)[1])
        status, _, text = request(port, "GET", "/health")
        check(status == 503 and json.loads(text)["status"] == "loading", "/health while loading -> %d %s" % (status, text))
        for method, path, body in (("POST", "/v1/completions", {"prompt": "the cat", "max_tokens": 2}),
                                   ("GET", "/metrics", None), ("GET", "/v1/models", None), ("GET", "/nope", None)):
            status, ctype, text = request(port, method, path, body)
            check(status == 503 and ctype == "application/json" and "loading" in json.loads(text)["error"]["message"],
                  "%s %s while loading -> %d %s" % (method, path, status, text))
        check(p.poll() is None, "the server exited while loading")
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        line = p.stdout.readline()
        check("listening on http://" in line, "after loading the server printed %r" % line)
        status, _, text = request(port, "GET", "/health")
        check(status == 200 and json.loads(text)["status"] == "ok", "/health once loaded -> %d %s" % (status, text))
        ids, _ = complete(port, dict(GREEDY))
        check(ids == generate(GREEDY)["ids"], "completion once loaded: %s, moe generate %s" % (ids, generate(GREEDY)["ids"]))
        status, _, text = request(port, "GET", "/metrics")
        check(status == 200 and 'moe_serve_requests_total{code="5xx"} 5' in text,
              "/metrics counts the five 503s answered while loading:\n%s" % text)
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=300)
        check(rc == 0, "the server exited %d after SIGTERM" % rc)
    finally:
        os.close(fd)
        if p.poll() is None:
            p.kill()
            p.wait()
    print("loading: %d failures" % len(failures), file=sys.stderr)
    sys.exit(1 if failures else 0)


def pieces(port):
    """Logprobs' token strings are the text each token adds (SentencePiece's "\u2581" a space, no raw pieces):
    joined they are the echoed prompt and the completion, and each text_offset is the bytes before it."""
    prompt = "Hello world, na\u00efve caf\u00e9 costs 12 euros."
    status, _, text = request(port, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 5, "temperature": 0,
                                                                "echo": True, "logprobs": 2, "ignore_eos": True})
    check(status == 200, "pieces: %d %s" % (status, text))
    if status != 200:
        return
    ch = json.loads(text)["choices"][0]
    lp = ch["logprobs"]
    toks = lp["tokens"]
    check(ch["text"].startswith(prompt) and "".join(toks) == ch["text"], "tokens %s joined are not the text %r" % (toks, ch["text"]))
    check(not any("\u2581" in t or t.startswith("<0x") for t in toks), "raw pieces among %s" % toks)
    want = [len("".join(toks[:i]).encode()) for i in range(len(toks))]
    check(lp["text_offset"] == want, "text_offset %s, want %s" % (lp["text_offset"], want))
    body = {"prompt": prompt, "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    ids, text = complete(port, body)
    want = generate(body)
    check(ids == want["ids"] and text == want["text"] and ch["text"] == prompt + text,
          "completion %r %s, moe generate %r %s, echoed %r" % (text, ids, want["text"], want["ids"], ch["text"]))
    alts = [k for d in lp["top_logprobs"][1:] for k in d]
    check(alts and not any("\u2581" in k for k in alts), "raw pieces among the alternatives %s" % alts)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0, "logprobs": True,
            "top_logprobs": 1, "ignore_eos": True}
    status, _, text = request(port, "POST", "/v1/chat/completions", body)
    if status == 200:  # a checkpoint with a chat template: each token's bytes are its text's
        content = json.loads(text)["choices"][0]["logprobs"]["content"]
        check(all(bytes(e["bytes"]).decode("utf-8", "replace") == e["token"] for e in content), "chat bytes %s" % content)


def main():
    if SCENARIO == "loading":
        loading()
    ck = CK
    if SCENARIO == "eos":
        ck, want, i = eos_checkpoint()
    if SCENARIO == "chat":
        ck = chat_checkpoint()
    p, port = start(ck)
    try:
        status, _, text = request(port, "GET", "/health")
        check(status == 200 and json.loads(text)["status"] == "ok", "/health -> %d %s" % (status, text))
        if SCENARIO in ("sigterm", "drain"):
            {"sigterm": sigterm, "drain": drain}[SCENARIO](port, p)
        else:
            {"match": match, "ids": ids, "busy": busy, "bad": bad, "full": full, "metrics": metrics, "stop": stop, "chat": chat,
             "pieces": pieces, "expert_bytes": expert_bytes, "eos": lambda port: eos(port, ck, want, i)}[SCENARIO](port)
            p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=300)
        check(rc == 0, "the server exited %d after SIGTERM" % rc)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    print("%s: %d failures" % (SCENARIO, len(failures)), file=sys.stderr)
    sys.exit(1 if failures else 0)


main()
