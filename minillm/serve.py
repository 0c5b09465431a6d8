"""An OpenAI-compatible HTTP server over the engine: ``python -m minillm.serve --model tiny``.

Endpoints: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (streamed as server-sent events with
``"stream": true``, else one JSON answer), ``GET /v1/models``, ``GET /health``. Any OpenAI client works:

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")
    client.completions.create(model="tiny", prompt="def add(a, b):", max_tokens=16, temperature=0)

How it runs. One engine loop thread owns the stepping: it steps the engine while any request is unfinished
and hands each request's new tokens to the HTTP handler that waits for them (an asyncio queue on the web
server's event loop). Handlers add requests from any number of concurrent connections; each step serves all
of them (continuous batching). A client that disconnects -- a closed stream, a cancelled non-streaming call --
has its requests aborted, which frees their KV blocks at once. A bad request (unknown model, a value
SamplingParams refuses, a prompt too long for the model) gets a 4xx JSON error in OpenAI's shape
(``{"error": {"message", "type", "param", "code"}}``) and never reaches the engine, so the others keep running.

Parameters: OpenAI's ``max_tokens`` (chat: also ``max_completion_tokens``), ``temperature`` (default 1.0, as
OpenAI's; the offline API's default is greedy), ``top_p``, ``n``, ``stop``, ``seed``, ``logprobs`` (chat:
``logprobs`` + ``top_logprobs``; not with streaming), ``stream_options.include_usage``; and vLLM's extras
(``extra_body`` in the OpenAI client): ``top_k``, ``min_p``, ``repetition_penalty``, ``stop_token_ids``,
``ignore_eos``, ``return_token_ids`` (each choice carries ``token_ids`` and ``prompt_token_ids``).
``presence_penalty``, ``frequency_penalty``, ``logit_bias``, ``best_of`` > n and ``echo`` are refused (400), as
are ``n`` over 128 and values of the wrong JSON type (:mod:`minillm.serve_api`); a body over ``--max-body-bytes``
(16 MiB) gets a 413.
Prompts may be a string, a list of token ids, or a list of either (the completions endpoint).

The web stack (FastAPI, uvicorn) is the ``serve`` extra: ``pip install 'minillm[serve]'``. ``import minillm``
never imports it. In a notebook or a test, :class:`Server` runs the server in a thread on a free port.
"""
from __future__ import annotations

import argparse
import asyncio
import codecs
import json
import socket
import threading
import time
import uuid

try:
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import StreamingResponse
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
except ImportError as e:         # pragma: no cover - the message is the point
    raise ImportError(f"minillm.serve needs the web stack ({e}): pip install 'minillm[serve]'") from e

from .serve_api import (MAX_BODY_BYTES, BadRequest, ChatBody, ClientGone, CompletionBody, RequestBody, error_response,
                        sampling_params)
from .serving import LLM, LLMEngine, SamplingParams
from .serving.llm import apply_chat_template
from .tokenizer import ByteTokenizer


# -- the engine loop -----------------------------------------------------------------------------------------
class EngineLoop:
    """Steps ``llm.engine`` in one thread while it has work; hands each tracked request's progress to the
    asyncio queue of the handler that added it: ("tokens", request id, its new token ids) after a step that gave it
    tokens, ("done", request id, RequestOutput) once it has finished (the engine then forgets it)."""

    def __init__(self, llm: LLM | LLMEngine):
        self.engine = llm if isinstance(llm, LLMEngine) else llm.engine
        self.trackers: dict[int, tuple] = {}          # request id -> (event loop, queue, [tokens sent])
        self._wake, self._stop = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, name="minillm-engine-loop", daemon=True)
        self.steps = 0                                # engine steps run
        self.tokens = 0                               # output tokens of the tracked requests
        self.error: str | None = None                 # the last failed step's error (the loop goes on serving)
        self.failed_steps = 0                         # steps that raised (their requests got a 500)
        self.fatal: str | None = None                 # what ended the loop thread, if anything did

    def start(self) -> EngineLoop:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self.thread.join(timeout=10)

    def add(self, prompt, params: SamplingParams, aloop, queue) -> int:
        """Queue a request (raises, queuing nothing, if the engine refuses it) and track it. Any thread. The
        prompt is tokenized and checked before the engine's lock is taken: a long one does not stall the steps."""
        eng = self.engine
        request = eng.prepare(prompt, params)
        with eng.lock:
            rid = eng.add_prepared(request)
            self.trackers[rid] = (aloop, queue, [0])
        self._wake.set()
        return rid

    def abort(self, rid: int) -> None:
        """Stop tracking a request and abort it if it is unfinished (its client went away). Any thread."""
        eng = self.engine
        with eng.lock:
            self.trackers.pop(rid, None)
            if rid in eng.requests:
                eng.abort_request(rid)
                eng.output(rid)                        # hand it over: the engine forgets it

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as e:                    # the thread dies: /health says why
            self.fatal = f"{type(e).__name__}: {e}"
            raise

    def _serve(self) -> None:
        eng = self.engine
        while not self._stop.is_set():
            self._wake.clear()
            if not eng.has_unfinished():
                self._publish()                       # requests aborted or finished while idle
                self._wake.wait(0.1)
                continue
            try:
                eng.step()
                self.steps += 1
            except Exception as e:                    # an engine bug: fail what is tracked, keep serving
                self.error, self.failed_steps = f"{type(e).__name__}: {e}", self.failed_steps + 1
                with eng.lock:
                    for rid in list(self.trackers):
                        aloop, q, _ = self.trackers.pop(rid)
                        self._send(aloop, q, ("error", rid, self.error))
                        if rid in eng.requests:
                            eng.abort_request(rid)
                            eng.output(rid)
            self._publish()

    @staticmethod
    def _send(aloop, q, item) -> None:
        try:
            aloop.call_soon_threadsafe(q.put_nowait, item)
        except RuntimeError:                          # that event loop has closed: nobody is listening
            pass

    def _publish(self) -> None:
        eng = self.engine
        with eng.lock:
            for rid, (aloop, q, sent) in list(self.trackers.items()):
                seq = eng.requests.get(rid)
                if seq is None:
                    continue
                self.tokens += max(0, len(seq.output) - sent[0])
                if seq.finished:
                    del self.trackers[rid]
                    self._send(aloop, q, ("done", rid, eng.output(rid)))
                elif len(seq.output) > sent[0]:
                    new = seq.output[sent[0]:]
                    sent[0] = len(seq.output)
                    self._send(aloop, q, ("tokens", rid, new))


class _App:
    def __init__(self, llm: LLM | LLMEngine, model_name: str):
        self.name, self.created = model_name, int(time.time())
        self.loop = EngineLoop(llm).start()
        self.engine = self.loop.engine
        if self.engine.tokenizer is None:
            raise ValueError("the server needs an engine with a byte-level tokenizer (encode, decode, decode_bytes): "
                             "LLMEngine(..., tokenizer=ByteTokenizer())")
        self.tok = self.engine.tokenizer
        self.max_model_len = self.engine.scheduler.max_model_len

    # -- adding and collecting --------------------------------------------------------------------------------
    async def _add_all(self, prompts, params: SamplingParams):
        """Add n requests per prompt (seed + i for sample i, as LLM.generate does); abort them all and raise
        BadRequest if the engine refuses one. Returns (queue, [(choice index, request id, prompt index)])."""
        aloop, q = asyncio.get_running_loop(), asyncio.Queue()
        added = []
        try:
            for i, p in enumerate(prompts):
                for c in range(params.n):
                    seed = None if params.seed is None else (params.seed + c) % 2**32
                    one = SamplingParams(**{**_fields(params), "n": 1, "seed": seed})
                    rid = await run_in_threadpool(self.loop.add, p, one, aloop, q)
                    added.append((i * params.n + c, rid, i))
        except (TypeError, ValueError) as e:          # RequestRejected is a ValueError
            for _, rid, _ in added:
                self.loop.abort(rid)
            raise BadRequest(str(e)) from None
        except BaseException:
            for _, rid, _ in added:
                self.loop.abort(rid)
            raise
        return q, added

    async def _collect(self, request: Request, q: asyncio.Queue, added) -> dict:
        """Wait for every request to finish; abort them all if the client disconnects first."""
        outs, pending = {}, {rid for _, rid, _ in added}
        checked = time.monotonic()
        try:
            while pending:
                if time.monotonic() - checked > 0.2:      # every 0.2 s, whether tokens are coming or not
                    checked = time.monotonic()
                    if await request.is_disconnected():
                        raise ClientGone
                try:
                    kind, rid, item = await asyncio.wait_for(q.get(), 0.2)
                except asyncio.TimeoutError:
                    continue
                if kind == "error":
                    raise RuntimeError(item)
                if kind == "done":
                    if item.finish_reason == "error":
                        raise RuntimeError(f"request {rid} failed: {item.error}")
                    outs[rid] = item
                    pending.discard(rid)
        finally:
            for rid in pending:
                self.loop.abort(rid)
        return outs

    def _prompts(self, body: CompletionBody) -> list:
        p = body.prompt
        if isinstance(p, str) or (isinstance(p, list) and p and isinstance(p[0], int)):
            return [p]
        if not p:
            raise BadRequest("prompt is empty", param="prompt")
        return list(p)

    def _check_model(self, body: RequestBody) -> None:
        if body.model is not None and body.model != self.name:
            raise BadRequest(f"The model `{body.model}` does not exist (this server serves `{self.name}`).", 404,
                             "model")

    # -- /v1/completions ----------------------------------------------------------------------------------------
    async def completions(self, request: Request, body: CompletionBody):
        self._check_model(body)
        if body.echo:
            raise BadRequest("echo is not supported by this server", param="echo")
        if body.suffix:
            raise BadRequest("suffix is not supported by this server", param="suffix")
        if body.best_of is not None and body.best_of != body.n:
            raise BadRequest("best_of other than n is not supported by this server", param="best_of")
        params = sampling_params(body, 16 if body.max_tokens is None else body.max_tokens, body.logprobs)
        q, added = await self._add_all(self._prompts(body), params)
        rid_, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        if body.stream:
            def chunk(index, text, finish):
                return {"id": rid_, "object": "text_completion", "created": created, "model": self.name,
                        "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish}]}
            return self._stream(request, q, added, params, chunk, body, "text_completion")
        outs = await self._collect(request, q, added)
        choices = []
        for index, rid, _ in added:
            o = outs[rid]
            c = o.outputs[0]
            ch = {"index": index, "text": c.text, "logprobs": self._completion_logprobs(c, body),
                  "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
            if body.return_token_ids:
                ch.update(token_ids=c.token_ids, prompt_token_ids=o.prompt_token_ids)
            choices.append(ch)
        return {"id": rid_, "object": "text_completion", "created": created, "model": self.name,
                "choices": choices, "usage": self._usage(added, outs)}

    @staticmethod
    def _usage(added, outs) -> dict:
        """OpenAI's usage: each prompt's tokens once (however many samples it has), every sample's tokens."""
        prompts = {i: len(outs[rid].prompt_token_ids) for _, rid, i in added if rid in outs}
        c = sum(len(outs[rid].token_ids) for _, rid, _ in added if rid in outs)
        p = sum(prompts.values())
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def _token(self, t: int, as_id: bool) -> str:
        """A token as logprobs name it, one name per token: its text where its bytes are whole UTF-8 characters,
        OpenAI's ``bytes:\\xNN`` where they are part of one, ``token_id:N`` (vLLM's form) for a token with no
        bytes (a special) or when the request asks for ids."""
        data = b"" if as_id else self.tok.decode_bytes([t])
        if not data:
            return f"token_id:{t}"
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in data)

    def _completion_logprobs(self, c, body) -> dict | None:
        if c.logprobs is None:
            return None
        as_id = body.return_tokens_as_token_ids
        tokens, lps, tops, offs = [], [], [], []
        chars, utf8 = 0, codecs.getincrementaldecoder("utf-8")("replace")  # the text's decoding, token by token
        for t, d in zip(c.token_ids, c.logprobs):
            tokens.append(self._token(t, as_id))
            lps.append(d[t].logprob)
            tops.append({self._token(i, as_id): v.logprob for i, v in d.items()})
            offs.append(chars)              # where the token's first byte lands in the text (its character's start)
            chars += len(utf8.decode(self.tok.decode_bytes([t])))
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offs}

    # -- /v1/chat/completions -----------------------------------------------------------------------------------
    async def chat(self, request: Request, body: ChatBody):
        self._check_model(body)
        try:
            prompt = apply_chat_template(body.messages, body.add_generation_prompt)
        except (TypeError, ValueError) as e:
            raise BadRequest(str(e), param="messages") from None
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        if max_tokens is None:                 # OpenAI's default: what the context has left
            max_tokens = max(1, self.max_model_len - len(self.tok.encode(prompt)))
        if body.top_logprobs is not None and not body.logprobs:
            raise BadRequest("top_logprobs needs logprobs=true", param="top_logprobs")
        params = sampling_params(body, max_tokens, (body.top_logprobs or 0) if body.logprobs else None)
        q, added = await self._add_all([prompt], params)
        rid_, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if body.stream:
            def chunk(index, text, finish, first=False):
                delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
                return {"id": rid_, "object": "chat.completion.chunk", "created": created, "model": self.name,
                        "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            return self._stream(request, q, added, params, chunk, body, "chat")
        outs = await self._collect(request, q, added)
        choices = []
        for index, rid, _ in added:
            o = outs[rid]
            c = o.outputs[0]
            ch = {"index": index, "message": {"role": "assistant", "content": c.text},
                  "logprobs": self._chat_logprobs(c, body), "finish_reason": c.finish_reason,
                  "stop_reason": c.stop_reason}
            if body.return_token_ids:
                ch.update(token_ids=c.token_ids, prompt_token_ids=o.prompt_token_ids)
            choices.append(ch)
        return {"id": rid_, "object": "chat.completion", "created": created, "model": self.name,
                "choices": choices, "usage": self._usage(added, outs)}

    def _chat_logprobs(self, c, body) -> dict | None:
        if c.logprobs is None:
            return None
        as_id = body.return_tokens_as_token_ids

        def entry(t, lp):
            return {"token": self._token(t, as_id), "logprob": lp, "bytes": list(self.tok.decode_bytes([t]))}
        return {"content": [{**entry(t, d[t].logprob),
                             "top_logprobs": [entry(i, v.logprob) for i, v in sorted(d.items(), key=lambda kv: kv[1].rank)
                                              ][:body.top_logprobs or 0]}
                            for t, d in zip(c.token_ids, c.logprobs)]}

    # -- streaming -------------------------------------------------------------------------------------------
    def _stream(self, request: Request, q: asyncio.Queue, added, params, chunk, body, kind) -> StreamingResponse:
        from .serving.outputs import TextDeltas
        index_of = {rid: index for index, rid, _ in added}
        deltas = {rid: TextDeltas(params.stop) for _, rid, _ in added}
        # the text so far, decoded incrementally (each step's new bytes only; a character cut between steps
        # waits for its last byte): the same text as the tokenizer's decode of all ids, at O(new) per step
        decoders = {rid: codecs.getincrementaldecoder("utf-8")("replace") for _, rid, _ in added}
        texts = {rid: "" for _, rid, _ in added}
        usage = bool((body.stream_options or {}).get("include_usage"))

        def sse(obj) -> str:
            return f"data: {json.dumps(obj)}\n\n"

        async def events():
            pending, outs = set(index_of), {}
            try:
                if kind == "chat":
                    for index, _, _ in added:
                        yield sse(chunk(index, "", None, first=True))
                while pending:
                    what, rid, item = await q.get()
                    if what == "error" or (what == "done" and item.finish_reason == "error"):
                        msg = item if what == "error" else f"request {rid} failed: {item.error}"
                        pending.discard(rid)
                        yield sse({"error": {"message": msg, "type": "InternalServerError", "code": 500}})
                        return
                    if what == "tokens":
                        texts[rid] += decoders[rid].decode(self.tok.decode_bytes(item))
                        piece = deltas[rid].push(texts[rid], False)
                        if piece:
                            yield sse(chunk(index_of[rid], piece, None))
                        continue
                    pending.discard(rid)
                    outs[rid] = item
                    c = item.outputs[0]
                    piece = deltas[rid].push(c.text, True)
                    yield sse(chunk(index_of[rid], piece, c.finish_reason))
                if usage:
                    yield sse({"id": chunk(0, "", None)["id"], "object": chunk(0, "", None)["object"],
                               "created": int(time.time()), "model": self.name, "choices": [],
                               "usage": self._usage(added, outs)})
                yield "data: [DONE]\n\n"
            finally:                                   # the client went away (or we are done): abort the rest
                for rid in pending:
                    self.loop.abort(rid)

        return StreamingResponse(events(), media_type="text/event-stream")


def _fields(params: SamplingParams) -> dict:
    from dataclasses import fields
    return {f.name: getattr(params, f.name) for f in fields(params)}


class BodyLimit:
    """ASGI middleware: a request whose Content-Length is over ``max_body_bytes`` gets a 413 before its body is
    read. (Plain ASGI: Starlette's BaseHTTPMiddleware would hide a client's disconnect from the handlers.)"""

    def __init__(self, app, max_body_bytes: int):
        self.app, self.max_body_bytes = app, max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            length = dict(scope["headers"]).get(b"content-length", b"").decode("latin-1")
            if length and (not length.isdigit() or int(length) > self.max_body_bytes):
                await error_response(f"the request body ({length} bytes) is over this server's limit of "
                                     f"{self.max_body_bytes} bytes", 413)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(llm: LLM | LLMEngine, model_name: str = "tiny", max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """The FastAPI app over ``llm`` (an LLM, or an LLMEngine with a tokenizer); its engine loop thread starts
    now, and ``app.state.minillm.loop.stop()`` stops it. A request whose Content-Length is over ``max_body_bytes``
    is refused with 413 before its body is read."""
    state = _App(llm, model_name)
    app = FastAPI(title="minillm", docs_url=None, redoc_url=None)
    app.state.minillm = state

    app.add_middleware(BodyLimit, max_body_bytes=max_body_bytes)

    @app.exception_handler(BadRequest)
    async def bad_request(request, exc: BadRequest):
        return error_response(str(exc), exc.status, exc.param)

    @app.exception_handler(ClientGone)
    async def client_gone(request, exc: ClientGone):
        return error_response("the client disconnected before the answer", 499)

    @app.exception_handler(RequestValidationError)
    async def invalid(request, exc: RequestValidationError):
        errs = exc.errors()
        if errs and errs[0]["type"] == "json_invalid":      # (its loc is the position in the body, not a field)
            pos = errs[0]["loc"][1] if len(errs[0]["loc"]) > 1 else "?"
            return error_response(f"the body is not valid JSON: {errs[0].get('ctx', {}).get('error', 'decode error')} "
                          f"at character {pos}", 400)
        where = ".".join(str(x) for x in errs[0]["loc"][1:]) if errs else None
        msg = "; ".join(f"{'.'.join(str(x) for x in e['loc'][1:])}: {e['msg']}" for e in errs[:3])
        return error_response(msg or "invalid request", 400, where or None)

    @app.exception_handler(HTTPException)
    async def httperror_response(request, exc: HTTPException):
        return error_response(str(exc.detail), exc.status_code)

    @app.exception_handler(RuntimeError)
    async def internal(request, exc: RuntimeError):
        return error_response(str(exc), 500)

    @app.get("/health")
    async def health():
        """Down (500) only while the engine loop thread is dead; a step that failed (its requests got a 500,
        later ones are served) leaves it up, with that step's error as ``last_error``."""
        loop = state.loop
        if not loop.thread.is_alive():
            return error_response(f"the engine loop is down: {loop.fatal or 'stopped'}", 500)
        return {"status": "ok"} if loop.error is None else {"status": "ok", "last_error": loop.error}

    @app.get("/metrics")
    async def metrics():
        """A few of vLLM's Prometheus gauges and counters, under minillm's prefix."""
        from fastapi.responses import PlainTextResponse
        sch = state.engine.scheduler
        lines = [f"minillm:num_requests_running {len(sch.running)}", f"minillm:num_requests_waiting {len(sch.waiting)}",
                 f"minillm:engine_steps_total {state.loop.steps}",
                 f"minillm:generation_tokens_total {state.loop.tokens}",
                 f"minillm:engine_step_errors_total {state.loop.failed_steps}"]
        return PlainTextResponse("\n".join(lines) + "\n")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": state.name, "object": "model", "created": state.created,
                                            "owned_by": "minillm", "max_model_len": state.max_model_len}]}

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionBody):
        return await state.completions(request, body)

    @app.post("/v1/chat/completions")
    async def chat(request: Request, body: ChatBody):
        return await state.chat(request, body)

    return app


# -- running it --------------------------------------------------------------------------------------------
class Server:
    """The server in a background thread (a notebook, a test): ``with Server(LLM("tiny")) as s: s.url``.

    ``port=0`` picks a free port. ``stop()`` (or leaving the ``with``) shuts the web server and the engine
    loop down."""

    def __init__(self, llm: LLM | LLMEngine, model_name: str = "tiny", host: str = "127.0.0.1", port: int = 0,
                 log_level: str = "warning", max_body_bytes: int = MAX_BODY_BYTES):
        self.app = build_app(llm, model_name, max_body_bytes)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.host, self.port = host, self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level=log_level, timeout_graceful_shutdown=1))
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def serve_forever(self) -> None:
        """Run in this thread until interrupted (what ``python -m minillm.serve`` does)."""
        try:
            self.server.run(sockets=[self.sock])
        finally:
            self.app.state.minillm.loop.stop()

    def start(self, timeout: float = 30.0) -> Server:
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True,
                                       name="minillm-http")
        self.thread.start()
        t0 = time.monotonic()
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() - t0 > timeout:
                raise RuntimeError("the HTTP server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout=10)
        self.app.state.minillm.loop.stop()
        self.sock.close()

    def __enter__(self) -> Server:
        return self.start() if self.thread is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


# -- random-weight models of a given shape (load tests on a GPU) ----------------------------------------------
SHAPES = {   # Llama-3.2-1B's shape (as benchmarks/serving.py), and a small one for CPU checks
    "llama1b": dict(vocab_size=128256, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8, d_ff=8192,
                    max_seq_len=2048, rope_theta=500000.0),
    "small": dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=96, max_seq_len=256),
}


class AnyIdTokenizer(ByteTokenizer):
    """The byte tokenizer for a random-weight model whose vocabulary is larger than 259: prompts are UTF-8
    bytes as usual; an id >= 256 decodes to one CJK character (U+4E00 + id mod 20000), so every sampled token
    shows as text and a load generator sees each one arrive."""

    def decode_bytes(self, ids) -> bytes:
        return "".join(chr(i) if i < 128 else (bytes([i]).decode("latin-1") if i < 256 else chr(0x4E00 + i % 20000))
                       for i in map(int, ids)).encode()

    def decode(self, ids) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


def random_engine(shape: str, runner: str = "torch", dtype: str = "bfloat16", max_num_seqs: int = 64,
                  max_num_batched_tokens: int = 512, num_blocks: int | None = None, block_size: int = 16,
                  enforce_eager: bool = False, seed: int = 0) -> LLMEngine:
    """An engine over random weights of a named shape (``SHAPES``), made on the device for "torch" (no host copy
    of a 1B model), with :class:`AnyIdTokenizer` and no end-of-sequence token (random weights never mean to
    stop: clients ask for ``max_tokens``)."""
    from .model import Model, ModelConfig, init_params
    from .serving import NumpyRunner, SchedulerConfig
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; shapes: {', '.join(SHAPES)}")
    cfg = ModelConfig(**SHAPES[shape])
    sched = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)
    if num_blocks is None:
        num_blocks = max_num_seqs * -(-cfg.max_seq_len // block_size)
    if runner == "numpy":
        run = NumpyRunner(Model(cfg, init_params(cfg, seed)), num_blocks, block_size)
    elif runner == "torch":
        import numpy as np
        import torch

        from .serving.torch_runner import TorchRunner
        from .torch_model import TorchModel
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        torch.manual_seed(seed)
        m = TorchModel(cfg).to(device)
        with torch.no_grad():                      # init_params' scales, drawn on the device
            for name, p in m.named_parameters():
                if name.endswith("norm"):
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02 / np.sqrt(2 * cfg.n_layers) if name.endswith(("wo", "w_down")) else 0.02)
        run = TorchRunner(m.to(getattr(torch, dtype)), num_blocks, block_size, device=device,
                          dtype=getattr(torch, dtype), cuda_graphs=not enforce_eager)
    else:
        raise ValueError(f"runner must be 'numpy' or 'torch', got {runner!r}")
    run.prepare(sched)
    return LLMEngine(run, num_blocks, block_size, cfg.max_seq_len, cfg.vocab_size, sched, eos_token_id=None,
                     tokenizer=AnyIdTokenizer(), seed=seed)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m minillm.serve", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", help="a shipped checkpoint (tiny, draft) or an .npz path")
    ap.add_argument("--random-shape", default=None, choices=sorted(SHAPES),
                    help="serve random weights of this shape instead of --model (llama1b: a GPU load test)")
    ap.add_argument("--served-model-name", default=None, help="the model id clients send (default: --model, "
                                                              "or the shape)")
    ap.add_argument("--runner", default="numpy", choices=["numpy", "torch"])
    ap.add_argument("--dtype", default="bfloat16", help="torch runner with --random-shape: the weights' dtype")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="0: a free port (printed)")
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--num-blocks", type=int, default=None)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--log-level", default="warning")
    ap.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES, help="larger request bodies get a 413")
    args = ap.parse_args(argv)
    if args.random_shape:
        llm = random_engine(args.random_shape, args.runner, args.dtype, args.max_num_seqs,
                            args.max_num_batched_tokens, args.num_blocks, enforce_eager=args.enforce_eager)
        name = args.served_model_name or args.random_shape
    else:
        llm = LLM(args.model, runner=args.runner, max_num_seqs=args.max_num_seqs, num_blocks=args.num_blocks,
                  max_num_batched_tokens=args.max_num_batched_tokens, enforce_eager=args.enforce_eager)
        name = args.served_model_name or args.model
    srv = Server(llm, name, args.host, args.port, args.log_level, args.max_body_bytes)
    print(f"minillm.serve: {name} on {srv.url}", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
