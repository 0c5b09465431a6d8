"""The parent decides: record what the student's code returns in the child, replay it in a trusted process.

The grader runs every test twice.

* In the **child** (the student's bodies spliced into the package) each *registered call* -- a graded
  function or method, or the launcher of a graded Triton kernel -- is wrapped: at its outermost call the wrapper
  records the state of its arguments (``self`` included) before and after, what it returned or raised, and the
  calls it made to functions the test passed in (a sampler, a resample callback). Values are plain data: JSON
  with arrays as base64 bytes, objects as their class's name and attributes, each mutable object numbered so
  that identity survives (the same Sequence in the queue and in the test). A test's trace is written to a file
  when it ends; a trace over MAX_BYTES is refused.
* In the **replay** process (the trusted package with the assignment's bodies *stubbed*: no line the student
  wrote is there) the same test runs again, and each registered call is served from the trace: the arguments
  the grader's own code passes must be the ones the child saw (else the replay *diverged* and the test fails),
  the objects they reach are brought to their state after the call, the callbacks are called with the recorded
  arguments, and the recorded value is returned or the recorded exception raised. The test's own assertions,
  oracles and expectations run only here, and its outcome here is the one that counts.

A forged "passed" record, a forged trace or a replaced assertion in the child therefore gains nothing: the
child supplies only values, and the trusted process checks them. Measurements the test takes of the student's
run (``tracemalloc.get_traced_memory``) are registered calls too, so they are the child's.
"""
from __future__ import annotations

import functools
import importlib
import json
import sys
import tracemalloc


import probes  # noqa: F401,E402  (a sibling module: the measurements in OBSERVED besides tracemalloc's)
from replay_codec import (  # noqa: E402  (a sibling module in the tests folder)
    MAX_BYTES,
    Decoder,
    Divergence,
    Encoder,
    OBSERVED,
    TraceTooLarge,
    global_name,
    resolve)


# --------------------------------------------------------------------------- wrappers


class Recorder:
    """The child's side for one test."""

    def __init__(self):
        self.enc = Encoder()
        self.events: list[dict] = []
        self.depth = 0
        self.error: str | None = None
        self.mem_cur = self.mem_peak = 0     # tracemalloc's view of the student's calls (see _carry)

    def args(self, args, kwargs):
        seen = set()
        return {"args": [self.enc.encode(a, seen) for a in args],
                "kwargs": {k: self.enc.encode(v, seen) for k, v in kwargs.items()}}

    def dump(self) -> str:
        return json.dumps({"events": self.events, "error": self.error})


class Replayer:
    """The trusted side for one test."""

    def __init__(self, trace: dict):
        self.events = list(trace.get("events") or [])
        self.pos = 0
        self.dec = Decoder()
        self.error = trace.get("error")

    def next(self, name: str) -> dict:
        if self.error:
            raise Divergence(self.error)
        if self.pos >= len(self.events):
            raise Divergence(f"{name} was called here but not in the child (the test ended there, or took "
                             f"another path)")
        ev = self.events[self.pos]
        self.pos += 1
        if ev.get("call") != name:
            raise Divergence(f"the grader calls {name} where the child called {ev.get('call')}")
        return ev


RECORDER: Recorder | None = None
REPLAYER: Replayer | None = None


def _callable_arg(x) -> bool:
    """A function the test passed in (its calls from the student's code are part of the trace)."""
    if isinstance(x, type) or not callable(x) or isinstance(x, functools.partial):
        return False
    mod = getattr(x, "__module__", "") or ""
    return not mod.startswith("minillm") and type(x).__name__ in ("function", "method")


def _exception(e: BaseException, enc: Encoder) -> dict:
    name = global_name(type(e))
    try:
        args = enc.encode(e.args)
    except Exception:  # noqa: BLE001
        args = {"t": "tuple", "v": [str(e)]}
    return {"type": name, "name": type(e).__name__, "msg": str(e)[:2000], "args": args}


def _raise(rec: dict, dec: Decoder):
    cls = None
    if rec.get("type"):
        try:
            cls = resolve(rec["type"])
        except Exception:  # noqa: BLE001
            cls = None
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(*dec.decode(rec["args"]))
        except Exception:  # noqa: BLE001
            pass
    return RuntimeError(f"{rec.get('name')}: {rec.get('msg')}")


_traced = tracemalloc.get_traced_memory    # the originals (the observed one gets wrapped)
_tracing = tracemalloc.is_tracing


def _pause() -> bool:
    """Stop tracemalloc while the recorder encodes (its copies are not the student's memory)."""
    if _tracing():
        tracemalloc.stop()
        return True
    return False


def recording(orig, name: str):
    if name == "tracemalloc:get_traced_memory":
        return _observed_memory(orig, name)

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        rec = RECORDER
        if rec is None or rec.depth > 0 or rec.error:
            return orig(*args, **kwargs)
        ev = {"call": name}
        paused = _pause()
        try:
            ev["before"] = rec.args(args, kwargs)
        except (Divergence, TraceTooLarge) as e:
            rec.error = str(e)
        if paused:
            tracemalloc.start()
        if rec.error:
            return orig(*args, **kwargs)
        calls: list = []
        a2 = [_proxy(v, ("a", k), calls) if _callable_arg(v) else v for k, v in enumerate(args)]
        kw2 = {k: _proxy(v, ("k", k), calls) if _callable_arg(v) else v for k, v in kwargs.items()}
        rec.depth += 1
        try:
            out = orig(*a2, **kw2)
        except Exception as e:
            rec.depth -= 1
            paused = _carry(rec)
            ev["raise"] = _exception(e, rec.enc)
            _finish(rec, ev, args, kwargs, calls, None, False)
            if paused:
                tracemalloc.start()
            raise
        rec.depth -= 1
        paused = _carry(rec)
        _finish(rec, ev, args, kwargs, calls, out, True)
        if paused:
            tracemalloc.start()
        return out

    wrapper.__minillm_replay__ = name
    return wrapper


def _carry(rec) -> bool:
    """After the student's call, while tracemalloc traces: keep what it measured (the recorder restarts the
    trace around its own work, and the test reads the sum through the wrapped get_traced_memory)."""
    if not _tracing():
        return False
    cur, peak = _traced()
    rec.mem_peak = max(rec.mem_peak, rec.mem_cur + peak)
    rec.mem_cur += cur
    return _pause()


def _observed_memory(orig, name):
    @functools.wraps(orig)
    def wrapper():
        rec = RECORDER
        cur, peak = orig()
        if rec is not None and rec.depth == 0:
            cur, peak = rec.mem_cur + cur, max(rec.mem_peak, rec.mem_cur + peak)
            if not rec.error:
                rec.events.append({"call": name, "before": {"args": [], "kwargs": {}}, "after": {"args": [],
                                   "kwargs": {}}, "return": {"t": "tuple", "v": [cur, peak]}, "callbacks": []})
        return cur, peak

    wrapper.__minillm_replay__ = name
    return wrapper


def _finish(rec, ev, args, kwargs, calls, out, returned):
    try:
        ev["after"] = rec.args(args, kwargs)
        if returned:
            ev["return"] = rec.enc.encode(out)
        ev["callbacks"] = calls
    except (Divergence, TraceTooLarge) as e:
        rec.error = str(e)
        return
    rec.events.append(ev)


def _proxy(fn, where, calls):
    @functools.wraps(fn)
    def proxy(*a, **k):
        rec = RECORDER
        out = fn(*a, **k)
        if rec is not None and not rec.error:
            try:
                seen = set()
                calls.append({"fn": list(where), "args": [rec.enc.encode(v, seen) for v in a],
                              "kwargs": {n: rec.enc.encode(v, seen) for n, v in k.items()},
                              "return": rec.enc.encode(out)})
            except (Divergence, TraceTooLarge) as e:
                rec.error = str(e)
        return out
    return proxy


def _array_state(e):
    """What an encoded array argument holds: its bytes (a view: its root's, and where it sits in it)."""
    if e.get("t") == "view":
        return _array_state(e["root"]), e["offset"], tuple(e["shape"]), tuple(e["strides"])
    return e.get("b")


def _written_arrays(before: dict, after: dict) -> list:
    """The positions (or keyword names) of the array and tensor arguments whose contents differ after the call."""
    pairs = [(i, b, a) for i, (b, a) in enumerate(zip(before["args"], after["args"]))]
    pairs += [(k, before["kwargs"][k], after["kwargs"].get(k)) for k in before["kwargs"]]
    return [k for k, b, a in pairs if isinstance(b, dict) and b.get("t") in ("nd", "tensor", "view")
            and isinstance(a, dict) and _array_state(b) != _array_state(a)]


def replaying(orig, name: str, may_write: bool = False):
    """``may_write``: the call may change the arrays and tensors it is handed (no graded call may: see install)."""
    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        rp = REPLAYER
        if rp is None:
            raise Divergence(f"{name}: no trace to replay")
        ev = rp.next(name)
        before, after = ev["before"], ev["after"]
        if len(before["args"]) != len(args) or set(before["kwargs"]) != set(kwargs):
            raise Divergence(f"{name}: called with other arguments than in the child")
        for k, (e, x) in enumerate(zip(before["args"], args)):
            rp.dec.match(e, x, f"{name} argument {k}")
        for k, e in before["kwargs"].items():
            rp.dec.match(e, kwargs[k], f"{name} argument {k}")
        for c in ev.get("callbacks") or []:
            kind, key = c["fn"]
            fn = args[key] if kind == "a" else kwargs[key]
            got = fn(*(rp.dec.decode(v) for v in c["args"]), **{n: rp.dec.decode(v) for n, v in c["kwargs"].items()})
            rp.dec.match(c["return"], got, f"the return value of the function passed to {name}")
        written = [] if may_write else _written_arrays(before, after)
        if written:
            raise Divergence(f"{name} wrote into the array given as its argument {written[0]}: a graded function may "
                             f"not change the arrays it is handed (the tests compute the expected answer from them)")
        for e in after["args"]:
            rp.dec.decode(e)
        for e in after["kwargs"].values():
            rp.dec.decode(e)
        if "raise" in ev:
            raise _raise(ev["raise"], rp.dec)
        return rp.dec.decode(ev["return"])

    wrapper.__minillm_replay__ = name
    return wrapper


def _is_kernel(obj) -> bool:
    return type(obj).__module__.split(".")[0] == "triton"


def install(names, mode: str, may_write=()) -> list[str]:
    """Wrap every registered call (``module:qualname``, ``module:Class.method``) for ``mode`` "record" or
    "replay"; a name whose object is a Triton kernel is skipped (its launcher is registered instead). Returns
    the names wrapped. Every loaded module and class that holds the original gets the wrapper. In the replay a
    call not named in ``may_write`` fails the test if it changed an array or tensor it was handed: a graded
    function that wrote into its inputs would rewrite the answer the test computes from them (the grader names
    none: no graded function writes into its array arguments; ``self`` and other objects may change)."""
    def make(fn, name):
        return recording(fn, name) if mode == "record" else replaying(fn, name, name in may_write)
    done = []
    for name in list(names) + list(OBSERVED):
        mod_name, _, qual = name.partition(":")
        mod = importlib.import_module(mod_name)
        owner, attr = mod, qual
        if "." in qual:
            cls_name, attr = qual.rsplit(".", 1)
            owner = resolve(f"{mod_name}:{cls_name}")
        raw = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr)
        if raw is None or _is_kernel(raw) or getattr(raw, "__minillm_replay__", None):
            continue
        if isinstance(raw, (staticmethod, classmethod)):
            wrapped = type(raw)(make(raw.__func__, name))
        else:
            wrapped = make(raw, name)
        setattr(owner, attr, wrapped)
        if not isinstance(owner, type):   # a module function: other modules' imports of it too
            for m in list(sys.modules.values()):
                if m is not None and m is not owner and getattr(m, "__name__", "").startswith("minillm") \
                        and getattr(m, attr, None) is raw:
                    setattr(m, attr, wrapped)
        done.append(name)
    return done


def begin(mode: str, trace: dict | None = None) -> None:
    global RECORDER, REPLAYER
    if mode == "record":
        RECORDER = Recorder()
    else:
        REPLAYER = Replayer(trace or {"events": [], "error": "the child recorded no values for this test"})


def end_record() -> str | None:
    global RECORDER
    rec, RECORDER = RECORDER, None
    return None if rec is None else rec.dump()


def end_replay() -> None:
    global REPLAYER
    REPLAYER = None
