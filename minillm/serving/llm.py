"""``LLM``: an engine for a shipped model behind vLLM's offline API (the common subset, same names).

    from minillm.serving import LLM, SamplingParams
    llm = LLM("tiny")
    outs = llm.generate(["def add(a, b):"], SamplingParams(temperature=0.8, top_p=0.95, max_tokens=32))
    print(outs[0].prompt, outs[0].outputs[0].text)

What matches vLLM: ``generate(prompts, sampling_params, use_tqdm=...)`` with prompts as texts, token-id
lists or ``{"prompt": ...}`` / ``{"prompt_token_ids": ...}`` dicts, one SamplingParams or one per prompt;
``RequestOutput.{prompt, prompt_token_ids, outputs, finished}`` and ``CompletionOutput.{index, text, token_ids,
cumulative_logprob, logprobs, finish_reason, stop_reason}``; ``chat(messages, sampling_params)``;
``abort_request(request_id)``; ``get_tokenizer()``; ``SamplingParams(n, temperature, top_p, top_k, min_p,
repetition_penalty, max_tokens, stop, stop_token_ids, seed, logprobs, ignore_eos)``.

What differs, on purpose: ``SamplingParams()`` is greedy (temperature 0; vLLM's default is 1.0); the progress
bar shows by default only from 8 prompts on (``use_tqdm``/``progress`` force it either way); request ids are
integers; ``stream(prompt, params)`` (not in vLLM's offline API) yields token ids, and ``.text()`` on it yields
text pieces. The model is a byte-level model: one token per byte, so a text's tokens are its UTF-8 bytes.
"""
from __future__ import annotations

import inspect
from dataclasses import replace

from .engine import LLMEngine, TokenStream
from .outputs import RequestOutput
from .scheduler import SchedulerConfig
from .sequence import SamplingParams, check_int

__all__ = ["LLM", "SamplingParams", "apply_chat_template"]

ROLES = ("system", "user", "assistant")


def apply_chat_template(messages, add_generation_prompt: bool = True) -> str:
    """The chat template of minillm's byte-level models (they were not trained to chat; this only gives chat
    requests a fixed, documented text form, which vLLM reads from a model's tokenizer config):

        ### system:\n{content}\n\n### user:\n{content}\n\n### assistant:\n

    one block per message, in order, then ``### assistant:\n`` when ``add_generation_prompt``. ``messages``:
    dicts with "role" (system, user or assistant) and "content" (a string, or OpenAI's list of
    ``{"type": "text", "text": ...}`` parts)."""
    if not isinstance(messages, (list, tuple)):
        raise TypeError("messages must be a list of {'role': ..., 'content': ...} dicts")
    if not messages:
        raise ValueError("messages is empty: a chat request needs at least one message")
    out = []
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"each message needs 'role' and 'content', got {m!r}")
        role, content = m["role"], m["content"]
        if role not in ROLES:
            raise ValueError(f"a message's role must be one of {', '.join(ROLES)}, got {role!r}")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise ValueError("a message's content parts must be {'type': 'text', 'text': ...} (text only)")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise ValueError(f"a message's content must be a string, got {type(content).__name__}")
        out.append(f"### {role}:\n{content}\n\n")
    if add_generation_prompt:
        out.append("### assistant:\n")
    return "".join(out)


class LLM:
    """``LLM("tiny").generate(prompts, SamplingParams(...))``: an engine for a model and a runner (see the
    module's doc for how it matches vLLM's ``LLM``).

    runner: "numpy" (the reference, CPU), "torch" (the GPU path: torch model + Triton kernels) or
    "simulated" (counts only). ``num_speculative_tokens=k`` verifies up to k draft tokens per decode step
    (chapter 9), drafted by ``speculative_model``: "ngram" (prompt lookup, the default) or a draft model (a
    shipped name such as "draft", or a ``Model``) run by a second runner of the same kind over a pool that
    mirrors the target's. ``num_blocks`` defaults to enough blocks for ``max_num_seqs`` sequences of
    ``max_seq_len`` tokens, so nothing is preempted unless you ask for a smaller pool.

    On a GPU, "torch" captures its CUDA graphs when the LLM is built (vLLM's and nano-vllm's startup
    capture): one per decode batch size up to ``max_num_seqs`` and one per mixed-step token bucket up to
    ``max_num_batched_tokens``, so decode-only and mixed steps replay graphs. ``enforce_eager=True`` (vLLM's
    name) captures none and runs every step eagerly. Elsewhere (CPU, "numpy", "simulated") there is nothing
    to capture.

    Other keyword arguments go to the runner (``dtype`` for "numpy"; ``device``, ``dtype``, ``attention``,
    ``max_graph_batch`` for "torch"; ``cost`` for "simulated"); any other name raises TypeError. "torch"
    needs the ``[gpu]`` extra (``pip install 'minillm[gpu]'``).
    """

    def __init__(self, model="tiny", runner: str = "numpy", num_blocks: int | None = None, block_size: int = 16,
                 max_num_seqs: int = 64, max_num_batched_tokens: int = 512, max_prefill_chunk: int | None = None,
                 enable_chunked_prefill: bool = True, enable_prefix_caching: bool = True, seed: int = 0,
                 num_speculative_tokens: int = 0, speculative_model="ngram", enforce_eager: bool = False,
                 **runner_kw):
        from ..model import Model, load_model
        from ..tokenizer import EOS, ByteTokenizer

        self._check_runner_kw(runner, runner_kw)
        if runner == "torch":
            runner_kw = {**runner_kw, "cuda_graphs": not enforce_eager}
        block_size = check_int("block_size", block_size, 1)
        if num_blocks is not None:
            num_blocks = check_int("num_blocks", num_blocks, 1)
        sched = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                max_prefill_chunk=max_prefill_chunk, enable_chunked_prefill=enable_chunked_prefill,
                                num_speculative_tokens=num_speculative_tokens)
        self.model = model if isinstance(model, Model) else load_model(model)
        cfg = self.model.config
        if num_blocks is None:
            num_blocks = max_num_seqs * -(-cfg.max_seq_len // block_size)
        run = self._runner(runner, self.model, num_blocks, block_size, runner_kw)
        drafter = None
        if num_speculative_tokens and speculative_model == "ngram":
            from ..speculative import NgramDrafter
            drafter = NgramDrafter()
        elif num_speculative_tokens:
            if runner == "simulated":
                raise ValueError("a draft model needs a runner that computes ('numpy' or 'torch')")
            from .draft import DraftModelProposer
            draft = speculative_model if isinstance(speculative_model, Model) else load_model(speculative_model)
            draft_run = self._runner(runner, draft, num_blocks, block_size, runner_kw)
            draft_run.prepare(replace(sched, num_speculative_tokens=0))   # one logits row per sequence
            drafter = DraftModelProposer(draft_run)
        run.prepare(sched)                      # the torch runner captures its CUDA graphs (none on CPU)
        self.engine = LLMEngine(run, num_blocks, block_size, cfg.max_seq_len, cfg.vocab_size, sched,
                                enable_prefix_caching, eos_token_id=EOS, tokenizer=ByteTokenizer(), seed=seed,
                                drafter=drafter)

    @staticmethod
    def _runner_class(kind: str):
        if kind == "numpy":
            from .runner import NumpyRunner
            return NumpyRunner
        if kind == "torch":
            try:
                from .torch_runner import TorchRunner
            except ImportError as e:
                if (e.name or "").split(".")[0] in ("torch", "triton"):
                    raise ImportError(f"runner='torch' needs PyTorch, which is not installed ({e}): install the "
                                      f"GPU extra, pip install 'minillm[gpu]'") from e
                raise
            return TorchRunner
        if kind == "simulated":
            from .runner import SimulatedRunner
            return SimulatedRunner
        raise ValueError(f"runner must be 'numpy', 'torch' or 'simulated', got {kind!r}")

    @classmethod
    def _runner_options(cls, kind: str) -> list[str]:
        """The keyword arguments the runner of this kind takes from ``LLM(...)``."""
        runner = cls._runner_class(kind)
        if kind == "simulated":
            return ["cost", "clock"]                              # its other fields are counters
        given = {"self", "model", "num_blocks", "block_size", "cuda_graphs"}   # the LLM passes these itself
        return [n for n in inspect.signature(runner).parameters if n not in given]

    @classmethod
    def _check_runner_kw(cls, kind: str, kw: dict) -> None:
        accepted = cls._runner_options(kind)
        bad = sorted(set(kw) - set(accepted))
        if bad:
            own = [n for n in inspect.signature(cls.__init__).parameters if n not in ("self", "runner_kw")]
            raise TypeError(f"LLM() got unexpected keyword argument(s) {', '.join(map(repr, bad))}: it takes "
                            f"{', '.join(own)}, and for runner={kind!r} "
                            f"{', '.join(accepted) if accepted else 'nothing else'}")

    @classmethod
    def _runner(cls, kind: str, model, num_blocks: int, block_size: int, kw: dict):
        if kind == "simulated":
            return cls._runner_class(kind)(**kw)
        return cls._runner_class(kind)(model, num_blocks, block_size, **kw)

    def generate(self, prompts, sampling_params=None, progress: bool | None = None, *, use_tqdm: bool | None = None,
                 params=None) -> list[RequestOutput]:
        """:meth:`LLMEngine.generate`: one RequestOutput per prompt, in order (thread-safe; raises
        :class:`RequestFailed` if a request failed). ``sampling_params``: one SamplingParams for all prompts
        or one per prompt (None: greedy, 16 tokens). ``use_tqdm`` is vLLM's name for ``progress`` (default:
        a bar from 8 requests on); ``params`` the book's older name for ``sampling_params``."""
        if params is not None:
            if sampling_params is not None:
                raise TypeError("pass sampling_params or params, not both")
            sampling_params = params
        if use_tqdm is not None:
            if progress is not None:
                raise TypeError("pass use_tqdm or progress, not both")
            progress = bool(use_tqdm)
        return self.engine.generate(prompts, sampling_params, progress)

    def chat(self, messages, sampling_params=None, use_tqdm: bool | None = None, *,
             add_generation_prompt: bool = True, chat_template=None) -> list[RequestOutput]:
        """vLLM's ``LLM.chat``: ``messages`` is one conversation (a list of {"role", "content"} dicts) or a list
        of them; each is rendered by :func:`apply_chat_template` (or ``chat_template(messages)``, a function)
        and generated. Returns one RequestOutput per conversation."""
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        render = chat_template or (lambda m: apply_chat_template(m, add_generation_prompt))
        return self.generate([render(c) for c in convs], sampling_params, use_tqdm=use_tqdm)

    def stream(self, prompt, params=None, *, sampling_params=None) -> TokenStream:
        """:meth:`LLMEngine.stream`: an iterator over one request's token ids (closing or dropping it aborts);
        ``.text()`` on it yields the text as it grows. ``.request_id`` is the id ``abort_request`` takes."""
        return self.engine.stream(prompt, sampling_params if params is None else params)

    def abort_request(self, request_id) -> None:
        """Abort a request (or an iterable of them) by id, from any thread: a stream's ``request_id``, or one
        of ``llm.engine.add_request``. Unknown or already finished ids are ignored, as in vLLM."""
        ids = [request_id] if isinstance(request_id, (int, str)) else list(request_id)
        for i in ids:
            try:
                self.engine.abort_request(int(i))
            except (KeyError, ValueError):
                pass

    def get_tokenizer(self):
        """The tokenizer (byte-level: ``encode`` / ``decode``)."""
        return self.engine.tokenizer
