"""Command line: ``python -m minillm.assignments {list,build,test,pack,grade,leak-check,instructors-page}``."""
from __future__ import annotations

import argparse
import sys

from .registry import ASSIGNMENTS, AssignmentError


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m minillm.assignments",
                                description="Generate the student tree of the minillm assignments and grade it.")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the assignments, their parts and time estimates")
    b = sub.add_parser("build", help="write the student tree (stubs, handouts, public tests) into OUT_DIR")
    b.add_argument("out_dir")
    b.add_argument("--assignment", "-a", action="append", help="only this assignment (repeatable); default all")
    b.add_argument("--force", action="store_true", help="replace OUT_DIR if it is not empty")
    t = sub.add_parser("test", help="a student's check: run one assignment's public tests in your tree")
    t.add_argument("student_dir")
    t.add_argument("--assignment", "-a", required=True)
    k = sub.add_parser("pack", help="run the public tests, then zip your files for one assignment to hand in")
    k.add_argument("student_dir")
    k.add_argument("--assignment", "-a", required=True)
    k.add_argument("--out", help="the zip to write (default STUDENT_DIR/assignment-NN-submission.zip)")
    g = sub.add_parser("grade", help="run the public and grader tests against a student tree or a submission zip")
    g.add_argument("student_dir")
    g.add_argument("--assignment", "-a", required=True)
    g.add_argument("--out", default="grades", help="folder for the JSON and JUnit reports (default ./grades)")
    g.add_argument("--timeout", type=float, default=60.0, help="seconds per test (default 60)")
    ip = sub.add_parser("instructors-page", help="rewrite the generated block of the book's instructors page")
    ip.add_argument("page")
    lc = sub.add_parser("leak-check", help="fail if a student tree holds a solution line or marker")
    lc.add_argument("tree")
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
                  f"({len(info['stubbed'])} files stubbed); leak check passed")
            for path, n in info["scrubbed"].items():
                print(f"  {path}: dropped {n} line(s) that quote a solution")
        elif args.command in ("test", "pack"):
            import subprocess

            from .submission import check_student_dir
            from .registry import get

            a = get(args.assignment)
            root = check_student_dir(args.student_dir, a)
            if not (root / "tests" / a.public_tests).is_file():
                raise AssignmentError(f"{root}/tests/{a.public_tests} is missing: this tree was not built for "
                                      f"assignment {a.number} (python -m minillm.assignments build DIR -a {a.number})")
            rc = subprocess.call([sys.executable, "-m", "pytest", "-q", f"tests/{a.public_tests}"], cwd=root,
                                 env={**__import__("os").environ, "PYTHONPATH": str(root)})
            if args.command == "pack":
                from .submission import pack

                path = pack(root, a.number, args.out)
                print(f"wrote {path}" + ("" if rc == 0 else "  (some public tests fail: it is packed anyway)"))
                return 0
            return rc
        elif args.command == "grade":
            from .grader import grade, summary

            report = grade(args.student_dir, args.assignment, out_dir=args.out, timeout=args.timeout)
            print(summary(report))
            print("reports: " + ", ".join(report["reports"]))
        elif args.command == "instructors-page":
            from .docs import update_page

            print(f"{args.page}: " + ("updated" if update_page(args.page) else "already up to date"))
        elif args.command == "leak-check":
            from .builder import leak_check

            leaks = leak_check(args.tree)
            for leak in leaks:
                print(leak)
            if leaks:
                print(f"{len(leaks)} leak(s)", file=sys.stderr)
                return 1
            print("no solution line or marker found")
    except AssignmentError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
