"""``python -m minillm.assignments grade SUBMISSION --assignment N``: the offline autograder.

What runs, and where:

1. The submission (a student tree or a zip from ``pack``/``handin.py``) is read, never run. Only the bodies of
   the assignment's marked regions are taken from it and spliced into a fresh copy of the reference package
   (:mod:`.splice`): a change anywhere else, a body that does not parse alone, or one that breaks the policy
   for graded code rejects the submission with a reason and a score of 0. The copy stubs every other
   assignment except those the assignment builds on, and the given code that would reveal a solution.
2. The public and the grader tests run in a child process (pytest) in its own empty temporary folder (also its
   HOME and TMPDIR), with a per-test time limit (an alarm; a watchdog kills a process the alarm cannot reach,
   and the remaining tests go on in a fresh one) and the whole submission under a total time cap. The tests compare against ``oracles.py``, copied from the
   reference package, which the submission cannot reach.
3. Each child reports its results; after every test it checks that nothing the tests rely on was replaced,
   and two canary tests that must fail run last. A replaced object or a passing canary scores the whole
   submission 0 ("tampered").
4. Two reports: the instructor's (everything) and the student's, which holds no grader-test source:
   messages of hidden tests are reduced to what the student's own code raised, NumPy's mismatch summary,
   and the traceback frames inside the student's files.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

from .builder import (
    ORACLES,
    PACKAGE_DIR,
    PYTEST_INI,
    SUPPORT,
    TESTS_DIR,
    all_regions,
    message,
    oracles_source,
    reveal_message,
    stub_function,
    write_package,
)
from .markers import normalize
from .registry import ASSIGNMENTS, Assignment, AssignmentError, get
from .splice import Rejected, splice
from .submission import MANIFEST

GRACE_S = 15.0       # the watchdog's margin over the in-process alarm
STARTUP_S = 120.0    # longest a fresh pytest process may take to reach its first test
MEMORY_MB = 8192     # default address-space limit of a test process (RLIMIT_AS); the reference needs under 2 GB
CANARY = "zz_integrity.py"
# record the values in the child, replay them where the grader decides (probes: the measurements of the child's run)
REPLAY = ("replay.py", "replay_codec.py", "probes.py")
REPLAY_MIN_S = 120.0       # the trusted replay's own time, past the submission's total cap
CANARY_SOURCE = '''"""Integrity canaries: they run after the graded tests and must fail. One that passes means the code under test
changed how results are checked."""
import numpy as np


def test_canary_assert():
    assert 1 == 2


def test_canary_allclose():
    np.testing.assert_allclose(1.0, 2.0)
'''


# --------------------------------------------------------------------------- reading and splicing a submission


def read_submission(src, a: Assignment) -> dict[str, str]:
    """{file: text} of the assignment's files from a student tree or a submission zip (AssignmentError if
    unusable)."""
    if str(src).endswith(".zip"):
        zip_path = Path(src)
        try:
            z = zipfile.ZipFile(zip_path)
        except (OSError, zipfile.BadZipFile) as e:
            raise AssignmentError(f"{zip_path} is not a readable zip archive: {e}") from e
        with z:
            names = set(z.namelist())
            if MANIFEST not in names:
                raise AssignmentError(f"{zip_path} has no {MANIFEST}: make it with `python -m minillm.assignments "
                                      f"pack` or `python handin.py N`")
            try:
                manifest = json.loads(z.read(MANIFEST))
            except ValueError as e:
                raise AssignmentError(f"{zip_path}: {MANIFEST} is not JSON: {e}") from e
            if manifest.get("assignment") != a.number:
                raise AssignmentError(f"{zip_path} is a submission for assignment {manifest.get('assignment')!r}, "
                                      f"not {a.number}")
            want = set(a.files)
            extra, missing = names - want - {MANIFEST}, want - names
            if extra or missing:
                raise AssignmentError(f"{zip_path}: unexpected files {sorted(extra)}, missing files {sorted(missing)}")
            out = {}
            for f in sorted(want):
                data = z.read(f)
                if hashlib.sha256(data).hexdigest() != (manifest.get("files") or {}).get(f):
                    raise AssignmentError(f"{zip_path}: {f} does not match its checksum in {MANIFEST}")
                out[f] = data.decode("utf-8", errors="replace")
            return out
    root = Path(src)
    if not root.is_dir():
        raise AssignmentError(f"student directory {root} does not exist (or is not a directory)")
    missing = [f for f in a.files if not (root / f).is_file()]
    if missing:
        raise AssignmentError(f"student directory {root} is missing {', '.join(missing)} "
                              f"(assignment {a.number} needs the minillm package with these files)")
    return {f: (root / f).read_text(errors="replace") for f in a.files}


def grading_stubs(a: Assignment) -> set[int]:
    """The assignments the grading tree stubs: all but those ``a`` builds on (its own are spliced in)."""
    return set(ASSIGNMENTS) - set(a.builds_on)


def reference_text(rel: str, stubbed: set[int]) -> str:
    """The reference file with its markers, the given code that reveals a stubbed assignment's solution stubbed."""
    text = (PACKAGE_DIR / rel).read_text()
    for n in sorted(stubbed):
        for path, qualname in ASSIGNMENTS[n].reveals:
            if path == rel:
                text = stub_function(text, qualname, reveal_message(n), rel)
    return text


def spliced_sources(a: Assignment, submitted: dict[str, str]) -> dict[str, str]:
    """{file: the trusted text to grade}; Rejected with the reason where the submission cannot be graded."""
    stubbed = grading_stubs(a)
    owner = {(p.path, p.qualname): n for n, x in ASSIGNMENTS.items() for p in x.parts}
    graded = {p.qualname for p in a.parts}
    out = {}
    for f in a.files:
        rel = f[len("minillm/"):]
        text = submitted[f]
        if "\x00" in text:
            raise Rejected(f"{f} is not a text file")
        regions = [r for r in all_regions() if r.path == rel]
        fill = {}
        ref_lines = (PACKAGE_DIR / rel).read_text().splitlines()
        for r in regions:
            n = owner[(rel, r.qualname)]
            if n in stubbed:
                fill[r.qualname] = [f"{r.indent}raise NotImplementedError({message(ASSIGNMENTS[n], r.qualname)!r})"]
            else:
                fill[r.qualname] = ref_lines[r.begin + 1:r.end]
        out[f] = splice(reference_text(rel, stubbed), text, rel,
                        {q for q in graded if (rel, q) in owner}, fill, forbid=set(a.forbid))
    return out


def check_submission(src, number) -> list[str]:
    """Problems that would reject a submission (empty: it would be graded). What ``check`` prints."""
    a = get(number)
    try:
        spliced_sources(a, read_submission(src, a))
    except Rejected as e:
        return [str(e)]
    return []


# --------------------------------------------------------------------------- running the tests


def _read_log(path: Path, offset: int) -> tuple[list[dict], int]:
    if not path.exists():
        return [], offset
    with open(path) as f:
        f.seek(offset)
        chunk = f.read()
    complete = chunk[:chunk.rfind("\n") + 1]
    records = []
    for line in complete.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            records.append({"event": "fatal", "message": "the result log holds a line that is not JSON"})
    return records, offset + len(complete)


def _env(work: Path, pythonpath: Path, log: Path, timeout: float, files: list[str], memory_mb: float = 0,
         extra: dict | None = None) -> dict:
    keep = ("PATH", "LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    env = {k: v for k, v in os.environ.items() if k in keep}
    tmp = work / "tmp"
    tmp.mkdir(exist_ok=True)
    env.update(PYTHONPATH=str(pythonpath), PYTHONDONTWRITEBYTECODE="1", MINILLM_GRADE_LOG=str(log),
               MINILLM_GRADE_TIMEOUT=str(timeout), MINILLM_GRADE_ROOT=str(pythonpath),
               MINILLM_GRADE_FILES=os.pathsep.join(files), MINILLM_GRADE_MEMORY_MB=f"{memory_mb:g}",
               MALLOC_ARENA_MAX="2", HOME=str(tmp), TMPDIR=str(tmp),
               TRITON_INTERPRET="1", TRITON_CACHE_DIR=str(tmp / "triton"), PYTHONNOUSERSITE="1")
    env.update(extra or {})
    return env


def _limit_memory(memory_mb: float):
    """A preexec function that caps the child's address space (None: no cap, or no resource module)."""
    if not memory_mb or memory_mb <= 0:
        return None
    try:
        import resource
    except ImportError:   # not on POSIX: no cap
        return None
    limit = int(memory_mb * 2**20)

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return cap


def _pytest(work: Path, pythonpath: Path, log: Path, timeout: float, args: list[str], files: list[str],
            collect_only=False, memory_mb: float = 0, extra: dict | None = None):
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(work / "pytest.ini"),
           "--rootdir", str(work), "--continue-on-collection-errors", "-o", "console_output_style=classic"]
    if collect_only:
        cmd.append("--collect-only")
    out = open(work / "output.txt", "w")  # noqa: SIM115 -- closed by the caller once the process ends
    proc = subprocess.Popen(cmd + args, cwd=work, env=_env(work, pythonpath, log, timeout, files, memory_mb, extra),
                            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=_limit_memory(memory_mb))
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


def _run(work: Path, tree: Path, args: list[str], files: list[str], timeout: float,
         deadline: float, memory_mb: float = 0, extra: dict | None = None) -> tuple[dict, dict, list[str]]:
    """Run until every collected test has a result or the deadline passes; returns (tests meta, results, errors)."""
    try:
        return _run_attempts(work, tree, args, files, timeout, deadline, memory_mb, extra)
    finally:  # an exception or Ctrl-C in the grader must not leave a student's process running
        while _live:
            p = _live.pop()
            if p.poll() is None:
                _kill(p)


def _run_attempts(work, tree, args, files, timeout, deadline, memory_mb=0, extra=None) -> tuple[dict, dict, list[str]]:
    meta: dict[str, dict] = {}
    results: dict[str, dict] = {}
    errors: list[str] = []
    for attempt in range(1000):
        log = work / f"log{attempt}.jsonl"
        proc, out = _pytest(work, tree, log, timeout, args, files, memory_mb=memory_mb, extra=extra)
        _live.append(proc)
        offset, current, started, killed, finished_at = 0, None, time.time(), None, None
        t_launch = time.time()
        while True:
            done = proc.poll() is not None
            records, offset = _read_log(log, offset)
            for r in records:
                if r.get("event") == "collected":
                    for t in r["tests"]:
                        meta.setdefault(t["id"], t)
                elif r.get("event") == "start":
                    current, started = r["id"], time.time()
                elif r.get("event") == "result":
                    results[r["id"]] = r
                    current = None
                elif r.get("event") == "collect_error":
                    errors.append(f"collecting {r['nodeid']}: {r['message']}")
                elif r.get("event") == "fatal":
                    errors.append(r["message"])
            if done:
                break
            now = time.time()
            finished = bool(meta) and current is None and all(t in results for t in meta)
            if finished and finished_at is None:
                finished_at = now
            if finished and now - finished_at > GRACE_S:  # e.g. a thread the student left running
                _kill(proc)
            elif now > deadline:
                killed = "the submission ran out of its total time (the process was killed)"
                _kill(proc)
            elif current is not None and now - started > timeout + GRACE_S:
                killed = f"timed out after {timeout:g} s (the process was killed)"
                _kill(proc)
            elif current is None and not records and now - t_launch > STARTUP_S and offset == 0:
                killed = f"pytest did not start within {STARTUP_S:g} s"
                _kill(proc)
            time.sleep(0.05)
        out.close()
        if current is not None:
            rc = proc.returncode
            died = f"the test process died (exit status {rc})"
            if memory_mb and memory_mb > 0:
                died += f"; it may have run past the memory limit ({memory_mb:g} MB)"
            results[current] = {"id": current, "outcome": "timeout" if killed else "crashed", "duration": 0.0,
                                "message": killed or died,
                                "details": _tail(work / "output.txt"), "exc": None, "frames": []}
        elif killed:
            errors.append(killed)
        if not meta and proc.returncode not in (0, 1, 5):
            errors.append(f"pytest exited with status {proc.returncode}:\n{_tail(work / 'output.txt')}")
            break
        remaining = [t for t in meta if t not in results]
        if not remaining:
            break
        if time.time() > deadline:
            for t in remaining:
                results[t] = {"id": t, "outcome": "timeout", "duration": 0.0, "exc": None, "frames": [],
                              "message": "not run: the submission ran out of its total time", "details": ""}
            break
        if current is None:   # the process ended without starting the remaining tests: no progress possible
            errors.append(f"{len(remaining)} test(s) did not run:\n{_tail(work / 'output.txt')}")
            break
        args = remaining
    return meta, results, errors


def _workdir(root: Path, name: str, test_files: list[str]) -> Path:
    work = root / name
    work.mkdir()
    for test_file in test_files:
        shutil.copy(TESTS_DIR / test_file, work / test_file)
    shutil.copy(TESTS_DIR / SUPPORT, work / SUPPORT)
    for name in REPLAY:
        shutil.copy(TESTS_DIR / name, work / name)
    (work / ORACLES).write_text(oracles_source())
    (work / CANARY).write_text(CANARY_SOURCE)
    (work / "pytest.ini").write_text(PYTEST_INI.replace("testpaths = tests\n", ""))
    return work


_collected: dict[tuple, dict] = {}   # (assignment, test files' mtimes) -> the reference's test list


def _canonical_tests(root: Path, a: Assignment) -> dict[str, dict]:
    """The test list as collected against the reference package (for a submission that does not run)."""
    files = [a.public_tests, a.grader_tests]
    key = (a.number, *[(TESTS_DIR / f).stat().st_mtime_ns for f in files + [SUPPORT]])
    if key in _collected:
        return dict(_collected[key])
    work = _workdir(root, "collect", files)
    log = work / "collect.jsonl"
    proc, out = _pytest(work, PACKAGE_DIR.parent, log, 0, files, [], collect_only=True)
    try:
        proc.wait(timeout=STARTUP_S)
    except subprocess.TimeoutExpired:
        _kill(proc)
    out.close()
    meta = {}
    for r in _read_log(log, 0)[0]:
        if r.get("event") == "collected":
            for t in r["tests"]:
                meta[t["id"]] = t
    if meta:
        _collected[key] = dict(meta)
    return meta


# --------------------------------------------------------------------------- grading


def grade(student_dir, number, out_dir=None, timeout: float = 60.0, total_timeout: float | None = None,
          memory_mb: float = MEMORY_MB) -> dict:
    """Grade one assignment; writes assignment-NN.json (the instructor's report), assignment-NN.student.json
    and assignment-NN.junit.xml to ``out_dir``. ``student_dir`` is a student tree or a submission zip.
    ``total_timeout``: seconds for the whole submission (default: 600, or 10 x timeout if that is more).
    ``memory_mb``: the address-space limit of each test process (0: none); a test whose allocation fails under it
    reads "ran past the memory limit", and the other tests go on."""
    a = get(number)
    if not timeout > 0:
        raise AssignmentError(f"timeout must be > 0 seconds, got {timeout!r}")
    total = max(600.0, 10 * timeout) if total_timeout is None else float(total_timeout)
    if not total > 0:
        raise AssignmentError(f"total_timeout must be > 0 seconds, got {total_timeout!r}")
    submitted = read_submission(student_dir, a)
    t0 = time.time()
    deadline = t0 + total
    files = list(a.files)
    rejected = None
    meta: dict[str, dict] = {}
    results: dict[str, dict] = {}
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix=f"minillm-grade-{a.number:02d}-") as tmp:
        root = Path(tmp)
        try:
            sources = spliced_sources(a, submitted)
        except Rejected as e:
            rejected = str(e)
        if rejected is None:
            tree = root / "tree"
            write_package(tree / "minillm", grading_stubs(a))
            for f, text in sources.items():
                (tree / f).write_text(text)
            work = _workdir(root, "run", [a.public_tests, a.grader_tests])
            traces = root / "traces"
            traces.mkdir()
            calls = ",".join(a.replay_calls)
            meta, results, errors = _run(work, tree, [a.public_tests, a.grader_tests, CANARY], files, timeout,
                                         deadline, memory_mb,
                                         {"MINILLM_GRADE_TRACES": str(traces), "MINILLM_GRADE_CALLS": calls})
            results = _decide(a, root, meta, results, traces, calls, timeout, deadline, memory_mb, errors)
        if rejected is not None or errors or not meta:
            for tid, t in _canonical_tests(root, a).items():
                meta.setdefault(tid, t)
    report = _report(a, student_dir, meta, results, errors, rejected, t0)
    if out_dir is not None:
        write_reports(report, out_dir)
    return report


def _decide(a: Assignment, root: Path, meta: dict, results: dict, traces: Path, calls: str, timeout: float,
            deadline: float, memory_mb: float, errors: list[str]) -> dict:
    """The parent decides: every test the child reports as passed runs again in a trusted process (the package
    with this assignment's bodies stubbed: none of the student's lines) on the values the child recorded
    (replay.py). It passes only if it passes there. A "passed" with no recorded values is a forged result."""
    claimed = [tid for tid, r in results.items() if r.get("outcome") == "passed" and tid.split("::")[0] != CANARY
               and tid in meta]
    if not claimed:
        return results
    out = dict(results)
    forged = [tid for tid in claimed
              if not (traces / (hashlib.sha1(tid.encode()).hexdigest() + ".json")).is_file()]
    for tid in forged:
        out[tid] = dict(results[tid], outcome="tampered",
                        message="the test process reported a result for a test it recorded no values for "
                                "(a forged result record)", exc=None, frames=[])
    todo = [tid for tid in claimed if tid not in forged]
    if not todo:
        return out
    trusted = root / "trusted"
    write_package(trusted / "minillm", grading_stubs(a))
    work = _workdir(root, "replay", [a.public_tests, a.grader_tests])
    _, replayed, replay_errors = _run(work, trusted, todo, [], timeout, max(deadline, time.time() + REPLAY_MIN_S),
                                      memory_mb, {"MINILLM_GRADE_REPLAY": str(traces), "MINILLM_GRADE_CALLS": calls})
    errors += [f"replay: {e}" for e in replay_errors]
    for tid in todo:
        p = replayed.get(tid)
        if p is not None and p.get("outcome") == "passed":
            continue
        why = (p or {}).get("message") or "the trusted replay did not run"
        exc = (p or {}).get("exc")
        diverged = bool(exc) and exc.get("type") == "Divergence"
        message = ("your code's results could not be checked: " if diverged else
                   "the values your code returned fail the check: ") + why
        out[tid] = dict(results[tid], outcome="failed", message=message, details=(p or {}).get("details", ""),
                        exc=exc and dict(exc, raised_in_student_code=False), frames=[], replayed=True)
    return out


def _secrets(a: Assignment) -> list[str]:
    """Whitespace-free lines of the grader tests that the public tests do not have: what no student report may
    quote."""
    public = {normalize(line) for line in (TESTS_DIR / a.public_tests).read_text().splitlines()}
    text = (TESTS_DIR / a.grader_tests).read_text()
    return [n for n in (normalize(line) for line in text.splitlines()) if len(n) >= 8 and n not in public]


_DROP_PREFIXES = ("assert ", "where ", "+ ", "- ", "E ", ">", "and ", "AssertionError: assert")


def _quotes(line: str, secrets: list[str]) -> bool:
    n = normalize(line)
    return any(sec in n for sec in secrets) or (len(n) >= 12 and any(n in sec for sec in secrets))


def sanitize(text: str, secrets: list[str], max_lines: int = 6) -> str:
    """Lines of an exception message that quote no grader source (and no pytest assertion rewrite)."""
    kept = []
    for line in (text or "").splitlines():
        s = line.strip()
        if not s or s.startswith(_DROP_PREFIXES):
            continue
        if _quotes(s, secrets):
            continue
        kept.append(s[:300])
        if len(kept) == max_lines:
            break
    return "\n".join(kept)


def _student_message(t: dict, r: dict, kind: str, secrets: list[str]) -> str:
    outcome = t["outcome"]
    if outcome == "passed":
        return ""
    if outcome in ("timeout", "crashed", "tampered", "rejected", "error") and not r.get("exc"):
        return t["message"] if kind == "public" or outcome != "error" else "the test could not run"
    exc = r.get("exc") or {}
    etype, etext = exc.get("type", ""), exc.get("text", "")
    if kind == "public":   # the student has this test's source; the hidden tests' is kept out all the same
        msg = "\n".join(line for line in t["message"].splitlines() if not _quotes(line, secrets))
        if not msg.strip() or msg.strip() in ("AssertionError", "AssertionError:"):
            msg = "AssertionError: the result is wrong" + (f" ({t['doc']})" if t.get("doc") else "")
        return msg
    clean = sanitize(etext, secrets)
    if etype == "Divergence":
        return "your code's results could not be checked" + (f": {clean}" if clean else "")
    if exc.get("raised_in_student_code"):
        return f"{etype} raised in your code" + (f": {clean}" if clean else "")
    if etype == "AssertionError":
        return "wrong result" + (f": {clean}" if clean else "") + (f" ({t['doc']})" if t.get("doc") else "")
    return f"{etype} while checking your result" + (f": {clean}" if clean else "")


def _report(a: Assignment, src, meta, results, errors, rejected, t0) -> dict:
    why = rejected or "\n".join(errors) or "the test was not run"
    canaries = {tid: results.get(tid) for tid in meta if tid.split("::")[0] == CANARY}
    tampered = [r["message"] for r in results.values() if r.get("outcome") == "tampered"]
    tampered += [f"{tid}: a canary that must fail passed" for tid, r in canaries.items()
                 if r is not None and r.get("outcome") == "passed"]
    secrets = _secrets(a)
    tests = []
    for tid, t in meta.items():
        file = tid.split("::")[0]
        if file == CANARY:
            continue
        r = results.get(tid) or {"outcome": "rejected" if rejected else "error", "message": why.splitlines()[0],
                                 "details": why, "duration": 0.0}
        kind = "grader" if file == a.grader_tests else "public"
        test = {"id": tid, "file": file, "kind": kind, "stretch": t["stretch"], "core": t.get("core", False),
                "points": t["points"], "earned": 0.0, "outcome": r["outcome"], "message": r.get("message", ""),
                "details": r.get("details", ""), "doc": t.get("doc", ""), "frames": r.get("frames") or [],
                "exc": r.get("exc"), "duration": round(float(r.get("duration", 0.0)), 3)}
        if test["outcome"] == "failed" and test["message"].strip() in ("", "AssertionError", "AssertionError:"):
            test["message"] = "AssertionError: the result is wrong" + (f" ({test['doc']})" if test["doc"] else "")
        test["student_message"] = _student_message(test, r, kind, secrets)
        tests.append(test)
    core = [t for t in tests if t["core"] and not t["stretch"]]
    gate = all(t["outcome"] == "passed" for t in core)
    for t in tests:
        if t["outcome"] == "passed" and not tampered and not rejected:
            if gate or t["core"]:
                t["earned"] = t["points"]
            else:
                t["student_message"] = t["message"] = "passed, but counts only once every core test passes"
    graded = [t for t in tests if not t["stretch"]]
    report = {
        "assignment": a.number, "title": a.title, "student_dir": str(src),
        "score": sum(t["earned"] for t in graded), "max_score": sum(t["points"] for t in graded),
        "bonus": sum(t["earned"] for t in tests if t["stretch"]),
        "bonus_max": sum(t["points"] for t in tests if t["stretch"]),
        "passed": sum(t["outcome"] == "passed" for t in tests), "total": len(tests),
        "rejected": rejected, "tampered": tampered, "core_passed": gate,
        "errors": errors, "seconds": round(time.time() - t0, 2), "tests": tests,
    }
    return report


def student_report(report: dict) -> dict:
    """What the student sees: scores, outcomes, sanitized messages and the frames of their own code."""
    reason = report["rejected"] or ("your code changed objects the tests rely on, or the checks themselves: the "
                                    "submission scores 0" if report["tampered"] else None)
    return {
        "assignment": report["assignment"], "title": report["title"], "score": report["score"],
        "max_score": report["max_score"], "bonus": report["bonus"], "bonus_max": report["bonus_max"],
        "not_graded_because": reason, "core_passed": report["core_passed"],
        "tests": [{"name": t["id"].split("::", 1)[1], "kind": t["kind"], "core": t["core"], "stretch": t["stretch"],
                   "points": t["points"], "earned": t["earned"], "outcome": t["outcome"],
                   "message": t["student_message"],
                   "your_code": [f"{f}:{line} in {fn}: {src}" for f, line, fn, src in t["frames"]]}
                  for t in report["tests"]],
    }


def write_reports(report: dict, out_dir) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    slug = f"assignment-{report['assignment']:02d}"
    (out / f"{slug}.json").write_text(json.dumps(report, indent=2))
    (out / f"{slug}.student.json").write_text(json.dumps(student_report(report), indent=2))
    junit(report).write(out / f"{slug}.junit.xml", encoding="unicode", xml_declaration=True)
    report["reports"] = [str(out / f"{slug}.json"), str(out / f"{slug}.student.json"), str(out / f"{slug}.junit.xml")]


def junit(report: dict) -> ET.ElementTree:
    """The instructor's results as JUnit XML (full messages)."""
    tests = report["tests"]
    failed = sum(t["outcome"] == "failed" for t in tests)
    errored = sum(t["outcome"] not in ("passed", "failed", "skipped") for t in tests)
    suite = ET.Element("testsuite", name=f"assignment-{report['assignment']:02d}", tests=str(len(tests)),
                       failures=str(failed), errors=str(errored),
                       skipped=str(sum(t["outcome"] == "skipped" for t in tests)),
                       time=f"{report['seconds']:.2f}")
    props = ET.SubElement(suite, "properties")
    for k in ("score", "max_score", "bonus", "bonus_max"):
        ET.SubElement(props, "property", name=k, value=f"{report[k]:g}")
    if report["rejected"]:
        ET.SubElement(props, "property", name="rejected", value=report["rejected"][:500])
    for t in tests:
        file, _, name = t["id"].partition("::")
        case = ET.SubElement(suite, "testcase", classname=file.removesuffix(".py"), name=name,
                             time=f"{t['duration']:.3f}")
        cprops = ET.SubElement(case, "properties")
        for k, v in (("points", t["points"]), ("earned", t["earned"]), ("kind", t["kind"]),
                     ("stretch", t["stretch"]), ("core", t["core"])):
            ET.SubElement(cprops, "property", name=k, value=f"{v:g}" if isinstance(v, float) else str(v))
        if t["outcome"] == "failed":
            ET.SubElement(case, "failure", message=t["message"][:500]).text = t["details"]
        elif t["outcome"] == "skipped":
            ET.SubElement(case, "skipped", message=t["message"][:500])
        elif t["outcome"] != "passed":
            ET.SubElement(case, "error", message=f"{t['outcome']}: {t['message']}"[:500]).text = t["details"]
    return ET.ElementTree(suite)


def summary(report: dict, student: bool = False) -> str:
    lines = [f"assignment {report['assignment']}: {report['title']}"]
    if report["rejected"]:
        lines.append(f"  NOT GRADED (score 0): {report['rejected']}")
    if report["tampered"]:
        lines.append("  TAMPERED (score 0): " + "; ".join(report["tampered"])[:300])
    for t in report["tests"]:
        tag = "bonus " if t["stretch"] else ("core " if t["core"] else "")
        msg = t["student_message"] if student else t["message"]
        gated = t["outcome"] == "passed" and t["earned"] == 0 and t["points"] > 0
        msg = f"  -- {msg.splitlines()[0][:120]}" if (t["outcome"] != "passed" or gated) and msg else ""
        lines.append(f"  {t['outcome']:8s} {t['earned']:g}/{t['points']:g} {tag}{t['id']}{msg}")
    if not student:
        for e in report["errors"]:
            lines.append("  error: " + e.splitlines()[0][:200])
    lines.append(f"score {report['score']:g}/{report['max_score']:g}"
                 + (f" (+{report['bonus']:g}/{report['bonus_max']:g} bonus)" if report["bonus_max"] else "")
                 + f", {report['passed']}/{report['total']} tests passed, {report['seconds']:.1f} s")
    return "\n".join(lines)


# --------------------------------------------------------------------------- a folder of submissions

_SUBMISSION = re.compile(r"(?P<student>.+?)[-_. ]*assignment-(?P<n>\d+)-submission\.zip$")


def grade_folder(folder, number, out_dir, timeout: float = 60.0, total_timeout: float | None = None,
                 memory_mb: float = MEMORY_MB) -> Path:
    """Grade every ``*.zip`` in ``folder`` (one per student; the student is the file name without ``.zip``, or
    what precedes ``assignment-NN-submission.zip``) into ``out_dir/STUDENT/`` reports and ``out_dir/gradebook.csv``
    (student, score, max_score, bonus, status, reason). Returns the CSV's path. A submission that cannot be read
    gets a row with status "unreadable" and its reason."""
    a = get(number)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    zips = sorted(Path(folder).glob("*.zip"))
    if not zips:
        raise AssignmentError(f"{folder} holds no .zip submission")
    for z in zips:
        m = _SUBMISSION.match(z.name)
        student = (m.group("student") if m and m.group("student") else z.stem) or z.stem
        try:
            report = grade(z, a.number, out / student, timeout=timeout, total_timeout=total_timeout,
                           memory_mb=memory_mb)
        except AssignmentError as e:
            rows.append({"student": student, "score": 0, "max_score": "", "bonus": 0, "status": "unreadable",
                         "reason": str(e)})
            continue
        status = ("rejected" if report["rejected"] else "tampered" if report["tampered"] else "graded")
        reason = report["rejected"] or "; ".join(report["tampered"]) or ""
        rows.append({"student": student, "score": f"{report['score']:g}", "max_score": f"{report['max_score']:g}",
                     "bonus": f"{report['bonus']:g}", "status": status, "reason": reason[:500]})
    path = out / "gradebook.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["student", "score", "max_score", "bonus", "status", "reason"])
        w.writeheader()
        w.writerows(rows)
    return path
