"""Trusted splicing: only the bodies a student writes enter the graded package.

A submitted file is matched against the handed-out file line by line: every line outside the marked
regions must be there unchanged (trailing spaces and trailing blank lines aside). Each region of the
graded assignment becomes a *hole* whose lines are taken from the submission; the holes of other
assignments are filled from the grader's own tree (their reference or their stub), whatever the
submission holds there. A body must

* stay inside its function (every non-blank line indented at least like the region),
* parse on its own as a function body (so no string or bracket it opens swallows the code after it),
* follow the grading policy (:func:`policy_violations`): no file, process or interpreter access, no
  introspection, no ``global``, no monkeypatching of modules or classes, imports from a short list.

Anything else rejects the submission (:class:`Rejected`, with a reason meant for the student): the
grader then scores it 0 without running it.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from .markers import BEGIN, END, Region, find_regions

# Modules a body may import (exactly these, or any module of the package); relative imports stay inside it.
# (No torch: every graded body is NumPy or a Triton kernel, and torch would compute a NumPy part's answer with memory
# tracemalloc does not see.)
ALLOWED_IMPORTS = frozenset({"math", "numpy", "triton", "triton.language", "collections", "itertools",
                             "functools", "heapq", "bisect", "dataclasses", "time", "random", "minillm"})
# Names a body may not mention at all (as a variable, a call or an argument).
FORBIDDEN_NAMES = frozenset({
    "eval", "exec", "compile", "open", "__import__", "globals", "locals", "vars", "getattr", "setattr", "delattr",
    "breakpoint", "input", "exit", "quit", "help", "memoryview", "sys", "os", "subprocess", "shutil", "pathlib",
    "Path", "io", "signal", "ctypes", "inspect", "gc", "importlib", "builtins", "threading", "multiprocessing",
    "socket", "pickle", "tempfile", "traceback", "linecache", "KeyboardInterrupt", "SystemExit", "GeneratorExit",
    "BaseException", "torch"})
# Attribute names a body may not read or write (file I/O, frames, module tables, the test machinery, Triton's
# interpreter, through which a grader test counts a kernel's loads).
FORBIDDEN_ATTRS = frozenset({
    "sys", "os", "modules", "builtins", "subprocess", "environ", "system", "popen", "_getframe", "f_back",
    "f_globals", "f_locals", "f_code", "f_builtins", "gi_frame", "cr_frame", "ag_frame", "tb_frame", "tb_next",
    "co_code", "co_consts", "save", "savez", "savez_compressed", "savetxt", "tofile", "loadtxt",
    "fromfile", "genfromtxt", "memmap", "open", "write_text", "write_bytes", "read_text", "read_bytes",
    "testing", "ctypes", "inspect", "gc", "importlib", "linecache", "lib", "DataSource", "setattr", "getattr",
    "fromregex", "from_file", "load_library", "hub", "cpp_extension", "utils", "f2py", "distutils", "ctypeslib",
    "attrgetter", "methodcaller", "shutil", "pathlib", "Path", "tempfile", "copyfile", "copytree", "rmtree", "cwd",
    "unlink", "mkdir", "PACKAGE_DIR", "TESTS_DIR", "torch", "runtime", "interpreter", "InterpreterBuilder",
    "interpreter_builder", "create_masked_load", "create_load"})
# Inside a string (a format string can reach attributes): dunders and frame attributes.
FORBIDDEN_IN_STRINGS = re.compile(r"__\w+__|\bf_(back|globals|locals|code|builtins)\b|\b(gi|cr|ag|tb)_frame\b|\btb_next\b")


class Rejected(Exception):
    """A submission that cannot be graded; the message says why (it is shown to the student)."""


@dataclass(frozen=True)
class Hole:
    region: Region
    reference: list[str]     # the reference body (lines, no markers)
    names: frozenset         # the enclosing function's parameters and locals (in the reference)


def _function_names(tree: ast.AST, qualname: str) -> frozenset:
    node = tree
    for part in qualname.split("."):
        node = next(n for n in ast.iter_child_nodes(node)
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part)
    names = {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
    names |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return frozenset(names)


def template(text: str, path: str) -> tuple[list[list[str]], list[Hole]]:
    """The reference file as fixed segments around holes: segments[i], holes[i], segments[i + 1], ..."""
    lines = text.splitlines()
    regions = sorted(find_regions(text, path), key=lambda r: r.begin)
    segments, holes, pos = [], [], 0
    tree = ast.parse(text) if regions else None
    for r in regions:
        segments.append(lines[pos:r.begin])
        holes.append(Hole(r, lines[r.begin + 1:r.end], _function_names(tree, r.qualname)))
        pos = r.end + 1
    segments.append(lines[pos:])
    for seg in segments:
        assert not any(s.strip() in (BEGIN, END) for s in seg)
    return segments, holes


def _norm(lines: list[str]) -> list[str]:
    return [s.rstrip() for s in lines]


def _strip_tail(lines: list[str]) -> list[str]:
    n = len(lines)
    while n and not lines[n - 1].strip():
        n -= 1
    return lines[:n]


def _find(hay: list[str], needle: list[str], start: int) -> int:
    n = len(needle)
    for i in range(start, len(hay) - n + 1):
        if hay[i:i + n] == needle:
            return i
    return -1


def _first_missing(hay: list[str], needle: list[str], start: int) -> tuple[int, str] | None:
    """The first line of ``needle`` that cannot be found in order in ``hay`` from ``start``."""
    i = start
    for k, line in enumerate(needle):
        try:
            i = hay.index(line, i) + 1
        except ValueError:
            return k, line
    return None


def _qualnames(holes: list[Hole], graded: set[str]) -> str:
    return ", ".join(h.region.qualname for h in holes if h.region.qualname in graded) or "(none)"


def split_submission(submitted: str, segments: list[list[str]], holes: list[Hole], path: str,
                     graded: set[str]) -> list[list[str]]:
    """The submission's lines in each hole; Rejected where a line outside the holes was changed."""
    sub = _strip_tail(_norm(submitted.splitlines()))
    segs = [_norm(s) for s in segments]
    segs[-1] = _strip_tail(segs[-1])
    where = f"{path}: you may change only the bodies of {_qualnames(holes, graded)}"

    def differ(seg_index: int, start: int) -> Rejected:
        seg = segs[seg_index]
        miss = _first_missing(sub, seg, start)
        if miss is None:
            return Rejected(f"{where}; the code around them is not in the handed-out order")
        k, line = miss
        before = sum(len(s) for s in segs[:seg_index]) + k + 1 + sum(1 for h in holes[:seg_index])
        return Rejected(f"{where}; a line outside them was changed or removed (the handed-out line "
                        f"{line.strip()!r}, near line {before} of the handed-out file, is missing)")

    if sub[:len(segs[0])] != segs[0]:
        raise differ(0, 0)
    pos, bodies = len(segs[0]), []
    for i in range(len(holes)):
        seg = segs[i + 1]
        if i + 1 == len(holes):   # the last segment ends the file
            at = len(sub) - len(seg)
            if at < pos + 1 or sub[at:] != seg:
                raise differ(i + 1, pos)
        else:
            at = _find(sub, seg, pos + 1)
            if at < 0:
                raise differ(i + 1, pos)
        bodies.append(sub[pos:at])
        pos = at + len(seg)
    if not holes and sub != segs[0]:
        raise differ(0, 0)
    return bodies


def check_body(body: list[str], region: Region, path: str, names=frozenset(), forbid=frozenset()) -> None:
    """Rejected unless the body stays in its function, parses alone and follows the policy."""
    name = f"{path}: your code in {region.qualname}"
    if not any(s.strip() for s in body):
        raise Rejected(f"{name} is empty")
    for k, line in enumerate(body):
        if line.strip() and not line.startswith(region.indent):
            raise Rejected(f"{name}: the line {line.strip()!r} is indented less than the function body: nothing "
                           f"may be added outside the bodies you write (at the end of the file, say), and every "
                           f"line of a body, multi-line strings included, keeps the body's indentation")
    src = "def __body__():\n" + "\n".join("    " + s[len(region.indent):] if s.strip() else "" for s in body) + "\n"
    try:
        tree = ast.parse(src)
    except SyntaxError as e:
        raise Rejected(f"{name} does not parse: {e.msg} (line {max(1, (e.lineno or 2) - 1)} of the body)") from None
    bad = policy_violations(tree.body[0], names, forbid)
    if bad:
        raise Rejected(f"{name} uses what graded code may not: {'; '.join(bad)}")


def policy_violations(func: ast.FunctionDef, names=frozenset(), forbid=frozenset()) -> list[str]:
    """What a body does that graded code may not (empty: nothing). ``names``: the enclosing function's own
    parameters and locals, which the body may assign into; ``forbid``: names of given helpers that do the graded
    step (the assignment's ``forbid``)."""
    bad: list[str] = []
    local = {a.arg for a in ast.walk(func) if isinstance(a, ast.arg)} | {"self", "cls"} | set(names)
    aliases: set[str] = set()   # names bound to a module or a global object: never assigned into
    for node in ast.walk(func):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            local.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not func:
            local.add(node.name)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            local.add(node.name)
        elif isinstance(node, ast.alias):
            local.add((node.asname or node.name).split(".")[0])
            aliases.add((node.asname or node.name).split(".")[0])
    for node in ast.walk(func):   # locals that merely name a global object (x = np.linalg) are aliases of it
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Name, ast.Attribute)):
            root = _root(node.value)
            if isinstance(root, ast.Name) and (root.id not in local or root.id in aliases):
                aliases.update(t.id for t in node.targets if isinstance(t, ast.Name))

    def store_target(t):
        if isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                store_target(e)
            return
        if isinstance(t, ast.Starred):
            store_target(t.value)
            return
        if isinstance(t, (ast.Attribute, ast.Subscript)):
            root = _root(t)
            if not isinstance(root, ast.Name):
                bad.append(f"line {t.lineno - 1}: assigns into the result of an expression")
            elif root.id not in local or root.id in aliases:
                bad.append(f"line {t.lineno - 1}: changes {root.id!r}, which your function does not own "
                           f"(modules, classes and globals are off limits)")

    for node in ast.walk(func):
        line = getattr(node, "lineno", 1) - 1
        if isinstance(node, ast.Global):
            bad.append(f"line {line}: a global statement")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if not _allowed_module(a.name):
                    bad.append(f"line {line}: import {a.name}")
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and not _allowed_module(node.module or ""):
                bad.append(f"line {line}: from {node.module} import ...")
            for a in node.names:
                if a.name == "*" or a.name in FORBIDDEN_NAMES or (node.module == "minillm" and a.name == "assignments"):
                    bad.append(f"line {line}: import of {a.name}")
        elif isinstance(node, ast.Name) and node.id in forbid or isinstance(node, ast.Attribute) and node.attr in forbid:
            bad.append(f"line {line}: {getattr(node, 'id', None) or node.attr} (this assignment asks you to write "
                       f"what it does)")
        elif isinstance(node, ast.alias) and (node.asname or node.name).split(".")[-1] in forbid:
            bad.append(f"line {line}: import of {node.name}")
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            bad.append(f"line {line}: {node.id}")
        elif isinstance(node, ast.Name) and node.id.startswith("__") and node.id.endswith("__"):
            bad.append(f"line {line}: {node.id}")
        elif isinstance(node, ast.Attribute) and (node.attr in FORBIDDEN_ATTRS
                                                   or (node.attr.startswith("__") and node.attr.endswith("__"))):
            bad.append(f"line {line}: .{node.attr}")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not _owned(node, local, aliases):
            bad.append(f"line {line}: .{node.attr} (a private name of a module, a class or a global)")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            for t in (node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]):
                store_target(t)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                FORBIDDEN_IN_STRINGS.search(node.value) or node.value in FORBIDDEN_ATTRS | FORBIDDEN_NAMES):
            bad.append(f"line {line}: the string {node.value[:40]!r}")
    return sorted(set(bad), key=lambda s: (int(s.split(":")[0].split()[-1]), s))


def _allowed_module(name: str) -> bool:
    """The allowed modules and the package's own, except the grader's (``minillm.assignments``: on an editable
    install it holds the reference package's paths and file tools)."""
    if name == "minillm.assignments" or name.startswith("minillm.assignments."):
        return False
    return name in ALLOWED_IMPORTS or name == "minillm" or name.startswith("minillm.")


def _owned(node, local, aliases) -> bool:
    root = _root(node)
    return isinstance(root, ast.Name) and root.id in local and root.id not in aliases


def _root(node):
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.value
    return node


def splice(reference: str, submitted: str, path: str, graded: set[str], fill: dict[str, list[str]],
           forbid=frozenset()) -> str:
    """The trusted file: the reference's lines outside the regions, the submission's bodies for the regions
    named in ``graded`` (checked), and ``fill[qualname]`` for every other region."""
    segments, holes = template(reference, path)
    bodies = split_submission(submitted, segments, holes, path, graded)
    out = list(segments[0])
    for hole, body, seg in zip(holes, bodies, segments[1:]):
        q = hole.region.qualname
        if q in graded:
            check_body(body, hole.region, path, hole.names, forbid)
            out += body
        else:
            out += fill[q]
        out += seg
    text = "\n".join(out) + "\n"
    try:
        compile(text, path, "exec")
    except SyntaxError as e:
        raise Rejected(f"{path}: the spliced file does not compile ({e.msg}, line {e.lineno})") from None
    return text
