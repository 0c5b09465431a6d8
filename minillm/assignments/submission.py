"""Submissions: ``pack`` zips the files a student wrote for one assignment, ``unpack`` rebuilds a gradable tree.

A submission holds only the source files that contain the assignment's graded parts (``minillm/<path>``),
plus ``submission.json`` (assignment number, files, SHA-256 of each). The grader reads only those files, and
from them only the bodies of the assignment's marked regions (``grader.read_submission`` and ``splice``);
``unpack`` rebuilds a student tree with the submitted files in it (to look at a submission by hand).
"""
from __future__ import annotations

import hashlib
import json
import time
import zipfile
from pathlib import Path

from .registry import Assignment, AssignmentError, get

MANIFEST = "submission.json"


def check_student_dir(student_dir, a: Assignment) -> Path:
    root = Path(student_dir)
    if not root.is_dir():
        raise AssignmentError(f"student directory {root} does not exist (or is not a directory)")
    need = ["minillm/__init__.py"] + a.files
    missing = [f for f in need if not (root / f).is_file()]
    if missing:
        raise AssignmentError(f"student directory {root} is missing {', '.join(missing)} "
                              f"(assignment {a.number} needs the minillm package with these files)")
    return root.resolve()


def pack(student_dir, number, out=None) -> Path:
    """Zip the student's files for assignment ``number``; returns the archive's path
    (default: STUDENT_DIR/assignment-NN-submission.zip)."""
    a = get(number)
    root = check_student_dir(student_dir, a)
    out = Path(out) if out is not None else root / f"{a.slug}-submission.zip"
    files = a.files
    manifest = {"assignment": a.number, "title": a.title, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "files": {f: hashlib.sha256((root / f).read_bytes()).hexdigest() for f in files}}
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for f in files:
            z.write(root / f, f)
        z.writestr(MANIFEST, json.dumps(manifest, indent=2))
    return out


def unpack(zip_path, number, work_dir) -> Path:
    """A student tree for assignment ``number`` (stubs, from this package) with the submitted files copied
    over it. Raises AssignmentError for an archive of another assignment, missing or unexpected files, or
    files that do not match the manifest."""
    from .builder import build

    a = get(number)
    zip_path = Path(zip_path)
    try:
        z = zipfile.ZipFile(zip_path)
    except (OSError, zipfile.BadZipFile) as e:
        raise AssignmentError(f"{zip_path} is not a readable zip archive: {e}") from e
    with z:
        names = set(z.namelist())
        if MANIFEST not in names:
            raise AssignmentError(f"{zip_path} has no {MANIFEST}: make it with `python -m minillm.assignments pack`")
        manifest = json.loads(z.read(MANIFEST))
        if manifest.get("assignment") != a.number:
            raise AssignmentError(f"{zip_path} is a submission for assignment {manifest.get('assignment')!r}, "
                                  f"not {a.number}")
        want = set(a.files)
        extra, missing = names - want - {MANIFEST}, want - names
        if extra or missing:
            raise AssignmentError(f"{zip_path}: unexpected files {sorted(extra)}, missing files {sorted(missing)}")
        tree = Path(work_dir)
        build(tree, [a.number], force=True)
        for f in sorted(want):
            data = z.read(f)
            if hashlib.sha256(data).hexdigest() != manifest["files"].get(f):
                raise AssignmentError(f"{zip_path}: {f} does not match its checksum in {MANIFEST}")
            (tree / f).write_bytes(data)
    return tree
