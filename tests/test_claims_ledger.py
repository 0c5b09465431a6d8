"""tools/claims_ledger.py: the Claims ledger lists every inventoried claim of the source page, checked or not,
the inventory and the chapters' verdict lines agree, and the committed page is current."""
from __future__ import annotations

import ast
import importlib.util
import json
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

from minillm.book import source_claims

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("claims_ledger", ROOT / "tools" / "claims_ledger.py")
claims_ledger = importlib.util.module_from_spec(_spec)
sys.modules["claims_ledger"] = claims_ledger  # dataclasses look their module up
_spec.loader.exec_module(claims_ledger)


def ledger_tables(text: str) -> dict[str, list[list[str]]]:
    """Each '## ' section's table body rows, cells split on unescaped '|' and Markdown escapes removed."""
    tables, heading = {}, None
    for line in text.splitlines():
        if line.startswith("## "):
            heading = line[3:]
            tables[heading] = []
        elif heading and line.startswith("| ") and not line.startswith(("| ---", "| Claim |", "| Chapter |")):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            tables[heading].append([re.sub(r"\\(.)", r"\1", c) for c in cells])
    return tables


def printed_verdicts(root: Path = ROOT) -> list[tuple[str, str, str, str, str]]:
    """An independent scan: (chapter, claim, computed, scope, verdict) of every printed line that starts like a
    verdict, in every chapter notebook."""
    printed = []
    for nb_path in sorted((root / "chapters").glob("*.ipynb")):
        nb = json.loads(nb_path.read_text())
        for cell in nb["cells"]:
            for out in cell.get("outputs", []):
                for line in "".join(out.get("text", "")).splitlines():
                    if line.startswith(("holds: claim ", "DOES NOT HOLD: claim ", "holds only when ")):
                        verdict, rest = line.split(": claim ", 1)
                        claim, computed = rest.rsplit("; computed ", 1) if "; computed " in rest else (rest, "")
                        computed, scope = computed.split("; scope ", 1) if "; scope " in computed else (computed, "")
                        printed.append((f"chapters/{nb_path.stem}", ast.literal_eval(claim), computed, scope, verdict))
    return printed


def ledger_verdict(verdict: str) -> str:
    return {"holds": "holds", "DOES NOT HOLD": "**does not hold**"}.get(verdict, verdict)


def named_verdicts(claims: list[dict]) -> list[tuple[str, str]]:
    return [(v["chapter"], v["verdict"]) for c in claims for v in c["checked_by"] or []]


def link(chapter: str) -> str:
    return f"[{chapter.split('/')[1].split('_')[0].lstrip('0')}]({chapter}.ipynb)"


def test_claims_ledger_committed_page_is_current():
    assert claims_ledger.LEDGER.read_text() == claims_ledger.render(
        claims_ledger.collect(), claims_ledger.load_inventory()), (
        "claims_ledger.md is out of date: run python tools/claims_ledger.py")


def test_inventory_each_named_verdict_matches_exactly_one_verdict_line():
    printed = Counter((chapter, claim) for chapter, claim, *_ in printed_verdicts())
    named = named_verdicts(source_claims())
    assert len(named) >= 40
    wrong = [(key, printed[key]) for key in named if printed[key] != 1]
    assert not wrong, f"inventory verdicts printed by no chapter, or by more than one line: {wrong}"


def test_inventory_names_every_verdict_line_of_every_chapter_once():
    printed = printed_verdicts()
    named = Counter(named_verdicts(source_claims()))
    assert len(printed) >= 40
    unnamed = [(chapter, claim) for chapter, claim, *_ in printed if named[(chapter, claim)] == 0]
    assert not unnamed, ("verdict lines no claim in minillm/data/source_claims.json names "
                         f"(add them to the inventory): {unnamed}")
    twice = [key for key, n in named.items() if n > 1]
    assert not twice, f"verdicts named by more than one inventory claim: {twice}"


def test_claims_ledger_lists_every_verdict_line_of_every_chapter():
    checked = ledger_tables(claims_ledger.LEDGER.read_text())["Checked claims"]
    expected = Counter((link(chapter), claim, computed, scope or "**no scope stated**", ledger_verdict(verdict))
                       for chapter, claim, computed, scope, verdict in printed_verdicts())
    assert Counter(tuple(row[1:]) for row in checked) == expected
    ids = {c["id"]: c for c in source_claims()}
    for row in checked:  # each row under the claim that names it
        assert row[2] in [v["verdict"] for v in ids[row[0]]["checked_by"]], row


def test_every_verdict_line_states_its_scope():
    unscoped = [(chapter, claim) for chapter, claim, _, scope, _ in printed_verdicts() if not scope]
    assert not unscoped, f"verdict lines printed without a scope (minillm.book.verdict(..., scope=...)): {unscoped}"


def test_every_claim_is_checked_or_says_why_not():
    bare = [c["id"] for c in source_claims() if c["checked_by"] is None and "why_unchecked" not in c]
    assert not bare, f"claims no verdict checks and no reason given (why_unchecked): {bare}"


def test_claims_ledger_unchecked_count_equals_the_inventory():
    text = claims_ledger.LEDGER.read_text()
    unchecked = [c for c in source_claims() if c["checked_by"] is None]
    rows = ledger_tables(text)["Not checked"]
    assert len(rows) == len(unchecked)
    assert re.search(rf"^- Not checked: {len(unchecked)}[,.]", text, re.M)
    for row, c in zip(rows, unchecked):
        assert row == [c["id"], c["section"], f"\u201c{c['quote']}\u201d", c.get("why_unchecked", "not yet checked")]
    n_checked = len(source_claims()) - len(unchecked)
    assert re.search(rf"^- Checked: {n_checked}, by ", text, re.M)


def test_claims_ledger_intro_prose_has_no_typed_number():
    page = claims_ledger.render(claims_ledger.collect(), claims_ledger.load_inventory())
    intro = page.split("\n\n- ", 1)[0]
    assert "Claims ledger" in intro and not re.search(r"\d", intro), intro


def test_parse_line_reads_claim_computed_scope_and_verdict():
    assert claims_ledger.parse_line("holds: claim 'a; computed b'; computed 5,050; scope live: x; y") == (
        "a; computed b", "5,050", True, "live: x; y", None)
    assert claims_ledger.parse_line('DOES NOT HOLD: claim "the page\'s 5x"; computed 2.9x') == (
        "the page's 5x", "2.9x", False, "", None)
    assert claims_ledger.parse_line("holds only when k >= 6: x: claim 'c'; computed 3; scope simulated: m") == (
        "c", "3", False, "simulated: m", "k >= 6: x")
    assert claims_ledger.parse_line("met: target 'x'; measured 1") is None
    assert claims_ledger.parse_line("N=  256: standard peak") is None


def _fake_book(tmp_path: Path, *lines: str) -> Path:
    (tmp_path / "chapters").mkdir(parents=True)
    (tmp_path / "_toc.yml").write_text("root: intro\nchapters:\n  - file: chapters/01_x\n")
    nb = {"cells": [
        {"cell_type": "markdown", "source": ["# 1. X\n"], "metadata": {}},
        {"cell_type": "code", "source": [], "metadata": {}, "execution_count": 1,
         "outputs": [{"output_type": "stream", "name": "stdout", "text": [line + "\n" for line in lines] + ["other output\n"]}]},
    ], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "chapters" / "01_x.ipynb").write_text(json.dumps(nb))
    return tmp_path


FAKE_CLAIMS = [
    {"id": "1.1", "section": "One", "quote": "c | d", "checked_by": [{"chapter": "chapters/01_x", "verdict": "c | d"}]},
    {"id": "1.2", "section": "One", "quote": "it is *2x* faster", "checked_by": None},
]


def test_render_changed_verdict_changes_the_page(tmp_path):
    held = claims_ledger.render(claims_ledger.collect(
        _fake_book(tmp_path / "a", "holds: claim 'c | d'; computed 1 * 2; scope live: a | b")), FAKE_CLAIMS)
    failed = claims_ledger.render(claims_ledger.collect(
        _fake_book(tmp_path / "b", "DOES NOT HOLD: claim 'c | d'; computed 1 * 2; scope live: a | b")), FAKE_CLAIMS)
    conditional = claims_ledger.render(claims_ledger.collect(
        _fake_book(tmp_path / "c", "holds only when n > 2: claim 'c | d'; computed 1 * 2; scope simulated: m")),
        FAKE_CLAIMS)
    assert len({held, failed, conditional}) == 3
    tables = ledger_tables(held)
    assert tables["Checked claims"] == [["1.1", "[1](chapters/01_x.ipynb)", "c | d", "1 * 2", "live: a | b", "holds"]]
    assert tables["Not checked"] == [["1.2", "One", "\u201cit is *2x* faster\u201d", "not yet checked"]]
    assert "Verdict lines the inventory does not name" not in tables
    assert ledger_tables(failed)["Checked claims"][0][5] == "**does not hold**"
    assert ledger_tables(conditional)["Checked claims"][0][4:] == ["simulated: m", "holds only when n > 2"]
    assert ("- Checked: 1, by 1 verdict lines in 1 chapters (1 hold, 0 hold only under a condition, "
            "0 do not hold).") in held.splitlines()
    assert "- Scopes of the verdict lines: 1 live." in held.splitlines()
    assert "- Scopes of the verdict lines: 1 simulated." in conditional.splitlines()


def test_render_unchecked_claim_shows_its_reason(tmp_path):
    claims = [FAKE_CLAIMS[0], dict(FAKE_CLAIMS[1], why_unchecked="a history, no number")]
    page = claims_ledger.render(claims_ledger.collect(
        _fake_book(tmp_path, "holds: claim 'c | d'; computed 1; scope cited: x")), claims)
    assert ledger_tables(page)["Not checked"] == [["1.2", "One", "\u201cit is *2x* faster\u201d", "a history, no number"]]
    assert "- Not checked: 1, 1 of them with the reason no code can check them." in page.splitlines()


def test_render_verdict_no_claim_names_gets_its_own_table(tmp_path):
    rows = claims_ledger.collect(_fake_book(tmp_path, "holds: claim 'c | d'; computed 1; scope live: x",
                                            "holds: claim 'new'; computed 2"))
    page = claims_ledger.render(rows, FAKE_CLAIMS)
    assert ledger_tables(page)["Verdict lines the inventory does not name"] == [
        ["[1](chapters/01_x.ipynb)", "new", "2", "**no scope stated**", "holds"]]
    assert "- Verdict lines that state no scope: 0." not in page.splitlines()
    assert "- Verdict lines the inventory does not name: 1 (listed last)." in page.splitlines()


def test_render_named_verdict_no_chapter_prints_is_marked_not_found(tmp_path):
    rows = claims_ledger.collect(_fake_book(tmp_path, "holds: claim 'c | e'; computed 1"))
    page = claims_ledger.render(rows, FAKE_CLAIMS)
    assert ledger_tables(page)["Checked claims"][0][-1] == "**not found**"
    assert "- Verdicts the inventory names that no chapter prints: 1." in page.splitlines()


def test_notebook_title_missing_raises():
    with pytest.raises(ValueError, match="no '# ' title"):
        claims_ledger.notebook_title({"cells": [{"cell_type": "markdown", "source": ["text"]}]})


def _stale_source_page(path: Path) -> str:
    """A copy of source.md whose generated claim table is stale (one row removed); returns the current text."""
    from minillm.claims import BEGIN, END, render_source_page

    current = render_source_page((ROOT / "source.md").read_text())
    head, rest = current.split(BEGIN)
    table, tail = rest.split(END)
    stale_table = "\n".join(line for line in table.splitlines() if not line.startswith("| 1.1 |"))
    path.write_text(f"{head}{BEGIN}{stale_table}\n{END}{tail}")
    assert path.read_text() != current
    return current


def test_ledger_tool_also_regenerates_the_source_pages_claim_table(tmp_path, monkeypatch, capsys):
    """One command after an inventory change: tools/claims_ledger.py rewrites source.md's generated table too
    (before, only `python -m minillm.claims source.md` did, and the ledger tool left source.md stale)."""
    source = tmp_path / "source.md"
    current = _stale_source_page(source)
    monkeypatch.setattr(claims_ledger, "LEDGER", tmp_path / "claims_ledger.md")
    monkeypatch.setattr(claims_ledger, "SOURCE_PAGE", source, raising=False)
    assert claims_ledger.main([]) == 0
    assert source.read_text() == current
    assert (tmp_path / "claims_ledger.md").read_text() == claims_ledger.render(
        claims_ledger.collect(), claims_ledger.load_inventory())
    capsys.readouterr()
    assert claims_ledger.main(["--check"]) == 0


def test_ledger_tool_check_flags_a_stale_source_page(tmp_path, monkeypatch, capsys):
    source = tmp_path / "source.md"
    _stale_source_page(source)
    ledger = tmp_path / "claims_ledger.md"
    ledger.write_text(claims_ledger.render(claims_ledger.collect(), claims_ledger.load_inventory()))
    monkeypatch.setattr(claims_ledger, "LEDGER", ledger)
    monkeypatch.setattr(claims_ledger, "SOURCE_PAGE", source, raising=False)
    assert claims_ledger.main(["--check"]) == 1
    assert "source.md is out of date" in capsys.readouterr().out
    before = source.read_text()
    assert claims_ledger.main(["--check"]) == 1 and source.read_text() == before  # --check writes nothing
