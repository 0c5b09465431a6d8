"""Course assignments generated from the package: student stubs, public and grader-only tests, an autograder.

    python -m minillm.assignments build OUT_DIR -a N       # the student tree for assignment N (release flow)
    python -m minillm.assignments grade ZIP --assignment N # instructor + student reports, JUnit, points per test
    python -m minillm.assignments grade-all DIR -a N       # a folder of zips -> gradebook.csv
    python -m minillm.assignments gradescope OUT.zip -a N  # a Gradescope autograder

See the book's "For instructors" page. Only NumPy is needed to build; grading the Triton
parts needs torch and triton (the kernels run in Triton's interpreter on a CPU).
"""
from .registry import ASSIGNMENTS, Assignment, AssignmentError, Part, get

__all__ = ["ASSIGNMENTS", "Assignment", "AssignmentError", "Part", "build", "get", "grade", "leak_check"]


def build(out_dir, numbers=None, force: bool = False, *, stub=None) -> dict:
    from .builder import build as _build

    return _build(out_dir, numbers, force=force, stub=stub)


def grade(student_dir, number, out_dir=None, timeout: float = 60.0, total_timeout: float | None = None,
          **kw) -> dict:
    from .grader import grade as _grade

    return _grade(student_dir, number, out_dir=out_dir, timeout=timeout, total_timeout=total_timeout, **kw)


def leak_check(tree, numbers=None, *, stub=None) -> list[str]:
    from .builder import leak_check as _leak_check

    return _leak_check(tree, numbers, stub=stub)
