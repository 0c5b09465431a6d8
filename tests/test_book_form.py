"""The reader's path (issue 34): what a chapter shows on the website is for the reader.

For every chapter:

* no ``# NBVAL_IGNORE_OUTPUT`` comment in a cell: the cell tag ``nbval-ignore-output`` does the same job and
  does not show;
* no ``glue(...)`` call, ``assert`` statement or ``load_result(...)`` call in a code cell the site shows: such
  bookkeeping goes to a cell tagged ``remove-cell`` (or ``remove-input`` where its output matters), which
  nbval still runs and checks;
* no run ID (``kernels53``), results-file name (``*.json``, a published model's ``config.json`` excepted), date
  (YYYY-MM-DD) or package/driver version in the main path's markdown, in the outputs the site shows, or in the
  glued values the prose renders: they belong to the chapter's lab-notebook page (``appendix/``);
* an "Exercises" section whose every exercise has a hint and an answer in collapsed dropdowns.

And every appendix page is listed in _toc.yml, in the "Lab notebook" part after the chapters.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

READER_PATH_CHAPTERS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "chapters").glob("*.ipynb"))

HIDDEN_CELL = {"remove-cell"}
HIDDEN_INPUT = {"remove-cell", "remove-input"}
HIDDEN_OUTPUT = {"remove-cell", "remove-output"}

# Lab-notebook material: results files, run IDs, dates, versions.
RESULTS_FILE = re.compile(r"\b[\w.-]+\.json\b")
ALLOWED_JSON = {"config.json"}  # a published model's configuration file, named as its source
RUN_ID = re.compile(r"kernels\d+")
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
VERSION = re.compile(
    r"\b(?:torch|pytorch|triton|numpy|cuda|cudnn|driver|python|jax|vllm|sglang|flash[-_]?attn|flashinfer|nccl)"
    r"\s*(?:version\s*)?[=v ]?\s*\d+\.\d+", re.IGNORECASE)
SEMVER = re.compile(r"(?<![\w.,])\d+\.\d+\.\d+(?:[+.-]?(?:cu|rc|post|dev)\w*)?(?![\w.])")


def load(name: str) -> dict:
    return json.loads((ROOT / name).read_text())


def source(cell: dict) -> str:
    return "".join(cell["source"])


def tags(cell: dict) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def glue_values(cell: dict) -> list[str]:
    """The text of every value the cell glues (rendered in the prose wherever {glue:text} names it)."""
    out = []
    for o in cell.get("outputs", []):
        for mime, value in o.get("data", {}).items():
            if mime.startswith("application/papermill.record/") and mime.endswith("text/plain"):
                out.append("".join(value) if isinstance(value, list) else str(value))
    return out


def visible_output_text(cell: dict) -> list[str]:
    """Text of the outputs the site shows for a code cell (stream and text/plain; glue records render in prose)."""
    if tags(cell) & HIDDEN_OUTPUT:
        return []
    out = []
    for o in cell.get("outputs", []):
        if o["output_type"] == "stream":
            out.append("".join(o["text"]))
        elif "text/plain" in o.get("data", {}) and not any(m.startswith("application/papermill") for m in o["data"]):
            out.append("".join(o["data"]["text/plain"]))
    return out


def lab_material(text: str) -> list[str]:
    found = [m for m in RESULTS_FILE.findall(text) if m not in ALLOWED_JSON]
    for pattern in (RUN_ID, DATE, VERSION, SEMVER):
        found += pattern.findall(text)
    return found


def is_bookkeeping(node: ast.AST) -> bool:
    """A glue(...) call, an assert, or a load_result(...) call anywhere in the statement."""
    if isinstance(node, ast.Assert):
        return True
    for sub in ast.walk(node):
        if isinstance(sub, ast.Assert):
            return True
        if isinstance(sub, ast.Call):
            f = sub.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in {"glue", "load_result"}:
                return True
    return False


@pytest.mark.parametrize("chapter", READER_PATH_CHAPTERS)
def test_no_nbval_ignore_output_comment(chapter):
    marked = [i for i, c in enumerate(load(chapter)["cells"])
              if c["cell_type"] == "code" and "NBVAL_IGNORE_OUTPUT" in source(c)]
    assert not marked, f"{chapter}: cells {marked} carry '# NBVAL_IGNORE_OUTPUT'; tag them nbval-ignore-output instead"


@pytest.mark.parametrize("chapter", READER_PATH_CHAPTERS)
def test_bookkeeping_is_hidden(chapter):
    shown = []
    for i, cell in enumerate(load(chapter)["cells"]):
        if cell["cell_type"] != "code" or tags(cell) & HIDDEN_INPUT:
            continue
        text = "\n".join(line for line in source(cell).splitlines() if not line.lstrip().startswith(("%", "!")))
        tree = ast.parse(text)
        lines = [ast.get_source_segment(text, node).splitlines()[0] for node in ast.walk(tree)
                 if isinstance(node, ast.stmt) and is_bookkeeping(node) and not isinstance(node, (ast.For, ast.If, ast.While, ast.With, ast.FunctionDef, ast.Try))]
        if lines:
            shown.append(f"cell {i}: {lines[0].strip()}")
    assert not shown, (f"{chapter}: glue/assert/load_result in cells the site shows (move them to a cell tagged "
                       "remove-cell):\n" + "\n".join(shown))


@pytest.mark.parametrize("chapter", READER_PATH_CHAPTERS)
def test_main_path_has_no_run_ids_files_dates_or_versions(chapter):
    found = []
    for i, cell in enumerate(load(chapter)["cells"]):
        texts = [source(cell)] if cell["cell_type"] == "markdown" else visible_output_text(cell) + glue_values(cell)
        for text in texts:
            found += [f"cell {i}: {hit}" for hit in lab_material(text)]
    assert not found, (f"{chapter}: lab-notebook material in the main path (it belongs to the chapter's page in "
                       "appendix/):\n" + "\n".join(found))


DROPDOWN = re.compile(r"(?:^|\n)\s*(?::::*|```+)\{dropdown\}\s*(\w+)"
                      r"|(?:^|\n)\s*(?::::*|```+)\{admonition\}\s*(\w+)[^\n]*\n\s*:class:[^\n]*\bdropdown\b")


@pytest.mark.parametrize("chapter", READER_PATH_CHAPTERS)
def test_exercises_have_hints_and_answers_in_dropdowns(chapter):
    cells = load(chapter)["cells"]
    starts = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown" and re.search(r"^## Exercises\s*$", source(c), re.M)]
    assert len(starts) == 1, f"{chapter}: needs one '## Exercises' section, found {len(starts)}"
    section = source(cells[starts[0]]).split("## Exercises", 1)[1]
    for c in cells[starts[0] + 1:]:
        if c["cell_type"] == "markdown" and re.search(r"^#{1,2} ", source(c), re.M):
            break
        if c["cell_type"] == "markdown":
            section += "\n" + source(c)
    items = re.split(r"\n(?=\d+\.\s)", "\n" + section)[1:]
    assert 3 <= len(items) <= 6, f"{chapter}: {len(items)} numbered exercises; the form is 3 or 4"
    for k, item in enumerate(items, 1):
        titles = [(a or b).lower() for a, _, b in ((m.group(1), None, m.group(2)) for m in DROPDOWN.finditer(item))]
        assert "hint" in titles and "answer" in titles, (
            f"{chapter}: exercise {k} needs a Hint and an Answer in dropdowns, has {titles}: {item[:80]!r}")


def toc_parts() -> list[dict]:
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return toc.get("parts") or [{"chapters": toc.get("chapters", [])}]


def test_every_appendix_page_is_in_the_lab_notebook_part_after_the_chapters():
    parts = toc_parts()
    captions = [p.get("caption") for p in parts]
    assert "Lab notebook" in captions, f"_toc.yml has no 'Lab notebook' part (parts: {captions})"
    lab = captions.index("Lab notebook")
    chapter_part = max(i for i, p in enumerate(parts)
                       if any(str(c.get("file", "")).startswith("chapters/") for c in p.get("chapters", [])))
    assert lab > chapter_part, "the 'Lab notebook' part must come after the chapters"
    listed = {c["file"] for c in parts[lab]["chapters"]}
    pages = {str(p.relative_to(ROOT).with_suffix("")) for p in (ROOT / "appendix").glob("*")
             if p.suffix in {".ipynb", ".md"}}
    assert pages, "no appendix pages"
    assert pages == listed, f"appendix pages not in the Lab notebook part: {sorted(pages - listed)}; " \
                            f"listed but missing: {sorted(listed - pages)}"


# Every chapter starts with objectives (issue 34, item 6): right after the title, in the first markdown cell, an
# "Objectives and prerequisites" admonition whose "In this chapter you will:" list has 3 to 5 items.
OBJECTIVES = re.compile(r"^```\{admonition\} Objectives and prerequisites\n:class: note\n"
                        r"\*\*In this chapter you will:\*\*\n\n(?P<items>(?:- .*\n(?:  .*\n)*)+)\n"
                        r"\*\*Prerequisites:\*\* ", re.M)


@pytest.mark.parametrize("chapter", READER_PATH_CHAPTERS)
def test_chapter_starts_with_objectives(chapter):
    first = next(c for c in load(chapter)["cells"] if c["cell_type"] == "markdown")
    text = source(first)
    title, _, rest = text.partition("\n")
    assert title.startswith("# "), f"{chapter}: the first markdown cell must start with the chapter's title"
    m = OBJECTIVES.search(rest)
    assert m, (f"{chapter}: the first markdown cell needs, after the title, a '```{{admonition}} Objectives and "
               "prerequisites' block with an '**In this chapter you will:**' list and a '**Prerequisites:**' line")
    assert not rest[:m.start()].strip(), f"{chapter}: the objectives must come right after the title"
    items = re.findall(r"^- ", m.group("items"), re.M)
    assert 3 <= len(items) <= 5, f"{chapter}: {len(items)} objectives; the form is 3 to 5"


# Each chapter's main path (its markdown before "## Exercises") is at most 3,500 words (issue 34, "Done when").
MAIN_PATH_WORDS = 3500


def main_path_words(cells: list[dict]) -> int:
    """Words of the markdown cells before '## Exercises': code fences (so admonition and dropdown blocks in
    backtick fences), display and inline math and role targets do not count; a role's text does."""
    n = 0
    for cell in cells:
        if cell["cell_type"] != "markdown":
            continue
        t = source(cell)
        if t.startswith("## Exercises"):
            break
        t = re.sub(r"```.*?```|\$\$.*?\$\$|\$[^$\n]+\$", " ", t, flags=re.S)
        t = re.sub(r"\{(glue:text|glue:|term|doc|ref|numref)\}`([^`<]*)(<[^`]*>)?`", r" \2 ", t)
        t = re.sub(r"\]\([^)]*\)", "]", t)
        n += len(re.findall(r"[A-Za-z0-9]+(?:['’.-][A-Za-z0-9]+)*", t))
    return n


def test_main_path_word_counter():
    cells = [{"cell_type": "markdown", "source": ["# Title\n", "```{admonition} A\nnot counted\n```\n",
                                                  "Two words $x + y$ and {term}`a term <glossary target>`.\n"]},
             {"cell_type": "code", "source": ["words in code do not count"]},
             {"cell_type": "markdown", "source": ["A [link](https://example.org/x-y) it's 3.5 long."]},
             {"cell_type": "markdown", "source": ["## Exercises\n", "not counted"]},
             {"cell_type": "markdown", "source": ["after the exercises"]}]
    assert main_path_words(cells) == 1 + 5 + 5  # Title | Two words and a term | A link it's 3.5 long


@pytest.mark.parametrize("chapter", READER_PATH_CHAPTERS)
def test_main_path_is_at_most_3500_words(chapter):
    n = main_path_words(load(chapter)["cells"])
    assert n <= MAIN_PATH_WORDS, (f"{chapter}: the main path has {n} markdown words, over {MAIN_PATH_WORDS}; "
                                  "tighten it or move lab material to its appendix page")
