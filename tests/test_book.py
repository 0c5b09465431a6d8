import pytest

from minillm.book import agrees, in_range, median_seconds, verdict, verdict_line


def test_verdict_prints_holds_or_not_with_its_scope(capsys):
    verdict("two plus two is four", 4, 2 + 2 == 4, scope="arithmetic: integers")
    verdict("two plus two is five", 4, 2 + 2 == 5, scope="live: one addition")
    out = capsys.readouterr().out.splitlines()
    assert out == ["holds: claim 'two plus two is four'; computed 4; scope arithmetic: integers",
                   "DOES NOT HOLD: claim 'two plus two is five'; computed 4; scope live: one addition"]


def test_verdict_line_only_when_is_the_third_state():
    line = verdict_line("3 to 5 tokens per call", "2.5 at alpha 0.6", False, scope="simulated: i.i.d. model",
                        only_when="alpha >= 0.75 and k >= 6")
    assert line.startswith("holds only when alpha >= 0.75 and k >= 6: claim '3 to 5 tokens per call'")


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(scope="measured: x"), ValueError, "kind from"),
    (dict(scope="live"), ValueError, "kind from"),
    (dict(scope="live: "), ValueError, "kind from"),
    (dict(scope="live: a; scope b"), ValueError, "one line"),
    (dict(scope="live: x", only_when="n > 2", holds=True), ValueError, "holds=False"),
    (dict(scope="live: x", only_when=" "), ValueError, "one-line condition"),
    (dict(scope="live: x", holds=1), TypeError, "must be a bool"),
    (dict(scope="live: x", claim=""), ValueError, "non-empty string"),
])
def test_verdict_line_bad_arguments_raise(kwargs, error, message):
    args = dict(claim="c", computed=1, holds=False) | kwargs
    with pytest.raises(error, match=message):
        verdict_line(args.pop("claim"), args.pop("computed"), args.pop("holds"), **args)


def test_agrees_plain_within_one_percent_about_within_ten():
    assert agrees(2.10, 2.094) and not agrees(2.10, 2.07)  # 0.3% off holds, 1.4% off does not
    assert agrees(4.0, 3.91, about=True) and not agrees(4.0, 3.5, about=True)
    assert agrees(0.0, 0.0) and not agrees(0.0, 1e-9)


def test_in_range_widens_the_range_by_the_tolerance():
    assert in_range(5, 10, 4.96) and not in_range(5, 10, 4.9) and in_range(5, 10, 4.6, about=True)
    assert in_range(60, 80, 80.7) and not in_range(60, 80, 81)
    with pytest.raises(ValueError, match="low <= high"):
        in_range(10, 5, 7)


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


def test_result_path_finds_the_recorded_results_of_a_checkout_and_load_result_reads_a_record():
    from pathlib import Path

    from minillm.book import load_result, result_path

    assert result_path("serving_h200.json") == Path(__file__).resolve().parents[1] / "benchmarks" / "results" / \
        "serving_h200.json"
    doc = load_result("serving_h200.json")
    assert doc["suite"] == "serving" and "serving" in doc["records"]
    assert load_result("serving_h200.json", "serving")["meta"]["gpu"] == doc["gpu"]
    with pytest.raises(KeyError, match="has no record"):
        load_result("serving_h200.json", "nope")
    with pytest.raises(FileNotFoundError):
        result_path("nope.json")


def test_result_path_falls_back_to_the_copy_an_installed_wheel_ships(tmp_path, monkeypatch):
    import json

    from minillm import book

    (tmp_path / "minillm" / "results").mkdir(parents=True)
    (tmp_path / "minillm" / "results" / "x_h200.json").write_text(json.dumps({"records": {"r": {"meta": {}}}}))
    monkeypatch.setattr(book, "PACKAGE", tmp_path / "minillm")  # an installed package: no benchmarks/ beside it
    assert book.result_path("x_h200.json") == tmp_path / "minillm" / "results" / "x_h200.json"
    assert book.load_result("x_h200.json", "r") == {"meta": {}}
    assert book.benchmark_command("flash") is None


def test_source_claims_loads_the_shipped_inventory_in_page_order():
    from minillm.book import source_claims

    claims = source_claims()
    assert len(claims) >= 40 and len({c["id"] for c in claims}) == len(claims)
    numbers = [tuple(int(p) for p in c["id"].split(".")) for c in claims]
    assert numbers == sorted(numbers)  # ids are section.n in page order
    assert any(c["checked_by"] is None for c in claims) and any(c["checked_by"] for c in claims)


def _inventory(tmp_path, **change):
    import json

    claim = {"id": "1.1", "section": "A", "quote": "it is 2x faster",
             "checked_by": [{"chapter": "chapters/01_x", "verdict": "2x faster"}]}
    claim.update(change)
    path = tmp_path / "claims.json"
    path.write_text(json.dumps({"sections": ["A"], "claims": [claim, dict(claim, id="1.2", checked_by=None)]}))
    return path


@pytest.mark.parametrize("change, message", [
    ({"section": "B"}, "section 'B'"),
    ({"id": "2.1"}, "the id must be <section number>"),
    ({"quote": " ".join(["word"] * 26)}, "at most 25 words"),
    ({"checked_by": []}, "checked_by must be null"),
    ({"checked_by": [{"chapter": "01_x", "verdict": "2x"}]}, "checked_by must be null"),
    ({"id": "1.2"}, "appears twice"),
    ({"extra": 1}, "expected id, section, quote, checked_by"),
    ({"why_unchecked": "no code can"}, "only for a claim no verdict checks"),
    ({"checked_by": None, "why_unchecked": " "}, "only for a claim no verdict checks"),
])
def test_source_claims_malformed_entry_raises(tmp_path, change, message):
    from minillm.book import source_claims

    assert len(source_claims(_inventory(tmp_path))) == 2
    with pytest.raises(ValueError, match=message):
        source_claims(_inventory(tmp_path, **change))


def test_source_drops_the_assignment_markers():
    from minillm.book import source
    from minillm.paged.allocator import BlockAllocator

    src = source(BlockAllocator.allocate)
    assert "def allocate" in src and "OutOfBlocks" in src and "SOLUTION" not in src
