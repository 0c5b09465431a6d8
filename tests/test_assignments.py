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
    with pytest.raises(AssignmentError, match="unknown assignment '11'"):
        grade(ROOT, "11")


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


# --------------------------------------------------------------------------- release flow, leaks, course tooling


def test_release_flow_stubs_k_and_later_and_keeps_released_solutions(tmp_path):
    tree = tmp_path / "tree"
    info = build(tree, [5])
    assert info["assignments"] == [5] and info["stubbed_assignments"] == [5, 6, 7, 8, 9, 10]
    assert sorted(p.name for p in (tree / "handouts").iterdir()) == ["assignment-05.md"]
    assert "m_new = np.maximum(m, s.max(axis=1))" in (tree / "minillm" / "hardware.py").read_text()  # 4: released
    assert "assignment 5:" in (tree / "minillm" / "softmax.py").read_text()
    assert leak_check(tree, [5]) == []
    assert any("hardware.py" in leak for leak in leak_check(tree))   # checked as an all-stub tree, 4 leaks
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cli = [sys.executable, "-m", "minillm.assignments", "leak-check", str(tree)]
    assert subprocess.run(cli + ["-a", "5"], env=env, capture_output=True, text=True).returncode == 0
    assert subprocess.run(cli, env=env, capture_output=True, text=True).returncode == 1


def test_a_tree_for_assignment_8_runs_its_public_tests_on_the_released_solutions(tmp_path):
    """The issue's case: assignment 8's tests run through assignments 2 and 7, which were stubs in the old tree."""
    tree = tmp_path / "tree"
    build(tree, [8])
    shutil.copy(PACKAGE_DIR / "serving" / "scheduler.py", tree / "minillm" / "serving" / "scheduler.py")  # solved
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/a08_public.py"],
                       cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:]


def test_given_code_that_reveals_a_solution_is_stubbed_and_near_copies_are_caught(student_tree, tmp_path):
    for rel, qualname, n in (("kernels/paged_prefill.py", "def _varlen_inner", 7),
                             ("kernels/flash_hopper.py", "def _fwd_inner_tma", 6),
                             ("torch_sampling.py", "def verify_batch", 9),
                             ("explorables/__init__.py", "def online_softmax_steps", 5)):
        text = (student_tree / "minillm" / rel).read_text()
        after = text[text.index(qualname):]
        assert "holds the reference solution of assignment" in after[:3000], rel
    # the reference's paged_prefill.py put back: the near-copy check (token windows) sees the decode kernel in it
    tree = tmp_path / "tree"
    shutil.copytree(student_tree, tree)
    shutil.copy(PACKAGE_DIR / "kernels" / "paged_prefill.py", tree / "minillm" / "kernels" / "paged_prefill.py")
    leaks = leak_check(tree)
    assert any("paged_prefill.py" in x and "near-copy" in x and "_paged_decode_kernel" in x for x in leaks), leaks
    # a solution re-wrapped onto other lines, other indentation and comments: the exact-line check misses it
    body = [r for r in all_regions() if r.qualname == "simulate_tiled_attention"][0]
    lines = (PACKAGE_DIR / "hardware.py").read_text().splitlines()[body.begin + 1:body.end]
    rewrapped = " ".join(line.strip() for line in lines).replace(" = ", "=").replace(", ", ",\n   ")
    (tree / "notes.md").write_text("# my notes\n" + rewrapped + "\n")
    assert any(x.startswith("notes.md") and "simulate_tiled_attention" in x for x in leak_check(tree))


def test_handouts_show_builds_on_the_rules_and_the_gpu_track(student_tree):
    h8 = (student_tree / "handouts" / "assignment-08.md").read_text()
    assert "It builds on" in h8 and "1, 2, 7" in h8
    h6 = (student_tree / "handouts" / "assignment-06.md").read_text()
    assert "TRITON_INTERPRET=1" in h6 and "`softmax_step`" in h6 and "Rules for graded code" in h6
    for f in (student_tree / "handouts").iterdir():
        assert "benchmarks/" not in f.read_text(), f.name          # the student tree has no benchmarks folder
    assert 'os.environ.setdefault("TRITON_INTERPRET", "1")' in (student_tree / "tests" / "conftest.py").read_text()


def test_handin_and_test_stop_an_endless_public_test(tmp_path):
    tree = tmp_path / "tree"
    build(tree, [3])
    f = tree / "minillm" / "sizing.py"
    f.write_text(f.read_text().replace("raise NotImplementedError('assignment 3: validate every size",
                                       "while True: pass\n    raise NotImplementedError('assignment 3: validate every size"))
    h = tree / "handin.py"
    h.write_text(h.read_text().replace("TIMEOUT = 600", "TIMEOUT = 3"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "handin.py", "3"], cwd=tree, capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0 and "ran past 3 s" in r.stdout and (tree / "assignment-03-submission.zip").exists()
    r = subprocess.run([sys.executable, "-m", "minillm.assignments", "test", str(tree), "-a", "3", "--timeout", "3"],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert r.returncode == 1 and "ran past 3 s" in r.stdout


def test_grade_all_writes_a_gradebook_and_per_student_reports(tmp_path):
    import csv
    import zipfile

    from minillm.assignments.grader import grade_folder
    from minillm.assignments.submission import pack

    tree = tmp_path / "tree"
    build(tree, [3])
    subs = tmp_path / "subs"
    subs.mkdir()
    pack(tree, 3, subs / "alice-assignment-03-submission.zip")                     # the stubs: graded, 0
    f = tree / "minillm" / "sizing.py"
    f.write_text("import os\n" + f.read_text())
    pack(tree, 3, subs / "bob.zip")                                                 # a change outside the bodies
    with zipfile.ZipFile(subs / "carol.zip", "w") as z:
        z.writestr("hello.txt", "no manifest")
    path = grade_folder(subs, 3, tmp_path / "out")
    rows = {r["student"]: r for r in csv.DictReader(open(path))}
    assert set(rows) == {"alice", "bob", "carol"}
    assert rows["alice"]["status"] == "graded" and rows["alice"]["score"] == "0" and rows["alice"]["max_score"]
    assert rows["bob"]["status"] == "rejected" and "sizing.py" in rows["bob"]["reason"]
    assert rows["carol"]["status"] == "unreadable" and "submission.json" in rows["carol"]["reason"]
    assert (tmp_path / "out" / "alice" / "assignment-03.student.json").is_file()
    assert (tmp_path / "out" / "alice" / "assignment-03.json").is_file()


def test_gradescope_export_and_results_json(tmp_path):
    import zipfile

    from minillm.assignments.gradescope import export, run
    from minillm.assignments.submission import pack

    z = export(tmp_path / "autograder.zip", 3)
    with zipfile.ZipFile(z) as zf:
        names = set(zf.namelist())
        assert {"setup.sh", "run_autograder", "minillm/assignments/grader.py",
                "minillm/assignments/tests/a03_grader.py"} <= names
        assert zf.getinfo("run_autograder").external_attr >> 16 & 0o111
        assert "gradescope-run /autograder/submission -a 3" in " ".join(zf.read("run_autograder").decode().split()[:-1]
                                                                          ).replace("\\ ", "")
        assert "numpy==" in zf.read("setup.sh").decode()
    tree = tmp_path / "tree"
    build(tree, [3])
    sub = tmp_path / "submission"                     # Gradescope unpacks the uploaded zip here
    with zipfile.ZipFile(pack(tree, 3, tmp_path / "s.zip")) as zf:
        zf.extractall(sub)
    data = run(sub, 3, tmp_path / "results.json")
    assert json.loads((tmp_path / "results.json").read_text()) == data
    vis = {t["visibility"] for t in data["tests"]}
    assert vis == {"visible", "after_due_date"} and data["score"] == 0
    assert all(t["visibility"] == ("visible" if t["name"].startswith("public") else "after_due_date")
               for t in data["tests"])
    grader_src = (PACKAGE_DIR / "assignments" / "tests" / "a03_grader.py").read_text()
    assert not [line for line in grader_src.splitlines() if len(line.strip()) > 25 and line.strip() in
                json.dumps(data)]


# --------------------------------------------------------------------------- chapter cells that print a graded body


def _notebook(tagged: bool) -> dict:
    """A small notebook: a cell that prints assignment 5's merge body (as a chapter's ``print(source(...))`` does)
    and an ordinary cell."""
    r = next(r for r in all_regions() if (r.path, r.qualname) == ("softmax.py", "merge"))
    body = "\n".join((PACKAGE_DIR / "softmax.py").read_text().splitlines()[r.begin + 1:r.end]) + "\n"
    meta = {"tags": ["assignment-solution"]} if tagged else {}
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "code", "id": "a", "metadata": meta, "execution_count": 1,
         "source": "print(source(merge))", "outputs": [{"output_type": "stream", "name": "stdout", "text": body}]},
        {"cell_type": "code", "id": "b", "metadata": {}, "execution_count": 2, "source": "1 + 1",
         "outputs": [{"output_type": "execute_result", "execution_count": 2, "metadata": {},
                      "data": {"text/plain": "2"}}]}]}


def test_solution_cells_lose_their_outputs_and_untagged_ones_are_flagged(tmp_path):
    """The book build and a student tree drop the outputs of a cell tagged assignment-solution (its code stays);
    the leak check flags an untagged cell whose output prints a graded body (it read the notebook's JSON lines
    before and never fired)."""
    from minillm.assignments.builder import notebook_leaks, strip_notebook_text, write_package

    untagged, tagged = _notebook(False), _notebook(True)
    leaks = notebook_leaks(json.dumps(untagged), where="ch.ipynb")
    assert len(leaks) == 1 and leaks[0].startswith("ch.ipynb: cell 0: output quotes a graded body")
    assert notebook_leaks(json.dumps(tagged)) == []                       # the build drops it
    assert notebook_leaks(json.dumps(tagged), tagged_ok=False)            # in a student tree nothing may remain
    text, n = strip_notebook_text(json.dumps(tagged))
    nb = json.loads(text)
    assert n == 1 and nb["cells"][0]["outputs"] == [] and nb["cells"][0]["source"] == "print(source(merge))"
    assert nb["cells"][1] == tagged["cells"][1]
    assert strip_notebook_text(json.dumps(untagged))[1] == 0

    # the Sphinx hook the book build loads (_config.yml) rewrites the notebook it reads
    sys.path.insert(0, str(ROOT / "_ext"))
    try:
        import minillm_assignment_cells as hook
    finally:
        sys.path.remove(str(ROOT / "_ext"))
    assert "minillm_assignment_cells: _ext" in (ROOT / "_config.yml").read_text()

    class Env:
        @staticmethod
        def doc2path(docname):
            return ROOT / f"{docname}.ipynb"

    app = type("App", (), {"env": Env()})()
    source = [json.dumps(tagged)]
    hook.strip_source(app, "chapters/xx", source)
    assert json.loads(source[0])["cells"][0]["outputs"] == [] and notebook_leaks(source[0], tagged_ok=False) == []

    # a notebook in the package reaches a student tree without the tagged outputs; an untagged one is a leak
    pkg = tmp_path / "pkg" / "minillm"
    shutil.copytree(PACKAGE_DIR, pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "assignments"))
    (pkg / "demo.ipynb").write_text(json.dumps(tagged))
    write_package(tmp_path / "tree" / "minillm", set(ASSIGNMENTS), package_dir=pkg)
    assert leak_check(tmp_path / "tree") == []
    (tmp_path / "tree" / "minillm" / "demo2.ipynb").write_text(json.dumps(untagged))
    assert any(x.startswith("minillm/demo2.ipynb: cell 0: output quotes") for x in leak_check(tmp_path / "tree"))


def test_leak_check_book_finds_no_untagged_cell_printing_a_graded_body():
    """Every book cell whose output quotes a graded body is tagged assignment-solution (the site drops its
    outputs); chapter 9 printed a held-out snippet quoting a line of flash_attention's body until it stopped."""
    root = Path(__file__).resolve().parents[1]
    books = [str(p) for pat in ("intro.ipynb", "chapters/*.ipynb", "appendix/*.ipynb") for p in sorted(root.glob(pat))]
    assert len(books) > 10
    done = subprocess.run([sys.executable, "-m", "minillm.assignments", "leak-check-book", *books],
                          capture_output=True, text=True, cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
