"""Shared by the public and the grader tests: fixtures, the points/stretch marks, and (only when the
grader runs them) a per-test time limit, a log of every result and an integrity check.

The grader sets MINILLM_GRADE_LOG (a JSON-lines file), MINILLM_GRADE_TIMEOUT (seconds), MINILLM_GRADE_ROOT
(the trusted package it grades) and MINILLM_GRADE_FILES (the files whose bodies the student wrote); students
running the public tests with plain pytest get none of them.

The integrity check: after every test, the objects the tests rely on (NumPy's and pytest's functions, the
builtins, the oracles, the test modules, the package's modules and classes) must be the ones that were there
when the tests were collected; a test after which one was replaced is reported as ``tampered``, which scores
the whole submission 0.
"""
from __future__ import annotations

import builtins
import json
import math
import os
import signal
import sys
import time

import numpy as np
import pytest

# The tests build their tensors on the CPU, so the Triton kernels run in the interpreter even on a CUDA machine
# (compiled runs on a GPU are the handouts' ungraded extension). Set before anything imports triton.
os.environ.setdefault("TRITON_INTERPRET", "1")

_LOG = os.environ.get("MINILLM_GRADE_LOG")
_TIMEOUT = float(os.environ.get("MINILLM_GRADE_TIMEOUT") or 0)
_EXPECT = os.environ.get("MINILLM_GRADE_ROOT")
_FILES = [f for f in (os.environ.get("MINILLM_GRADE_FILES") or "").split(os.pathsep) if f]
_MEMORY_MB = float(os.environ.get("MINILLM_GRADE_MEMORY_MB") or 0)
# Record (the child: the student's code) or replay (the trusted process that decides): see replay.py.
_CALLS = [c for c in (os.environ.get("MINILLM_GRADE_CALLS") or "").split(",") if c]
_TRACES = os.environ.get("MINILLM_GRADE_TRACES")
_REPLAY = os.environ.get("MINILLM_GRADE_REPLAY")
_MODE = "record" if _TRACES else "replay" if _REPLAY else None


def _trace_path(nodeid: str) -> str:
    import hashlib

    return os.path.join(_TRACES or _REPLAY, hashlib.sha1(nodeid.encode()).hexdigest() + ".json")
_OUT_OF_MEMORY = ("can't allocate memory", "not enough memory", "Unable to allocate", "out of memory")


def _memory_error(value) -> bool:
    """An allocation that failed (NumPy's MemoryError, torch's allocator error) while a memory limit is set."""
    return _MEMORY_MB > 0 and (isinstance(value, MemoryError) or any(s in str(value) for s in _OUT_OF_MEMORY))


class TestTimedOut(BaseException):
    """Raised in a test that ran past its limit (a BaseException, so ``except Exception`` cannot swallow it)."""


_write = open(_LOG, "a", buffering=1) if _LOG else None  # noqa: SIM115 -- open for the whole session


def _log(**record) -> None:
    if _write is not None:
        _write.write(json.dumps(record) + "\n")


def pytest_configure(config):
    config.addinivalue_line("markers", "points(n): the test is worth n points (default 1)")
    config.addinivalue_line("markers", "stretch: an optional part; its points are a bonus outside the maximum")
    config.addinivalue_line("markers", "core: a test of the core idea; the other tests count only once every "
                                       "core test of the assignment passes")


def pytest_sessionstart(session):
    if not _EXPECT:
        return
    try:
        import minillm
    except BaseException:  # noqa: BLE001 -- a broken student package: each test module's import reports it
        return
    where = os.path.realpath(os.path.dirname(minillm.__file__))
    if not where.startswith(os.path.realpath(_EXPECT) + os.sep):
        _log(event="fatal", message=f"imported minillm from {where}, not from {_EXPECT}")
        pytest.exit(f"imported minillm from {where}, not from {_EXPECT}", returncode=3)
    if _MODE:
        import replay

        try:
            replay.install(_CALLS, _MODE)
        except BaseException as e:  # noqa: BLE001 -- a student module that does not import: the tests say so
            _log(event="fatal", message=f"could not wrap the graded calls: {type(e).__name__}: {e}")


def pytest_collectreport(report):
    if report.failed:
        _log(event="collect_error", nodeid=report.nodeid, message=str(report.longrepr)[-4000:])


# --------------------------------------------------------------------------- integrity

_snapshot: dict[str, dict[str, object]] = {}


def _watched() -> dict[str, dict]:
    """name -> namespace whose entries no test may replace."""
    spaces = {"builtins": vars(builtins), "numpy": vars(np), "numpy.testing": vars(np.testing),
              "numpy.random": vars(np.random), "math": vars(math), "pytest": vars(pytest),
              "conftest": globals()}
    for name, mod in list(sys.modules.items()):
        if mod is None:
            continue
        if name == "oracles" or name.startswith(("minillm", "a0", "zz_integrity")) or name.endswith("conftest"):
            spaces[name] = vars(mod)
            if name.startswith("minillm"):
                for k, v in list(vars(mod).items()):
                    if isinstance(v, type) and getattr(v, "__module__", None) == name:
                        spaces[f"{name}.{k}"] = v.__dict__
    return spaces


def _code_like(v) -> bool:
    """Functions, classes, modules and descriptors: what a test calls. (Data such as a module's cache may
    legitimately change while the tests run; code may not.)"""
    return callable(v) or isinstance(v, (type(math), staticmethod, classmethod, property))


def _take_snapshot() -> None:
    _snapshot.clear()
    for name, ns in _watched().items():
        _snapshot[name] = {k: v for k, v in list(ns.items())
                           if _code_like(v) and not (k.startswith("__") and k != "__import__")}


def _changed() -> list[str]:
    now = _watched()
    out = []
    for name, objs in _snapshot.items():
        ns = now.get(name)
        if ns is None:
            out.append(f"{name} was removed")
            continue
        for k, v in objs.items():
            if k not in ns or ns[k] is not v:
                out.append(f"{name}.{k} was replaced")
    return out


def pytest_collection_finish(session):
    tests = []
    for item in session.items:
        mark = item.get_closest_marker("points")
        doc = (getattr(getattr(item, "function", None), "__doc__", None) or "").strip().split("\n")[0]
        tests.append({"id": item.nodeid, "points": float(mark.args[0]) if mark else 1.0,
                      "stretch": item.get_closest_marker("stretch") is not None,
                      "core": item.get_closest_marker("core") is not None, "doc": doc})
    _log(event="collected", tests=tests)
    if _LOG:
        _take_snapshot()


_state: dict[str, dict] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _state[item.nodeid] = {"outcome": "passed", "message": "", "details": "", "t0": time.time(), "exc": None,
                           "frames": []}
    _log(event="start", id=item.nodeid, t=time.time())
    if _MODE:
        import replay

        trace = None
        if _MODE == "replay":
            try:
                with open(_trace_path(item.nodeid)) as f:
                    text = f.read(replay.MAX_BYTES * 2 + 2**20)
                trace = json.loads(text)
                if not isinstance(trace, dict):
                    trace = {"error": "the child's values for this test are not readable"}
            except FileNotFoundError:
                trace = {"error": "the child recorded no values for this test"}
            except ValueError:
                trace = {"error": "the child's values for this test are not readable"}
        replay.begin(_MODE, trace)
    yield
    if _MODE == "record":
        import replay

        text = replay.end_record()
        if text is not None:
            with open(_trace_path(item.nodeid), "w") as f:
                f.write(text)
    elif _MODE == "replay":
        import replay

        replay.end_replay()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    armed = _TIMEOUT > 0 and hasattr(signal, "setitimer")
    if armed:
        def expire(signum, frame):
            raise TestTimedOut(f"timed out after {_TIMEOUT:g} s")
        previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, _TIMEOUT)
    try:
        yield
    finally:
        if armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def _student_frames(tb) -> list[list]:
    """(file, line, function, source line) of each traceback frame in a file the student wrote."""
    if not _EXPECT or not _FILES:
        return []
    root = os.path.realpath(_EXPECT) + os.sep
    out = []
    while tb is not None:
        code = tb.tb_frame.f_code
        path = os.path.realpath(code.co_filename)
        rel = path[len(root):] if path.startswith(root) else None
        if rel in _FILES:
            import linecache

            out.append([rel, tb.tb_lineno, code.co_name, linecache.getline(path, tb.tb_lineno).strip()])
        tb = tb.tb_next
    return out[-8:]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    st = _state.get(item.nodeid)
    if st is not None and call.excinfo is not None and st["exc"] is None:
        value = call.excinfo.value
        tb = call.excinfo.tb
        frames = _student_frames(tb)
        last = tb
        while last is not None and last.tb_next is not None:
            last = last.tb_next
        in_student = bool(frames) and last is not None and os.path.realpath(
            last.tb_frame.f_code.co_filename).endswith(os.sep + frames[-1][0])
        st["exc"] = {"type": type(value).__name__, "text": str(value)[:2000], "raised_in_student_code": in_student}
        if _memory_error(value):
            st["exc"]["text"] = f"ran past the memory limit ({_MEMORY_MB:g} MB): {str(value)[:300]}"
            st["memory"] = True
        st["frames"] = frames
    del outcome


def pytest_runtest_logreport(report):
    st = _state.get(report.nodeid)
    if st is None:
        return
    if st["outcome"] == "passed" and (report.failed or report.skipped):
        st["outcome"] = "skipped" if report.skipped else ("failed" if report.when == "call" else "error")
        crash = getattr(report.longrepr, "reprcrash", None)
        if report.skipped and isinstance(report.longrepr, tuple):
            st["message"] = str(report.longrepr[2])
        else:
            st["message"] = crash.message if crash is not None else str(report.longrepr)[-500:]
        st["details"] = report.longreprtext[-3000:]
        if "TestTimedOut" in report.longreprtext:
            st["outcome"] = "timeout"
        if st.get("memory"):
            st["message"] = f"ran past the memory limit ({_MEMORY_MB:g} MB): {st['message']}"
    if report.when == "teardown":
        tampered = _changed() if _snapshot else []
        if tampered:
            st["outcome"] = "tampered"
            st["message"] = "the test changed objects the tests rely on: " + "; ".join(tampered[:5])
        _log(event="result", id=report.nodeid, outcome=st["outcome"], message=st["message"],
             details=st["details"], duration=time.time() - st["t0"], exc=st["exc"], frames=st["frames"])


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def small_model():
    """A random-weight model: small enough that every test runs in well under a second."""
    from minillm.model import Model, ModelConfig, init_params

    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48, max_seq_len=64)
    return Model(cfg, init_params(cfg, seed=3))


@pytest.fixture
def rng():
    return np.random.default_rng(0)
