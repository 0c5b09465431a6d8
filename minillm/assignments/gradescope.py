"""A Gradescope autograder for one assignment: ``python -m minillm.assignments gradescope OUT.zip -a N``.

The zip holds what Gradescope's autograder format asks for -- ``setup.sh`` (installs the pinned CPU stack),
``run_autograder`` (grades ``/autograder/submission`` and writes ``/autograder/results/results.json``) -- and
the reference package with this kit (the grader needs the solutions; the zip stays with the instructor).

Students upload the zip that ``python handin.py N`` writes (Gradescope unpacks it into the submission folder)
or the files themselves. results.json: one entry per test, public tests ``visible``, hidden tests
``after_due_date`` (their messages are the student report's, with no grader source), stretch tests extra credit
(max_score 0), a rejected or tampered submission scored 0 with its reason in the output.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import zipfile
from pathlib import Path

from .builder import PACKAGE_DIR
from .registry import get

PINS = {"numpy": "2.3.5", "pytest": "9.2.0", "torch": "2.13.0", "triton": "3.6.0"}

SETUP = """#!/usr/bin/env bash
# Gradescope runs this once when it builds the autograder image (Ubuntu, Python 3).
set -euo pipefail
apt-get update -q && apt-get install -y -q --no-install-recommends python3 python3-pip python3-venv
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install -q numpy=={numpy} pytest=={pytest}
{torch_install}
"""
TORCH = ("/autograder/venv/bin/pip install -q --index-url https://download.pytorch.org/whl/cpu torch=={torch}\n"
         "/autograder/venv/bin/pip install -q triton=={triton}")

RUN = """#!/usr/bin/env bash
# Gradescope runs this for each submission: grade it, write /autograder/results/results.json.
cd /autograder/source
mkdir -p /autograder/results
PYTHONPATH=/autograder/source /autograder/venv/bin/python -m minillm.assignments gradescope-run \\
    /autograder/submission -a {n} --results /autograder/results/results.json --timeout {timeout:g}
"""


def export(out_zip, number, timeout: float = 60.0) -> Path:
    """Write the autograder zip for assignment ``number``; returns its path."""
    a = get(number)
    out = Path(out_zip)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp)
        shutil.copytree(PACKAGE_DIR, src / "minillm",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "weights", "results"))
        torch = TORCH.format(**PINS) if a.needs_triton else "# this assignment runs no Triton kernel: no torch"
        (src / "setup.sh").write_text(SETUP.format(torch_install=torch, **PINS))
        (src / "run_autograder").write_text(RUN.format(n=a.number, timeout=timeout))
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            for f in sorted(src.rglob("*")):
                if f.is_file():
                    info = zipfile.ZipInfo(f.relative_to(src).as_posix())
                    info.external_attr = (0o755 if f.name in ("setup.sh", "run_autograder") else 0o644) << 16
                    info.compress_type = zipfile.ZIP_DEFLATED
                    z.writestr(info, f.read_bytes())
    return out


def results_json(report: dict) -> dict:
    """Gradescope's results.json from a grader report (the student-facing messages only)."""
    from .grader import student_report

    view = student_report(report)
    tests = []
    for t in view["tests"]:
        output = t["message"] + ("\n" + "\n".join(t["your_code"]) if t["your_code"] else "")
        tests.append({"name": f"{t['kind']}: {t['name']}" + (" (core)" if t["core"] else ""),
                      "score": t["earned"], "max_score": 0 if t["stretch"] else t["points"],
                      "output": output or t["outcome"],
                      "visibility": "visible" if t["kind"] == "public" else "after_due_date"})
    head = (f"Not graded (score 0): {view['not_graded_because']}" if view["not_graded_because"] else
            f"{report['passed']}/{report['total']} tests passed" +
            ("" if view["core_passed"] else "; the core tests fail, so the other tests do not count yet"))
    return {"score": report["score"] + report["bonus"], "output": head, "tests": tests,
            "stdout_visibility": "hidden"}


def run(submission_dir, number, results_path, timeout: float = 60.0) -> dict:
    """Grade a Gradescope submission folder (the unpacked handin zip, or the files) into results.json."""
    from .grader import grade
    from .registry import AssignmentError

    a = get(number)
    sub = Path(submission_dir)
    zips = sorted(sub.glob("*.zip"))
    target = zips[0] if zips and not (sub / a.files[0]).exists() else sub
    try:
        report = grade(target, a.number, timeout=timeout)
        data = results_json(report)
    except AssignmentError as e:
        data = {"score": 0, "output": f"Not graded (score 0): {e}", "tests": [], "stdout_visibility": "hidden"}
    Path(results_path).write_text(json.dumps(data, indent=2))
    return data
