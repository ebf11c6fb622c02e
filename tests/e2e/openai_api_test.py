"""End-to-end: the OpenAI-compatible HTTP API of `specserve serve`, driven by the official
`openai` Python package (and raw HTTP where the package would refuse to send the request).

Two servers run on the default model: one with n-gram speculation and an API key, one without
speculation. Run by ctest (label e2e) through tests/e2e/run_python_test.sh:
    python tests/e2e/openai_api_test.py --bin build/bin/specserve [--model PATH]
"""
import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

import openai

ARGS = None
SPEC = None   # the server with speculation (and an API key)
PLAIN = None  # the server without speculation (no key)
API_KEY = "e2e-secret-key"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, name, extra, api_key=None):
        self.name = name
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="specserve-e2e-")
        self.log_path = os.path.join(self.dir, "server.log")
        cmd = [ARGS.bin, "serve", "--port", str(self.port), "--actor-port", str(free_port()),
               "--token-file", os.path.join(self.dir, "token"), "--threads", "1", "--max-model-len", "1024",
               "--kv-cache-bytes", "256MiB"] + extra
        if ARGS.model:
            cmd += ["--model", ARGS.model]
        env = dict(os.environ)
        env.pop("SPECSERVE_API_KEY", None)
        if api_key:
            cmd += ["--api-key", api_key]
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.base = "http://127.0.0.1:%d" % self.port
        self.client = openai.OpenAI(base_url=self.base + "/v1", api_key=api_key or "none", max_retries=0, timeout=300)

    def wait_healthy(self, timeout=300):
        end = time.time() + timeout
        saw_503 = False
        while time.time() < end:
            if self.proc.poll() is not None:
                raise RuntimeError("%s exited with %s:\n%s" % (self.name, self.proc.returncode, self.log_text()))
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=5) as r:
                    if r.status == 200:
                        return saw_503
            except urllib.error.HTTPError as e:
                if e.code == 503:
                    saw_503 = True
            except (urllib.error.URLError, ConnectionError, socket.timeout):
                pass
            time.sleep(0.2)
        raise RuntimeError("%s not healthy after %d s:\n%s" % (self.name, timeout, self.log_text()))

    def log_text(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()[-4000:]

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()

    def raw(self, method, path, body=None, headers=None):
        """(status, parsed JSON or text) of a raw request."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        data = body.encode() if isinstance(body, str) else body
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        conn.request(method, path, body=data, headers=h)
        r = conn.getresponse()
        text = r.read().decode("utf-8", "replace")
        conn.close()
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text

    def metrics(self):
        with urllib.request.urlopen(self.base + "/metrics", timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return text, out


def model_name(server):
    return server.client.models.list().data[0].id


PROMPT = "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is"
CHAT = [{"role": "user", "content": "Name three colors of the rainbow, one per line."}]
# Text that repeats: n-gram lookup finds drafts in it.
REPEAT = ("Repeat after me. The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. "
          "The quick brown fox jumps over the lazy dog. The quick brown")


class OpenAiApiTest(unittest.TestCase):
    def test_models_and_health(self):
        models = SPEC.client.models.list().data
        self.assertEqual(len(models), 1)
        self.assertTrue(models[0].id)
        status, body = SPEC.raw("GET", "/health")
        self.assertEqual(status, 200, body)

    def test_completion_and_streaming_agree(self):
        m = model_name(SPEC)
        full = SPEC.client.completions.create(model=m, prompt=PROMPT, max_tokens=24, temperature=0)
        self.assertEqual(full.object, "text_completion")
        self.assertTrue(full.choices[0].text)
        self.assertIn(full.choices[0].finish_reason, ("stop", "length"))
        self.assertGreater(full.usage.prompt_tokens, 5)
        self.assertEqual(full.usage.total_tokens, full.usage.prompt_tokens + full.usage.completion_tokens)
        stream = SPEC.client.completions.create(model=m, prompt=PROMPT, max_tokens=24, temperature=0, stream=True,
                                                stream_options={"include_usage": True})
        parts, finish, usage = [], None, None
        for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for c in chunk.choices:
                parts.append(c.text)
                finish = c.finish_reason or finish
        self.assertEqual("".join(parts), full.choices[0].text)
        self.assertEqual(finish, full.choices[0].finish_reason)
        self.assertIsNotNone(usage)
        self.assertEqual(usage.completion_tokens, full.usage.completion_tokens)

    def test_chat_and_streaming_agree(self):
        m = model_name(SPEC)
        full = SPEC.client.chat.completions.create(model=m, messages=CHAT, max_tokens=32, temperature=0)
        self.assertEqual(full.choices[0].message.role, "assistant")
        text = full.choices[0].message.content
        self.assertTrue(text)
        stream = SPEC.client.chat.completions.create(model=m, messages=CHAT, max_tokens=32, temperature=0, stream=True)
        parts, roles = [], []
        for chunk in stream:
            for c in chunk.choices:
                if c.delta.role:
                    roles.append(c.delta.role)
                if c.delta.content:
                    parts.append(c.delta.content)
        self.assertEqual(roles, ["assistant"])
        self.assertEqual("".join(parts), text)

    def test_speculation_gives_the_same_greedy_text(self):
        for kind in ("completion", "repeat", "chat"):
            outs = []
            for server in (SPEC, PLAIN):
                m = model_name(server)
                if kind != "chat":
                    r = server.client.completions.create(model=m, prompt=PROMPT if kind == "completion" else REPEAT,
                                                         max_tokens=48, temperature=0)
                    outs.append(r.choices[0].text)
                else:
                    r = server.client.chat.completions.create(model=m, messages=CHAT, max_tokens=48, temperature=0)
                    outs.append(r.choices[0].message.content)
            self.assertEqual(outs[0], outs[1], kind)
        _, metrics = SPEC.metrics()
        drafts = sum(v for k, v in metrics.items() if k.startswith("specserve:spec_decode_num_draft_tokens_total"))
        self.assertGreater(drafts, 0, "the speculative server drafted nothing")

    def test_n_and_seed(self):
        m = model_name(PLAIN)
        a = PLAIN.client.completions.create(model=m, prompt="Once upon a time", max_tokens=16, temperature=1.0, n=2,
                                            seed=1234)
        self.assertEqual(sorted(c.index for c in a.choices), [0, 1])
        b = PLAIN.client.completions.create(model=m, prompt="Once upon a time", max_tokens=16, temperature=1.0, n=2,
                                            seed=1234)
        self.assertEqual([c.text for c in sorted(a.choices, key=lambda c: c.index)],
                         [c.text for c in sorted(b.choices, key=lambda c: c.index)])
        self.assertEqual(a.usage.completion_tokens, b.usage.completion_tokens)
        # Streaming with n=2: each choice's deltas carry its index.
        stream = PLAIN.client.completions.create(model=m, prompt="Once upon a time", max_tokens=16, temperature=1.0,
                                                 n=2, seed=1234, stream=True)
        texts = {0: "", 1: ""}
        for chunk in stream:
            for c in chunk.choices:
                texts[c.index] += c.text
        self.assertEqual([texts[0], texts[1]], [c.text for c in sorted(a.choices, key=lambda c: c.index)])

    def test_many_concurrent_streams(self):
        import concurrent.futures
        m = model_name(PLAIN)
        prompts = ["Tell me about %s." % w for w in ("cats", "dogs", "rain", "the sea", "bread", "music", "stars", "trees")]
        want = {p: PLAIN.client.chat.completions.create(model=m, messages=[{"role": "user", "content": p}], max_tokens=12,
                                                        temperature=0).choices[0].message.content for p in prompts}

        def stream(p):
            out = []
            for chunk in PLAIN.client.chat.completions.create(model=m, messages=[{"role": "user", "content": p}],
                                                             max_tokens=12, temperature=0, stream=True):
                for c in chunk.choices:
                    out.append(c.delta.content or "")
            return p, "".join(out)

        with concurrent.futures.ThreadPoolExecutor(24) as ex:
            results = list(ex.map(stream, prompts * 3))
        self.assertEqual(len(results), 24)
        for p, text in results:
            self.assertEqual(text, want[p], p)  # batched greedy output equals the request alone

    def test_stop_strings(self):
        m = model_name(PLAIN)
        free = PLAIN.client.completions.create(model=m, prompt=PROMPT, max_tokens=32, temperature=0).choices[0].text
        self.assertGreater(len(free.strip()), 3)
        stop = free.strip()[2:4]  # a piece of text the greedy continuation contains
        cut = PLAIN.client.completions.create(model=m, prompt=PROMPT, max_tokens=32, temperature=0, stop=[stop])
        self.assertEqual(cut.choices[0].finish_reason, "stop")
        self.assertEqual(cut.choices[0].text, free[:free.index(stop)])
        self.assertNotIn(stop, cut.choices[0].text)
        self.assertEqual(cut.choices[0].to_dict().get("stop_reason", "absent"), stop)  # vLLM's stop_reason
        # The same in a stream: on the chunk that carries the finish reason.
        reasons = [c.to_dict().get("stop_reason", "absent") for chunk in PLAIN.client.completions.create(
            model=m, prompt=PROMPT, max_tokens=32, temperature=0, stop=[stop], stream=True) for c in chunk.choices
            if c.finish_reason]
        self.assertEqual(reasons, [stop])

    def test_min_tokens_and_stop_reason(self):
        # A short chat answer ends on EOS: stop_reason null. min_tokens holds EOS off (vLLM's
        # min_tokens): the answer keeps its greedy start and goes on; the speculative server
        # (n-gram drafts) gives the same text.
        m = model_name(PLAIN)
        chat = [{"role": "user", "content": "Reply with one word: yes or no. Is water wet?"}]
        free = PLAIN.client.chat.completions.create(model=m, messages=chat, max_tokens=48, temperature=0)
        c = free.choices[0]
        self.assertEqual(c.finish_reason, "stop", c.message.content)
        self.assertIn("stop_reason", c.to_dict())
        self.assertIsNone(c.to_dict()["stop_reason"])
        n = free.usage.completion_tokens
        held = {}
        for name, server in (("plain", PLAIN), ("spec", SPEC)):
            r = server.client.chat.completions.create(model=model_name(server), messages=chat, max_tokens=48, temperature=0,
                                                      extra_body={"min_tokens": n + 6})
            self.assertGreaterEqual(r.usage.completion_tokens, n + 6, name)
            self.assertTrue(r.choices[0].message.content.startswith(c.message.content.rstrip()), name)
            held[name] = r.choices[0].message.content
        self.assertEqual(held["plain"], held["spec"])
        # A stop_token_ids id is its own stop_reason (a number): an id of the greedy continuation,
        # found by tokenizing prompt + continuation (/tokenize) past the prompt's ids.
        def tokenize(text):
            req = urllib.request.Request(PLAIN.base + "/tokenize", data=json.dumps({"model": m, "prompt": text}).encode(),
                                         headers={"Content-Type": "application/json"})
            return json.loads(urllib.request.urlopen(req).read())["tokens"]
        cont = PLAIN.client.completions.create(model=m, prompt=PROMPT, max_tokens=8, temperature=0).choices[0].text
        prompt_ids, both = tokenize(PROMPT), tokenize(PROMPT + cont)
        self.assertEqual(both[:len(prompt_ids)], prompt_ids, "the continuation changed the prompt's tokens: pick another prompt")
        stop_id = both[len(prompt_ids) + 1]
        r = PLAIN.client.completions.create(model=m, prompt=PROMPT, max_tokens=8, temperature=0,
                                            extra_body={"stop_token_ids": [stop_id]})
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertEqual(r.choices[0].to_dict().get("stop_reason"), stop_id)
        self.assertLess(len(r.choices[0].text), len(cont))
        with self.assertRaises(openai.BadRequestError) as e:
            PLAIN.client.completions.create(model=m, prompt=PROMPT, max_tokens=4, extra_body={"min_tokens": 5})
        self.assertIn("min_tokens = 5", str(e.exception))

    def test_logprobs(self):
        m = model_name(SPEC)
        r = SPEC.client.completions.create(model=m, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3)
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.tokens), r.usage.completion_tokens)
        self.assertEqual(len(lp.token_logprobs), len(lp.tokens))
        self.assertEqual("".join(lp.tokens), r.choices[0].text)
        for i, top in enumerate(lp.top_logprobs):
            self.assertLessEqual(len(top), 3)
            self.assertGreaterEqual(len(top), 1)
            self.assertLessEqual(lp.token_logprobs[i], 1e-6)
            # Greedy picks the most likely token: its logprob is the best of the top list.
            self.assertAlmostEqual(max(top.values()), lp.token_logprobs[i], places=4)
        c = SPEC.client.chat.completions.create(model=m, messages=CHAT, max_tokens=6, temperature=0, logprobs=True,
                                                top_logprobs=2)
        content = c.choices[0].logprobs.content
        self.assertEqual(len(content), c.usage.completion_tokens)
        for t in content:
            self.assertEqual(len(t.top_logprobs), 2)
            self.assertAlmostEqual(t.top_logprobs[0].logprob, t.logprob, places=4)
            self.assertEqual(bytes(t.bytes).decode("utf-8", "replace") if t.bytes else "", t.token if t.bytes else "")

    def test_echo_and_prompt_lists(self):
        m = model_name(PLAIN)
        r = PLAIN.client.completions.create(model=m, prompt="Hello there", max_tokens=4, temperature=0, echo=True)
        self.assertTrue(r.choices[0].text.startswith("Hello there"))
        r = PLAIN.client.completions.create(model=m, prompt=["One two", "Red green"], max_tokens=4, temperature=0)
        self.assertEqual(len(r.choices), 2)
        single = PLAIN.client.completions.create(model=m, prompt="Red green", max_tokens=4, temperature=0)
        self.assertEqual(sorted(r.choices, key=lambda c: c.index)[1].text, single.choices[0].text)

    def test_errors(self):
        m = model_name(SPEC)
        c = SPEC.client
        with self.assertRaises(openai.NotFoundError) as e:
            c.completions.create(model="no-such-model", prompt="x", max_tokens=2)
        self.assertIn("no-such-model", str(e.exception))
        cases = [
            (dict(max_tokens=0), "max_tokens"),
            (dict(max_tokens=2, n=100), "n"),
            (dict(max_tokens=2, temperature=-1), "temperature"),
            (dict(max_tokens=2, logit_bias={"1": 10}), "logit_bias"),
            (dict(max_tokens=2, extra_body={"top_p": "high"}), "top_p"),
            (dict(max_tokens=2, extra_body={"frobnicate": True}), "frobnicate"),
            (dict(max_tokens=2, stop=[""]), "stop"),
            (dict(max_tokens=2, logprobs=50), "logprobs"),
            (dict(max_tokens=5000), "max_tokens"),
        ]
        for kwargs, field in cases:
            with self.assertRaises(openai.BadRequestError, msg=str(kwargs)) as e:
                c.completions.create(model=m, prompt="x", **kwargs)
            self.assertEqual(e.exception.body.get("param") if isinstance(e.exception.body, dict) else None, field,
                             str(e.exception))
        with self.assertRaises(openai.BadRequestError):
            c.chat.completions.create(model=m, messages=[{"role": "wizard", "content": "x"}], max_tokens=2)
        with self.assertRaises(openai.BadRequestError) as e:
            c.completions.create(model=m, prompt="word " * 3000, max_tokens=2)
        self.assertEqual(e.exception.status_code, 400)
        self.assertEqual(e.exception.code, "context_length_exceeded", str(e.exception))
        # Malformed JSON and a non-object body: raw HTTP (the package never sends these).
        h = {"Authorization": "Bearer " + API_KEY}
        status, body = SPEC.raw("POST", "/v1/completions", '{"prompt": "x", ', h)
        self.assertEqual(status, 400)
        self.assertIn("malformed JSON", body["error"]["message"])
        status, body = SPEC.raw("POST", "/v1/chat/completions", "[]", h)
        self.assertEqual(status, 400)
        status, body = SPEC.raw("GET", "/v1/nothing-here", None, h)
        self.assertEqual(status, 404)
        # The server keeps serving.
        ok = c.completions.create(model=m, prompt="Hello", max_tokens=3, temperature=0)
        self.assertTrue(ok.choices)

    def test_api_key(self):
        bad = openai.OpenAI(base_url=SPEC.base + "/v1", api_key="wrong", max_retries=0)
        with self.assertRaises(openai.AuthenticationError):
            bad.models.list()
        status, body = SPEC.raw("POST", "/v1/completions", json.dumps({"prompt": "x"}))
        self.assertEqual(status, 401)
        self.assertIn("error", body)
        status, _ = SPEC.raw("GET", "/health")
        self.assertEqual(status, 200)  # health and metrics stay open (as in vLLM)

    def test_disconnect_cancels_and_frees_kv(self):
        m = model_name(PLAIN)
        body = json.dumps({"model": m, "prompt": "Count: 1, 2, 3,", "max_tokens": 900, "temperature": 0,
                           "ignore_eos": True, "stream": True})
        conn = http.client.HTTPConnection("127.0.0.1", PLAIN.port, timeout=60)
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        self.assertEqual(r.status, 200)
        got = b""
        while got.count(b"data: ") < 3:
            got += r.read1(4096) if hasattr(r, "read1") else r.read(64)
        _, before = PLAIN.metrics()
        running = [v for k, v in before.items() if k.startswith("specserve:num_requests_running")]
        self.assertEqual(running, [1.0])
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        end = time.time() + 30
        while time.time() < end:
            _, after = PLAIN.metrics()
            run = sum(v for k, v in after.items() if k.startswith("specserve:num_requests_running"))
            kv = sum(v for k, v in after.items() if k.startswith("specserve:kv_cache_usage_perc"))
            if run == 0 and kv == 0:
                break
            time.sleep(0.2)
        self.assertEqual(run, 0, "the request kept running after its client disconnected")
        self.assertEqual(kv, 0, "its KV blocks were not freed")
        # ignore_eos: uncancelled, it would have produced all 900 tokens.
        gen = lambda vals: sum(v for k, v in vals.items() if k.startswith("specserve:generation_tokens_total"))
        self.assertLess(gen(after) - gen(before), 600, "the request ran to the end: it was not cancelled")

    def test_non_streamed_disconnect_cancels(self):
        # A non-streamed request whose client goes away is cancelled too (vLLM aborts it).
        m = model_name(PLAIN)
        body = json.dumps({"model": m, "prompt": "Count: 1, 2, 3,", "max_tokens": 900, "temperature": 0,
                           "ignore_eos": True})
        gen = lambda vals: sum(v for k, v in vals.items() if k.startswith("specserve:generation_tokens_total"))
        s = socket.create_connection(("127.0.0.1", PLAIN.port))
        s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   "Content-Length: %d\r\n\r\n%s" % (len(body), body)).encode())
        end = time.time() + 30
        while time.time() < end:
            _, before = PLAIN.metrics()
            if sum(v for k, v in before.items() if k.startswith("specserve:num_requests_running")) == 1:
                break
            time.sleep(0.1)
        s.close()
        end = time.time() + 30
        while time.time() < end:
            _, after = PLAIN.metrics()
            if sum(v for k, v in after.items() if k.startswith("specserve:num_requests_running")) == 0:
                break
            time.sleep(0.2)
        self.assertEqual(sum(v for k, v in after.items() if k.startswith("specserve:num_requests_running")), 0,
                         "the request kept running after its client disconnected")
        self.assertLess(gen(after) - gen(before), 600, "the request ran to the end: it was not cancelled")

    def test_hostile_bodies(self):
        import gzip
        h = {"Authorization": "Bearer " + API_KEY}
        # 100000 nested arrays: used to overflow the stack (the server died).
        status, body = SPEC.raw("POST", "/v1/completions",
                                '{"prompt": "x", "max_tokens": ' + "[" * 100000 + "]" * 100000 + "}", h)
        self.assertEqual(status, 400, body)
        self.assertEqual(body["error"]["param"], "max_tokens")
        # A number beyond a double: a 400, not a 500.
        status, body = SPEC.raw("POST", "/v1/completions", '{"prompt": "x", "temperature": 1e999}', h)
        self.assertEqual(status, 400, body)
        # 40 MiB inflated from 40 KiB of gzip: the 32 MiB limit counts what the server inflates.
        bomb = gzip.compress(b'{"prompt": "x", "max_tokens": 1, "user": "' + b"a" * (40 << 20) + b'"}')
        status, body = SPEC.raw("POST", "/v1/completions", bomb, dict(h, **{"Content-Encoding": "gzip"}))
        self.assertEqual(status, 413, body)
        # The same over Transfer-Encoding: chunked.
        big = b'{"prompt": "x", "max_tokens": 1, "user": "' + b"a" * (33 << 20) + b'"}'
        conn = http.client.HTTPConnection("127.0.0.1", SPEC.port, timeout=120)
        try:
            conn.request("POST", "/v1/completions", body=iter([big[i:i + (1 << 20)] for i in range(0, len(big), 1 << 20)]),
                         headers=dict(h, **{"Content-Type": "application/json"}), encode_chunked=True)
            self.assertEqual(conn.getresponse().status, 413)
        except (ConnectionError, BrokenPipeError):
            pass  # the server answered 413 and closed while the body was still being sent
        conn.close()
        status, _ = SPEC.raw("GET", "/health")
        self.assertEqual(status, 200)

    def test_wrong_method_and_bursts(self):
        import concurrent.futures
        status, body = PLAIN.raw("GET", "/v1/completions")
        self.assertEqual(status, 405, body)
        self.assertEqual(body["error"]["code"], "method_not_allowed")

        def health(_):
            return PLAIN.raw("GET", "/health")[0]

        # 64 clients at once: the listen backlog is no longer 5 (connections were reset).
        with concurrent.futures.ThreadPoolExecutor(64) as ex:
            self.assertEqual(set(ex.map(health, range(64))), {200})

    def test_stop_ends_open_streams_cleanly(self):
        # Streams still open when the drain timeout ends get an error event, [DONE] and a
        # terminated body, and the process exits.
        import threading
        server = Server("drain server", ["--drain-timeout", "1"])
        try:
            server.wait_healthy()
            m = model_name(server)
            results = []

            def stream():
                body = json.dumps({"model": m, "prompt": "Count: 1, 2, 3,", "max_tokens": 900, "temperature": 0,
                                   "ignore_eos": True, "stream": True})
                conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
                conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
                try:
                    results.append(conn.getresponse().read().decode())
                except Exception as e:  # IncompleteRead: the body was cut
                    results.append(e)
                finally:
                    conn.close()

            threads = [threading.Thread(target=stream) for _ in range(2)]
            for t in threads:
                t.start()
            time.sleep(2)
            os.killpg(server.proc.pid, signal.SIGTERM)
            for t in threads:
                t.join(60)
            self.assertEqual(server.proc.wait(30), 0)
            for r in results:
                self.assertIsInstance(r, str, "the stream was cut: %r" % (r,))
                self.assertIn("shutting down", r)
                self.assertTrue(r.endswith("data: [DONE]\n\n"), r[-200:])
        finally:
            server.stop()

    def test_metrics(self):
        m = model_name(SPEC)
        SPEC.client.completions.create(model=m, prompt=PROMPT, max_tokens=8, temperature=0)
        text, values = SPEC.metrics()
        for family in ("specserve:num_requests_running", "specserve:num_requests_waiting", "specserve:kv_cache_usage_perc",
                       "specserve:time_to_first_token_seconds", "specserve:inter_token_latency_seconds",
                       "specserve:request_time_per_output_token_seconds",
                       "specserve:prompt_tokens_total", "specserve:generation_tokens_total",
                       "specserve:spec_decode_num_drafts_total", "specserve:spec_decode_num_draft_tokens_total",
                       "specserve:spec_decode_num_accepted_tokens_total",
                       "specserve:spec_decode_num_accepted_tokens_per_pos_total", "specserve:spec_decode_draft_seconds_total",
                       "specserve:spec_decode_verify_seconds_total", "specserve:prefix_cache_queries_total",
                       "specserve:prefix_cache_hits_total", "specserve:num_preemptions_total",
                       "specserve:spec_decode_goodput_drafting_total",
                       "specserve:spec_decode_goodput_skipped_total"):
            self.assertIn("# TYPE " + family, text)
        ttft = [v for k, v in values.items() if k.startswith("specserve:time_to_first_token_seconds_count")]
        self.assertGreaterEqual(ttft[0], 1)
        per_pos = sum(v for k, v in values.items() if k.startswith("specserve:spec_decode_num_accepted_tokens_per_pos_total"))
        accepted = sum(v for k, v in values.items() if k.startswith("specserve:spec_decode_num_accepted_tokens_total"))
        self.assertEqual(per_pos, accepted)
        self.assertGreater(sum(v for k, v in values.items() if k.startswith("specserve:prompt_tokens_total")), 0)


def main():
    global ARGS, SPEC, PLAIN
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True, help="the specserve binary")
    p.add_argument("--model", default="", help="GGUF model (default: the server's default)")
    ARGS, rest = p.parse_known_args()
    SPEC = Server("speculative server", ["--speculative-config", json.dumps(
        {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4})],
        api_key=API_KEY)
    PLAIN = Server("plain server", [])
    try:
        saw_503 = SPEC.wait_healthy()
        PLAIN.wait_healthy()
        print("servers healthy (spec server answered 503 before ready: %s)" % saw_503, flush=True)
        prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
        ok = prog.result.wasSuccessful()
        if not ok:
            print("---- speculative server log ----\n" + SPEC.log_text())
            print("---- plain server log ----\n" + PLAIN.log_text())
    finally:
        SPEC.stop()
        PLAIN.stop()
    for s in (SPEC, PLAIN):
        if s.proc.returncode not in (0, -signal.SIGTERM):
            print("%s exited with %s" % (s.name, s.proc.returncode))
            ok = False
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
