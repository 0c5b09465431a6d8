"""Shared by the public and the grader tests: fixtures, the points/stretch marks, and (only when the
grader runs them) a per-test time limit and a log of every result.

The grader sets MINILLM_GRADE_LOG (a JSON-lines file) and MINILLM_GRADE_TIMEOUT (seconds); students
running the public tests with plain pytest get neither.
"""
from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import pytest

_LOG = os.environ.get("MINILLM_GRADE_LOG")
_TIMEOUT = float(os.environ.get("MINILLM_GRADE_TIMEOUT") or 0)
_EXPECT = os.environ.get("MINILLM_GRADE_ROOT")


class TestTimedOut(BaseException):
    """Raised in a test that ran past its limit (a BaseException, so ``except Exception`` cannot swallow it)."""


def _log(**record) -> None:
    if _LOG:
        with open(_LOG, "a") as f:
            f.write(json.dumps(record) + "\n")


def pytest_configure(config):
    config.addinivalue_line("markers", "points(n): the test is worth n points (default 1)")
    config.addinivalue_line("markers", "stretch: an optional part; its points are a bonus outside the maximum")


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


def pytest_collectreport(report):
    if report.failed:
        _log(event="collect_error", nodeid=report.nodeid, message=str(report.longrepr)[-4000:])


def pytest_collection_finish(session):
    tests = []
    for item in session.items:
        mark = item.get_closest_marker("points")
        tests.append({"id": item.nodeid, "points": float(mark.args[0]) if mark else 1.0,
                      "stretch": item.get_closest_marker("stretch") is not None})
    _log(event="collected", tests=tests)


_state: dict[str, dict] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _state[item.nodeid] = {"outcome": "passed", "message": "", "details": "", "t0": time.time()}
    _log(event="start", id=item.nodeid, t=time.time())
    yield


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
    if report.when == "teardown":
        _log(event="result", id=report.nodeid, outcome=st["outcome"], message=st["message"],
             details=st["details"], duration=time.time() - st["t0"])


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
