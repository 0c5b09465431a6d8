import pytest

from minillm.book import median_seconds, verdict


def test_verdict_prints_holds_or_not(capsys):
    verdict("two plus two is four", 4, 2 + 2 == 4)
    verdict("two plus two is five", 4, 2 + 2 == 5)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("holds:") and out[1].startswith("DOES NOT HOLD:")


def test_median_seconds_calls_warmup_plus_repeats():
    calls = []
    t = median_seconds(lambda: calls.append(1), repeats=3)
    assert len(calls) == 4 and t >= 0


def test_glue_without_myst_nb_is_silent(monkeypatch):
    import sys

    from minillm.book import glue

    monkeypatch.setitem(sys.modules, "myst_nb", None)
    assert glue("x", 1) is None


@pytest.mark.parametrize("bad", [0, -1])
def test_median_seconds_rejects_no_repeats(bad):
    with pytest.raises(ValueError):
        median_seconds(lambda: None, repeats=bad)


def test_result_path_finds_recorded_results_and_the_shipped_copy_matches():
    from pathlib import Path

    from minillm.book import load_result, result_path

    shipped = Path(__import__("minillm").__file__).parent / "results"
    for f in shipped.glob("*.json"):
        recorded = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / f.name
        assert recorded.read_bytes() == f.read_bytes(), f"{f.name}: the package copy differs from benchmarks/results"
    assert load_result("serving_h200.json")["meta"]["gpu"]
    assert result_path("serving_h200.json").exists()
    with pytest.raises(FileNotFoundError):
        result_path("nope.json")
