"""Chapter 10's latency-throughput frontier as an offline explorable.

The step-cost model of chapters 8 to 10 (:class:`minillm.serving.StepCost`): a decode step over ``batch``
sequences, each with ``context`` cached tokens, reads every weight once and each sequence's K/V once, and does
2 FLOPs per weight per new token plus the attention FLOPs; it takes the longer of the memory time and the
compute time. Every request gets one token per step, so

    time per output token (what one request waits) = step time,
    aggregate throughput (what the server delivers) = batch / step time.

While the step is memory-bound, a larger batch shares the same weight reads and throughput grows almost for
free; past the ridge the step grows with the batch and each request waits longer. :func:`frontier_points`
is the Python side (``StepCost.seconds_for``); the widget's JavaScript recomputes it in the page for a model,
a GPU, a context length and a batch size chosen by the reader (``tests/test_explorables.py`` runs it in Node
against this). A recorded sweep (:class:`minillm.studies.composition.BatchSweep`) can be drawn beside it.
"""
from __future__ import annotations

import numpy as np

from minillm.explorables._base import COMMON_JS, widget_class
from minillm.hardware import GPUS
from minillm.sizing import MODELS

BATCHES = [2 ** i for i in range(11)]  # 1 .. 1024, the slider's stops
_FIELDS = ("weight_bytes", "kv_bytes_per_token", "flops_per_token", "attn_flops_per_context_token", "bandwidth",
           "flops", "overhead")

_FRONTIER_JS = COMMON_JS + """
// The step-cost model of minillm.serving.StepCost, recomputed in the page (decode steps: one new token per sequence).
export function stepSeconds(m, batch, context) {
  const mem = m.weight_bytes + m.kv_bytes_per_token * batch * (context + 1);
  const comp = m.flops_per_token * batch + m.attn_flops_per_context_token * batch * (context + 1);
  return { s: Math.max(mem / m.bandwidth, comp / m.flops) + m.overhead, bound: comp / m.flops > mem / m.bandwidth ? "compute" : "memory" };
}
export function point(m, batch, context) {
  const { s, bound } = stepSeconds(m, batch, context);
  return { batch, step_s: s, tok_per_s: batch / s, per_request_tok_per_s: 1 / s, bound };
}
export function ridgeBatch(m, context, maxBatch) {   // the first batch whose step is compute-bound, or null
  for (let b = 1; b <= maxBatch; b++) if (stepSeconds(m, b, context).bound === "compute") return b;
  return null;
}

function render({ model, el }) {
  const configs = model.get("configs"), batches = model.get("batches"), saved = model.get("measured");
  const measured = saved && saved.batch ? saved : null;
  const sel = (opts, value) => { const s = h("select"); for (const o of opts) s.append(h("option", { value: o }, o)); s.value = value; return s; };
  const c = { model: sel(Object.keys(configs), model.get("model")),
              gpu: sel(Object.keys(configs[model.get("model")]), model.get("gpu")),
              context: h("input", { type: "number", value: model.get("context"), min: 0, max: 1000000, step: 256, style: "width:7em" }),
              batch: h("input", { type: "range", min: 0, max: batches.length - 1, step: 1, value: Math.max(0, batches.indexOf(model.get("batch"))), style: "width:14em;vertical-align:middle" }) };
  const root = h("div", { class: "minillm-explorable", "data-explorable": "frontier" });
  const status = h("div", { class: "status" }), note = h("div", { class: "note" }), table = h("table");
  const svgNS = "http://www.w3.org/2000/svg", W = 560, H = 240, pad = 40;
  const svg = document.createElementNS(svgNS, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("style", "width:100%;max-width:560px;height:auto;display:block");
  const node = (tag, attrs, text) => { const e = document.createElementNS(svgNS, tag); for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v); if (text !== undefined) e.textContent = text; return e; };
  function draw() {
    const cfg = configs[c.model.value][c.gpu.value], ctx = Math.max(0, Math.round(+c.context.value || 0));
    const b = batches[Math.round(+c.batch.value)], pts = batches.map((x) => point(cfg, x, ctx)), p = point(cfg, b, ctx);
    const ridge = ridgeBatch(cfg, ctx, batches[batches.length - 1]);
    status.textContent = `${c.model.value} on ${c.gpu.value}, ${ctx.toLocaleString()} cached tokens per request, ${b} request(s) at once: ` +
      `a step takes ${(1e3 * p.step_s).toFixed(2)} ms (${p.bound}-bound), so each request waits ${(1e3 * p.step_s).toFixed(2)} ms per token ` +
      `(${p.per_request_tok_per_s.toFixed(0)} tokens/s) and the server delivers ${Math.round(p.tok_per_s).toLocaleString()} tokens/s.`;
    note.textContent = (ridge ? `From ${ridge} requests at once the step is compute-bound: past that, more requests add little throughput and every request waits longer.`
      : `Up to ${batches[batches.length - 1]} requests the step stays memory-bound: each added request costs only its own K/V reads.`) +
      ` (Model: every weight and each request's K/V read once per step, 2 FLOPs per weight per token; no launch overhead or memory limit.)`;
    // the frontier: aggregate tokens/s (log x) against time per output token (y), this batch in orange
    const xs = pts.map((q) => q.tok_per_s).concat(measured ? measured.tok_per_s : []);
    const ys = pts.map((q) => 1e3 * q.step_s).concat(measured ? measured.per_request_tok_per_s.map((v) => 1e3 / v) : []);
    const lx0 = Math.log10(Math.min(...xs)) - 0.1, lx1 = Math.log10(Math.max(...xs)) + 0.1, y1 = Math.max(...ys) * 1.1;
    const X = (v) => pad + (W - 2 * pad) * (Math.log10(v) - lx0) / (lx1 - lx0), Y = (v) => H - pad - (H - 2 * pad) * v / y1;
    svg.replaceChildren();
    svg.append(node("polyline", { points: pts.map((q) => `${X(q.tok_per_s)},${Y(1e3 * q.step_s)}`).join(" "), fill: "none", stroke: "#1f77b4" }));
    pts.forEach((q) => { svg.append(node("circle", { cx: X(q.tok_per_s), cy: Y(1e3 * q.step_s), r: q.batch === b ? 6 : 3, fill: q.batch === b ? "#ff7f0e" : "#1f77b4" }));
      svg.append(node("text", { x: X(q.tok_per_s) - 4, y: Y(1e3 * q.step_s) - 6, "font-size": 9, "text-anchor": "end" }, String(q.batch))); });
    if (measured) {
      measured.batch.forEach((mb, i) => svg.append(node("rect", { x: X(measured.tok_per_s[i]) - 3, y: Y(1e3 / measured.per_request_tok_per_s[i]) - 3, width: 6, height: 6, fill: "#d62728" })));
    }
    svg.append(node("line", { x1: pad, x2: W - pad, y1: H - pad, y2: H - pad, stroke: "#000" }));
    svg.append(node("line", { x1: pad, x2: pad, y1: pad / 2, y2: H - pad, stroke: "#000" }));
    svg.append(node("text", { x: W / 2, y: H - 8, "font-size": 10, "text-anchor": "middle" }, "aggregate tokens/s (log scale)"));
    svg.append(node("text", { x: 4, y: pad / 2 - 4, "font-size": 10 }, `ms per output token (0 to ${y1.toFixed(1)})`));
    table.replaceChildren(h("tr", {}, ...["requests at once", "step (ms)", "tokens/s per request", "aggregate tokens/s", "bound"].map((t) => h("th", {}, t))));
    for (const q of pts) table.append(h("tr", { style: q.batch === b ? "background:#ffe8cc" : "" },
      ...[q.batch, (1e3 * q.step_s).toFixed(2), q.per_request_tok_per_s.toFixed(0), Math.round(q.tok_per_s).toLocaleString(), q.bound].map((t) => h("td", {}, String(t)))));
    legend.textContent = "blue: the step-cost model; orange: the batch chosen" + (measured ? `; red squares: ${measured.label}` : "");
  }
  const legend = h("div", { class: "note" });
  c.model.addEventListener("change", () => { const g = c.gpu.value; c.gpu.replaceChildren(...Object.keys(configs[c.model.value]).map((o) => h("option", { value: o }, o))); c.gpu.value = configs[c.model.value][g] ? g : Object.keys(configs[c.model.value])[0]; draw(); });
  for (const e of [c.gpu, c.context, c.batch]) { e.addEventListener("input", draw); e.addEventListener("change", draw); }
  const step = (d) => { c.batch.value = Math.max(0, Math.min(batches.length - 1, Math.round(+c.batch.value) + d)); draw(); };
  const label = (t, e) => h("label", {}, t, " ", e, " ");
  root.append(h("div", {}, label("model", c.model), label("GPU", c.gpu), label("cached tokens", c.context)),
    h("div", {}, label("requests at once", c.batch), h("button", { "data-action": "halve-batch", onclick: () => step(-1) }, "\\u00f72"),
      h("button", { "data-action": "double-batch", onclick: () => step(1) }, "\\u00d72")),
    status, svg, legend, note, table);
  draw();
  el.append(root);
}
export default { render };
"""


def step_cost_fields(cost) -> dict:
    """The numbers of a :class:`~minillm.serving.StepCost` the page's JavaScript reads."""
    return {f: float(getattr(cost, f)) for f in _FIELDS}


def frontier_configs() -> dict[str, dict[str, dict]]:
    """Step costs for every published GQA/MHA model of ``minillm.sizing.MODELS`` on every GPU of
    ``minillm.hardware.GPUS`` with bf16 tensor cores (``minillm.diagrams``' step cost: bf16 weights and cache)."""
    from minillm.diagrams.serving import step_cost

    gpus = [name for name, g in GPUS.items() if g.bf16_flops]
    return {m: {g: step_cost_fields(step_cost(m, g)) for g in gpus}
            for m, spec in MODELS.items() if spec.attention != "MLA"}


def frontier_points(cost, context: int, batches=BATCHES) -> list[dict]:
    """Per batch size: the decode step's seconds (``cost.seconds_for``: one new token per sequence, each with
    ``context`` cached tokens), tokens/s per request (1 / step) and in aggregate (batch / step), and which
    roofline side binds. The page's JavaScript computes the same."""
    if isinstance(context, bool) or int(context) != context or context < 0:
        raise ValueError(f"context must be an integer >= 0, got {context!r}")
    batches = list(batches)
    if not batches or any(isinstance(b, bool) or int(b) != b or b < 1 for b in batches):
        raise ValueError(f"batches must be integers >= 1, got {batches!r}")
    out = []
    for b in batches:
        b = int(b)
        s = cost.seconds_for(np.ones(b), np.full(b, context + 1))
        mem = (cost.weight_bytes + cost.kv_bytes_per_token * b * (context + 1)) / cost.bandwidth
        comp = (cost.flops_per_token * b + cost.attn_flops_per_context_token * b * (context + 1)) / cost.flops
        out.append({"batch": b, "step_s": s, "tok_per_s": b / s, "per_request_tok_per_s": 1 / s,
                    "bound": "compute" if comp > mem else "memory"})
    return out


def frontier_explorable(model: str = "Llama 3.1 8B", gpu: str = "H200", context: int = 2048, batch: int = 32,
                        measured=None, measured_label: str = "measured"):
    """Chapter 10's frontier (requests at once -> time per token and aggregate tokens/s) as an offline widget;
    without anywidget, the model's table printed. ``measured``: a ``BatchSweep`` drawn beside the model."""
    configs = frontier_configs()
    if model not in configs:
        raise ValueError(f"unknown model {model!r}: one of {sorted(configs)}")
    if gpu not in configs[model]:
        raise ValueError(f"unknown GPU {gpu!r}: one of {sorted(configs[model])}")
    if batch not in BATCHES:
        raise ValueError(f"batch must be one of {BATCHES}, got {batch!r}")
    from minillm.diagrams.serving import step_cost

    pts = frontier_points(step_cost(model, gpu), context)
    sweep = None
    if measured is not None:
        sweep = {"label": str(measured_label), "batch": [int(b) for b in measured.batch],
                 "tok_per_s": [float(v) for v in measured.tok_per_s],
                 "per_request_tok_per_s": [float(v) for v in measured.per_request_tok_per_s]}
    cls = widget_class("FrontierExplorable", _FRONTIER_JS, {
        "configs": "dict", "batches": "list", "model": "str", "gpu": "str", "context": "int", "batch": "int",
        "measured": "dict"})
    if cls is None:
        print(f"(anywidget is not installed: the model's frontier as text, {model} on {gpu}, {context:,} cached tokens)")
        for p in pts:
            print(f"{p['batch']:5d} at once: step {1e3 * p['step_s']:7.2f} ms ({p['bound']}-bound), "
                  f"{p['per_request_tok_per_s']:7.0f} tok/s per request, {p['tok_per_s']:9,.0f} tok/s in aggregate")
        if sweep:
            print(f"{measured_label}: " + ", ".join(f"{b}: {a:,.0f} / {r:,.0f} tok/s" for b, a, r in
                                                     zip(sweep["batch"], sweep["tok_per_s"], sweep["per_request_tok_per_s"])))
        return None
    return cls(configs=configs, batches=list(BATCHES), model=model, gpu=gpu, context=int(context), batch=int(batch),
               measured=sweep or {})
