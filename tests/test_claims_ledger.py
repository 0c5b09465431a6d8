"""tools/claims_ledger.py: the Claims ledger appendix is built from the chapters' verdict lines and is current."""
from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("claims_ledger", ROOT / "tools" / "claims_ledger.py")
claims_ledger = importlib.util.module_from_spec(_spec)
sys.modules["claims_ledger"] = claims_ledger  # dataclasses look their module up
_spec.loader.exec_module(claims_ledger)


def ledger_rows(text: str) -> list[list[str]]:
    """The table's body rows, cells split on unescaped '|' and Markdown escapes removed."""
    rows = []
    for line in text.splitlines():
        if not re.match(r"^\| \d+ \|", line):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        rows.append([re.sub(r"\\(.)", r"\1", c) for c in cells])
    return rows


def test_claims_ledger_committed_page_is_current():
    assert claims_ledger.LEDGER.read_text() == claims_ledger.render(claims_ledger.collect()), (
        "claims_ledger.md is out of date: run python tools/claims_ledger.py")


def test_claims_ledger_lists_every_verdict_line_of_every_chapter():
    # An independent scan: every printed line that starts like a verdict, in every chapter notebook.
    printed = []
    for nb_path in sorted((ROOT / "chapters").glob("*.ipynb")):
        nb = json.loads(nb_path.read_text())
        number = nb_path.name.split("_")[0].lstrip("0")
        for cell in nb["cells"]:
            for out in cell.get("outputs", []):
                for line in "".join(out.get("text", "")).splitlines():
                    if line.startswith(("holds: claim ", "DOES NOT HOLD: claim ")):
                        printed.append((number, line))
    rows = ledger_rows(claims_ledger.LEDGER.read_text())
    assert len(printed) >= 40 and len(rows) == len(printed)
    for (number, line), row in zip(printed, rows):
        verdict, rest = line.split(": claim ", 1)
        claim, computed = rest.rsplit("; computed ", 1) if "; computed " in rest else (rest, "")
        assert row[1] == f"[{number}](chapters/{next((ROOT / 'chapters').glob(f'{int(number):02d}_*.ipynb')).stem}.ipynb)"
        assert row[2] == claim[1:-1].replace("\\'", "'"), line
        assert row[3] == computed, line
        assert row[4] == ("holds" if verdict == "holds" else "**does not hold**"), line


def test_parse_line_reads_claim_computed_and_verdict():
    assert claims_ledger.parse_line("holds: claim 'a; computed b'; computed 5,050") == ("a; computed b", "5,050", True)
    assert claims_ledger.parse_line('DOES NOT HOLD: claim "the page\'s 5x"; computed 2.9x') == ("the page's 5x", "2.9x", False)
    assert claims_ledger.parse_line("met: target 'x'; measured 1") is None
    assert claims_ledger.parse_line("N=  256: standard peak") is None


def _fake_book(tmp_path: Path, line: str) -> Path:
    (tmp_path / "chapters").mkdir(parents=True)
    (tmp_path / "_toc.yml").write_text("root: intro\nchapters:\n  - file: chapters/01_x\n")
    nb = {"cells": [
        {"cell_type": "markdown", "source": ["# 1. X\n"], "metadata": {}},
        {"cell_type": "code", "source": [], "metadata": {}, "execution_count": 1,
         "outputs": [{"output_type": "stream", "name": "stdout", "text": [line + "\n", "other output\n"]}]},
    ], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "chapters" / "01_x.ipynb").write_text(json.dumps(nb))
    return tmp_path


def test_collect_changed_verdict_changes_the_page(tmp_path):
    held = claims_ledger.render(claims_ledger.collect(_fake_book(tmp_path / "a", "holds: claim 'c | d'; computed 1 * 2")))
    failed = claims_ledger.render(claims_ledger.collect(_fake_book(tmp_path / "b", "DOES NOT HOLD: claim 'c | d'; computed 1 * 2")))
    assert held != failed
    assert ledger_rows(held) == [["1", "[1](chapters/01_x.ipynb)", "c | d", "1 * 2", "holds"]]
    assert ledger_rows(failed)[0][4] == "**does not hold**"


def test_notebook_title_missing_raises():
    with pytest.raises(ValueError, match="no '# ' title"):
        claims_ledger.notebook_title({"cells": [{"cell_type": "markdown", "source": ["text"]}]})
