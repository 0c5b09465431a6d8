"""A load generator for the OpenAI-compatible server: Poisson arrivals at a sweep of request rates, latencies
measured by the client over HTTP streaming (what vLLM's ``benchmark_serving`` measures).

    python -m minillm.serve --model tiny --port 8000 &
    python -m minillm.serve_bench --url http://127.0.0.1:8000 --rates 2,4,8,inf --num-prompts 64 \\
        --input-len 64 --output-len 32 --slo-ttft-ms 500 --slo-tpot-ms 50 --out sweep.json

For each rate, ``num_prompts`` requests are sent to ``/v1/completions`` with ``stream: true``, their start times
drawn as a Poisson process (exponential gaps of mean 1/rate; ``inf`` sends them all at once, a burst), each
asking for exactly ``output_len`` tokens (``ignore_eos``) after a prompt of about ``input_len`` bytes (the
byte-level model: one token per byte). Per request the client records

* TTFT: from sending the request to the first streamed text;
* ITL: the gaps between streamed chunks (a chunk may carry more than one token);
* TPOT: (E2E - TTFT) / (output tokens - 1), the tokens counted by the server's final ``usage``;
* E2E: from sending to the last byte.

Per rate: mean, median, p90 and p99 of each, request and output-token throughput over the run, and goodput:
requests per second that met every SLO given (TTFT, TPOT, E2E), as in DistServe and vLLM's benchmark.

From Python (a notebook, a benchmark suite): :func:`sweep` (blocking; runs its own event loop in a thread, so it
works inside Jupyter) returns one dict per rate; :func:`run_rate` is the async core. Needs an HTTP client:
``httpx2`` (what the ``openai`` client uses) or ``httpx``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import threading
import time
from dataclasses import asdict, dataclass, field

import numpy as np

try:
    import httpx2 as httpx
except ImportError:                     # pragma: no cover - either client works
    import httpx

SNIPPET = ("def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
           "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n"
           "        self.items.append(x)\n\nimport os\nimport sys\n\nfor i in range(10):\n    print(i)\n")


@dataclass
class RequestResult:
    ok: bool
    prompt_len: int
    output_tokens: int = 0
    ttft: float = math.nan
    e2e: float = math.nan
    itl: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def tpot(self) -> float:
        return (self.e2e - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else math.nan


def make_prompts(n: int, input_len: int, seed: int = 0, spread: float = 0.25) -> list[str]:
    """``n`` prompts of ``input_len`` bytes on average (uniform within +-spread), cut from code text at random
    offsets (so prefix caching does not make them free)."""
    rng = np.random.default_rng(seed)
    text = SNIPPET * (2 + input_len // len(SNIPPET) * 2)
    lo, hi = max(1, int(input_len * (1 - spread))), max(1, int(input_len * (1 + spread)))
    out = []
    for _ in range(n):
        length = int(rng.integers(lo, hi + 1))
        start = int(rng.integers(0, len(text) - length))
        out.append(text[start:start + length])
    return out


def arrival_times(n: int, rate: float, seed: int = 0) -> np.ndarray:
    """Start times (s) of ``n`` requests: a Poisson process of ``rate`` requests/s (inf: all at 0)."""
    if math.isinf(rate):
        return np.zeros(n)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


async def _one(client, url: str, model: str, prompt: str, output_len: int) -> RequestResult:
    body = {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0.0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    res = RequestResult(ok=False, prompt_len=len(prompt.encode()))
    t0 = time.perf_counter()
    last = None
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread()).decode()[:200]}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                msg = json.loads(data)
                if "error" in msg:
                    res.error = msg["error"].get("message", "error")
                    return res
                if msg.get("usage"):
                    res.output_tokens = msg["usage"]["completion_tokens"]
                for ch in msg.get("choices", []):
                    if ch.get("text"):
                        now = time.perf_counter()
                        if last is None:
                            res.ttft = now - t0
                        else:
                            res.itl.append(now - last)
                        last = now
        res.e2e = time.perf_counter() - t0
        res.ok = last is not None
        if not res.ok:
            res.error = "no text came back"
    except Exception as e:                        # a failed request is counted, not fatal
        res.error = f"{type(e).__name__}: {e}"
    return res


def _stats(xs) -> dict:
    a = np.asarray([x for x in xs if np.isfinite(x)], np.float64)
    if a.size == 0:
        return {"mean": math.nan, "median": math.nan, "p90": math.nan, "p99": math.nan}
    return {"mean": float(a.mean()), "median": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99))}


def summarize(results: list[RequestResult], duration: float, rate: float, slo_ttft: float | None = None,
              slo_tpot: float | None = None, slo_e2e: float | None = None) -> dict:
    """One rate's metrics (seconds; throughputs per second; goodput: requests/s meeting every SLO given)."""
    ok = [r for r in results if r.ok]

    def good(r):
        return ((slo_ttft is None or r.ttft <= slo_ttft) and (slo_tpot is None or not (r.tpot > slo_tpot))
                and (slo_e2e is None or r.e2e <= slo_e2e))
    return {"rate": rate, "num_requests": len(results), "completed": len(ok), "failed": len(results) - len(ok),
            "errors": sorted({r.error for r in results if r.error})[:5], "duration": duration,
            "request_throughput": len(ok) / duration, "output_throughput": sum(r.output_tokens for r in ok) / duration,
            "goodput": sum(good(r) for r in ok) / duration, "slo": {"ttft": slo_ttft, "tpot": slo_tpot, "e2e": slo_e2e},
            "ttft": _stats(r.ttft for r in ok), "tpot": _stats(r.tpot for r in ok),
            "itl": _stats(x for r in ok for x in r.itl), "e2e": _stats(r.e2e for r in ok)}


async def run_rate(url: str, rate: float, prompts: list[str], output_len: int, model: str = "tiny", seed: int = 0,
                   max_concurrency: int | None = None, timeout: float = 600.0, **slo) -> tuple[dict, list]:
    """Send ``prompts`` at Poisson ``rate`` and wait for all; returns (summary, per-request results)."""
    starts = arrival_times(len(prompts), rate, seed)
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        t0 = time.perf_counter()

        async def launch(prompt, at):
            delay = at - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            if sem is None:
                return await _one(client, url, model, prompt, output_len)
            async with sem:
                return await _one(client, url, model, prompt, output_len)

        results = await asyncio.gather(*(launch(p, float(a)) for p, a in zip(prompts, starts)))
        duration = time.perf_counter() - t0
    return summarize(list(results), duration, rate, **slo), list(results)


def sweep(url: str, rates, num_prompts: int = 32, input_len: int = 64, output_len: int = 16, model: str = "tiny",
          seed: int = 0, slo_ttft: float | None = None, slo_tpot: float | None = None, slo_e2e: float | None = None,
          max_concurrency: int | None = None, keep_requests: bool = False, warmup: int = 2) -> list[dict]:
    """Run :func:`run_rate` for each rate in turn (same prompts) and return the summaries; with
    ``keep_requests`` each summary holds its per-request results under "requests". First ``warmup`` requests
    are sent and not measured (the first requests of a fresh server pay one-off costs). Blocking, and safe
    inside a running event loop (Jupyter): the client runs its own loop in a thread."""
    prompts = make_prompts(num_prompts, input_len, seed)
    out: list[dict] = []
    err: list[BaseException] = []

    def work():
        try:
            if warmup:
                asyncio.run(run_rate(url, math.inf, make_prompts(warmup, input_len, seed + 1), output_len, model))
            for r in rates:
                s, reqs = asyncio.run(run_rate(url, float(r), prompts, output_len, model, seed, max_concurrency,
                                               slo_ttft=slo_ttft, slo_tpot=slo_tpot, slo_e2e=slo_e2e))
                s.update(input_len=input_len, output_len=output_len)
                if keep_requests:
                    s["requests"] = [asdict(x) for x in reqs]
                out.append(s)
        except BaseException as e:                  # pragma: no cover - re-raised below
            err.append(e)

    t = threading.Thread(target=work, name="serve-bench")
    t.start()
    t.join()
    if err:
        raise err[0]
    return out


def format_table(rows: list[dict]) -> str:
    """The summaries of :func:`sweep` as a text table (latencies in ms)."""
    head = f"{'rate':>6} {'done':>5} {'req/s':>7} {'tok/s':>8} {'good/s':>7} {'TTFT p50':>9} {'p99':>8} " \
           f"{'TPOT p50':>9} {'p99':>8} {'ITL p99':>8} {'E2E p50':>8}"
    lines = [head]
    for s in rows:
        ms = lambda k, q: f"{1e3 * s[k][q]:.1f}"  # noqa: E731
        lines.append(f"{s['rate']:>6} {s['completed']:>5} {s['request_throughput']:>7.2f} "
                     f"{s['output_throughput']:>8.1f} {s['goodput']:>7.2f} {ms('ttft', 'median'):>9} "
                     f"{ms('ttft', 'p99'):>8} {ms('tpot', 'median'):>9} {ms('tpot', 'p99'):>8} "
                     f"{ms('itl', 'p99'):>8} {ms('e2e', 'median'):>8}")
    return "\n".join(lines) + "\n(latencies in ms)"


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(prog="python -m minillm.serve_bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--rates", default="1,2,4,inf", help="requests/s, comma-separated; inf = a burst")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-concurrency", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=2, help="unmeasured requests sent first")
    ap.add_argument("--slo-ttft-ms", type=float, default=None)
    ap.add_argument("--slo-tpot-ms", type=float, default=None)
    ap.add_argument("--slo-e2e-ms", type=float, default=None)
    ap.add_argument("--out", default=None, help="write the summaries (and per-request results) here as JSON")
    a = ap.parse_args(argv)
    ms = lambda v: None if v is None else v / 1e3  # noqa: E731
    rows = sweep(a.url, [float(r) for r in a.rates.split(",")], a.num_prompts, a.input_len, a.output_len, a.model,
                 a.seed, ms(a.slo_ttft_ms), ms(a.slo_tpot_ms), ms(a.slo_e2e_ms), a.max_concurrency,
                 keep_requests=a.out is not None, warmup=a.warmup)
    print(format_table(rows))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    return rows


if __name__ == "__main__":
    main()
