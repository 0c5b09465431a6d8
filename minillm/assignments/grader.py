"""``python -m minillm.assignments grade STUDENT_DIR --assignment N``: the offline autograder.

The public and grader-only tests are copied into a scratch folder and run by pytest in a
subprocess with ``PYTHONPATH=STUDENT_DIR``, so they import the student's ``minillm``. Each
test gets a time limit (an alarm inside the test process; a watchdog outside it kills a
process stuck where the alarm cannot reach). A test that crashes the process, hangs, or
cannot even be collected (a syntax error) scores 0 with its message, and the remaining tests
run in a fresh process: nothing a student writes stops the grader. Reports: JSON and JUnit XML.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from .builder import PACKAGE_DIR, PYTEST_INI, SUPPORT, TESTS_DIR
from .registry import AssignmentError, get
from .submission import check_student_dir, unpack

GRACE_S = 15.0       # the watchdog's margin over the in-process alarm
STARTUP_S = 120.0    # longest a fresh pytest process may take to reach its first test


def _read_log(path: Path, offset: int) -> tuple[list[dict], int]:
    if not path.exists():
        return [], offset
    with open(path) as f:
        f.seek(offset)
        chunk = f.read()
    complete = chunk[:chunk.rfind("\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()], offset + len(complete)


def _pytest(work: Path, pythonpath: Path, log: Path, timeout: float, args: list[str], collect_only=False):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "MINILLM_GRADE", "PYTEST"))}
    env.update(PYTHONPATH=str(pythonpath), PYTHONDONTWRITEBYTECODE="1", MINILLM_GRADE_LOG=str(log),
               MINILLM_GRADE_TIMEOUT=str(timeout), MINILLM_GRADE_ROOT=str(pythonpath))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(work / "pytest.ini"),
           "--rootdir", str(work), "--continue-on-collection-errors", "-o", "console_output_style=classic"]
    if collect_only:
        cmd.append("--collect-only")
    out = open(work / "output.txt", "w")  # noqa: SIM115 -- closed by the caller once the process ends
    proc = subprocess.Popen(cmd + args, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    return proc, out


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except FileNotFoundError:
        return ""


_live: list = []   # test processes of the current grading; killed if the grader itself stops early


def _run(work: Path, student: Path, files: list[str], timeout: float) -> tuple[dict, dict, list[str]]:
    """Run until every collected test has a result; returns (tests meta, results, errors)."""
    try:
        return _run_attempts(work, student, files, timeout)
    finally:  # an exception or Ctrl-C in the grader must not leave a student's process running
        while _live:
            p = _live.pop()
            if p.poll() is None:
                _kill(p)


def _run_attempts(work: Path, student: Path, files: list[str], timeout: float) -> tuple[dict, dict, list[str]]:
    meta: dict[str, dict] = {}
    results: dict[str, dict] = {}
    errors: list[str] = []
    args = files
    for attempt in range(1000):
        log = work / f"log{attempt}.jsonl"
        proc, out = _pytest(work, student, log, timeout, args)
        _live.append(proc)
        offset, current, started, killed, finished_at = 0, None, time.time(), None, None
        t_launch = time.time()
        while True:
            done = proc.poll() is not None
            records, offset = _read_log(log, offset)
            for r in records:
                if r["event"] == "collected":
                    for t in r["tests"]:
                        meta.setdefault(t["id"], t)
                elif r["event"] == "start":
                    current, started = r["id"], time.time()
                elif r["event"] == "result":
                    results[r["id"]] = r
                    current = None
                elif r["event"] == "collect_error":
                    errors.append(f"collecting {r['nodeid']}: {r['message']}")
                elif r["event"] == "fatal":
                    errors.append(r["message"])
            if done:
                break
            finished = bool(meta) and current is None and all(t in results for t in meta)
            if finished and finished_at is None:
                finished_at = time.time()
            if finished and time.time() - finished_at > GRACE_S:  # e.g. a thread the student left running
                _kill(proc)
            elif current is not None and time.time() - started > timeout + GRACE_S:
                killed = f"timed out after {timeout:g} s (the process was killed)"
                _kill(proc)
            elif current is None and not records and time.time() - t_launch > STARTUP_S and offset == 0:
                killed = f"pytest did not start within {STARTUP_S:g} s"
                _kill(proc)
            time.sleep(0.05)
        out.close()
        if current is not None:
            rc = proc.returncode
            results[current] = {"id": current, "outcome": "timeout" if killed else "crashed", "duration": 0.0,
                                "message": killed or f"the test process died (exit status {rc})",
                                "details": _tail(work / "output.txt")}
        elif killed:
            errors.append(killed)
        if not meta and proc.returncode not in (0, 1, 5):
            errors.append(f"pytest exited with status {proc.returncode}:\n{_tail(work / 'output.txt')}")
            break
        remaining = [t for t in meta if t not in results]
        if not remaining:
            break
        if current is None:   # the process ended without starting the remaining tests: no progress possible
            errors.append(f"{len(remaining)} test(s) did not run:\n{_tail(work / 'output.txt')}")
            break
        args = remaining
    return meta, results, errors


def _canonical_tests(work: Path, files: list[str]) -> dict[str, dict]:
    """The test list as collected against the reference package (when the student's does not collect)."""
    log = work / "reference_collect.jsonl"
    proc, out = _pytest(work, PACKAGE_DIR.parent, log, 0, files, collect_only=True)
    try:
        proc.wait(timeout=STARTUP_S)
    except subprocess.TimeoutExpired:
        _kill(proc)
    out.close()
    meta = {}
    for r in _read_log(log, 0)[0]:
        if r["event"] == "collected":
            for t in r["tests"]:
                meta[t["id"]] = t
    return meta


def grade(student_dir, number, out_dir=None, timeout: float = 60.0) -> dict:
    """Grade one assignment; writes assignment-NN.json and assignment-NN.junit.xml to ``out_dir``.

    ``student_dir`` is a student tree, or a submission zip from ``pack`` (graded over a fresh tree)."""
    if str(student_dir).endswith(".zip"):
        with tempfile.TemporaryDirectory(prefix="minillm-submission-") as tmp:
            report = grade(unpack(student_dir, number, Path(tmp) / "tree"), number, out_dir, timeout)
            report["student_dir"] = str(student_dir)
            return report
    a = get(number)
    student = check_student_dir(student_dir, a)
    if not timeout > 0:
        raise AssignmentError(f"timeout must be > 0 seconds, got {timeout!r}")
    files = [a.public_tests, a.grader_tests]
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix=f"minillm-grade-{a.number:02d}-") as tmp:
        work = Path(tmp)
        for f in files + [SUPPORT]:
            shutil.copy(TESTS_DIR / f, work / f)
        (work / "pytest.ini").write_text(PYTEST_INI.replace("testpaths = tests\n", ""))
        meta, results, errors = _run(work, student, files, timeout)
        if errors or not meta:
            for tid, t in _canonical_tests(work, files).items():
                meta.setdefault(tid, t)
    why = "\n".join(errors) or "the test was not run"
    tests = []
    for tid, t in meta.items():
        r = results.get(tid) or {"outcome": "error", "message": why.splitlines()[0] if why else "", "details": why,
                                 "duration": 0.0}
        file = tid.split("::")[0]
        passed = r["outcome"] == "passed"
        tests.append({"id": tid, "file": file, "kind": "grader" if file == a.grader_tests else "public",
                      "stretch": t["stretch"], "points": t["points"], "earned": t["points"] if passed else 0.0,
                      "outcome": r["outcome"], "message": r.get("message", ""), "details": r.get("details", ""),
                      "duration": round(float(r.get("duration", 0.0)), 3)})
    core = [t for t in tests if not t["stretch"]]
    report = {
        "assignment": a.number, "title": a.title, "student_dir": str(student),
        "score": sum(t["earned"] for t in core), "max_score": sum(t["points"] for t in core),
        "bonus": sum(t["earned"] for t in tests if t["stretch"]),
        "bonus_max": sum(t["points"] for t in tests if t["stretch"]),
        "passed": sum(t["outcome"] == "passed" for t in tests), "total": len(tests),
        "errors": errors, "seconds": round(time.time() - t0, 2), "tests": tests,
    }
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{a.slug}.json").write_text(json.dumps(report, indent=2))
        junit(report).write(out / f"{a.slug}.junit.xml", encoding="unicode", xml_declaration=True)
        report["reports"] = [str(out / f"{a.slug}.json"), str(out / f"{a.slug}.junit.xml")]
    return report


def junit(report: dict) -> ET.ElementTree:
    tests = report["tests"]
    failed = sum(t["outcome"] == "failed" for t in tests)
    errored = sum(t["outcome"] in ("error", "timeout", "crashed") for t in tests)
    suite = ET.Element("testsuite", name=f"assignment-{report['assignment']:02d}", tests=str(len(tests)),
                       failures=str(failed), errors=str(errored),
                       skipped=str(sum(t["outcome"] == "skipped" for t in tests)),
                       time=f"{report['seconds']:.2f}")
    props = ET.SubElement(suite, "properties")
    for k in ("score", "max_score", "bonus", "bonus_max"):
        ET.SubElement(props, "property", name=k, value=f"{report[k]:g}")
    for t in tests:
        file, _, name = t["id"].partition("::")
        case = ET.SubElement(suite, "testcase", classname=file.removesuffix(".py"), name=name,
                             time=f"{t['duration']:.3f}")
        cprops = ET.SubElement(case, "properties")
        for k, v in (("points", t["points"]), ("earned", t["earned"]), ("kind", t["kind"]),
                     ("stretch", t["stretch"])):
            ET.SubElement(cprops, "property", name=k, value=f"{v:g}" if isinstance(v, float) else str(v))
        if t["outcome"] == "failed":
            ET.SubElement(case, "failure", message=t["message"][:500]).text = t["details"]
        elif t["outcome"] == "skipped":
            ET.SubElement(case, "skipped", message=t["message"][:500])
        elif t["outcome"] != "passed":
            ET.SubElement(case, "error", message=f"{t['outcome']}: {t['message']}"[:500]).text = t["details"]
    return ET.ElementTree(suite)


def summary(report: dict) -> str:
    lines = [f"assignment {report['assignment']}: {report['title']}"]
    for t in report["tests"]:
        tag = "bonus " if t["stretch"] else ""
        msg = "" if t["outcome"] == "passed" else f"  -- {t['message'].splitlines()[0][:100] if t['message'] else ''}"
        lines.append(f"  {t['outcome']:8s} {t['earned']:g}/{t['points']:g} {tag}{t['id']}{msg}")
    for e in report["errors"]:
        lines.append("  error: " + e.splitlines()[0][:200])
    lines.append(f"score {report['score']:g}/{report['max_score']:g}"
                 + (f" (+{report['bonus']:g}/{report['bonus_max']:g} bonus)" if report["bonus_max"] else "")
                 + f", {report['passed']}/{report['total']} tests passed, {report['seconds']:.1f} s")
    return "\n".join(lines)
