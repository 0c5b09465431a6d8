"""The grader's record and replay (minillm/assignments/tests/replay.py, issue 35 item 1): the child records the
values the student's calls return and leave behind, and the trusted process that decides replays them.

A tiny stand-in for a graded module (``minillm.zz_replay_demo``) is recorded under the "child's" code and
replayed under a module whose functions would fail if they ran: what the test checks in the replay is what the
child's code computed, identity and in-place changes included; a changed value in the trace changes the verdict;
a trace cannot make the trusted side run code.
"""
import json
import sys
import types

import numpy as np
import pytest

from minillm.assignments.builder import TESTS_DIR

sys.path.insert(0, str(TESTS_DIR))
import replay  # noqa: E402

sys.path.remove(str(TESTS_DIR))

NAME = "minillm.zz_replay_demo"
CALLS = [f"{NAME}:scale", f"{NAME}:Queue.push", f"{NAME}:window", f"{NAME}:each"]


def _module(solved: bool):
    """The graded module: its bodies, or stubs that raise (the replay's tree has stubs)."""
    mod = types.ModuleType(NAME)
    src = '''
import numpy as np


class Queue:
    def __init__(self):
        self.items = []
        self.total = 0

    def push(self, x, log):
        SOLVED_push


def scale(x, factor):
    SOLVED_scale


def window(buf, n):
    SOLVED_window


def each(xs, fn):
    SOLVED_each
'''
    bodies = {"push": "self.items.append(x)\n        self.total += x\n        log.append(('push', x))\n"
                      "        return len(self.items)",
              "scale": "x *= factor\n    return float(x.sum())",
              "window": "return buf[:n]",
              "each": "return [fn(v) for v in xs]"}
    for k, body in bodies.items():
        src = src.replace(f"SOLVED_{k}", body if solved else "raise NotImplementedError('stub')")
    exec(compile(src, NAME, "exec"), mod.__dict__)
    sys.modules[NAME] = mod
    return mod


def _scenario():
    """A test body: it calls the graded functions and returns what it would assert on."""
    mod = sys.modules[NAME]
    q, log = mod.Queue(), []
    sizes = [q.push(3, log), q.push(4, log)]
    a = np.arange(4.0)
    total = mod.scale(a, 2.0)                       # changes a in place
    buf = np.zeros(8)
    w = mod.window(buf, 3)
    seen = []
    squares = mod.each([1, 2, 3], lambda v: seen.append(v) or v * v)
    return dict(sizes=sizes, items=list(q.items), total=q.total, log=log, a=a.tolist(), sum=total,
                shares=bool(np.shares_memory(w, buf)), w_shape=w.shape, squares=squares, seen=seen)


def _record():
    _module(solved=True)
    replay.install(CALLS, "record")
    replay.begin("record")
    want = _scenario()
    return want, json.loads(replay.end_record())


def _replay(trace):
    _module(solved=False)
    replay.install(CALLS, "replay", may_write=CALLS)  # (the demo changes an array in place)
    replay.begin("replay", trace)
    try:
        return _scenario()
    finally:
        replay.end_replay()


@pytest.fixture(autouse=True)
def _clean():
    yield
    sys.modules.pop(NAME, None)
    replay.RECORDER = replay.REPLAYER = None


def test_the_replay_sees_what_the_childs_code_computed_identity_and_in_place_changes_included():
    want, trace = _record()
    assert [e["call"] for e in trace["events"]] == CALLS[1:2] * 2 + CALLS[0:1] + CALLS[2:4]
    got = _replay(trace)
    assert got == want
    assert got["a"] == [0.0, 2.0, 4.0, 6.0] and got["shares"] and got["seen"] == [1, 2, 3]
    assert got["log"] == [("push", 3), ("push", 4)]      # the test's own list, appended to by the student's code


def test_a_call_that_writes_into_an_array_it_was_handed_fails_unless_allowed():
    """The grader installs no call with may_write: a graded function that changed an input array (zeroing q and
    v so that the expected attention, computed from them after the call, is zero too) fails the test."""
    _, trace = _record()
    _module(solved=False)
    replay.install(CALLS, "replay")
    replay.begin("replay", trace)
    try:
        with pytest.raises(replay.Divergence, match="wrote into the array given as its argument"):
            _scenario()
    finally:
        replay.end_replay()


def test_a_changed_value_in_the_trace_changes_the_verdict():
    """The replay returns what the trace holds: a trace that lies about a value is checked as that value (a
    child cannot make a wrong value pass by reporting "passed")."""
    want, trace = _record()
    ev = next(e for e in trace["events"] if e["call"].endswith(":scale"))
    ev["return"] = 999.0
    got = _replay(trace)
    assert got["sum"] == 999.0 and got != want


def test_a_missing_or_reordered_trace_fails_the_test():
    _, trace = _record()
    with pytest.raises(replay.Divergence, match="recorded no values"):
        _replay(None)
    trace["events"] = trace["events"][2:]
    with pytest.raises(replay.Divergence, match="where the child called"):
        _replay(trace)


@pytest.mark.parametrize("value", [
    {"t": "ntuple", "cls": "builtins:exec", "v": ["import os"]},
    {"t": "global", "name": "builtins:exec"},
    {"t": "global", "name": "os:system"},
    {"t": "module", "name": "subprocess"},
    {"t": "obj", "@": 99, "cls": "builtins:object", "v": []},
    {"t": "obj", "@": 98, "cls": "builtins:ValueError", "v": []},
    {"t": "enum", "cls": "builtins:dict", "name": "fromkeys"},
    {"t": "tensor", "@": 97, "dtype": "load", "shape": [1], "b": ""},
])
def test_a_forged_trace_cannot_make_the_trusted_side_run_code(value):
    with pytest.raises(Exception) as e:
        replay.Decoder().decode(value)
    assert isinstance(e.value, (replay.Divergence, ModuleNotFoundError, ImportError)) or "torch" in str(e.value)


def test_functions_made_by_the_students_code_become_stand_ins_that_fail_only_when_used():
    enc = replay.Encoder()
    data = json.loads(json.dumps(enc.encode({"f": lambda: 1, "n": 3})))
    out = replay.Decoder().decode(data)
    assert out["n"] == 3
    with pytest.raises(replay.Divergence, match="cannot call"):
        out["f"]()
