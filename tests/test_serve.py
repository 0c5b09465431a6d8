"""The OpenAI-compatible server (minillm.serve) under the official ``openai`` client: completions, chat,
streaming, cancellation mid-stream and on a non-streaming call, concurrent clients, greedy tokens equal to
LLM.generate, bad requests refused with 4xx while other requests complete; and the ``python -m minillm.serve``
command in a subprocess."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx2")
pytest.importorskip("fastapi")

from minillm.serve import Server  # noqa: E402
from minillm.serving import LLM, SamplingParams  # noqa: E402

PROMPTS = ["def add(a, b):", "import numpy as np\n", "class Stack:\n    def push(self, x):", "for i in range(10):"]


@pytest.fixture(scope="module")
def server():
    with Server(LLM("tiny")) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference():
    """Greedy outputs of the offline API, one request at a time."""
    llm = LLM("tiny")
    return lambda prompt, n: llm.generate([prompt], SamplingParams(max_tokens=n), progress=False)[0]


def _idle(server, timeout=10.0) -> bool:
    eng = server.app.state.minillm.engine
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        with eng.lock:
            if not eng.has_unfinished() and not eng.requests:
                return True
        time.sleep(0.02)
    return False


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    r = httpx.get(server.url + "/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    assert "minillm:num_requests_running 0" in httpx.get(server.url + "/metrics").text


def test_greedy_completion_tokens_equal_llm_generate(client, reference):
    for p in PROMPTS:
        r = client.completions.create(model="tiny", prompt=p, max_tokens=12, temperature=0,
                                      extra_body={"return_token_ids": True})
        ref = reference(p, 12)
        ch = r.choices[0]
        assert ch.model_extra["token_ids"] == ref.token_ids and ch.text == ref.outputs[0].text
        assert ch.model_extra["prompt_token_ids"] == ref.prompt_token_ids
        assert ch.finish_reason == ref.outputs[0].finish_reason
        assert r.usage.prompt_tokens == len(ref.prompt_token_ids) and r.usage.completion_tokens == len(ref.token_ids)


def test_chat_is_the_offline_chat(client):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=10, temperature=0)
    ref = LLM("tiny").chat(msgs, SamplingParams(max_tokens=10))[0].outputs[0]
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == ref.text
    assert r.object == "chat.completion" and r.choices[0].finish_reason == ref.finish_reason


def test_streaming_sends_the_same_text_in_pieces(client):
    full = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=20, temperature=0).choices[0]
    pieces, finish, usage = [], None, None
    for ch in client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=20, temperature=0, stream=True,
                                        stream_options={"include_usage": True}):
        if ch.choices:
            pieces.append(ch.choices[0].text)
            finish = ch.choices[0].finish_reason or finish
        else:
            usage = ch.usage
    assert "".join(pieces) == full.text and len([p for p in pieces if p]) > 1 and finish == full.finish_reason
    assert usage.completion_tokens == 20
    chat = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0, stream=True)]
    ref = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                         temperature=0).choices[0].message.content
    assert "".join(chat) == ref


def test_stop_strings_n_seed_and_logprobs(client):
    r = client.completions.create(model="tiny", prompt="def f(x):", max_tokens=30, temperature=0, stop=["  "],
                                  extra_body={"return_token_ids": True})
    ch = r.choices[0]
    assert ch.finish_reason == "stop" and "  " not in ch.text and ch.model_extra["stop_reason"] == "  "
    r = client.completions.create(model="tiny", prompt="x = ", max_tokens=8, temperature=1.0, n=3, seed=5,
                                  logprobs=2)
    again = client.completions.create(model="tiny", prompt="x = ", max_tokens=8, temperature=1.0, n=3, seed=5)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [c.text for c in again.choices]      # seeded: reproducible
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 8
    assert all(v <= 0 for v in lp.token_logprobs) and all(2 <= len(t) <= 3 for t in lp.top_logprobs)


def test_cancel_mid_stream_aborts_the_request(server, client):
    loop = server.app.state.minillm.loop
    steps = loop.steps
    stream = client.completions.create(model="tiny", prompt="a", max_tokens=480, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    got = 0
    for ch in stream:
        got += bool(ch.choices and ch.choices[0].text)
        if got == 3:
            break
    stream.close()                                  # the client goes away
    assert _idle(server), "the abandoned request kept running"
    assert loop.steps - steps < 240                 # it did not run to its 480 tokens


def test_client_timeout_on_a_non_streaming_call_aborts_it(server, client):
    loop = server.app.state.minillm.loop
    steps = loop.steps
    with pytest.raises(openai.APITimeoutError):
        client.with_options(timeout=0.3).completions.create(model="tiny", prompt="a", max_tokens=480,
                                                            temperature=0, extra_body={"ignore_eos": True})
    assert _idle(server)
    # 480 tokens take 480 steps (the first from the prefill): fewer means the request was aborted, not finished.
    # (How many ran before the abort depends on the machine's load: a bound of 240 failed on a busy 2-core CI.)
    assert loop.steps - steps < 480


def test_concurrent_clients_share_steps_and_get_their_own_tokens(server, client, reference):
    loop = server.app.state.minillm.loop
    work = [(p, 10 + 3 * i) for i, p in enumerate(PROMPTS * 2)]
    got, errors = [None] * len(work), []

    def one(i):
        try:
            p, n = work[i]
            got[i] = client.completions.create(model="tiny", prompt=p, max_tokens=n, temperature=0,
                                               extra_body={"return_token_ids": True, "ignore_eos": True}
                                               ).choices[0].model_extra["token_ids"]
        except Exception as e:                      # pragma: no cover - reported below
            errors.append(e)

    steps = loop.steps
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(work))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    llm = LLM("tiny")
    for (p, n), ids in zip(work, got):
        assert ids == llm.generate([p], SamplingParams(max_tokens=n, ignore_eos=True), progress=False)[0].token_ids
    assert loop.steps - steps < sum(n for _, n in work)   # continuous batching: requests shared steps


@pytest.mark.parametrize("body,status", [
    (dict(prompt="x", max_tokens=0), 400), (dict(prompt="x", temperature=-1), 400), (dict(prompt="x", top_p=2), 400),
    (dict(prompt="x", n=0), 400), (dict(prompt="x" * 600, max_tokens=4), 400), (dict(prompt=[1, 2, 99999]), 400),
    (dict(prompt="x", presence_penalty=0.5), 400), (dict(prompt={"a": 1}), 400), (dict(), 400),
    (dict(prompt="x", model="gpt-4"), 404), (dict(prompt="x", stop_token_ids=[10**6]), 400),
    (dict(prompt="x", logprobs=21), 400), (dict(prompt="x", logprobs=1, stream=True), 400),
    # strict types (were coerced: "5" ran five tokens, true one, "yes" streamed, [true, false] ran as ids [1, 0])
    (dict(prompt="x", max_tokens="5"), 400), (dict(prompt="x", max_tokens=True), 400),
    (dict(prompt="x", stream="yes"), 400), (dict(prompt=[True, False]), 400), (dict(prompt=[1.0, 2.0]), 400),
    (dict(prompt="x", logprobs=True), 400), (dict(prompt="x", n=True), 400), (dict(prompt="x", n=129), 400),
])
def test_bad_requests_get_a_4xx_json_error_while_a_stream_keeps_running(server, client, reference, body, status):
    stream = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=40, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    it = iter(stream)
    first = next(it).choices[0].text
    r = httpx.post(server.url + "/v1/completions", json={"model": "tiny", **body})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and err["message"]
    text = first + "".join(c.choices[0].text for c in it if c.choices)
    ref = LLM("tiny").generate([PROMPTS[0]], SamplingParams(max_tokens=40, ignore_eos=True), progress=False)[0]
    assert text == ref.outputs[0].text                 # the stream was unaffected
    assert _idle(server)


def test_the_openai_client_raises_its_own_errors(client):
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model="tiny", prompt="x", max_tokens=0)
    with pytest.raises(openai.NotFoundError, match="gpt-4"):
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])
    assert client.completions.create(model="tiny", prompt="x", max_tokens=2).choices[0].finish_reason == "length"


def test_bad_chat_messages_are_refused(server):
    for msgs in ([{"role": "robot", "content": "hi"}], [{"content": "hi"}], "hi", [{"role": "user", "content": 5}],
                 []):
        r = httpx.post(server.url + "/v1/chat/completions", json={"model": "tiny", "messages": msgs})
        assert r.status_code == 400 and r.json()["error"]["message"], (msgs, r.text)


def test_python_dash_m_minillm_serve_starts_a_server():
    proc = subprocess.Popen([sys.executable, "-m", "minillm.serve", "--model", "tiny", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stdout.readline()
        m = re.search(r"on (http://\S+)", line)
        assert m, line
        c = openai.OpenAI(base_url=m.group(1) + "/v1", api_key="none", max_retries=5, timeout=30)
        r = c.completions.create(model="tiny", prompt="def add(a, b):", max_tokens=6, temperature=0)
        assert r.choices[0].text == LLM("tiny").generate(["def add(a, b):"], SamplingParams(max_tokens=6),
                                                         progress=False)[0].outputs[0].text
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_random_shape_server_streams_every_token():
    """--random-shape (a GPU load test with llama1b) through the same code path on CPU with the small shape:
    ids beyond the bytes decode to one character each, so a client sees every token."""
    from minillm import serve_bench
    from minillm.serve import random_engine
    eng = random_engine("small", runner="numpy", max_num_seqs=8)
    assert eng.vocab_size > 256 or eng.eos_token_id is None
    with Server(eng, "small") as srv:
        rows = serve_bench.sweep(srv.url, [float("inf")], num_prompts=4, input_len=16, output_len=5, model="small",
                                 keep_requests=True)
    assert rows[0]["completed"] == 4 and all(q["output_tokens"] == 5 for q in rows[0]["requests"])


def test_health_stays_ok_after_one_failed_engine_step():
    """Was: one step that raised (its request got a 500, later ones a 200) left /health at "the engine loop is
    down" forever. Now it is down only while the loop thread is dead; the last error stays readable."""
    from minillm import load_model
    from minillm.serving import LLMEngine, NumpyRunner, SchedulerConfig
    from minillm.tokenizer import EOS, ByteTokenizer

    class FailsOnce(NumpyRunner):
        failed = False

        def execute(self, batch):
            if not self.failed:
                self.failed = True
                raise MemoryError("injected: out of memory once")
            return super().execute(batch)

    model = load_model("tiny")
    cfg = model.config
    eng = LLMEngine(FailsOnce(model, 64, 16), 64, 16, cfg.max_seq_len, cfg.vocab_size, SchedulerConfig(),
                    eos_token_id=EOS, tokenizer=ByteTokenizer())
    with Server(eng) as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60)
        with pytest.raises(openai.InternalServerError, match="injected"):
            c.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=4, temperature=0)
        ok = c.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=4, temperature=0)
        assert ok.usage.completion_tokens == 4                # later requests are served
        r = httpx.get(srv.url + "/health")
        assert r.status_code == 200
        assert r.json() == {"status": "ok", "last_error": "MemoryError: injected: out of memory once"}
        assert "minillm:engine_step_errors_total 1" in httpx.get(srv.url + "/metrics").text
        srv.app.state.minillm.loop.stop()                 # a dead loop thread is what makes the server down
        r = httpx.get(srv.url + "/health")
        assert r.status_code == 500 and "the engine loop is down" in r.json()["error"]["message"]


def test_a_huge_top_k_keeps_every_token_and_fails_no_other_request(server, client):
    """Was: top_k=2**63 was accepted, then every engine step raised OverflowError: it and the stream beside it
    both got a 500. A top-k of at least the vocabulary keeps every token."""
    stream = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=40, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    it = iter(stream)
    first = next(it).choices[0].text
    kw = dict(model="tiny", prompt=PROMPTS[1], max_tokens=8, temperature=1.0, seed=3)
    huge = client.completions.create(**kw, extra_body={"top_k": 2**63}).choices[0].text
    assert huge == client.completions.create(**kw).choices[0].text
    text = first + "".join(c.choices[0].text for c in it if c.choices)
    ref = LLM("tiny").generate([PROMPTS[0]], SamplingParams(max_tokens=40, ignore_eos=True), progress=False)[0]
    assert text == ref.outputs[0].text
    assert _idle(server)


def test_a_temperature_below_1e_5_decodes_greedily(client, reference):
    """Was: temperature 1e-308 divided the logits into inf and the tiny model wrote only newlines."""
    got = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=12, temperature=1e-308, seed=1)
    assert got.choices[0].text == reference(PROMPTS[0], 12).outputs[0].text


def test_completion_logprobs_name_each_token_once(server):
    """Was: top_logprobs was a dict keyed by each token's text alone, and every lone byte >= 0x80 decodes to
    U+FFFD: alternatives overwrote each other (5 asked, 1 returned) and the sampled token's entry could hold
    another token's logprob. Now a token that is part of a character is named by its bytes (OpenAI's
    ``bytes:\\xNN``), and text_offset counts characters of the text."""
    prompt = list("# 日本語の文字列\ns = '日本".encode()) + [0xE8]
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 5}
    named = httpx.post(server.url + "/v1/completions", json=body).json()["choices"][0]
    by_id = httpx.post(server.url + "/v1/completions", json={**body, "return_tokens_as_token_ids": True}
                       ).json()["choices"][0]["logprobs"]
    lp = named["logprobs"]
    assert [len(t) for t in lp["top_logprobs"]] == [5] * 6
    # (the second request reads the first's cached prompt blocks: float32 sums in another order, to ~1e-7)
    assert lp["token_logprobs"] == pytest.approx(by_id["token_logprobs"], rel=1e-5)
    for tops, tops_id, tok, tok_lp in zip(lp["top_logprobs"], by_id["top_logprobs"], lp["tokens"],
                                          lp["token_logprobs"]):
        assert sorted(tops.values()) == pytest.approx(sorted(tops_id.values()), rel=1e-5)
        assert tops[tok] == tok_lp                       # the sampled token's own entry
    assert any(t.startswith("bytes:\\x") for t in lp["tokens"] + [k for d in lp["top_logprobs"] for k in d])
    offs, text = lp["text_offset"], named["text"]
    assert offs == sorted(offs) and offs[0] == 0 and offs[-1] <= len(text)
    for tok, off in zip(lp["tokens"], offs):
        if not tok.startswith(("bytes:", "token_id:")):
            assert text[off:off + len(tok)] == tok


def test_a_body_over_the_limit_gets_413_and_the_server_goes_on():
    with Server(LLM("tiny"), max_body_bytes=1000) as srv:
        r = httpx.post(srv.url + "/v1/completions", json={"model": "tiny", "prompt": "x" * 2000})
        assert r.status_code == 413 and "limit of 1000 bytes" in r.json()["error"]["message"], r.text
        ok = httpx.post(srv.url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


def test_malformed_json_is_named_as_such(server):
    """Was: "1: JSON decode error" with param "1" (the character position read as a field name)."""
    r = httpx.post(server.url + "/v1/completions", content=b'{"prompt": ',
                   headers={"content-type": "application/json"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert "not valid JSON" in err["message"] and err["param"] is None


def test_a_client_gone_from_a_non_streaming_call_logs_no_error(server, client):
    """Was: the handler raised CancelledError and uvicorn logged "Exception in ASGI application" with a traceback
    for an ordinary disconnect."""
    import logging

    records = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = records.append
    log = logging.getLogger("uvicorn.error")
    log.addHandler(handler)
    try:
        with pytest.raises(openai.APITimeoutError):
            client.with_options(timeout=0.3).completions.create(model="tiny", prompt="a", max_tokens=480,
                                                                temperature=0, extra_body={"ignore_eos": True})
        assert _idle(server)
        time.sleep(0.5)                              # the handler returns after the abort
    finally:
        log.removeHandler(handler)
    assert not records, [r.getMessage() for r in records]
