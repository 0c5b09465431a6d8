"""What every offline explorable shares: the page style, the JavaScript helpers, and the anywidget class
factory (anywidget is imported only here, lazily, so ``import minillm`` needs NumPy alone)."""
from __future__ import annotations

_CSS = """
.minillm-explorable { font: 13px/1.4 system-ui, sans-serif; border: 1px solid #ccd; border-radius: 6px;
  padding: 8px 10px; max-width: 100%; box-sizing: border-box; overflow-x: auto; }
.minillm-explorable button { margin: 0 4px 4px 0; padding: 2px 8px; cursor: pointer; }
.minillm-explorable select, .minillm-explorable input { margin: 0 8px 4px 2px; }
.minillm-explorable table { border-collapse: collapse; margin-top: 6px; font-variant-numeric: tabular-nums; }
.minillm-explorable td, .minillm-explorable th { border: 1px solid #dde; padding: 1px 6px; text-align: right; }
.minillm-explorable .note { color: #555; margin-top: 4px; }
.minillm-explorable .ok { color: #1a7f37; } .minillm-explorable .bad { color: #b00020; }
"""

COMMON_JS = """
const h = (tag, attrs = {}, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k);
  return e;
};
const fmt = (v, d = 4) => (Number.isFinite(v) ? v.toFixed(d) : v > 0 ? "inf" : v < 0 ? "-inf" : "nan");
"""


def _anywidget():
    try:
        import anywidget
        import traitlets
    except ImportError:
        return None
    return anywidget, traitlets


_CLASSES: dict[str, type] = {}


def widget_class(name: str, esm: str, traits: dict):
    """An anywidget class (made once per name) with ``traits`` synced; None where anywidget is missing."""
    mods = _anywidget()
    if mods is None:
        return None
    if name not in _CLASSES:
        anywidget, t = mods
        body = {"_esm": esm, "_css": _CSS, "__repr__": lambda self: f"<{name}: an offline explorable>"}
        for key, kind in traits.items():
            body[key] = {"list": t.List, "dict": t.Dict, "int": t.Int, "float": t.Float, "str": t.Unicode}[kind]().tag(sync=True)
        _CLASSES[name] = type(name, (anywidget.AnyWidget,), body)
    return _CLASSES[name]


