"""Command line: ``python -m minillm.assignments {list,build,grade,leak-check}``."""
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
    g = sub.add_parser("grade", help="run the public and grader tests against a student tree")
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
