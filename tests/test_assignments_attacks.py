"""Attacks on the autograder (issue 35): each submission here got full marks, leaked grader source or wrote
outside its folder with the old grader; now it scores 0 with a reason, or is caught as tampering, or its
report holds no grader source.

Each fixture is what a student could hand in: a student tree built for the assignment (the release flow) with
some bodies written. Most are rejected before anything runs (fast); the ones that get past the static rules
run and must be caught by the child process's integrity check or the canaries.
"""
import ast
import json
import zipfile
from pathlib import Path

import pytest

from minillm.assignments import build, grade
from minillm.assignments import splice as splice_module
from minillm.assignments.builder import PACKAGE_DIR, TESTS_DIR, all_regions
from minillm.assignments.grader import check_submission, sanitize, student_report
from minillm.assignments.markers import normalize


def _tree(tmp_path, n) -> Path:
    out = tmp_path / f"tree{n}"
    if not out.exists():
        build(out, [n])
    return out


def _set_body(tree: Path, rel: str, qualname: str, code: str) -> None:
    """Replace the stub (the ``raise NotImplementedError`` line) of ``qualname`` by ``code`` at its indentation."""
    path = tree / "minillm" / rel
    text = path.read_text()
    node = ast.parse(text)
    for part in qualname.split("."):
        node = next(n for n in ast.iter_child_nodes(node)
                    if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part)
    lines = text.splitlines(keepends=True)
    k = next(i for i in range(node.lineno - 1, node.end_lineno)
             if lines[i].lstrip().startswith("raise NotImplementedError(") and "assignment " in lines[i])
    indent = lines[k][:len(lines[k]) - len(lines[k].lstrip())]
    lines[k:k + 1] = [(indent + line if line.strip() else "") + "\n" for line in code.strip("\n").splitlines()]
    path.write_text("".join(lines))


def _solve(tree: Path, rel: str, qualname: str) -> None:
    """Write the reference body of one part (what a correct student writes)."""
    r = next(r for r in all_regions() if (r.path, r.qualname) == (rel, qualname))
    body = (PACKAGE_DIR / rel).read_text().splitlines()[r.begin + 1:r.end]
    _set_body(tree, rel, qualname, "\n".join(line[len(r.indent):] for line in body))


def _zero(report, reason):
    assert report["score"] == 0 and report["bonus"] == 0
    assert all(t["earned"] == 0 for t in report["tests"]) and report["total"] > 0
    text = report["rejected"] or "; ".join(report["tampered"])
    assert reason in text, text


# --------------------------------------------------------------------------- rejected before anything runs


def test_forged_results_at_module_level_are_rejected(tmp_path):
    """The attack of the issue: ten lines at module level of softmax.py rewrote conftest's result log (18/18)."""
    tree = _tree(tmp_path, 5)
    f = tree / "minillm" / "softmax.py"
    f.write_text(f.read_text() + '''
import sys, json
_c = sys.modules.get("conftest")
if _c is not None:
    _orig = _c._log
    def _forged(**record):
        if record.get("event") == "result":
            record.update(outcome="passed", message="")
        _orig(**record)
    _c._log = _forged
''')
    report = grade(tree, 5)
    _zero(report, "softmax.py: your code in merge: the line 'import sys, json' is indented less than the function")
    assert all(t["outcome"] == "rejected" for t in report["tests"])
    text = f.read_text()   # the same lines above the first body: a change outside the bodies
    f.write_text(text.replace("\nimport sys, json", "").replace("from dataclasses import dataclass\n",
                                                                 "from dataclasses import dataclass\nimport sys\n"))
    problems = check_submission(tree, 5)
    assert problems and "softmax.py: you may change only the bodies of online_max_and_normalizer, merge" in problems[0]


def test_forged_results_from_inside_a_body_are_rejected(tmp_path):
    tree = _tree(tmp_path, 5)
    f = tree / "minillm" / "softmax.py"
    handed_out = f.read_text()
    _set_body(tree, "softmax.py", "merge", "import sys\nsys.modules['conftest']._log = print\nreturn a")
    _zero(grade(tree, 5), "import sys")
    for code, what in (("m = __import__('sys')\nreturn a", "__import__"),
                       ("g = globals()\nreturn a", "globals"),
                       ("return a.__class__.__init__.__globals__", ".__globals__"),
                       ("f = getattr(a, 'm')\nreturn a", "getattr"),
                       ("np.testing.assert_allclose = print\nreturn a", ".testing"),
                       ("alias = np\nalias.exp = print\nreturn a", "changes 'alias'"),
                       ("Partial.finalize = lambda self: 0\nreturn a", "changes 'Partial'"),
                       ("global safe_softmax\nsafe_softmax = print\nreturn a", "global statement"),
                       ("import operator\ng = operator.attrgetter('gi_frame')\nreturn a", "import operator"),
                       ("t = '{0.gi_frame.f_back.f_globals}'.format(x for x in [])\nreturn a", "the string"),
                       ("import numpy.f2py\nreturn a", "import numpy.f2py"),
                       ("c = np._core\nreturn a", "._core"),
                       ("import typing\nreturn a", "import typing")):
        f.write_text(handed_out)
        _set_body(tree, "softmax.py", "merge", code)
        problems = check_submission(tree, 5)
        assert problems and what in problems[0], (code, problems)


def test_tampered_oracle_is_rejected(tmp_path):
    """Assignment 9's oracle lives in the file the student hands in: resample-from-p plus a chi_square_gof that
    returns 1 got 20/20."""
    tree = _tree(tmp_path, 9)
    _solve(tree, "sampling.py", "verify_probs")
    _solve(tree, "speculative.py", "residual")
    _solve(tree, "speculative.py", "verify")
    f = tree / "minillm" / "speculative.py"
    text = f.read_text()
    head = "def chi_square_gof(counts, probs, min_expected: float = 5.0) -> tuple[float, int, float]:\n"
    assert head in text
    f.write_text(text.replace(head, head + "    return 0.0, 1, 1.0\n"))
    _zero(grade(tree, 9), "speculative.py: you may change only the bodies of residual, verify")


def test_tests_never_read_the_oracles_from_a_graded_file():
    """Every reference a test compares against comes from tests/oracles.py, never from a handed-in file."""
    oracle_names = {"chi_square_gof", "safe_softmax", "partial_attention", "standard_attention", "causal_mask"}
    for f in sorted(TESTS_DIR.glob("a0*_*.py")):
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("minillm"):
                assert not oracle_names & {a.name for a in node.names}, (f.name, node.module)


def test_leaking_the_grader_source_is_rejected_and_sanitized(tmp_path):
    tree = _tree(tmp_path, 5)
    _set_body(tree, "softmax.py", "online_max_and_normalizer", "raise RuntimeError(open('a05_grader.py').read())")
    _zero(grade(tree, 5), "open")
    secrets = [normalize(s) for s in (TESTS_DIR / "a05_grader.py").read_text().splitlines() if len(normalize(s)) >= 8]
    source = (TESTS_DIR / "a05_grader.py").read_text()
    assert all(len(normalize(line)) < 8 for line in sanitize(source, secrets, max_lines=1000).splitlines())
    assert sanitize("Mismatched elements: 3 / 12 (25%)\nassert m[1] == -inf", secrets) == \
        "Mismatched elements: 3 / 12 (25%)"


def test_writing_outside_the_folder_is_rejected(tmp_path):
    tree = _tree(tmp_path, 4)
    f = tree / "minillm" / "hardware.py"
    handed_out = f.read_text()
    target = tmp_path / "outside.txt"
    for code, what in ((f"open({str(target)!r}, 'w').write('x')\nreturn None", "open"),
                       (f"np.save({str(target)!r}, q)\nreturn None", ".save"),
                       (f"q.tofile({str(target)!r})\nreturn None", ".tofile"),
                       ("import os\nos.system('touch /tmp/x')\nreturn None", "import os"),
                       ("import pathlib\nreturn None", "import pathlib"),
                       # the grader's own module, which on an editable install holds the reference package's path
                       ("from minillm.assignments import builder as b\nreturn None", "minillm.assignments"),
                       ("from minillm import assignments\nreturn None", "import of assignments"),
                       (f"from minillm import book\nbook.shutil.copyfile('/etc/hostname', {str(target)!r})\n"
                        "return None", ".shutil"),
                       ("from minillm import book\nreturn book.Path.cwd()", ".Path"),
                       # torch computes a NumPy part's answer in memory tracemalloc does not count
                       ("import torch\nreturn None", "import torch"),
                       ("from minillm.kernels import flash_attention as f\nreturn f.torch.zeros(1)", ".torch"),
                       # Triton's interpreter, where a grader test counts a kernel's loads
                       ("import triton\nreturn triton.runtime", ".runtime")):
        _set_body(tree, "hardware.py", "simulate_tiled_attention", code)
        problems = check_submission(tree, 4)
        assert problems and what in problems[0], (code, problems)
        f.write_text(handed_out)
    assert not target.exists()


@pytest.mark.parametrize("code, reason", [
    ("x = 1\nif True:\nreturn x", "does not parse"),                               # a syntax error
    ("return (1,\n2)\nfoo = '''", "does not parse"),                               # a string left open
    ("s = '''\n'''\nreturn 0", "indented less"),                                    # a line at column 0
])
def test_bodies_that_do_not_stand_alone_are_rejected(tmp_path, code, reason):
    tree = _tree(tmp_path, 4)
    _set_body(tree, "hardware.py", "flash_attention_traffic", code)
    f = tree / "minillm" / "hardware.py"
    if reason == "indented less":   # the string's closing quotes at column 0
        f.write_text(f.read_text().replace("\n    '''\n    return 0", "\n'''\n    return 0"))
    problems = check_submission(tree, 4)
    assert problems and reason in problems[0], problems


def test_a_string_that_swallows_the_code_between_two_bodies_is_rejected(tmp_path):
    """Body 1 opens a string that body 2 closes: the trusted code between them (here flash_attention_traffic's
    neighbours) would vanish. Each body must parse on its own."""
    tree = _tree(tmp_path, 4)
    f = tree / "minillm" / "hardware.py"
    lines = f.read_text().splitlines(keepends=True)
    stubs = [i for i, line in enumerate(lines) if line.strip().startswith("raise NotImplementedError(")
             and "assignment 4" in line]
    assert len(stubs) == 2
    lines[stubs[0]] = '    x = """\n'
    lines[stubs[1]] = '    """\n    return None\n'
    f.write_text("".join(lines))
    problems = check_submission(tree, 4)
    assert problems and "does not parse" in problems[0]


def test_an_import_or_helper_outside_the_bodies_is_rejected_with_the_line(tmp_path):
    tree = _tree(tmp_path, 3)
    f = tree / "minillm" / "sizing.py"
    text = f.read_text()
    f.write_text(text.replace("from __future__ import annotations\n", "from __future__ import annotations\nimport os\n"))
    problems = check_submission(tree, 3)
    assert problems and "you may change only the bodies of gqa_kv_bytes, mla_kv_bytes" in problems[0]
    f.write_text(text.replace('"""', '"""Edited. ', 1))
    problems = check_submission(tree, 3)
    assert problems and "is missing" in problems[0]


def test_a_given_helper_that_does_the_step_is_forbidden(tmp_path):
    """kernels.common.softmax_step does assignment 6's online-softmax step; the kernel body may not call it."""
    tree = _tree(tmp_path, 6)
    _set_body(tree, "kernels/flash_attention.py", "_fwd_inner",
              "from .common import softmax_step\np, alpha, m, l = softmax_step(q, m, l, qk_scale, True, True)\n"
              "return acc, l, m")
    problems = check_submission(tree, 6)
    assert problems and "softmax_step" in problems[0]


# --------------------------------------------------------------------------- caught while it runs


def test_tampering_that_passes_the_static_rules_is_caught(tmp_path):
    """A body that replaces a NumPy function through a list (no rule catches it) is caught by the child's
    integrity check: the whole submission scores 0."""
    tree = _tree(tmp_path, 4)
    _solve(tree, "hardware.py", "flash_attention_traffic")
    _set_body(tree, "hardware.py", "simulate_tiled_attention",
              "box = [np]\nbox[0].allclose = lambda *a, **k: True\nraise ValueError('no')")
    assert check_submission(tree, 4) == []
    report = grade(tree, 4)
    _zero(report, "numpy.allclose was replaced")
    view = student_report(report)
    assert view["not_graded_because"].startswith("your code changed objects the tests rely on")


def test_canaries_catch_forged_checks(tmp_path, no_policy_module):
    """With the rules switched off, a body that disables NumPy's assertions everywhere: every check would pass.
    The integrity check and the canaries (which must fail) both see it."""
    tree = _tree(tmp_path, 4)
    _set_body(tree, "hardware.py", "flash_attention_traffic",
              "import numpy.testing as nt\nnt.assert_allclose = lambda *a, **k: None\n"
              "return {'q_tiles': 0, 'components': {}, 'total': 0}")
    report = grade(tree, 4)
    assert report["score"] == 0 and report["tampered"]
    assert any("numpy.testing.assert_allclose was replaced" in t or "canary" in t for t in report["tampered"])


FORGE = """
import json, os, hashlib
log = os.environ.get("MINILLM_GRADE_LOG")
if log:
    tests = [t["id"] for line in open(log) for t in json.loads(line).get("tests", [])]
    with open(log, "a") as f:
        for t in tests:
            passed = not t.startswith("zz_integrity")
            f.write(json.dumps({"event": "result", "id": t, "outcome": "passed" if passed else "failed",
                                "message": "", "details": "", "duration": 0.0, "exc": None, "frames": []}) + "\\n")
            if FAKE_TRACES and os.environ.get("MINILLM_GRADE_TRACES"):
                name = hashlib.sha1(t.encode()).hexdigest() + ".json"
                with open(os.path.join(os.environ["MINILLM_GRADE_TRACES"], name), "w") as g:
                    g.write(json.dumps({"events": [], "error": None}))
    os._exit(0)
return 0
"""


@pytest.mark.parametrize("fake_traces", [False, True])
def test_forged_result_records_score_zero(tmp_path, no_policy_module, fake_traces):
    """With the rules switched off, a body that writes a "passed" record for every test (and "failed" for the
    canaries) into the child's result log and exits: the old grader took the child's word (full marks). Now the
    parent decides from values: a "passed" with no recorded values is a forged record (score 0); with empty
    traces forged too, the trusted replay finds no values where the tests need them and nothing passes."""
    tree = _tree(tmp_path, 3)
    _set_body(tree, "sizing.py", "gqa_kv_bytes", f"FAKE_TRACES = {fake_traces}\n" + FORGE)
    report = grade(tree, 3)
    assert report["score"] == 0 and report["bonus"] == 0 and report["total"] > 0
    if fake_traces:
        assert report["passed"] == 0
        assert all("recorded no values" in t["message"] or "not in the child" in t["message"]
                   or "assignment 3" in t["message"] for t in report["tests"]), report["tests"]
    else:
        _zero(report, "forged result record")


@pytest.fixture
def no_policy_module(monkeypatch):
    monkeypatch.setattr(splice_module, "policy_violations", lambda *a, **k: [])


def test_total_time_cap_bounds_a_hanging_submission(tmp_path):
    tree = _tree(tmp_path, 3)
    _set_body(tree, "sizing.py", "gqa_kv_bytes", "while True:\n    try:\n        pass\n    except:\n        pass")
    report = grade(tree, 3, timeout=1.0, total_timeout=4.0)
    assert report["seconds"] < 60
    hung = [t for t in report["tests"] if t["outcome"] == "timeout"]
    assert hung and report["score"] < report["max_score"]
    assert any("total time" in t["message"] for t in hung)


def test_student_report_holds_no_grader_source(tmp_path):
    """A wrong submission that fails grader tests in several ways: the student's report (and results.json) quotes
    no line of the grader tests, while the instructor's report keeps the details."""
    tree = _tree(tmp_path, 4)
    _solve(tree, "hardware.py", "flash_attention_traffic")
    _set_body(tree, "hardware.py", "simulate_tiled_attention",
              "if block_m == 1:\n    raise ValueError('tiles of one row are not supported')\n"
              "o = np.zeros_like(q)\nreturn o, TrafficCounter()")
    report = grade(tree, 4, out_dir=tmp_path / "out")
    view = json.loads((tmp_path / "out" / "assignment-04.student.json").read_text())
    from minillm.assignments.gradescope import results_json

    gs = json.dumps(results_json(report))
    source = [normalize(s) for s in (TESTS_DIR / "a04_grader.py").read_text().splitlines() if len(normalize(s)) >= 16]
    public = {normalize(s) for s in (TESTS_DIR / "a04_public.py").read_text().splitlines()}
    flat = normalize(json.dumps(view)) + normalize(gs)
    assert not [s for s in source if s in flat and s not in public]
    hidden = [t for t in view["tests"] if t["kind"] == "grader" and t["outcome"] != "passed"]
    assert hidden and any("ValueError raised in your code: tiles of one row are not supported" in t["message"]
                          for t in hidden)
    assert any(t["message"].startswith("wrong result") for t in hidden)
    assert any(t["your_code"] and t["your_code"][0].startswith("minillm/hardware.py:") for t in hidden)
    inst = json.loads((tmp_path / "out" / "assignment-04.json").read_text())
    assert any("a04_grader.py" in t["details"] for t in inst["tests"] if t["outcome"] == "failed")
    assert report["score"] < report["max_score"] and not view["core_passed"]
    gated = [t for t in view["tests"] if t["outcome"] == "passed" and not t["core"]]
    assert gated and all(t["earned"] == 0 and "core" in t["message"] for t in gated)


def test_a_zip_with_a_file_outside_the_assignment_is_refused(tmp_path):
    from minillm.assignments import AssignmentError
    from minillm.assignments.submission import pack

    tree = _tree(tmp_path, 9)
    z = pack(tree, 9, tmp_path / "a.zip")
    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(z) as src, zipfile.ZipFile(bad, "w") as dst:
        for name in src.namelist():
            dst.writestr(name, src.read(name))
        dst.writestr("../../outside.py", "x = 1\n")
    with pytest.raises(AssignmentError, match="unexpected files"):
        grade(bad, 9)


def test_a_submission_past_the_memory_limit_fails_with_a_clear_reason(tmp_path):
    """A body that allocates 16 GB: under the grader's memory limit its tests fail with "ran past the memory
    limit", the other parts' tests still run and pass, and the grader itself is unharmed."""
    tree = _tree(tmp_path, 3)
    for q in ("gqa_kv_bytes", "mla_kv_bytes"):
        _solve(tree, "sizing.py", q)
    for q in ("quantize_fp8", "dequantize_fp8", "dequantize_int8"):
        _solve(tree, "quant.py", q)
    r = next(r for r in all_regions() if (r.path, r.qualname) == ("quant.py", "quantize_int8"))
    body = (PACKAGE_DIR / "quant.py").read_text().splitlines()[r.begin + 1:r.end]
    _set_body(tree, "quant.py", "quantize_int8",
              "waste = np.ones(2**31)\n" + "\n".join(line[len(r.indent):] for line in body))
    report = grade(tree, 3, memory_mb=3000)
    int8 = [t for t in report["tests"] if "int8" in t["id"] and "dequantize_int8_wrong" not in t["id"]]
    assert int8 and all(t["outcome"] != "passed" for t in int8)
    assert any("memory limit (3000 MB)" in t["message"] for t in int8)
    assert any("memory limit" in t["student_message"] for t in int8 if t["kind"] == "grader")
    others = [t for t in report["tests"] if "gqa" in t["id"] or "mla" in t["id"] or "fp8" in t["id"]]
    assert others and all(t["outcome"] == "passed" for t in others)
