"""minillm.claims: the callout a chapter shows before a verdict, and source.md's generated claim table."""
import subprocess
import sys
from pathlib import Path

import pytest

from minillm import claims
from minillm.book import source_claims

ROOT = Path(__file__).resolve().parents[1]


def test_callout_names_section_and_claim_in_the_books_words():
    c = next(c for c in source_claims() if c["checked_by"])
    text = claims.callout_text(c["id"])
    number = c["id"].split(".")[0]
    assert text.startswith(f"The page, section {number} ({c['section']}), claim {c['id']}")
    assert c["checked_by"][0]["verdict"] in text
    assert claims.callout_heading(c["id"]) in claims.callout_html(c["id"])


def test_callout_picks_the_chapters_own_verdicts():
    multi = next(c for c in source_claims()
                 if c["checked_by"] and len({v["chapter"] for v in c["checked_by"]}) > 1)
    first = multi["checked_by"][0]
    mine = claims.book_words(multi["id"], chapter=first["chapter"])
    assert mine and all(w in [v["verdict"] for v in multi["checked_by"] if v["chapter"] == first["chapter"]]
                        for w in mine)
    number = int(first["chapter"].split("/")[1][:2])
    assert claims.book_words(multi["id"], chapter=number) == mine
    other = {int(v["chapter"].split("/")[1][:2]) for v in multi["checked_by"]}
    absent = next(n for n in range(1, 20) if n not in other)
    with pytest.raises(ValueError, match="no verdict on claim"):
        claims.book_words(multi["id"], chapter=absent)


def test_callout_is_never_read_as_a_verdict_line():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from claims_ledger import parse_line
    finally:
        sys.path.pop(0)
    for c in source_claims():
        for line in claims.callout_text(c["id"]).splitlines():
            assert parse_line(line) is None, line


def test_claim_callout_prints_outside_a_notebook(capsys):
    c = next(c for c in source_claims() if c["checked_by"])
    claims.claim_callout(c["id"])
    assert capsys.readouterr().out.strip() == claims.callout_text(c["id"])


def test_unknown_and_unchecked_claims():
    with pytest.raises(KeyError, match="no claim"):
        claims.claim("99.9")
    with pytest.raises(ValueError, match="chapter"):
        claims.book_words("1.1", chapter="appendix")
    unchecked = [c for c in source_claims() if c["checked_by"] is None]
    for c in unchecked:
        assert claims.callout_text(c["id"]).endswith("not checked by any chapter")


def test_html_escapes_the_claim(monkeypatch):
    monkeypatch.setattr(claims, "book_words", lambda claim_id, chapter=None: ["a <b> & c"])
    out = claims.callout_html("1.1")
    assert out.startswith('<div class="admonition note') and "a &lt;b&gt; &amp; c" in out and "<b>" not in out


def test_claims_table_lists_every_claim_once_by_section():
    table = claims.claims_table()
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith(("| Claim", "| ---"))]
    assert [r.split(" | ")[0][2:] for r in rows] == [c["id"] for c in source_claims()]
    for n, name in enumerate(claims.sections(), start=1):
        assert f"**{n}. {name}**" in table
    for c in source_claims():
        for v in c["checked_by"] or []:
            assert f"]({v['chapter']}.ipynb)" in table


def test_source_page_table_is_up_to_date():
    """source.md's claim table is generated: after an inventory change run `python -m minillm.claims source.md`."""
    rc = subprocess.run([sys.executable, "-m", "minillm.claims", "--check", str(ROOT / "source.md")],
                        capture_output=True, text=True)
    assert rc.returncode == 0, rc.stderr


def test_render_needs_the_markers():
    with pytest.raises(ValueError, match="markers"):
        claims.render_source_page("# no markers here\n")
    page = f"intro\n{claims.BEGIN}\nSTALE-TABLE\n{claims.END}\nafter\n"
    out = claims.render_source_page(page)
    assert "STALE-TABLE" not in out and out.endswith(f"{claims.END}\nafter\n") and claims.render_source_page(out) == out


def test_source_page_and_glossary_are_in_the_toc():
    toc = (ROOT / "_toc.yml").read_text()
    assert "file: source" in toc and "file: glossary" in toc
    assert toc.index("file: source") < toc.index("file: chapters/01_")


GLOSSARY_TERMS = ["GQA", "RoPE", "SwiGLU", "ridge point", "bf16", "HBM", "tensor parallel", "binade", "SM",
                  "tensor core", "SDPA", "cuDNN", "warp", "warpgroup", "TMA", "wgmma", "persistent grid",
                  "CUDA graph", "NHD", "TPOT", "ITL", "E2E", "TTFT", "KV cache", "prefill", "decode", "roofline",
                  "arithmetic intensity"]


def test_glossary_defines_every_listed_term_with_its_chapter():
    text = (ROOT / "glossary.md").read_text()
    block = text.split("```{glossary}")[1].split("```")[0]
    terms, current = {}, None
    for line in block.splitlines():
        if line and not line.startswith(" "):
            current = line.strip()
            terms[current] = ""
        elif current:
            terms[current] += " " + line.strip()
    for term in GLOSSARY_TERMS:
        assert term in terms, f"glossary lacks {term!r}"
        assert "First used in [chapter" in terms[term], f"{term!r} names no chapter"
    lower = [t.lower() for t in terms]
    assert len(lower) == len(set(lower)), "a term defined twice (Sphinx treats terms case-insensitively)"
