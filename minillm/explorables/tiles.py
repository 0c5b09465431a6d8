"""Chapter 6's tile schedule as an offline explorable: the reader picks the sequence length, the query and key
tile sizes and the causal mask, and steps through which GPU program handles which (query tile, key tile) pair,
which pairs need a mask and which are never loaded.

The Python side is the reference: :func:`tile_schedule` reads the plan from ``minillm.attention.tile_plan``
(the forward kernel's loop bounds, tested against the causal mask) and orders it as the kernel launches it
(one program per query tile; a causal grid starts its last, longest query tile first, as
``minillm.kernels.common.causal_order`` does for one head). The JavaScript (``_TILES_JS``) recomputes the same
plan and order in the page for whatever the reader picks; tests/test_explorables.py runs it in Node against
:func:`tile_schedule`. Without anywidget, :func:`tile_schedule_explorable` prints the grid as text.
"""
from __future__ import annotations

import numpy as np

from minillm.attention import TILE_FULL, TILE_MASKED, TILE_SKIPPED, tile_plan
from minillm.explorables._base import COMMON_JS, widget_class

#: the largest grid the widget draws per side (the reader is told to pick larger tiles beyond it)
MAX_TILES_PER_SIDE = 64
KIND_NAMES = {TILE_FULL: "full", TILE_MASKED: "masked", TILE_SKIPPED: "skipped"}
TEXT_MARKS = {TILE_FULL: "#", TILE_MASKED: "m", TILE_SKIPPED: "."}


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def tile_schedule(n: int, block_m: int, block_n: int, causal: bool, n_keys: int | None = None) -> dict:
    """The forward kernel's schedule for one head of ``n`` queries and ``n_keys`` keys (default ``n``).

    Returns ``{"plan": rows x cols list of "full"/"masked"/"skipped", "order": [query tile of each program in
    launch order], "steps": [[program, query tile, key tile, kind], ...] in the order the programs' loops visit
    them, "counts": {"full", "masked", "skipped", "total"}}``. A program walks its key tiles left to right:
    first the unmasked ones, then the masked ones (the diagonal, the ragged last tile); skipped tiles are never
    visited. A causal grid launches its last query tile first (it has the most keys)."""
    n = _positive_int("n", n)
    n_keys = n if n_keys is None else _positive_int("n_keys", n_keys)
    block_m, block_n = _positive_int("block_m", block_m), _positive_int("block_n", block_n)
    if not isinstance(causal, (bool, np.bool_)):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    plan = tile_plan(n, n_keys, block_m, block_n, bool(causal))
    rows, cols = plan.shape
    if max(rows, cols) > MAX_TILES_PER_SIDE:
        raise ValueError(f"{rows} x {cols} tiles: at most {MAX_TILES_PER_SIDE} per side; pick larger tiles")
    order = list(range(rows - 1, -1, -1)) if causal else list(range(rows))
    steps = [[p, int(i), j, KIND_NAMES[int(plan[i, j])]] for p, i in enumerate(order)
             for j in range(cols) if plan[i, j] != TILE_SKIPPED]
    counts = {KIND_NAMES[k]: int((plan == k).sum()) for k in (TILE_FULL, TILE_MASKED, TILE_SKIPPED)}
    counts["total"] = int(plan.size)
    return {"plan": [[KIND_NAMES[int(v)] for v in row] for row in plan], "order": order, "steps": steps,
            "counts": counts}


def schedule_text(n: int, block_m: int, block_n: int, causal: bool) -> str:
    """The schedule as text: one line per query tile (# computed, m computed with a mask, . skipped)."""
    s = tile_schedule(n, block_m, block_n, causal)
    c = s["counts"]
    lines = [f"N = {n}, query tiles of {block_m}, key tiles of {block_n}, {'causal' if causal else 'no mask'}: "
             f"{c['full'] + c['masked']} of {c['total']} tiles run ({c['masked']} with a mask), {c['skipped']} skipped"]
    marks = {v: TEXT_MARKS[k] for k, v in KIND_NAMES.items()}
    for p, i in enumerate(s["order"]):
        lines.append(f"program {p:2d}, query tile {i:2d}: " + "".join(marks[k] for k in s["plan"][i]))
    return "\n".join(lines)


_TILES_JS = COMMON_JS + """
// Chapter 6's tile schedule (minillm.attention.tile_plan and the kernel's launch order), recomputed in the page.
export const MAX_SIDE = __MAX_SIDE__;
export function plan(nq, nk, bm, bn, causal) {
  const rows = Math.ceil(nq / bm), cols = Math.ceil(nk / bn), offset = nk - nq, out = [];
  for (let i = 0; i < rows; i++) {
    let full = Math.floor(nk / bn) * bn, hi = nk;
    if (causal) {
      hi = Math.min(nk, (i + 1) * bm + offset);
      full = Math.min(full, Math.floor(Math.max(i * bm + offset + 1, 0) / bn) * bn);
    }
    const row = [];
    for (let j = 0; j < cols; j++) row.push(j * bn < full ? "full" : j * bn < hi ? "masked" : "skipped");
    out.push(row);
  }
  return out;
}
export function schedule(nq, nk, bm, bn, causal) {
  const p = plan(nq, nk, bm, bn, causal), rows = p.length;
  const order = [...Array(rows).keys()];
  if (causal) order.reverse();  // the longest query tile starts first
  const steps = [];
  order.forEach((i, prog) => p[i].forEach((kind, j) => { if (kind !== "skipped") steps.push([prog, i, j, kind]); }));
  const count = (k) => p.reduce((s, row) => s + row.filter((v) => v === k).length, 0);
  return { plan: p, order, steps, counts: { full: count("full"), masked: count("masked"),
    skipped: count("skipped"), total: rows * (p[0] || []).length } };
}

const COLORS = { full: "#1f77b4", masked: "#ff7f0e", skipped: "#ffffff" };

function render({ model, el }) {
  const root = h("div", { class: "minillm-explorable", "data-explorable": "tile-schedule" });
  const sel = (opts, value, attrs = {}) => {
    const s = h("select", attrs);
    for (const o of opts) s.append(h("option", { value: o }, String(o)));
    s.value = String(value);
    return s;
  };
  const nSel = sel(model.get("lengths"), model.get("n"), { "data-control": "n" });
  const bmSel = sel(model.get("tiles"), model.get("block_m"), { "data-control": "block_m" });
  const bnSel = sel(model.get("tiles"), model.get("block_n"), { "data-control": "block_n" });
  const causalBox = h("input", { type: "checkbox", "data-control": "causal" });
  causalBox.checked = !!model.get("causal");
  const svgNS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(svgNS, "svg");
  svg.setAttribute("style", "width:100%;max-width:420px;height:auto;display:block;margin-top:4px");
  const status = h("div", { class: "status" }), note = h("div", { class: "note" });
  let s = null, done = 0;

  function draw() {
    svg.replaceChildren();
    if (!s) return;
    const rows = s.plan.length, cols = s.plan[0].length, cell = Math.max(4, Math.floor(400 / Math.max(rows, cols)));
    svg.setAttribute("viewBox", `0 0 ${cols * cell + 2} ${rows * cell + 2}`);
    const cur = done > 0 ? s.steps[done - 1] : null;
    const visited = new Set(s.steps.slice(0, done).map(([, i, j]) => `${i},${j}`));
    s.plan.forEach((row, i) => row.forEach((kind, j) => {
      const r = document.createElementNS(svgNS, "rect");
      r.setAttribute("x", 1 + j * cell); r.setAttribute("y", 1 + i * cell);
      r.setAttribute("width", cell); r.setAttribute("height", cell);
      r.setAttribute("fill", COLORS[kind]);
      r.setAttribute("fill-opacity", kind === "skipped" || visited.has(`${i},${j}`) ? 1 : 0.25);
      r.setAttribute("stroke", "#999"); r.setAttribute("stroke-width", 0.5);
      svg.append(r);
    }));
    if (cur) {  // the current program's row, and its current tile
      const [, i, j] = cur;
      const band = document.createElementNS(svgNS, "rect");
      band.setAttribute("x", 1); band.setAttribute("y", 1 + i * cell); band.setAttribute("width", cols * cell);
      band.setAttribute("height", cell); band.setAttribute("fill", "none"); band.setAttribute("stroke", "#000");
      band.setAttribute("stroke-width", 1.5); svg.append(band);
      const t = document.createElementNS(svgNS, "rect");
      t.setAttribute("x", 1 + j * cell); t.setAttribute("y", 1 + i * cell); t.setAttribute("width", cell);
      t.setAttribute("height", cell); t.setAttribute("fill", "none"); t.setAttribute("stroke", "#d62728");
      t.setAttribute("stroke-width", 3); svg.append(t);
    }
    const c = s.counts, nq = Number(nSel.value), bm = Number(bmSel.value), bn = Number(bnSel.value);
    if (!cur) status.textContent = `${s.order.length} programs, one per query tile; none has started. ` +
      `Press "next tile" to follow them.`;
    else {
      const [prog, i, j, kind] = cur;
      status.textContent = `Program ${prog} (query rows ${i * bm}-${Math.min(nq, (i + 1) * bm) - 1}) on key tile ${j} ` +
        `(keys ${j * bn}-${Math.min(nq, (j + 1) * bn) - 1}): ` + (kind === "full" ? "computed, no mask." : "computed with a mask.") +
        (done === s.steps.length ? ` All ${s.steps.length} tiles done.` : ` Step ${done} of ${s.steps.length}.`);
    }
    note.textContent = `Rows: query tiles (one program each); columns: key tiles. ${c.full + c.masked} of ${c.total} tiles run (${c.masked} of them with a mask); ` +
      `${c.skipped} skipped (never loaded). Launch order of the query tiles: ${s.order.length > 10 ? s.order.slice(0, 8).join(", ") + ", ..., " + s.order[s.order.length - 1] : s.order.join(", ")}. ` +
      "Blue: no mask; orange: masked; white: skipped; faded: not reached yet.";
  }
  function rebuild() {
    const nq = Number(nSel.value), bm = Number(bmSel.value), bn = Number(bnSel.value);
    if (Math.max(Math.ceil(nq / bm), Math.ceil(nq / bn)) > MAX_SIDE) {
      s = null; done = 0; draw();
      status.textContent = `More than ${MAX_SIDE} tiles per side: pick larger tiles.`; note.textContent = "";
      return;
    }
    s = schedule(nq, nq, bm, bn, causalBox.checked); done = 0; draw();
  }
  const go = (k) => { if (s) { done = Math.max(0, Math.min(s.steps.length, k)); draw(); } };
  const nextProgram = () => {
    if (!s || done >= s.steps.length) return;
    let k = done;  // the next step's program, to its last tile
    while (k < s.steps.length - 1 && s.steps[k + 1][0] === s.steps[k][0]) k++;
    go(k + 1);
  };
  for (const c of [nSel, bmSel, bnSel, causalBox]) c.addEventListener("change", rebuild);
  root.append(
    h("div", {}, "N ", nSel, "query tile ", bmSel, "key tile ", bnSel, h("label", {}, causalBox, " causal")),
    h("div", {}, h("button", { onclick: () => go(done - 1), "data-action": "back" }, "\\u25c0 back"),
      h("button", { onclick: () => go(done + 1), "data-action": "next" }, "next tile \\u25b6"),
      h("button", { onclick: nextProgram, "data-action": "next-program" }, "whole program \\u25b6\\u25b6"),
      h("button", { onclick: () => go(0), "data-action": "reset" }, "reset")),
    svg, status, note);
  rebuild();
  el.append(root);
}
export default { render };
""".replace("__MAX_SIDE__", str(MAX_TILES_PER_SIDE))

LENGTHS = (100, 256, 300, 512, 1000, 1024, 2048, 4096)
TILES = (16, 32, 64, 128, 256)


def tile_schedule_explorable(n: int = 1000, block_m: int = 128, block_n: int = 128, causal: bool = True):
    """Chapter 6's tile schedule as an offline widget (or, without anywidget, printed as text)."""
    tile_schedule(n, block_m, block_n, causal)  # validates the starting point
    cls = widget_class("TileScheduleExplorable", _TILES_JS, {
        "n": "int", "block_m": "int", "block_n": "int", "causal": "int", "lengths": "list", "tiles": "list"})
    if cls is None:
        print("(anywidget is not installed: the schedule as text)")
        print(schedule_text(n, block_m, block_n, causal))
        return None
    return cls(n=int(n), block_m=int(block_m), block_n=int(block_n), causal=int(bool(causal)),
               lengths=sorted(set(LENGTHS) | {int(n)}), tiles=sorted(set(TILES) | {int(block_m), int(block_n)}))
