"""Command line: ``python -m minillm.assignments COMMAND`` (``--help`` lists them)."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

from .registry import ASSIGNMENTS, AssignmentError


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m minillm.assignments",
                                description="Generate the student tree of the minillm assignments and grade it.")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the assignments, their parts and time estimates")
    b = sub.add_parser("build", help="write the student tree (stubs, handouts, public tests) into OUT_DIR")
    b.add_argument("out_dir")
    b.add_argument("--assignment", "-a", action="append",
                   help="hand out this assignment (repeatable); the tree stubs the earliest of them and every later "
                        "one, and keeps the released solutions of the earlier ones. Default: all, all stubbed")
    b.add_argument("--force", action="store_true", help="replace OUT_DIR if it is not empty")
    t = sub.add_parser("test", help="a student's check: run one assignment's public tests in your tree")
    t.add_argument("student_dir")
    t.add_argument("--assignment", "-a", required=True)
    t.add_argument("--timeout", type=float, default=600.0, help="seconds for all the public tests (default 600)")
    c = sub.add_parser("check", help="a student's check: would the grader accept your files (the rules for "
                                     "graded code)?")
    c.add_argument("student_dir")
    c.add_argument("--assignment", "-a", required=True)
    k = sub.add_parser("pack", help="run the public tests, then zip your files for one assignment to hand in")
    k.add_argument("student_dir")
    k.add_argument("--assignment", "-a", required=True)
    k.add_argument("--out", help="the zip to write (default STUDENT_DIR/assignment-NN-submission.zip)")
    k.add_argument("--timeout", type=float, default=600.0, help="seconds for all the public tests (default 600)")
    g = sub.add_parser("grade", help="grade a student tree or a submission zip (public and hidden tests)")
    g.add_argument("student_dir")
    g.add_argument("--assignment", "-a", required=True)
    g.add_argument("--out", default="grades", help="folder for the reports (default ./grades)")
    g.add_argument("--timeout", type=float, default=60.0, help="seconds per test (default 60)")
    g.add_argument("--total-timeout", type=float, default=None,
                   help="seconds for the whole submission (default max(600, 10 x timeout))")
    g.add_argument("--memory-limit", type=float, default=None,
                   help="MB of address space per test process (default 8192; 0: no limit)")
    g.add_argument("--student", action="store_true", help="print the student's view of the results")
    ga = sub.add_parser("grade-all", help="grade every submission zip in a folder into a gradebook CSV")
    ga.add_argument("folder")
    ga.add_argument("--assignment", "-a", required=True)
    ga.add_argument("--out", default="grades", help="folder for the reports and gradebook.csv (default ./grades)")
    ga.add_argument("--timeout", type=float, default=60.0, help="seconds per test (default 60)")
    ga.add_argument("--total-timeout", type=float, default=None, help="seconds per submission")
    ga.add_argument("--memory-limit", type=float, default=None,
                    help="MB of address space per test process (default 8192; 0: no limit)")
    gs = sub.add_parser("gradescope", help="write a Gradescope autograder zip for one assignment")
    gs.add_argument("out_zip")
    gs.add_argument("--assignment", "-a", required=True)
    gs.add_argument("--timeout", type=float, default=60.0, help="seconds per test (default 60)")
    gr = sub.add_parser("gradescope-run", help="(inside Gradescope) grade the submission into results.json")
    gr.add_argument("submission_dir")
    gr.add_argument("--assignment", "-a", required=True)
    gr.add_argument("--results", required=True)
    gr.add_argument("--timeout", type=float, default=60.0)
    ip = sub.add_parser("instructors-page", help="rewrite the generated block of the book's instructors page")
    ip.add_argument("page")
    lc = sub.add_parser("leak-check", help="fail if a student tree holds a solution line, a near-copy or a marker")
    lc.add_argument("tree")
    lc.add_argument("--assignment", "-a", action="append",
                    help="the tree was built for this assignment (as build -a): check the solutions it stubs")
    lb = sub.add_parser("leak-check-book", help="fail if a chapter cell that is not tagged assignment-solution "
                                               "prints a graded body (the book drops tagged cells' outputs)")
    lb.add_argument("notebooks", nargs="*", help="default: intro.ipynb, chapters/*.ipynb, appendix/*.ipynb")
    args = p.parse_args(argv)
    try:
        if args.command == "list":
            for a in ASSIGNMENTS.values():
                print(f"{a.number}. {a.title} ({a.hours[0]}-{a.hours[1]} h)")
                for part in a.parts:
                    print(f"     {part.module}.{part.qualname}{'  [stretch]' if part.stretch else ''}")
        elif args.command == "build":
            from .builder import build

            info = build(args.out_dir, args.assignment, force=args.force)
            print(f"wrote the student tree for assignments {info['assignments']} to {info['out_dir']} "
                  f"(stubs assignments {info['stubbed_assignments']} in {len(info['stubbed'])} files); "
                  f"leak check passed")
            for path, n in info["scrubbed"].items():
                print(f"  {path}: dropped {n} line(s) that quote a solution")
        elif args.command in ("test", "pack"):
            from .registry import get
            from .submission import check_student_dir

            a = get(args.assignment)
            root = check_student_dir(args.student_dir, a)
            if not (root / "tests" / a.public_tests).is_file():
                raise AssignmentError(f"{root}/tests/{a.public_tests} is missing: this tree was not built for "
                                      f"assignment {a.number} (python -m minillm.assignments build DIR -a {a.number})")
            try:
                rc = subprocess.run([sys.executable, "-m", "pytest", "-q", f"tests/{a.public_tests}"], cwd=root,
                                    env={**os.environ, "PYTHONPATH": str(root)}, timeout=args.timeout).returncode
            except subprocess.TimeoutExpired:
                print(f"the public tests ran past {args.timeout:g} s and were stopped (an endless loop?)")
                rc = 1
            if args.command == "pack":
                from .submission import pack

                path = pack(root, a.number, args.out)
                print(f"wrote {path}" + ("" if rc == 0 else "  (some public tests fail: it is packed anyway)"))
                return 0
            return rc
        elif args.command == "check":
            from .grader import check_submission

            problems = check_submission(args.student_dir, args.assignment)
            for problem in problems:
                print(problem)
            if problems:
                return 1
            print("the grader would accept these files")
        elif args.command == "grade":
            from .grader import MEMORY_MB, grade, summary

            report = grade(args.student_dir, args.assignment, out_dir=args.out, timeout=args.timeout,
                           total_timeout=args.total_timeout,
                           memory_mb=MEMORY_MB if args.memory_limit is None else args.memory_limit)
            print(summary(report, student=args.student))
            print("reports: " + ", ".join(report["reports"]))
        elif args.command == "grade-all":
            from .grader import MEMORY_MB, grade_folder

            path = grade_folder(args.folder, args.assignment, args.out, timeout=args.timeout,
                                total_timeout=args.total_timeout,
                                memory_mb=MEMORY_MB if args.memory_limit is None else args.memory_limit)
            print(f"wrote {path}")
        elif args.command == "gradescope":
            from .gradescope import export

            print(f"wrote {export(args.out_zip, args.assignment, timeout=args.timeout)}")
        elif args.command == "gradescope-run":
            from .gradescope import run

            data = run(args.submission_dir, args.assignment, args.results, timeout=args.timeout)
            print(data["output"])
        elif args.command == "instructors-page":
            from .docs import update_page

            print(f"{args.page}: " + ("updated" if update_page(args.page) else "already up to date"))
        elif args.command == "leak-check":
            from .builder import leak_check

            leaks = leak_check(args.tree, args.assignment)
            for leak in leaks:
                print(leak)
            if leaks:
                print(f"{len(leaks)} leak(s)", file=sys.stderr)
                return 1
            print("no solution line, near-copy or marker found")
        elif args.command == "leak-check-book":
            from pathlib import Path

            from .builder import notebook_leaks

            paths = args.notebooks or [str(q) for pat in ("intro.ipynb", "chapters/*.ipynb", "appendix/*.ipynb")
                                       for q in sorted(Path().glob(pat))]
            leaks = [leak for q in paths for leak in notebook_leaks(q)]
            for leak in leaks:
                print(leak)
            if leaks:
                print(f"{len(leaks)} cell(s) print a graded body untagged", file=sys.stderr)
                return 1
            print(f"{len(paths)} notebook(s): every cell that prints a graded body is tagged")
    except AssignmentError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
