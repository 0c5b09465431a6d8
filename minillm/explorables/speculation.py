"""Chapter 9's cost model of speculative decoding as an offline explorable.

With acceptance rate alpha (each draft kept independently with probability alpha), k drafts per round and a
draft step that costs c target steps, a round emits on average

    E[tokens per call] = 1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)      (k + 1 at alpha = 1)

tokens for 1 + k c target steps of time (k draft steps and one verify pass that costs about one step), so the
speedup over the target alone is

    S(alpha, k, c) = E[tokens per call] / (1 + k c).

:func:`speculation_cost` and :func:`best_k` are the Python side (``minillm.studies.speculation``'s
``expected_tokens_per_call`` and ``speedup_model``); the widget's JavaScript computes the same numbers in the
page from the sliders (``tests/test_explorables.py`` runs it in Node against these). ``presets`` are settings
the chapter measured, one click each.
"""
from __future__ import annotations

import math

from minillm.explorables._base import COMMON_JS, widget_class
from minillm.studies.speculation import expected_tokens_per_call, speedup_model

K_MAX = 16  # the slider's range of draft lengths, and the range best_k searches

_SPEC_JS = COMMON_JS + """
// Chapter 9's cost model, recomputed in the page from the sliders.
export function tokensPerCall(a, k) {           // 1 + a + ... + a^k, i.e. (1 - a^(k+1)) / (1 - a)
  return a < 1 ? (1 - a ** (k + 1)) / (1 - a) : k + 1;
}
export function speedup(a, k, c) { return tokensPerCall(a, k) / (1 + k * c); }
export function bestK(a, c, kMax) {             // the k in 1..kMax with the largest speedup (the smallest on ties)
  let best = 1;
  for (let k = 2; k <= kMax; k++) if (speedup(a, k, c) > speedup(a, best, c)) best = k;
  return best;
}

function render({ model, el }) {
  const kMax = model.get("k_max"), presets = model.get("presets");
  const slider = (value, min, max, step) => h("input", { type: "range", min, max, step, value, style: "width:14em;vertical-align:middle" });  // value last: the range must exist first
  const c = { alpha: slider(model.get("alpha"), 0, 0.99, 0.01), k: slider(model.get("k"), 1, kMax, 1),
              c: slider(model.get("c"), 0, 1, 0.01) };
  const shown = { alpha: h("span"), k: h("span"), c: h("span") };
  const root = h("div", { class: "minillm-explorable", "data-explorable": "speculation-cost" });
  const status = h("div", { class: "status" }), note = h("div", { class: "note" }), table = h("table");
  const svgNS = "http://www.w3.org/2000/svg", W = 560, H = 170, pad = 30;
  const svg = document.createElementNS(svgNS, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("style", "width:100%;max-width:560px;height:auto;display:block");
  const el_ = (tag, attrs, text) => { const e = document.createElementNS(svgNS, tag); for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v); if (text !== undefined) e.textContent = text; return e; };
  function draw() {
    const a = +c.alpha.value, k = Math.round(+c.k.value), cc = +c.c.value;
    shown.alpha.textContent = a.toFixed(2); shown.k.textContent = String(k); shown.c.textContent = cc.toFixed(2);
    const t = tokensPerCall(a, k), s = speedup(a, k, cc), kb = bestK(a, cc, kMax);
    status.textContent = `alpha = ${a.toFixed(2)}, k = ${k}, c = ${cc.toFixed(2)}: a round emits ${t.toFixed(2)} tokens ` +
      `on average for ${(1 + k * cc).toFixed(2)} target steps of time, a speedup of ${s.toFixed(2)}x ` +
      (s >= 1 ? "(speculation pays)." : "(speculation LOSES: slower than the target alone).");
    note.textContent = `Best k here: ${kb} (${speedup(a, kb, cc).toFixed(2)}x). However long the drafts, tokens per call ` +
      `stay below 1 / (1 - alpha) = ${a < 1 ? (1 / (1 - a)).toFixed(2) : "inf"}.`;
    // speedup against k for the current alpha and c; the chosen k in orange, 1x dashed
    svg.replaceChildren();
    const vals = Array.from({ length: kMax }, (_, i) => speedup(a, i + 1, cc));
    const top = Math.max(2, ...vals) * 1.1, bw = (W - 2 * pad) / kMax, y = (v) => H - pad - (H - 2 * pad) * v / top;
    vals.forEach((v, i) => svg.append(el_("rect", { x: pad + i * bw + 2, width: bw - 4, y: y(v), height: y(0) - y(v),
      fill: i + 1 === k ? "#ff7f0e" : "#1f77b4" })));
    vals.forEach((v, i) => { if (i % 2 === 0 || i + 1 === k) svg.append(el_("text", { x: pad + (i + 0.5) * bw, y: H - pad + 12, "font-size": 10, "text-anchor": "middle" }, String(i + 1))); });
    svg.append(el_("line", { x1: pad, x2: W - pad, y1: y(1), y2: y(1), stroke: "#000", "stroke-dasharray": "4 3" }));
    svg.append(el_("text", { x: 2, y: y(1) + 4, "font-size": 10 }, "1x"));
    svg.append(el_("text", { x: W / 2, y: H - 4, "font-size": 10, "text-anchor": "middle" }, "k (drafts per round): speedup at this alpha and c"));
    table.replaceChildren(h("tr", {}, ...["k", "tokens per call", "round cost (target steps)", "speedup"].map((x) => h("th", {}, x))));
    for (const kk of [1, 2, 4, 8, kMax].filter((x, i, xs) => x <= kMax && xs.indexOf(x) === i)) {
      table.append(h("tr", {}, ...[kk, tokensPerCall(a, kk).toFixed(2), (1 + kk * cc).toFixed(2), speedup(a, kk, cc).toFixed(2) + "x"]
        .map((x) => h("td", {}, String(x)))));
    }
  }
  for (const e of Object.values(c)) { e.addEventListener("input", draw); e.addEventListener("change", draw); }
  const set = (p) => { c.alpha.value = p.alpha; c.c.value = p.c; if (p.k) c.k.value = p.k; draw(); };
  const label = (t, e, s) => h("label", { style: "display:block" }, h("span", { style: "display:inline-block;width:11em" }, t), e, " ", s);
  root.append(
    label("alpha (acceptance)", c.alpha, shown.alpha), label("k (draft length)", c.k, shown.k),
    label("c (draft step / target step)", c.c, shown.c),
    h("div", {}, h("button", { "data-action": "k-up", onclick: () => { c.k.value = Math.min(kMax, Math.round(+c.k.value) + 1); draw(); } }, "k + 1"),
      h("button", { "data-action": "k-down", onclick: () => { c.k.value = Math.max(1, Math.round(+c.k.value) - 1); draw(); } }, "k \\u2212 1"),
      h("button", { "data-action": "best-k", onclick: () => { c.k.value = bestK(+c.alpha.value, +c.c.value, kMax); draw(); } }, "best k"),
      ...presets.map((p, i) => h("button", { "data-action": `preset-${i}`, title: p.note || "", onclick: () => set(p) }, p.name))),
    status, note, svg, table);
  draw();
  el.append(root);
}
export default { render };
"""


def _check(alpha, k, c) -> tuple[float, int, float]:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1 or math.isnan(alpha):
        raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
    if isinstance(k, bool) or int(k) != k or not 1 <= k <= K_MAX:
        raise ValueError(f"k must be an integer from 1 to {K_MAX}, got {k!r}")
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 <= c <= 1 or math.isnan(c):
        raise ValueError(f"c must be a number in [0, 1] (a draft step's cost in target steps), got {c!r}")
    return float(alpha), int(k), float(c)


def speculation_cost(alpha: float, k: int, c: float) -> dict:
    """The cost model at one setting: tokens per target call, a round's cost in target steps, the speedup."""
    alpha, k, c = _check(alpha, k, c)
    return {"alpha": alpha, "k": k, "c": c, "tokens_per_call": expected_tokens_per_call(alpha, k),
            "round_cost": 1 + k * c, "speedup": speedup_model(alpha, k, c)}


def best_k(alpha: float, c: float, k_max: int = K_MAX) -> int:
    """The draft length in 1..k_max with the largest modelled speedup (the smallest such k on a tie)."""
    _check(alpha, 1, c)
    if isinstance(k_max, bool) or int(k_max) != k_max or not 1 <= k_max <= K_MAX:
        raise ValueError(f"k_max must be an integer from 1 to {K_MAX}, got {k_max!r}")
    best = 1
    for k in range(2, int(k_max) + 1):
        if speedup_model(alpha, k, c) > speedup_model(alpha, best, c):
            best = k
    return best


def speculation_explorable(alpha: float = 0.7, k: int = 4, c: float = 0.1, presets=()):
    """Chapter 9's cost model (alpha, k, c -> tokens per call and speedup) as an offline widget; without
    anywidget, the same numbers printed. ``presets``: ``{"name", "alpha", "c"}`` (optional ``"k"``,
    ``"note"``) settings offered as buttons, e.g. what the chapter measured."""
    now = speculation_cost(alpha, k, c)
    presets = [dict(p) for p in presets]
    for p in presets:
        if not {"name", "alpha", "c"} <= set(p) or not set(p) <= {"name", "alpha", "c", "k", "note"}:
            raise ValueError(f"a preset has name, alpha, c and optionally k and note, got {sorted(p)}")
        _check(p["alpha"], p.get("k", 1), p["c"])
        p["alpha"], p["c"] = float(p["alpha"]), float(p["c"])
    cls = widget_class("SpeculationExplorable", _SPEC_JS, {
        "alpha": "float", "k": "int", "c": "float", "k_max": "int", "presets": "list"})
    if cls is None:
        print("(anywidget is not installed: the cost model as text)")
        for a, cc, name in [(now["alpha"], now["c"], "this setting")] + [(p["alpha"], p["c"], p["name"]) for p in presets]:
            kb = best_k(a, cc)
            print(f"{name}: alpha {a:.2f}, c {cc:.2f}: " + ", ".join(
                f"k={kk} {speculation_cost(a, kk, cc)['speedup']:.2f}x" for kk in (1, 2, 4, 8))
                + f"; best k = {kb} ({speculation_cost(a, kb, cc)['speedup']:.2f}x)")
        return None
    return cls(alpha=now["alpha"], k=now["k"], c=now["c"], k_max=K_MAX, presets=presets)
