import numpy as np
import pytest

from minillm import cached_decode, load_model, naive_decode
from minillm.book import load_result
from minillm.studies.composition import (BatchSweep, Ladder, Rung, check_same_tokens, composed_ladder,
                                         leave_one_out, measure_rung, recorded_gpu_gap, recorded_gpu_ladder,
                                         token_agreement)


def test_measure_rung_counts_tokens_and_keeps_the_fastest_run():
    calls = []

    def serve():
        calls.append(1)
        return [[1, 2, 3], np.array([4, 5])]
    r = measure_rung("x", serve, repeats=3)
    assert len(calls) == 3 and r.output_tokens == 5 and r.token_ids == [[1, 2, 3], [4, 5]]
    assert r.tok_per_s == pytest.approx(5 / r.seconds)
    with pytest.raises(ValueError):
        measure_rung("x", serve, repeats=0)
    with pytest.raises(ValueError):
        measure_rung("empty", lambda: [[1], []])


def test_measure_rung_rejects_a_rung_whose_repeats_disagree():
    state = iter([[[1]], [[2]]])
    with pytest.raises(AssertionError, match="repeat"):
        measure_rung("flaky", lambda: next(state), repeats=2)


def test_check_same_tokens_on_real_decoders():
    model = load_model("tiny")
    prompts = [[10, 20, 30], [40, 50]]
    ref = [cached_decode(model, p, 6).new_tokens for p in prompts]
    check_same_tokens(measure_rung("naive", lambda: [naive_decode(model, p, 6).new_tokens for p in prompts]), ref)
    wrong = Rung("wrong", [ref[0], ref[1][:-1] + [(ref[1][-1] + 1) % 259]], 1.0)
    with pytest.raises(AssertionError, match=r"requests \[1\]"):
        check_same_tokens(wrong, ref)
    with pytest.raises(AssertionError, match="answered 1"):
        check_same_tokens(Rung("short", ref[:1], 1.0), ref)


def test_ladder_steps_total_and_composition():
    lad = Ladder(["a", "b", "c", "d"], [10.0, 100.0, 300.0, 600.0])
    np.testing.assert_allclose(lad.steps, [10, 3, 2])
    assert lad.total == pytest.approx(np.prod(lad.steps)) == pytest.approx(60)
    assert lad.largest_step == 10 and lad.largest_step_name == "b" and lad.best == 60
    assert lad.steps_above(1.5) == 3 and lad.from_composition()


def test_ladder_one_trick_is_not_composition():
    lad = Ladder(["a", "b", "c"], [10.0, 200.0, 180.0])     # one rung gives everything, the next loses
    assert lad.total == pytest.approx(18) and lad.best == pytest.approx(20)
    assert lad.steps_above(1.5) == 1 and not lad.from_composition()
    # two rungs gain 1.5x or more, but a loss between them leaves the largest alone as the whole gain
    lossy = Ladder(["a", "b", "c", "d"], [1.0, 20.0, 8.0, 12.0])
    assert lossy.steps_above(1.5) == 2 and lossy.best == 20 and not lossy.from_composition()
    # a cache (22x) then one rung that pays 1.7x and one that loses: two rungs gain 1.5x, but without the
    # largest the ladder gains under 3x (what chapter 10 measures on a CPU)
    cpu_like = Ladder(["naive", "cache", "engine", "spec"], [28.0, 633.0, 1054.0, 829.0])
    assert cpu_like.steps_above(1.5) == 2 and not cpu_like.from_composition()


def test_ladder_rejects_bad_input():
    with pytest.raises(ValueError):
        Ladder(["a"], [1.0])
    with pytest.raises(ValueError):
        Ladder(["a", "b"], [1.0, 0.0])
    with pytest.raises(ValueError):
        Ladder(["a", "b", "c"], [1.0, 2.0])


def test_recorded_gpu_ladder_reads_the_serving_results():
    bench = load_result("serving_h200.json", "serving")
    lad = recorded_gpu_ladder(bench, "llama1b")
    runs = {(r["model"], r["policy"], r.get("max_num_seqs", r.get("batch"))): r["output_tok_per_s"]
            for r in bench["runs"] if "output_tok_per_s" in r}
    assert lad.tok_per_s[0] == runs["llama1b", "hf_generate_static", 64]
    assert lad.tok_per_s[-1] == runs["llama1b", "continuous", 256]
    assert lad.total == pytest.approx(np.prod(lad.steps))
    with pytest.raises(KeyError):
        recorded_gpu_ladder(bench, "no-such-model")


def test_recorded_gpu_gap_multiplies_factors_of_one_request_set_each():
    bench = load_result("serving_h200.json", "serving")
    gap = recorded_gpu_gap(bench, "llama1b")
    runs = {(r["model"], r["policy"], r.get("max_num_seqs", r.get("batch"))): r["output_tok_per_s"]
            for r in bench["runs"] if "output_tok_per_s" in r}
    assert gap["first"] == pytest.approx(runs["llama1b", "continuous_hf_subset", 64] / runs["llama1b", "hf_generate_static", 64])
    assert gap["gap"] == pytest.approx(gap["first"] * runs["llama1b", "continuous", 256] / runs["llama1b", "static", 64])
    assert gap["hf_requests"] < gap["trace_requests"]
    with pytest.raises(KeyError):
        recorded_gpu_gap(bench, "no-such-model")


def test_composed_ladder_keeps_order_and_identity():
    bench = {"rungs": [{"model": "m", "rung": "hf", "output_tok_per_s": 2.0, "identical_to_reference": 1.0},
                       {"model": "other", "rung": "x", "output_tok_per_s": 9.0, "identical_to_reference": 1.0},
                       {"model": "m", "rung": "engine", "output_tok_per_s": 8.0, "identical_to_reference": 0.5}]}
    lad, same = composed_ladder(bench, "m")
    assert lad.names == ["hf", "engine"] and lad.total == 4.0 and same == [1.0, 0.5]
    with pytest.raises(KeyError):
        composed_ladder(bench, "other")
    with pytest.raises(KeyError):  # a run cut short before its last rungs
        composed_ladder(bench, "m", min_rungs=6)


def test_hf_greedy_matches_cached_decode_with_and_without_cache():
    pytest.importorskip("transformers")
    from minillm.hf import to_hf
    from minillm.studies.composition import hf_greedy
    model = load_model("tiny")
    prompts = [[10, 20, 30], [40, 50]]
    ref = [cached_decode(model, p, 5).new_tokens for p in prompts]
    hf = to_hf(model)
    assert hf_greedy(hf, prompts, 5, use_cache=False) == ref
    assert hf_greedy(hf, prompts, 5, use_cache=True) == ref
    with pytest.raises(ValueError):
        hf_greedy(hf, prompts, 0, use_cache=True)


def test_ladder_stack_stops_at_the_fastest_rung_when_the_last_rung_loses():
    # the shape of the recorded 1B ladder: four rungs that gain, then speculation in a full batch that loses
    lad = Ladder(["hf", "cache", "engine", "graphs", "batching", "spec"], [44.0, 83.0, 99.0, 362.0, 3973.0, 2393.0])
    assert lad.best_index == 4 and lad.best_name == "batching"
    assert lad.best == pytest.approx(3973 / 44) and lad.total == pytest.approx(2393 / 44)
    assert lad.stack.names == ["hf", "cache", "engine", "graphs", "batching"]
    np.testing.assert_allclose(lad.stack.tok_per_s, lad.tok_per_s[:5])
    assert lad.stack.total == pytest.approx(lad.best)
    assert lad.from_composition()
    with pytest.raises(ValueError, match="fastest"):
        Ladder(["a", "b"], [5.0, 1.0]).stack
    assert not Ladder(["a", "b", "c"], [5.0, 1.0, 4.0]).from_composition()


def test_ladder_composition_ignores_steps_after_the_fastest_rung():
    # the whole ladder's largest step (20x) only wins back a loss after the fastest rung; up to the fastest
    # rung two steps (3x, 10x) compose, and 30x without the largest (10x) is still 3x
    lad = Ladder(["a", "b", "c", "d", "e"], [1.0, 3.0, 30.0, 1.0, 20.0])
    assert lad.largest_step == pytest.approx(20) and lad.best / lad.largest_step < 3
    assert lad.stack.largest_step == pytest.approx(10) and lad.from_composition()
    # and a recovery after the fastest rung does not count as a second gaining step
    assert not Ladder(["a", "b", "c", "d"], [1.0, 30.0, 1.0, 20.0]).from_composition()


def test_composed_ladder_reads_the_recorded_run_and_rejects_a_truncated_one():
    bench = load_result("composed_h200.json", "composed")
    rows = [r for r in bench["rungs"] if r["model"] == "llama1b"]
    lad, same = composed_ladder(bench, "llama1b", min_rungs=6)
    assert lad.names == [r["rung"] for r in rows] and len(lad.names) == 6
    assert lad.tok_per_s[0] == rows[0]["output_tok_per_s"] and same == [r["identical_to_reference"] for r in rows]
    assert lad.best == pytest.approx(max(r["output_tok_per_s"] for r in rows) / rows[0]["output_tok_per_s"])
    assert lad.stack.names == lad.names[: lad.best_index + 1]
    cut = {**bench, "rungs": [r for r in bench["rungs"] if r is not rows[-1]]}   # the run stopped before its last rung
    assert len(composed_ladder(cut, "llama1b")[0].names) == 5
    with pytest.raises(KeyError, match="5 rungs"):
        composed_ladder(cut, "llama1b", min_rungs=6)


def test_token_agreement_counts_identical_requests_and_the_prefix_before_the_first_difference():
    ref = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]]
    got = [[1, 2, 3, 4], [5, 6, 0, 8], [0, 9, 9, 9]]
    a = token_agreement(got, ref)
    assert a["identical"] == pytest.approx(1 / 3) and a["prefix"] == pytest.approx((1 + 0.5 + 0) / 3)
    assert token_agreement(got[:1], ref) == {"identical": 1.0, "prefix": 1.0}   # fewer requests than the reference
    assert token_agreement([[1, 2]], [[1, 2, 3, 4]])["prefix"] == pytest.approx(0.5)   # a short answer
    with pytest.raises(ValueError):
        token_agreement(ref + [[1]], ref)
    with pytest.raises(ValueError):
        token_agreement([], ref)


def test_leave_one_out_measures_every_factor_from_the_full_stack():
    f = leave_one_out(100.0, {"graphs": 20.0, "batching": 5.0})
    assert f == {"graphs": 5.0, "batching": 20.0}
    # the ladder's factor for the same technique depends on its place: here graphs gave 4x at batch 1
    lad = Ladder(["eager b1", "graphs b1", "graphs b32"], [1.0, 4.0, 100.0])
    assert lad.steps[0] == 4.0 != f["graphs"]
    with pytest.raises(ValueError):
        leave_one_out(100.0, {"x": 0.0})
    with pytest.raises(ValueError):
        leave_one_out(0.0, {"x": 1.0})


def test_batch_sweep_gives_both_views_and_the_first_batch_reaching_a_factor():
    rows = [{"batch": b, "output_tok_per_s": 300.0 * b ** 0.8, "per_request_tok_per_s": 300.0 * b ** -0.2}
            for b in (4, 1, 16)]
    sw = BatchSweep.of(rows)
    np.testing.assert_array_equal(sw.batch, [1, 4, 16])
    agg, per = sw.gains(50.0)
    np.testing.assert_allclose(agg, sw.tok_per_s / 50) and np.testing.assert_allclose(per, sw.per_request_tok_per_s / 50)
    assert sw.first_batch_reaching(50.0, 6.0) == 1 and sw.first_batch_reaching(50.0, 15.0) == 4
    assert sw.first_batch_reaching(50.0, 1e6) is None
    with pytest.raises(ValueError):
        BatchSweep([2, 1], [1.0, 2.0], [1.0, 1.0])
    with pytest.raises(ValueError):
        BatchSweep([1, 2], [1.0, -2.0], [1.0, 1.0])


def test_the_recorded_bf16_study_is_complete():
    bench = load_result("composed_h100.json", "composed_bf16")
    m = bench["meta"]
    assert m["gpu"].startswith("NVIDIA") and m["dtype"] == "bfloat16" and m["torch"] and m["triton"] and m["date"]
    assert m["command"].startswith("python benchmarks/composed_bench.py --study")
    rungs = [r["rung"] for r in bench["rungs"]]
    assert rungs[:4] == ["HF, no KV cache (naive PyTorch)", "HF, KV cache", "engine, batch 1, eager", "+ CUDA graphs"]
    assert len(rungs) == 6 and len(bench["leave_one_out"]) == 3 and bench["side"]
    sw = [r for r in bench["sweep"] if r["cuda_graphs"]]
    assert [r["batch"] for r in sw] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert all(r["new_tokens_per_request"] == 128 for r in bench["sweep"])
