"""The server under load, measured from the client (chapter 8): ``python -m minillm.serve`` in a process of its
own, ``minillm.serve_bench`` sending streamed completions with Poisson arrivals at a sweep of rates.

    python -m benchmarks serving_client                      # record serving_client in results/<gpu>
    python -m benchmarks serving_client --smoke --out /tmp/sc.json          # CPU: a small random model, seconds

On a GPU the server holds random bf16 weights of the Llama-3.2-1B shape on the torch runner (CUDA graphs
captured at startup); per rate the record keeps TTFT, TPOT, ITL and E2E (mean, median, p90, p99), request and
output-token throughput, and goodput under the SLOs given, as vLLM's ``benchmark_serving`` reports them. The
server runs in its own process so the client's event loop and the engine loop do not share an interpreter.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from ._common import run_meta

RECORD = "serving_client"  # the record a plain run writes


def start_server(args: list[str], timeout: float = 600.0) -> tuple[subprocess.Popen, str]:
    """``python -m minillm.serve ARGS --port 0`` in a child process; returns it and its URL once /health answers
    (raises with the server's output if it exits or does not answer within ``timeout`` seconds)."""
    from minillm.serve_bench import httpx  # the HTTP client serve_bench found (httpx2 or httpx)

    proc = subprocess.Popen([sys.executable, "-u", "-m", "minillm.serve", *args, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    t0, url, seen = time.monotonic(), None, []
    while url is None:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("the server exited before it started:\n" + "".join(seen[-30:]))
        seen.append(line)
        if line.startswith("minillm.serve:") and " on http" in line:
            url = line.rsplit(" on ", 1)[1].strip()
        elif time.monotonic() - t0 > timeout:
            proc.kill()
            raise RuntimeError("the server did not start in time:\n" + "".join(seen[-30:]))
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() - t0 > timeout:
            proc.kill()
            raise RuntimeError(f"the server at {url} never answered /health")
        time.sleep(0.2)


def main(argv=None) -> int:
    from minillm.serve_bench import format_table, sweep

    ap = argparse.ArgumentParser(prog="python -m benchmarks serving_client", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="CPU: the small random shape on the NumPy runner")
    ap.add_argument("--rates", default="1,2,4,8,16,32,inf", help="requests/s, comma-separated; inf = a burst")
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--slo-ttft-ms", type=float, default=500.0)
    ap.add_argument("--slo-tpot-ms", type=float, default=50.0)
    args = ap.parse_args(argv)
    if args.smoke:
        server = ["--random-shape", "small", "--runner", "numpy", "--max-num-seqs", "8"]
        rates, n, inp, outp = [4.0, float("inf")], 6, 16, 4
    else:
        server = ["--random-shape", "llama1b", "--runner", "torch", "--max-num-seqs", str(args.max_num_seqs),
                  "--max-num-batched-tokens", str(args.max_num_batched_tokens)]
        rates, n, inp, outp = [float(r) for r in args.rates.split(",")], args.num_prompts, args.input_len, \
            args.output_len
    meta = run_meta(server=" ".join(["python -m minillm.serve", *server]), num_prompts=n, input_len=inp,
                    output_len=outp, slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms)
    record = {"meta": meta, "rates": []}
    proc, url = start_server(server)
    try:
        for rate in rates:   # one rate at a time, the record written after each (a run cut short keeps them)
            row = sweep(url, [rate], n, inp, outp, model="small" if args.smoke else "llama1b",
                        slo_ttft=args.slo_ttft_ms / 1e3, slo_tpot=args.slo_tpot_ms / 1e3,
                        warmup=0 if record["rates"] else 4)[0]
            record["rates"].append(row)
            Path(args.out).write_text(json.dumps(record, indent=1, default=str))
            print(format_table([row]), flush=True)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return 0
