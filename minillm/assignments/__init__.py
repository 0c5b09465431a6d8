"""Course assignments generated from the package: student stubs, public and grader-only tests, an autograder.

    python -m minillm.assignments build OUT_DIR            # the student tree
    python -m minillm.assignments grade DIR --assignment N # JSON + JUnit reports, points per test

See the book's "For instructors" page. Only NumPy is needed to build; grading the Triton
parts needs torch and triton (the kernels run in Triton's interpreter on a CPU).
"""
from .registry import ASSIGNMENTS, Assignment, AssignmentError, Part, get

__all__ = ["ASSIGNMENTS", "Assignment", "AssignmentError", "Part", "build", "get", "grade", "leak_check"]


def build(out_dir, numbers=None, force: bool = False) -> dict:
    from .builder import build as _build

    return _build(out_dir, numbers, force=force)


def grade(student_dir, number, out_dir=None, timeout: float = 60.0) -> dict:
    from .grader import grade as _grade

    return _grade(student_dir, number, out_dir=out_dir, timeout=timeout)


def leak_check(tree, numbers=None) -> list[str]:
    from .builder import leak_check as _leak_check

    return _leak_check(tree, numbers)
