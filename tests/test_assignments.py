"""The course-assignment machinery: markers, the generated student tree, the leak check and the autograder.

The two CI checks of the issue run here, for every assignment:
* the reference passes every public and grader test (graded in a tree where every *other* assignment is
  stubbed, which also proves the assignments do not lean on each other's solutions);
* the generated stubs fail every graded test, so no test passes vacuously.
"""
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from minillm.assignments import (
    ASSIGNMENTS,
    AssignmentError,
    build,
    get,
    grade,
    leak_check,
)
from minillm.assignments import grader as grade_module
from minillm.assignments.builder import PACKAGE_DIR, all_regions, stubbed_sources
from minillm.assignments.markers import BEGIN, END, find_regions, stub

NUMBERS = sorted(ASSIGNMENTS)
ROOT = PACKAGE_DIR.parent


@pytest.fixture(scope="module")
def student_tree(tmp_path_factory):
    out = tmp_path_factory.mktemp("student") / "tree"
    info = build(out)
    assert info["assignments"] == NUMBERS
    return out


def _reference_copy(dest: Path) -> Path:
    """The package's Python files only (no checkpoints): enough to grade, cheap to copy."""
    shutil.copytree(PACKAGE_DIR, dest / "minillm",
                    ignore=shutil.ignore_patterns("__pycache__", "weights", "results", "data", "assignments"))
    return dest


def _plant(path: Path, doc_start: str, code: str) -> None:
    """Insert ``code`` (indented 4 spaces) at the top of the solution region below the docstring that starts with
    ``doc_start`` (inside the body a student writes, where the grader takes code from)."""
    text = path.read_text()
    assert text.count(doc_start) == 1, doc_start
    end = text.index('"""', text.index(doc_start) + len(doc_start)) + 3
    end = text.index(BEGIN, end) + len(BEGIN)
    path.write_text(text[:end] + "\n" + "".join("    " + line + "\n" for line in code.splitlines()) + text[end:])


@pytest.fixture
def no_policy(monkeypatch):
    """The policy for graded code switched off: the process-level defences are tested alone."""
    from minillm.assignments import splice

    monkeypatch.setattr(splice, "policy_violations", lambda *a, **k: [])


# --------------------------------------------------------------------------- markers and the registry


def test_registry_regions_match_every_part():
    regions = {(r.path, r.qualname) for r in all_regions()}
    assert regions == {(p.path, p.qualname) for a in ASSIGNMENTS.values() for p in a.parts}
    for a in ASSIGNMENTS.values():
        for f in (a.public_tests, a.grader_tests):
            assert (PACKAGE_DIR / "assignments" / "tests" / f).is_file()


def test_stub_keeps_signature_and_docstring():
    src = f'''def f(x, y=2):
    """Doc."""
    z = x + y
    {BEGIN}
    z = z * 2
    return z
    {END}


def g():
    {BEGIN}
    return 1
    {END}
'''
    regions = find_regions(src, "m.py")
    assert [(r.qualname, r.begin, r.end) for r in regions] == [("f", 3, 6), ("g", 10, 12)]
    out = stub(src, regions, {"f": "assignment 9: hint"})
    ns = {}
    exec(out, ns)  # noqa: S102 -- the stub of a test snippet
    assert ns["f"].__doc__ == "Doc." and ns["g"]() == 1 and BEGIN not in out and END not in out
    with pytest.raises(NotImplementedError, match="assignment 9: hint"):
        ns["f"](1)


@pytest.mark.parametrize("src, error", [
    (f"def f():\n    {BEGIN}\n    return 1\n", "never closed"),
    (f"def f():\n    {BEGIN}\n    {BEGIN}\n    return 1\n    {END}\n", "BEGIN inside"),
    (f"def f():\n    return 1\n    {END}\n", "END without"),
    (f"{BEGIN}\nx = 1\n{END}\n", "inside a function"),
    (f"def f():\n    x = 1  {BEGIN}\n    return x\n", "stand alone"),
    (f"def f():\n    {BEGIN}\n    return 1\n  {END}\n", "indented"),
    (f"def f():\n    {BEGIN}\n    {END}\n    return 1\n", "empty"),
])
def test_find_regions_rejects_bad_markers(src, error):
    with pytest.raises(AssignmentError, match=error):
        find_regions(src, "m.py")


def test_region_no_assignment_claims_is_an_error(tmp_path):
    pkg = tmp_path / "minillm"
    pkg.mkdir()
    (pkg / "extra.py").write_text(f"def h():\n    {BEGIN}\n    return 1\n    {END}\n")
    with pytest.raises(AssignmentError, match="no assignment"):
        all_regions(pkg)


def test_stubbed_sources_compile_and_name_their_assignment():
    for path, text in stubbed_sources(NUMBERS).items():
        compile(text, path, "exec")
        assert BEGIN not in text and END not in text
    text = stubbed_sources([3])["sizing.py"]
    assert "NotImplementedError('assignment 3:" in text


def test_instructors_page_is_up_to_date_with_the_registry():
    from minillm.assignments.docs import START, STOP, generated_block

    page = (ROOT / "instructors.md").read_text()
    assert START in page and STOP in page
    assert generated_block() in page, "run: python -m minillm.assignments instructors-page instructors.md"
    for a in ASSIGNMENTS.values():
        assert f"({a.label})=" in page


# --------------------------------------------------------------------------- the student tree


def test_build_writes_handouts_public_tests_and_no_grader_tests(student_tree):
    assert (student_tree / "README.md").is_file() and (student_tree / "pytest.ini").is_file()
    for a in ASSIGNMENTS.values():
        handout = (student_tree / "handouts" / f"{a.slug}.md").read_text()
        assert a.title in handout and "Done means" in handout
        assert all(p.qualname in handout for p in a.parts)
        assert (student_tree / "tests" / a.public_tests).is_file()
        assert not list(student_tree.rglob(a.grader_tests))
    assert not (student_tree / "minillm" / "assignments").exists()


def test_build_student_package_imports_everywhere(student_tree):
    code = ("import importlib, pkgutil, minillm; "
            "names = [m.name for m in pkgutil.walk_packages(minillm.__path__, 'minillm.')]; "
            "[importlib.import_module(n) for n in names]; print(minillm.__file__, len(names))")
    env = {**os.environ, "PYTHONPATH": str(student_tree)}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=student_tree, capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(str(student_tree))


def test_leak_check_passes_on_the_built_tree(student_tree):
    assert leak_check(student_tree) == []


def test_leak_check_finds_planted_lines(student_tree, tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(student_tree / "tests", tree / "tests")
    f = tree / "tests" / "a04_public.py"
    f.write_text(f.read_text() + "\n    q_tiles = math.ceil(n / block_m)\n"      # exact solution line
                 "x=n  *  d*b\n"                                                  # needs no hint: not a leak
                 "vec   =   n*d*b\n"                                              # whitespace-normalized leak
                 f"# {BEGIN.lstrip('# ')} stray\n")
    leaks = leak_check(tree)
    assert len(leaks) == 3, leaks
    assert any("solution line: q_tiles" in x for x in leaks)
    assert any("whitespace-normalized" in x for x in leaks)
    assert any("marker" in x for x in leaks)


def test_build_refuses_a_non_empty_folder_and_unknown_assignments(tmp_path):
    (tmp_path / "x.txt").write_text("keep me")
    with pytest.raises(AssignmentError, match="not empty"):
        build(tmp_path)
    with pytest.raises(AssignmentError, match="unknown assignment 12"):
        build(tmp_path / "new", [12])
    for bad in (0, "x", True, None, "3.0"):
        with pytest.raises(AssignmentError, match="unknown assignment"):
            get(bad)


# --------------------------------------------------------------------------- the two CI checks


@pytest.mark.parametrize("number", NUMBERS)
def test_reference_passes_every_test_alone(tmp_path, number):
    tree = tmp_path / "tree"
    keep = {number, *ASSIGNMENTS[number].builds_on}
    build(tree, stub=set(NUMBERS) - keep)   # only this assignment's (and its bases') solutions
    report = grade(tree, number)
    failed = [(t["id"], t["message"]) for t in report["tests"] if t["outcome"] != "passed"]
    assert failed == [] and report["errors"] == []
    assert report["score"] == report["max_score"] > 0 and report["bonus"] == report["bonus_max"]
    kinds = {t["kind"] for t in report["tests"]}
    assert kinds == {"public", "grader"}


@pytest.mark.parametrize("number", NUMBERS)
def test_stubs_fail_every_graded_test(student_tree, number):
    report = grade(student_tree, number)
    passed = [t["id"] for t in report["tests"] if t["outcome"] == "passed"]
    assert passed == [] and report["score"] == 0 and report["total"] > 0
    assert any(f"assignment {number}" in t["message"] for t in report["tests"])


# --------------------------------------------------------------------------- the grader on bad submissions


def test_grade_reports_points_json_and_junit(tmp_path):
    report = grade(ROOT, 4, out_dir=tmp_path)
    data = json.loads((tmp_path / "assignment-04.json").read_text())
    assert data["score"] == data["max_score"] == sum(t["points"] for t in data["tests"])
    assert any(t["points"] == 2 for t in data["tests"])
    suite = ET.parse(tmp_path / "assignment-04.junit.xml").getroot()
    assert suite.tag == "testsuite" and int(suite.get("tests")) == report["total"] == len(suite.findall("testcase"))
    assert suite.get("failures") == suite.get("errors") == "0"


def test_grade_survives_infinite_loops_crashes_and_stray_threads(tmp_path, monkeypatch, no_policy):
    monkeypatch.setattr(grade_module, "GRACE_S", 1.0)
    tree = _reference_copy(tmp_path / "sub")
    hw = tree / "minillm" / "hardware.py"
    _plant(hw, '    """HBM traffic of a fused, tiled kernel', "import signal\n"
           "while n == 1024:\n    pass\n"                                 # the alarm interrupts this
           "if n == 300:\n    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})\n"
           "    while True:\n        pass\n"                              # ...but not this: the watchdog
           "if n == 128:\n    import threading, time\n"                   # a thread that keeps pytest alive
           "    threading.Thread(target=time.sleep, args=(1000,)).start()")
    _plant(hw, '    """FlashAttention-2 loop order with online softmax',
           "import os\nif block_m == 8:\n    os._exit(3)")
    report = grade(tree, 4, out_dir=tmp_path / "out", timeout=2.0)
    by_id = {t["id"]: t for t in report["tests"]}
    loop = by_id["a04_public.py::test_flash_attention_traffic_formula"]
    hung = by_id["a04_grader.py::test_block_n_does_not_change_the_traffic"]
    crash = by_id["a04_public.py::test_simulated_tiled_attention_output_and_bytes"]
    assert (loop["outcome"], loop["earned"]) == ("timeout", 0) and "timed out after 2 s" in loop["message"]
    assert (hung["outcome"], hung["earned"]) == ("timeout", 0) and "killed" in hung["message"]
    assert (crash["outcome"], crash["earned"]) == ("crashed", 0) and "exit status 3" in crash["message"]
    rest = [t for t in report["tests"] if t["id"] not in (loop["id"], hung["id"], crash["id"])]
    assert rest and all(t["outcome"] == "passed" for t in rest)
    assert report["score"] == report["max_score"] - 3
    assert (tmp_path / "out" / "assignment-04.junit.xml").is_file()


def test_grade_syntax_error_scores_zero_with_the_message(tmp_path):
    tree = _reference_copy(tmp_path / "sub")
    _plant(tree / "minillm" / "decode.py", '    """Generate ``n_new`` tokens by re-running', "return (")
    report = grade(tree, 1, out_dir=tmp_path / "out")
    assert report["total"] == len(json.loads((tmp_path / "out" / "assignment-01.json").read_text())["tests"]) > 5
    assert report["score"] == 0 and all(t["outcome"] == "rejected" for t in report["tests"])
    assert report["rejected"].startswith("decode.py: your code in naive_decode does not parse")
    assert "pytest" not in report["rejected"] and "/" not in report["rejected"].split(":")[0]


def test_grade_missing_files_and_unknown_assignment(tmp_path):
    with pytest.raises(AssignmentError, match="does not exist"):
        grade(tmp_path / "nowhere", 1)
    (tmp_path / "minillm").mkdir()
    (tmp_path / "minillm" / "__init__.py").write_text("")
    with pytest.raises(AssignmentError, match="minillm/paged/allocator.py") as e:
        grade(tmp_path, 7)
    assert "minillm/kernels/paged_attention.py" in str(e.value)
    with pytest.raises(AssignmentError, match="unknown assignment '10'"):
        grade(ROOT, "10")


def test_cli_errors_exit_2_with_a_message(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for args, msg in ((["grade", str(tmp_path), "-a", "99"], "unknown assignment"),
                      (["grade", str(tmp_path), "-a", "2"], "missing minillm/decode.py"),
                      (["build", str(tmp_path / "x"), "-a", "0"], "unknown assignment")):
        out = subprocess.run([sys.executable, "-m", "minillm.assignments", *args], env=env, capture_output=True,
                             text=True, check=False)
        assert out.returncode == 2 and msg in out.stderr and "Traceback" not in out.stderr, out.stderr


# --------------------------------------------------------------------------- submissions


def test_pack_then_grade_the_zip_scores_full_marks(tmp_path):
    from minillm.assignments.submission import pack
    tree = tmp_path / "tree"
    build(tree, stub=set(NUMBERS) - {9})                   # assignment 9 solved (the reference)
    zpath = pack(tree, 9, tmp_path / "a9.zip")
    report = grade(zpath, 9)
    assert report["score"] == report["max_score"] > 0 and report["student_dir"] == str(zpath)


def test_graded_zip_uses_the_submitted_files_not_the_reference(tmp_path, student_tree):
    from minillm.assignments.submission import pack
    report = grade(pack(student_tree, 9, tmp_path / "stub.zip"), 9)   # the stubs, packed
    assert report["score"] == 0


def test_unpack_rejects_wrong_assignment_tampered_and_foreign_files(tmp_path, student_tree):
    import json
    import zipfile

    from minillm.assignments.submission import MANIFEST, pack, unpack
    z = pack(student_tree, 9, tmp_path / "a9.zip")
    with pytest.raises(AssignmentError, match="assignment 9, not 8"):
        unpack(z, 8, tmp_path / "w1")
    bad = tmp_path / "tampered.zip"
    with zipfile.ZipFile(z) as src, zipfile.ZipFile(bad, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            dst.writestr(name, data + b"\n# edited" if name.endswith(".py") else data)
    with pytest.raises(AssignmentError, match="checksum"):
        unpack(bad, 9, tmp_path / "w2")
    extra = tmp_path / "extra.zip"
    with zipfile.ZipFile(z) as src, zipfile.ZipFile(extra, "w") as dst:
        for name in src.namelist():
            dst.writestr(name, src.read(name))
        dst.writestr("minillm/model.py", "raise SystemExit\n")
    with pytest.raises(AssignmentError, match="unexpected files"):
        unpack(extra, 9, tmp_path / "w3")
    (tmp_path / "junk.zip").write_text("not a zip")
    with pytest.raises(AssignmentError, match="not a readable zip"):
        unpack(tmp_path / "junk.zip", 9, tmp_path / "w4")
    nomanifest = tmp_path / "nomanifest.zip"
    with zipfile.ZipFile(nomanifest, "w") as dst:
        dst.writestr("minillm/speculative.py", "")
    with pytest.raises(AssignmentError, match=MANIFEST):
        unpack(nomanifest, 9, tmp_path / "w5")
    assert json.loads(zipfile.ZipFile(z).read(MANIFEST))["assignment"] == 9


def test_cli_pack_runs_the_public_tests_and_writes_the_zip(tmp_path):
    tree = tmp_path / "tree"
    build(tree, [9])
    for name in ("speculative.py", "sampling.py"):                                        # "solved"
        shutil.copy(PACKAGE_DIR / name, tree / "minillm" / name)
    r = subprocess.run([sys.executable, "-m", "minillm.assignments", "pack", str(tree), "-a", "9"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "3 passed" in r.stdout and (tree / "assignment-09-submission.zip").exists()
    os.remove(tree / "assignment-09-submission.zip")
    r = subprocess.run([sys.executable, "handin.py", "9"], cwd=tree, capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert r.returncode == 0 and "3 passed" in r.stdout
    assert grade(tree / "assignment-09-submission.zip", 9)["score"] > 0      # the student-side script's zip grades
    (tree / "tests" / "a09_public.py").unlink()
    r = subprocess.run([sys.executable, "-m", "minillm.assignments", "test", str(tree), "-a", "9"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "not built for assignment 9" in r.stderr
