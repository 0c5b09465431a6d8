"""The values of the grader's record and replay (replay.py): how the child encodes what a graded call took, left
behind and returned as plain data (JSON, arrays as base64 bytes, objects as their class's name and attributes,
mutable objects numbered so that identity survives), and how the trusted process decodes it without calling
anything the record names but named tuples, enums and exception classes."""
from __future__ import annotations

import base64
import collections
import enum
import importlib
import re
import sys

import numpy as np

MAX_BYTES = 64 * 2**20        # per test: a trace bigger than this fails the test
OBSERVED = ("tracemalloc:get_traced_memory", "probes:loaded_elements", "probes:most_loaded_by_one_program",
            "probes:forward_calls")   # the test's measurements of the student's run
# Objects passed by reference only (their state is never copied; the student's code only reads them).
OPAQUE = ("minillm.model:Model", "minillm.serving.runner:NumpyRunner", "minillm.serving.torch_runner:TorchRunner")
_TEST_MODULE = re.compile(r"^(a\d\d_(public|grader)|conftest|oracles)$")
_TRUSTED = ("minillm", "numpy", "collections", "builtins", "dataclasses", "enum", "torch", "math", "fractions")


class Divergence(AssertionError):
    """The replay cannot follow the trace (the grader's code passed other arguments, or a value cannot be
    rebuilt): the test fails."""


class TraceTooLarge(Exception):
    pass


class Unrebuildable:
    """What a function, method or generator the student's code made (and kept or returned) becomes in the
    replay: a stand-in that fails the test only if the test uses it."""

    def __init__(self, kind: str):
        self._kind = kind

    def __call__(self, *a, **k):
        raise Divergence(f"your code returned a {self._kind}, which the grader cannot call: return plain data")

    def __iter__(self):
        raise Divergence(f"your code returned a {self._kind}, which the grader cannot iterate: return plain data")

    def __repr__(self):
        return f"<{self._kind} made by your code>"


def trusted_module(mod: str) -> bool:
    return bool(_TEST_MODULE.match(mod)) or mod.split(".")[0] in _TRUSTED


def global_name(obj) -> str | None:
    """'module:qualname' of a class or function importable from a trusted module, else None."""
    mod, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not mod or not qual or "<" in qual or not trusted_module(mod):
        return None
    try:
        return f"{mod}:{qual}" if resolve(f"{mod}:{qual}") is obj else None
    except Exception:  # noqa: BLE001
        return None


def resolve(name: str):
    mod, _, qual = name.partition(":")
    if not trusted_module(mod) or "<" in qual:
        raise Divergence(f"{name} is not a trusted name")
    obj = sys.modules.get(mod) or importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def _torch():
    return sys.modules.get("torch")


def _is_tensor(x) -> bool:
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


def _tensor_bytes(x):
    t = _torch()
    x = x.detach().cpu().contiguous()
    if x.dtype == t.bfloat16:
        return x.view(t.int16).numpy()
    return x.numpy()


def _opaque_types() -> tuple:
    out = []
    for name in OPAQUE:
        mod = name.partition(":")[0]
        if mod in sys.modules:
            try:
                out.append(resolve(name))
            except Exception:  # noqa: BLE001
                pass
    return tuple(out)


def _slots(cls) -> list[str]:
    out = []
    for k in cls.__mro__:
        s = k.__dict__.get("__slots__", ())
        out += [s] if isinstance(s, str) else [n for n in s if n not in ("__dict__", "__weakref__")]
    return out


def _state(obj) -> dict:
    d = dict(getattr(obj, "__dict__", {}) or {})
    for s in _slots(type(obj)):
        if hasattr(obj, s):
            d[s] = getattr(obj, s)
    return d


# --------------------------------------------------------------------------- the child: encoding


class Encoder:
    """Numbers every mutable object it meets (for the whole test), and writes each one's full state the first
    time it meets it within one encoding (later: a back-reference)."""

    def __init__(self):
        self.ids: dict[int, int] = {}
        self.keep: list = []
        self.size = 0
        self.opaque = _opaque_types()

    def ref(self, obj) -> int:
        r = self.ids.get(id(obj))
        if r is None:
            r = self.ids[id(obj)] = len(self.keep)
            self.keep.append(obj)
        return r

    def encode(self, obj, seen=None):
        return self._enc(obj, set() if seen is None else seen)

    def _bytes(self, a: np.ndarray) -> str:
        self.size += a.nbytes
        if self.size > MAX_BYTES:
            raise TraceTooLarge(f"the values your code returned are over {MAX_BYTES // 2**20} MB")
        return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()

    def _enc(self, x, seen):  # noqa: C901 -- one branch per kind of value
        if x is None or type(x) in (bool, int, float, str):
            if type(x) is str:
                self.size += len(x)
            return x
        if isinstance(x, enum.Enum):
            return self._enum(x)
        if isinstance(x, np.generic) and not isinstance(x, np.void):
            return {"t": "npscalar", "dtype": x.dtype.str, "b": self._bytes(np.asarray(x))}
        if type(x) is complex:
            return {"t": "complex", "v": [x.real, x.imag]}
        if isinstance(x, (bool, int, float, str)):   # a subclass of a plain type: its plain value
            return self._enc(type(x).__mro__[-2](x), seen)
        if isinstance(x, type) or type(x).__name__ in ("function", "builtin_function_or_method"):
            name = global_name(x)
            if name is not None:
                return {"t": "global", "name": name}
            r = self.ref(x)
            return {"t": "opaque", "@": r, "cls": type(x).__qualname__}
        if type(x) is type(sys):
            return {"t": "module", "name": x.__name__}
        if isinstance(x, np.dtype):
            return {"t": "npdtype", "v": x.str if x.fields is None else str(x)}
        t = _torch()
        if t is not None and isinstance(x, t.dtype):
            return {"t": "torchdtype", "v": str(x).split(".")[-1]}
        if type(x) is slice:
            return {"t": "slice", "v": [self._enc(x.start, seen), self._enc(x.stop, seen), self._enc(x.step, seen)]}
        if type(x) is range:
            return {"t": "range", "v": [x.start, x.stop, x.step]}
        if type(x) is bytes:
            return {"t": "bytes", "b": self._bytes(np.frombuffer(x, np.uint8))}
        if type(x) is tuple:
            return {"t": "tuple", "v": [self._enc(v, seen) for v in x]}
        if type(x) is frozenset:
            return {"t": "frozenset", "v": [self._enc(v, seen) for v in x]}
        r = self.ref(x)
        if r in seen:
            return {"t": "ref", "@": r}
        seen.add(r)
        if type(x) is list:
            return {"t": "list", "@": r, "v": [self._enc(v, seen) for v in x]}
        if type(x) is dict or type(x) in (collections.OrderedDict, collections.defaultdict, collections.Counter):
            out = {"t": "dict", "@": r, "v": [[self._enc(k, seen), self._enc(v, seen)] for k, v in x.items()]}
            if type(x) is not dict:
                out["cls"] = global_name(type(x))
                if type(x) is collections.defaultdict:
                    out["factory"] = self._enc(x.default_factory, seen)
            return out
        if type(x) is set:
            return {"t": "set", "@": r, "v": [self._enc(v, seen) for v in x]}
        if type(x) is collections.deque:
            return {"t": "deque", "@": r, "maxlen": x.maxlen, "v": [self._enc(v, seen) for v in x]}
        if type(x) is np.ndarray:
            root = x
            while isinstance(root.base, np.ndarray):
                root = root.base
            if root is not x and root.base is None and root.flags.c_contiguous and not x.dtype.hasobject:
                start = x.__array_interface__["data"][0] - root.__array_interface__["data"][0]
                return {"t": "view", "@": r, "root": self._enc(root, seen), "offset": int(start),
                        "dtype": x.dtype.str, "shape": list(x.shape), "strides": list(x.strides)}
            if x.dtype.hasobject:
                return {"t": "ndobj", "@": r, "shape": list(x.shape), "v": [self._enc(v, seen) for v in x.ravel()]}
            return {"t": "nd", "@": r, "dtype": x.dtype.str, "shape": list(x.shape), "b": self._bytes(x)}
        if _is_tensor(x):
            return {"t": "tensor", "@": r, "dtype": str(x.dtype).split(".")[-1], "shape": list(x.shape),
                    "b": self._bytes(_tensor_bytes(x))}
        if isinstance(x, np.random.Generator):
            return {"t": "rng", "@": r, "bitgen": type(x.bit_generator).__name__,
                    "state": self._enc(x.bit_generator.state, set())}
        if isinstance(x, self.opaque) or type(x).__name__ in ("method", "partial", "generator"):
            return {"t": "opaque", "@": r, "cls": type(x).__qualname__}
        return self._enc_obj(x, seen, r)

    def _enum(self, x):
        name = global_name(type(x))
        if name is None:
            raise Divergence(f"cannot pass a value of type {type(x).__qualname__}")
        return {"t": "enum", "cls": name, "name": x.name}

    def _enc_obj(self, x, seen, r=None):
        name = global_name(type(x))
        if name is None:
            raise Divergence(f"cannot pass a value of type {type(x).__module__}.{type(x).__qualname__}")
        if r is None:
            r = self.ref(x)
            seen.add(r)
        if isinstance(x, tuple):   # a namedtuple
            return {"t": "ntuple", "cls": name, "v": [self._enc(v, seen) for v in x]}
        return {"t": "obj", "@": r, "cls": name,
                "v": [[k, self._enc(v, seen)] for k, v in _state(x).items()]}


def _decode_array(e) -> np.ndarray:
    return np.frombuffer(base64.b64decode(e["b"]), dtype=np.dtype(e["dtype"])).reshape(e["shape"]).copy()


def _decode_tensor(e):
    t = _torch()
    dtype = getattr(t, str(e["dtype"]), None)
    if not isinstance(dtype, t.dtype):
        raise Divergence(f"{e['dtype']!r} is not a torch dtype")
    if dtype == t.bfloat16:
        a = np.frombuffer(base64.b64decode(e["b"]), dtype=np.int16).reshape(e["shape"]).copy()
        return t.from_numpy(a).view(t.bfloat16)
    a = np.frombuffer(base64.b64decode(e["b"]), dtype=t.empty(0, dtype=dtype).numpy().dtype)
    return t.from_numpy(a.reshape(e["shape"]).copy())


# --------------------------------------------------------------------------- the replay: decoding


class Decoder:
    """Maps the child's object numbers to the replay's objects: first by walking the arguments the grader's code
    passes next to what the child saw (``match``), then by building what the child's code made (``decode``)."""

    def __init__(self):
        self.objs: dict[int, object] = {}
        self.back: dict[int, int] = {}

    def bind(self, r: int, obj, where: str) -> None:
        old = self.objs.get(r)
        if old is not None and old is not obj:
            raise Divergence(f"{where}: the child passed another object here")
        if old is None:
            if id(obj) in self.back and self.back[id(obj)] != r:
                raise Divergence(f"{where}: the child passed two objects where the grader passes one")
            self.objs[r] = obj
            self.back[id(obj)] = r

    def match(self, e, x, where="argument") -> None:  # noqa: C901
        """Map the child's objects to the grader's along the same structure. Values are not compared: they may
        differ (a timestamp), and the state after the call is the child's in any case; what the tests assert
        runs on that state."""
        if not isinstance(e, dict):
            return
        t = e["t"]
        if "@" in e:
            self.bind(e["@"], x, where)
        if t in ("list", "tuple", "deque"):
            items = list(x) if isinstance(x, (list, tuple, collections.deque)) else None
            if items is None or len(items) != len(e["v"]):
                raise Divergence(f"{where}: {len(e['v'])} items in the child, not so here")
            for k, (ev, xv) in enumerate(zip(e["v"], items)):
                self.match(ev, xv, f"{where}[{k}]")
        elif t == "dict":
            if not isinstance(x, dict) or len(x) != len(e["v"]):
                raise Divergence(f"{where}: another dict")
            for ek, ev in e["v"]:
                k = self.decode(ek) if not (isinstance(ek, dict) and "@" in ek) else None
                if k is not None and k in x:
                    self.match(ev, x[k], f"{where}[{k!r:.40}]")
        elif t == "view":
            if isinstance(x, np.ndarray):
                root = x
                while isinstance(root.base, np.ndarray):
                    root = root.base
                self.match(e["root"], root, f"{where} (its array)")
        elif t in ("obj", "ntuple"):
            if global_name(type(x)) != e["cls"]:
                raise Divergence(f"{where}: a {e['cls']} in the child, a {type(x).__qualname__} here")
            if t == "ntuple":
                for k, (ev, xv) in enumerate(zip(e["v"], x)):
                    self.match(ev, xv, f"{where}[{k}]")
                return
            st = _state(x)
            for k, ev in e["v"]:
                if k in st:
                    self.match(ev, st[k], f"{where}.{k}")

    def decode(self, e):  # noqa: C901
        if not isinstance(e, dict):
            return e
        t = e["t"]
        if t == "ref":
            if e["@"] not in self.objs:
                raise Divergence("a reference to an object the trace never described")
            return self.objs[e["@"]]
        r, old = e.get("@"), self.objs.get(e.get("@"))
        if t == "tuple":
            return tuple(self.decode(v) for v in e["v"])
        if t == "frozenset":
            return frozenset(self.decode(v) for v in e["v"])
        if t == "npscalar":
            return np.frombuffer(base64.b64decode(e["b"]), dtype=np.dtype(e["dtype"]))[0]
        if t == "complex":
            return complex(*e["v"])
        if t == "global":
            g = resolve(e["name"])
            if e["name"].startswith("builtins:") and not isinstance(g, type):
                raise Divergence(f"{e['name']} cannot be a value")
            return g
        if t == "module":
            if not trusted_module(e["name"]):
                raise Divergence(f"module {e['name']}")
            return importlib.import_module(e["name"])
        if t == "npdtype":
            return np.dtype(e["v"])
        if t == "torchdtype":
            dt = getattr(_torch(), str(e["v"]), None)
            if not isinstance(dt, _torch().dtype):
                raise Divergence(f"{e['v']!r} is not a torch dtype")
            return dt
        if t == "slice":
            return slice(*(self.decode(v) for v in e["v"]))
        if t == "range":
            return range(*e["v"])
        if t == "bytes":
            return base64.b64decode(e["b"])
        if t == "enum":
            cls = resolve(e["cls"])
            if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
                raise Divergence(f"{e['cls']} is not an enum")
            return cls[str(e["name"])]
        if t == "ntuple":
            cls = resolve(e["cls"])
            if not (isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")):
                raise Divergence(f"{e['cls']} is not a named tuple")
            return cls(*(self.decode(v) for v in e["v"]))
        if t == "list":
            out = old if isinstance(old, list) else []
            self._new(r, out)
            out[:] = [self.decode(v) for v in e["v"]]
            return out
        if t == "dict":
            cls = resolve(e["cls"]) if e.get("cls") else dict
            if cls not in (dict, collections.OrderedDict, collections.defaultdict, collections.Counter):
                raise Divergence(f"{e['cls']} is not a dict")
            if type(old) is cls:
                out = old
            else:
                out = cls(self.decode(e["factory"])) if cls is collections.defaultdict else cls()
            self._new(r, out)
            items = [(self.decode(k), self.decode(v)) for k, v in e["v"]]
            out.clear()
            out.update(items)
            return out
        if t == "set":
            out = old if isinstance(old, set) else set()
            self._new(r, out)
            items = [self.decode(v) for v in e["v"]]
            out.clear()
            out.update(items)
            return out
        if t == "deque":
            out = old if isinstance(old, collections.deque) and old.maxlen == e["maxlen"] \
                else collections.deque(maxlen=e["maxlen"])
            self._new(r, out)
            items = [self.decode(v) for v in e["v"]]
            out.clear()
            out.extend(items)
            return out
        if t == "nd":
            a = _decode_array(e)
            if isinstance(old, np.ndarray) and old.shape == a.shape and old.dtype == a.dtype and old.flags.writeable:
                old[...] = a
                return old
            self._new(r, a)
            return a
        if t == "view":
            root = self.decode(e["root"])
            if not isinstance(root, np.ndarray):
                raise Divergence("a view of something that is not an array")
            try:
                a = np.ndarray(e["shape"], np.dtype(e["dtype"]), buffer=root, offset=e["offset"], strides=e["strides"])
            except (TypeError, ValueError) as err:
                raise Divergence(f"a view that does not fit its array: {err}") from None
            self._new(r, a)
            return a
        if t == "ndobj":
            a = np.empty(len(e["v"]), dtype=object)
            self._new(r, a)
            for k, v in enumerate(e["v"]):
                a[k] = self.decode(v)
            a = a.reshape(e["shape"])
            self.objs[r] = a
            return a
        if t == "tensor":
            x = _decode_tensor(e)
            if _is_tensor(old) and list(old.shape) == e["shape"] and old.dtype == x.dtype:
                old.copy_(x)
                return old
            self._new(r, x)
            return x
        if t == "rng":
            state = self.decode(e["state"])
            if isinstance(old, np.random.Generator):
                old.bit_generator.state = state
                return old
            bitgen = getattr(np.random, e["bitgen"])
            g = np.random.Generator(bitgen())
            g.bit_generator.state = state
            self._new(r, g)
            return g
        if t == "opaque":
            if old is None:   # made by the student's code: a stand-in that fails the test only if it is used
                old = Unrebuildable(str(e.get("cls")))
                self._new(r, old)
            return old
        if t == "obj":
            cls = resolve(e["cls"])
            if not isinstance(cls, type):
                raise Divergence(f"{e['cls']} is not a class")
            if issubclass(cls, BaseException) or cls.__module__ == "builtins":
                raise Divergence(f"{e['cls']} cannot be rebuilt from data")
            out = old if type(old) is cls else cls.__new__(cls)
            self._new(r, out)
            state = {str(k): self.decode(v) for k, v in e["v"]}
            slots = set(_slots(cls))
            if hasattr(out, "__dict__"):
                out.__dict__.clear()
            for k, v in state.items():   # plain attributes only: no property setter runs on the child's data
                if k in slots:
                    object.__setattr__(out, k, v)
                elif hasattr(out, "__dict__"):
                    out.__dict__[k] = v
                else:
                    raise Divergence(f"{e['cls']} has no attribute {k!r:.40}")
            return out
        raise Divergence(f"unknown value kind {t!r}")

    def _new(self, r, obj) -> None:
        old = self.objs.get(r)
        if old is not None and old is not obj:
            self.back.pop(id(old), None)
        self.objs[r] = obj
        self.back[id(obj)] = r
