"""The OpenAI API's wire format as :mod:`minillm.serve` takes it: the request bodies, the errors in OpenAI's shape,
and a body's sampling parameters.

Bodies are validated strictly: "5", ``true`` and ``1.0`` are not integers and "yes" is not a boolean (OpenAI
answers 400; :class:`~minillm.serving.SamplingParams` refuses them in Python too); an integer is still a number
where a float is asked for. Unknown fields are ignored, as OpenAI's clients send some this server does not use.
"""
from __future__ import annotations

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from .serving import SamplingParams


class RequestBody(BaseModel):
    """The fields completions and chat share (strict: see the module doc)."""
    model_config = ConfigDict(extra="allow", strict=True)
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stream: bool = False
    stream_options: dict | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict | None = None
    user: str | None = None
    # vLLM's extras
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False


class CompletionBody(RequestBody):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


class ChatBody(RequestBody):
    messages: list[dict]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True


MAX_N = 128                     # samples per prompt, as OpenAI allows
MAX_BODY_BYTES = 16 * 2**20     # a request body larger than this is refused (413) before it is read


class ClientGone(Exception):
    """The client of a non-streaming request disconnected before its answer: its requests are aborted and the
    handler answers 499 (nginx's "client closed request") to nobody, instead of an error traceback in the log."""


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.status, self.param = status, param


def error_response(message: str, status: int = 400, param: str | None = None) -> JSONResponse:
    kind = {400: "BadRequestError", 404: "NotFoundError", 413: "RequestTooLargeError", 499: "ClientClosedRequest",
            500: "InternalServerError"}.get(status, "Error")
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}},
                        status_code=status)


def sampling_params(body: RequestBody, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(body, name):
            raise BadRequest(f"{name} is not supported by this server (use repetition_penalty)", param=name)
    if body.logit_bias:
        raise BadRequest("logit_bias is not supported by this server", param="logit_bias")
    if isinstance(body.n, int) and body.n > MAX_N:
        raise BadRequest(f"n must be at most {MAX_N} (OpenAI's limit), got {body.n}", param="n")
    if body.stream and logprobs is not None:
        raise BadRequest("logprobs are not supported with stream=true by this server", param="logprobs")
    kw = dict(temperature=1.0 if body.temperature is None else body.temperature,
              top_p=1.0 if body.top_p is None else body.top_p, max_tokens=max_tokens, n=body.n, seed=body.seed,
              stop=body.stop, stop_token_ids=body.stop_token_ids or (), ignore_eos=body.ignore_eos,
              logprobs=logprobs, top_k=body.top_k, min_p=body.min_p or 0.0,
              repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty)
    try:
        return SamplingParams(**kw)
    except (TypeError, ValueError) as e:
        raise BadRequest(str(e)) from None
