"""The load generator (minillm.serve_bench) against the tiny server: a short burst and a Poisson rate, client-side
TTFT/TPOT/ITL/E2E percentiles and goodput, and its command line."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from minillm import serve_bench  # noqa: E402
from minillm.serve import Server  # noqa: E402
from minillm.serving import LLM  # noqa: E402


@pytest.fixture(scope="module")
def server():
    with Server(LLM("tiny")) as srv:
        yield srv


def test_arrivals_are_poisson_and_inf_is_a_burst():
    assert (serve_bench.arrival_times(5, math.inf) == 0).all()
    t = serve_bench.arrival_times(20000, 4.0, seed=1)
    assert t[0] == 0 and np.all(np.diff(t) >= 0) and np.mean(np.diff(t)) == pytest.approx(0.25, rel=0.03)
    p = serve_bench.make_prompts(50, 40, seed=2)
    assert len(set(p)) > 40 and all(30 <= len(x) <= 50 for x in p)


def test_a_burst_and_a_rate_measure_every_request(server):
    rows = serve_bench.sweep(server.url, [math.inf, 40.0], num_prompts=8, input_len=24, output_len=6,
                             slo_ttft=10.0, slo_tpot=10.0, keep_requests=True)
    assert [r["rate"] for r in rows] == [math.inf, 40.0]
    for r in rows:
        assert r["completed"] == 8 and r["failed"] == 0, r["errors"]
        assert r["output_throughput"] == pytest.approx(6 * r["request_throughput"])
        assert r["goodput"] == pytest.approx(r["request_throughput"])      # generous SLOs: every request is good
        for k in ("ttft", "tpot", "itl", "e2e"):
            s = r[k]
            assert 0 <= s["median"] <= s["p90"] <= s["p99"] and np.isfinite(s["mean"]), (k, s)
        assert r["ttft"]["median"] <= r["e2e"]["median"]
        assert all(q["output_tokens"] == 6 and len(q["itl"]) >= 1 for q in r["requests"])
    tight = serve_bench.sweep(server.url, [math.inf], num_prompts=4, input_len=24, output_len=4, slo_ttft=0.0)
    assert tight[0]["goodput"] == 0 and tight[0]["completed"] == 4


def test_failed_requests_are_counted_not_fatal(server):
    s, reqs = __import__("asyncio").run(serve_bench.run_rate(server.url, math.inf, ["x"] * 3, 4, model="nope"))
    assert s["failed"] == 3 and s["completed"] == 0 and "404" in s["errors"][0]


def test_command_line_writes_json(server, tmp_path, capsys):
    out = tmp_path / "sweep.json"
    serve_bench.main(["--url", server.url, "--rates", "inf", "--num-prompts", "4", "--input-len", "16",
                      "--output-len", "4", "--slo-ttft-ms", "5000", "--out", str(out)])
    rows = json.loads(out.read_text())
    assert rows[0]["completed"] == 4 and len(rows[0]["requests"]) == 4
    assert "TTFT p50" in capsys.readouterr().out
