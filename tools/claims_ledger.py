"""Build the "Claims ledger" appendix (claims_ledger.md): every quantitative claim of the source page, checked or not.

The claims are inventoried, in page order, in ``minillm/data/source_claims.json`` (``minillm.book.source_claims``):
each has an id, the page's section, a short quote, and the verdict lines that check it (or null). A chapter
checks a claim with ``minillm.book.verdict``, which prints ``holds: claim '...'; computed ...`` or
``DOES NOT HOLD: claim '...'; computed ...``. This tool reads those lines from the committed, executed chapter
notebooks (in _toc.yml order) and writes one table of the checked claims (one row per verdict line: chapter,
claim as checked, computed value, verdict), one of the claims not yet checked (section and quote), and, if
any, one of the verdict lines the inventory does not name. Nothing is typed in; tests/test_claims_ledger.py
fails when the committed page and the notebooks disagree, or the inventory and the verdict lines do.

    python tools/claims_ledger.py            # rewrite claims_ledger.md and source.md's generated claim table
    python tools/claims_ledger.py --check    # exit 1 if either is out of date

source.md's claim table (per section of the page, each claim in the book's words and the chapters that check
it) is generated from the same inventory by ``minillm.claims``; this tool regenerates it too, so one command
brings both pages up to date after an inventory change (``python -m minillm.claims source.md`` still works
alone).
"""
from __future__ import annotations

import ast
import json
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEDGER = ROOT / "claims_ledger.md"
SOURCE_PAGE = ROOT / "source.md"
INVENTORY = ROOT / "minillm" / "data" / "source_claims.json"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from minillm.book import SCOPES  # noqa: E402  (this checkout's package)

SCOPE_KINDS = tuple(SCOPES)

# The line minillm.book.verdict prints (minillm.book.verdict_line): the state, the claim as a Python string
# literal (repr), what was computed, and the scope. A line without a scope is read too (scope ""), so that the
# ledger shows it and a test flags it.
VERDICT_LINE = re.compile(
    r"^(?P<verdict>holds|DOES NOT HOLD|holds only when (?P<condition>.+?)): claim "
    r"(?P<claim>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"); computed (?P<computed>.*?)"
    rf"(?:; scope (?P<scope>(?:{'|'.join(SCOPE_KINDS)}): .*))?$"
)


@dataclass(frozen=True)
class Verdict:
    chapter: str  # document path without suffix, e.g. chapters/03_memory_tax
    title: str  # the chapter's first heading
    claim: str
    computed: str
    holds: bool  # the claim as the page states it
    scope: str = ""  # "<kind>: <detail>", see minillm.book.SCOPES; "" for a line printed without one
    condition: str | None = None  # the third state: holds only when this condition is met


def chapter_docs(toc: Path = ROOT / "_toc.yml") -> list[str]:
    return [line.split("file:")[1].strip() for line in toc.read_text().splitlines() if "file: chapters/" in line]


def notebook_title(nb: dict) -> str:
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    raise ValueError("notebook has no '# ' title")


def verdict_lines(nb: dict) -> list[str]:
    """Every line of every code cell's printed (stdout stream) output, in cell order."""
    lines = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stdout":
                lines.extend("".join(out["text"]).splitlines())
    return lines


def parse_line(line: str) -> tuple[str, str, bool, str, str | None] | None:
    """(claim, computed, holds, scope, condition) of a verdict line, or None for any other line."""
    m = VERDICT_LINE.match(line)
    if m is None:
        return None
    return ast.literal_eval(m["claim"]), m["computed"], m["verdict"] == "holds", m["scope"] or "", m["condition"]


def collect(root: Path = ROOT) -> list[Verdict]:
    rows = []
    for doc in chapter_docs(root / "_toc.yml"):
        nb = json.loads((root / f"{doc}.ipynb").read_text())
        title = notebook_title(nb)
        for line in verdict_lines(nb):
            parsed = parse_line(line)
            if parsed is not None:
                rows.append(Verdict(doc, title, *parsed))
    return rows


def load_inventory(path: Path = INVENTORY) -> list[dict]:
    """The inventory of the page's claims (validated by ``minillm.book.source_claims``, from this checkout)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from minillm.book import source_claims

    return source_claims(path)


@dataclass(frozen=True)
class Match:
    # (inventory claim, the verdict it names, the verdict line printed), page order; None: no chapter prints it
    checked: list[tuple[dict, dict, Verdict | None]]
    unchecked: list[dict]  # inventory claims with no verdict named
    unnamed: list[Verdict]  # verdict lines the inventory does not name


def match(rows: list[Verdict], claims: list[dict]) -> Match:
    """Pair each inventory claim with the verdict lines it names, by (chapter, exact claim text)."""
    by_key: dict[tuple[str, str], list[Verdict]] = {}
    for r in rows:
        by_key.setdefault((r.chapter, r.claim), []).append(r)
    checked, unchecked, named = [], [], set()
    for c in claims:
        if c["checked_by"] is None:
            unchecked.append(c)
            continue
        for ref in c["checked_by"]:
            key = (ref["chapter"], ref["verdict"])
            named.add(key)
            checked.extend((c, ref, r) for r in by_key.get(key, [None]))
    return Match(checked, unchecked, [r for r in rows if (r.chapter, r.claim) not in named])


_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>|$~#{}])")


def escape(text: str) -> str:
    """Plain text for a Markdown table cell: no emphasis, math, links or cell breaks."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text)


def chapter_link(chapter: str, title: str | None = None) -> str:
    label = title if title is not None else chapter.split("/")[-1].split("_")[0].lstrip("0")
    return f"[{escape(label)}]({chapter}.ipynb)"


def verdict_cell(r: Verdict) -> str:
    if r.condition is not None:
        return f"holds only when {escape(r.condition)}"
    return "holds" if r.holds else "**does not hold**"


def scope_cell(r: Verdict) -> str:
    return escape(r.scope) if r.scope else "**no scope stated**"


INTRO = """\
# Claims ledger

Every quantitative claim of the source page, in the page's order: where the book checks it, what the
chapter's code computed and the verdict it printed, or that it is not yet checked. The inventory of the
page's claims (each with its section of the page, a short quote and the verdict lines that check it) is
package data, `minillm/data/source_claims.json`; the computed values and verdicts are read from the verdict
lines of the executed chapters (`minillm.book.verdict`). This page is generated by `tools/claims_ledger.py`,
not typed in: a test fails when a chapter's verdict and this page disagree, when a chapter prints a verdict
the inventory does not name, or when the inventory names a verdict no chapter prints. The book's own
targets (`met` / `MISSED` lines) are not the page's claims and are not listed here.

Each verdict says where its number comes from (the scope): *arithmetic* from published configurations,
*live* on the machine that executed the chapter, *recorded* on a named GPU, *simulated* by one of the book's
models, or *cited*, checked against the source the page relies on. A verdict is `holds`, `does not hold`,
or `holds only when` a condition the data supports; numbers are compared under the tolerance policy the
introduction states.
"""


def render(rows: list[Verdict], claims: list[dict]) -> str:
    m = match(rows, claims)
    found = [r for _, _, r in m.checked if r is not None]
    held = sum(r.holds for r in found)
    conditional = sum(r.condition is not None for r in found)
    n_checked = len({c["id"] for c, _, _ in m.checked})
    sections = list(dict.fromkeys(c["section"] for c in claims))
    chapters = list(dict.fromkeys(r.chapter for r in rows))
    titles = {r.chapter: r.title for r in rows}
    kinds = Counter(r.scope.split(":")[0] for r in found if r.scope)
    out = [INTRO,
           f"- Claims inventoried: {len(claims)}, in {len(sections)} sections of the page, numbered section.claim.",
           f"- Checked: {n_checked}, by {len(found)} verdict lines in "
           f"{len(dict.fromkeys(r.chapter for r in found))} chapters ({held} hold, {conditional} hold only "
           f"under a condition, {len(found) - held - conditional} do not hold).",
           "- Scopes of the verdict lines: " + (", ".join(f"{kinds[k]} {k}" for k in SCOPE_KINDS if kinds[k])
                                                 or "none") + ".",
           f"- Not checked: {len(m.unchecked)}"
           + (f", {sum('why_unchecked' in c for c in m.unchecked)} of them with the reason no code can check them."
              if m.unchecked else "."),
           ]
    unscoped = sum(not r.scope for r in found)
    if unscoped:
        out.append(f"- Verdict lines that state no scope: {unscoped}.")
    missing = sum(r is None for _, _, r in m.checked)
    if missing:
        out.append(f"- Verdicts the inventory names that no chapter prints: {missing}.")
    if m.unnamed:
        out.append(f"- Verdict lines the inventory does not name: {len(m.unnamed)} (listed last).")
    numbered = dict.fromkeys((c["id"].split(".")[0], c["section"]) for c in claims)
    out += ["", "Sections of the page: " + "; ".join(f"{n} {escape(name)}" for n, name in numbered) + ".",
            "", "## Checked claims", "",
            "| Claim | Chapter | Checked as | Computed | Scope | Verdict |",
            "| --- | --- | --- | --- | --- | --- |"]
    for c, ref, r in m.checked:
        if r is None:
            out.append(f"| {c['id']} | {chapter_link(ref['chapter'])} | "
                       f"{escape(ref['verdict'])} | (no such verdict line in the chapter) | | **not found** |")
        else:
            out.append(f"| {c['id']} | {chapter_link(r.chapter)} | {escape(r.claim)} | "
                       f"{escape(r.computed)} | {scope_cell(r)} | {verdict_cell(r)} |")
    out += ["", "## Not checked", "",
            "No chapter prints a verdict on these claims.", "",
            "| Claim | Section | The page says | Status |",
            "| --- | --- | --- | --- |"]
    for c in m.unchecked:
        status = escape(c["why_unchecked"]) if "why_unchecked" in c else "not yet checked"
        out.append(f"| {c['id']} | {escape(c['section'])} | \u201c{escape(c['quote'])}\u201d | {status} |")
    if m.unnamed:
        out += ["", "## Verdict lines the inventory does not name", "",
                "These verdicts are printed by a chapter but named by no claim in `minillm/data/source_claims.json`.", "",
                "| Chapter | Checked as | Computed | Scope | Verdict |",
                "| --- | --- | --- | --- | --- |"]
        for r in m.unnamed:
            out.append(f"| {chapter_link(r.chapter)} | {escape(r.claim)} | {escape(r.computed)} | {scope_cell(r)} | "
                       f"{verdict_cell(r)} |")
    out += ["", "Chapters with verdicts: " + "; ".join(chapter_link(c, titles[c]) for c in chapters) + ".", ""]
    return "\n".join(out)


def source_page_text(path: Path | None = None) -> str:
    """source.md with its generated claim table re-rendered from the inventory (``minillm.claims``)."""
    from minillm.claims import render_source_page

    return render_source_page((SOURCE_PAGE if path is None else path).read_text())


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def main(argv: list[str]) -> int:
    pages = {LEDGER: render(collect(), load_inventory()), SOURCE_PAGE: source_page_text(SOURCE_PAGE)}
    if "--check" in argv:
        stale = [p for p, text in pages.items() if not p.exists() or p.read_text() != text]
        for p in stale:
            print(f"{p.name} is out of date: run python tools/claims_ledger.py")
        return 1 if stale else 0
    for p, text in pages.items():
        if not p.exists() or p.read_text() != text:
            p.write_text(text)
            print(f"wrote {_shown(p)}")
        else:
            print(f"{_shown(p)} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
