"""Offline explorables for the book's website: small anywidget widgets whose JavaScript computes from
arrays saved in the notebook, so they run in the reader's browser with no kernel and no network.

* ``online_softmax_explorable`` (chapter 5): step through online softmax one tile at a time: the running
  max m, the rescale factor exp(m_old - m_new) and the running sum l.
* ``paged_allocator_explorable`` (chapter 7): a block pool with reference counts, block tables,
  fork and copy-on-write; replays a scripted scenario and takes new operations from buttons.
* ``sizing_explorable`` (chapter 3): KV-cache bytes per token and per sequence for a model's published
  attention (MHA/GQA/MQA/MLA) against full MHA, and how many sequences fit on a set of GPUs.

and one module per later chapter's explorable: :mod:`.tiles` (chapter 6, FlashAttention's tile schedule),
:mod:`.speculation` (chapter 9, the draft-verify cost model) and :mod:`.frontier` (chapter 10, the
latency-throughput frontier); :mod:`._base` holds what they all share.

The data (scores, the scenario, the model table) are computed here in Python and saved with the widget;
the JavaScript (``_esm``) recomputes everything else in the page. anywidget is imported lazily:
``import minillm`` needs NumPy only, and where anywidget is missing (a bare Colab) each function prints a
plain-text version of the same content instead and returns None.
"""
from __future__ import annotations

import math

import numpy as np

from minillm.paged.cache import PagedKVCache
from minillm.hardware import GPUS
from minillm.sizing import DTYPE_BYTES, GIB, MODELS, capacity

from minillm.explorables._base import COMMON_JS, widget_class  # noqa: F401  (shared by every explorable)

_SOFTMAX_JS = COMMON_JS + """
// The online softmax of chapter 5, recomputed here from the saved scores, one tile per click.
export function steps(x, tile) {
  const out = [];
  let m = -Infinity, l = 0;
  for (let start = 0; start < x.length; start += tile) {
    const block = x.slice(start, start + tile);
    const mNew = Math.max(m, ...block);
    const rescale = Number.isFinite(m) ? Math.exp(m - mNew) : 0;
    l = l * rescale + block.reduce((s, v) => s + Math.exp(v - mNew), 0);
    out.push({ tile: out.length, block, mOld: m, m: mNew, rescale, l });
    m = mNew;
  }
  return out;
}

function render({ model, el }) {
  const x = model.get("scores"), tile = model.get("tile");
  const all = steps(x, tile);
  let done = 0;  // tiles processed so far
  const root = h("div", { class: "minillm-explorable", "data-explorable": "online-softmax" });
  const status = h("div", { class: "status" });
  const svgNS = "http://www.w3.org/2000/svg";
  const W = 560, H = 150, pad = 24;
  const svg = document.createElementNS(svgNS, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("style", "width:100%;max-width:560px;height:auto;display:block");
  const table = h("table");
  const lo = Math.min(0, ...x), hi = Math.max(0, ...x);
  const y = (v) => pad + (H - 2 * pad) * (hi - v) / (hi - lo || 1);
  const bw = (W - 2 * pad) / x.length;

  function draw() {
    svg.replaceChildren();
    const seen = done * tile;
    x.forEach((v, i) => {
      const r = document.createElementNS(svgNS, "rect");
      const fresh = i >= seen - tile && i < seen;
      r.setAttribute("x", pad + i * bw + 1); r.setAttribute("width", bw - 2);
      r.setAttribute("y", Math.min(y(v), y(0))); r.setAttribute("height", Math.abs(y(v) - y(0)));
      r.setAttribute("fill", i >= seen ? "#ccc" : fresh ? "#ff7f0e" : "#1f77b4");
      svg.append(r);
    });
    if (done > 0) {
      const m = all[done - 1].m, line = document.createElementNS(svgNS, "line");
      line.setAttribute("x1", pad); line.setAttribute("x2", W - pad);
      line.setAttribute("y1", y(m)); line.setAttribute("y2", y(m));
      line.setAttribute("stroke", "#000"); line.setAttribute("stroke-dasharray", "4 3");
      svg.append(line);
    }
    table.replaceChildren(h("tr", {}, ...["tile", "scores", "m_old", "m_new", "exp(m_old - m_new)", "l"]
      .map((t) => h("th", {}, t))));
    for (const s of all.slice(0, done)) {
      table.append(h("tr", {}, ...[s.tile, s.block.map((v) => v.toFixed(1)).join(", "), fmt(s.mOld, 2),
        fmt(s.m, 2), fmt(s.rescale, 3), fmt(s.l)].map((t) => h("td", {}, String(t)))));
    }
    if (done === 0) status.textContent = `No tile seen yet: m = -inf, l = 0. ${all.length} tiles of ${tile} scores.`;
    else if (done < all.length) status.textContent = `After tile ${done - 1}: running max m = ${fmt(all[done - 1].m, 2)}, running sum l = ${fmt(all[done - 1].l)} (orange: the new tile; dashed: m).`;
    else {
      const m = Math.max(...x), l2 = x.reduce((s, v) => s + Math.exp(v - m), 0);
      status.textContent = `All ${all.length} tiles: m = ${fmt(all[done - 1].m, 2)}, l = ${fmt(all[done - 1].l)}; ` +
        `two passes give m = ${fmt(m, 2)}, l = ${fmt(l2)} (difference ${Math.abs(l2 - all[done - 1].l).toExponential(1)}).`;
    }
  }
  const go = (n) => { done = Math.max(0, Math.min(all.length, n)); draw(); };
  root.append(
    h("div", {}, h("button", { onclick: () => go(done - 1), "data-action": "back" }, "\u25c0 back"),
      h("button", { onclick: () => go(done + 1), "data-action": "next" }, "next tile \u25b6"),
      h("button", { onclick: () => go(0), "data-action": "reset" }, "reset")),
    svg, status, table);
  draw();
  el.append(root);
}
export default { render };
"""

_ALLOCATOR_JS = COMMON_JS + """
// The block pool of chapter 7 (minillm.paged: BlockAllocator + PagedKVCache's append/fork/release),
// recomputed in the page. Free list: a queue, blocks 0, 1, 2, ... first, then in the order freed.
export function makePool(numBlocks, blockSize) {
  const pool = { free: [...Array(numBlocks).keys()], refs: Array(numBlocks).fill(0), seqs: {}, blockSize, log: [] };
  const alloc = () => { const b = pool.free.shift(); pool.refs[b] = 1; return b; };
  const decref = (b) => { pool.refs[b] -= 1; if (pool.refs[b] === 0) pool.free.push(b); };
  pool.apply = ([op, a, b]) => {
    const s = pool.seqs[a];
    if (op === "add") { if (s) throw new Error(`sequence ${a} exists`); pool.seqs[a] = { len: 0, table: [] }; return `add ${a}`; }
    if (!s) throw new Error(`no sequence ${a}`);
    if (op === "append") {
      const fill = s.len % blockSize, cow = fill > 0 && pool.refs[s.table[s.table.length - 1]] > 1;
      const need = Math.ceil((s.len + b) / blockSize) - s.table.length + (cow ? 1 : 0);
      if (need > pool.free.length) throw new Error(`out of blocks: ${a} needs ${need}, ${pool.free.length} free`);
      let note = "";
      if (cow) { const old = s.table[s.table.length - 1], nb = alloc(); decref(old); s.table[s.table.length - 1] = nb; note = ` (copy-on-write: block ${old} copied to ${nb})`; }
      while (s.table.length < Math.ceil((s.len + b) / blockSize)) s.table.push(alloc());
      s.len += b;
      return `${a} +${b} token(s)${note}`;
    }
    if (op === "fork") { if (pool.seqs[b]) throw new Error(`sequence ${b} exists`); s.table.forEach((x) => { pool.refs[x] += 1; }); pool.seqs[b] = { len: s.len, table: [...s.table] }; return `fork ${a} -> ${b} (blocks shared)`; }
    if (op === "release") { [...s.table].reverse().forEach(decref); delete pool.seqs[a]; return `${a} finishes (blocks released)`; }
    throw new Error(`unknown op ${op}`);
  };
  return pool;
}

function render({ model, el }) {
  const N = model.get("num_blocks"), B = model.get("block_size"), script = model.get("script");
  const expected = model.get("expected");  // minillm.paged's block tables after the whole script
  let pool, done, last, extra;
  const names = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
  const root = h("div", { class: "minillm-explorable", "data-explorable": "paged-allocator" });
  const status = h("div", { class: "status" }), grid = h("div"), tables = h("table"), check = h("div", { class: "note" });
  const pick = h("select");
  function replay(n) {
    pool = makePool(N, B); done = 0; last = "empty pool"; extra = [];
    for (const op of script.slice(0, n)) { last = pool.apply(op); done += 1; }
  }
  function act(op) {
    try { last = pool.apply(op); extra.push(op); } catch (e) { last = e.message; }
    draw();
  }
  function draw() {
    status.textContent = `step ${done}/${script.length}${extra.length ? ` + ${extra.length} of yours` : ""}: ${last}`;
    const owners = {};
    for (const [name, s] of Object.entries(pool.seqs)) s.table.forEach((b) => (owners[b] = [...(owners[b] || []), name]));
    grid.replaceChildren(...pool.refs.map((r, b) => h("span", {
      style: `display:inline-block;width:3.6em;margin:1px;padding:2px 0;text-align:center;border:1px solid #888;` +
        `background:${r === 0 ? "#fff" : r > 1 ? "#bbb" : "#cfe0f3"}`,
      title: `block ${b}: refcount ${r}`,
    }, `${b}`, h("br"), r ? `${(owners[b] || []).join("+")} \u00d7${r}` : "free")));
    tables.replaceChildren(h("tr", {}, ...["sequence", "tokens", "block table", "empty slots"].map((t) => h("th", {}, t))));
    for (const [name, s] of Object.entries(pool.seqs)) {
      tables.append(h("tr", {}, ...[name, s.len, `[${s.table.join(", ")}]`, s.table.length * B - s.len].map((t) => h("td", {}, String(t)))));
    }
    const cur = pick.value;
    pick.replaceChildren(...Object.keys(pool.seqs).map((n) => h("option", { value: n }, n)));
    if (pool.seqs[cur]) pick.value = cur;
    if (done === script.length && extra.length === 0) {
      const same = JSON.stringify(Object.fromEntries(Object.entries(pool.seqs).map(([k, s]) => [k, s.table]))) === JSON.stringify(expected);
      check.className = same ? "note ok" : "note bad";
      check.textContent = same ? "End of the scenario: these block tables equal minillm.paged.PagedKVCache's for the same operations."
        : "End of the scenario: these block tables DIFFER from minillm.paged.PagedKVCache's.";
    } else check.textContent = `free list (next allocated first): [${pool.free.join(", ")}]`;
  }
  const newName = () => [...names].find((n) => !pool.seqs[n]);
  root.append(
    h("div", {}, h("button", { onclick: () => { replay(Math.max(0, done - 1)); draw(); }, "data-action": "back" }, "\u25c0 back"),
      h("button", { onclick: () => { if (done < script.length && !extra.length) { last = pool.apply(script[done]); done += 1; } draw(); }, "data-action": "next" }, "next step \u25b6"),
      h("button", { onclick: () => { replay(0); draw(); }, "data-action": "reset" }, "reset")),
    h("div", {}, "sequence", pick,
      h("button", { onclick: () => act(["append", pick.value, 1]), "data-action": "append" }, "+1 token"),
      h("button", { onclick: () => act(["append", pick.value, B]), "data-action": "append-block" }, `+${B} tokens`),
      h("button", { onclick: () => act(["fork", pick.value, newName()]), "data-action": "fork" }, "fork"),
      h("button", { onclick: () => act(["release", pick.value]), "data-action": "release" }, "finish"),
      h("button", { onclick: () => { const n = newName(); act(["add", n]); act(["append", n, 1]); }, "data-action": "add" }, "new sequence")),
    status, grid, tables, check,
    h("div", { class: "note" }, `${N} blocks of ${B} token slots. White: free; blue: one owner; gray: shared (refcount > 1). ` +
      "Writing into a shared, partly filled last block copies it first (copy-on-write)."));
  replay(0); draw();
  el.append(root);
}
export default { render };
"""

_SIZING_JS = COMMON_JS + """
// The KV-cache and capacity formulas of minillm.sizing (chapter 3), recomputed in the page.
export function kvBytes(m, tokens, bytes, batch) {
  const el = m.attention === "MLA" ? batch * tokens * m.n_layers * (m.kv_lora_rank + m.qk_rope_dim)
    : 2 * batch * tokens * m.n_layers * m.n_kv_heads * m.d_head;
  return Math.ceil(el * bytes);
}
export function mhaBytesPerToken(m, bytes) {
  const el = m.attention === "MLA" ? m.n_layers * m.n_heads * (2 * m.d_head + m.qk_rope_dim)
    : 2 * m.n_layers * m.n_heads * m.d_head;
  return Math.ceil(el * bytes);
}
export function capacity(m, gpuBytes, nGpus, context, wBytes, cBytes, reserve) {
  const total = gpuBytes * nGpus, weights = Math.round(m.n_params_b * 1e9 * wBytes);
  const res = Math.round(total * reserve), free = total - res - weights, per = kvBytes(m, context, cBytes, 1);
  return { total, weights, res, free, per, fit: Math.max(0, Math.floor(free / per)) };
}

function render({ model, el }) {
  const models = model.get("models"), gpus = model.get("gpus"), dtypes = model.get("dtypes");
  const GiB = 1024 ** 3, KiB = 1024, reserve = model.get("reserve");
  const sel = (opts, value) => { const s = h("select"); for (const o of opts) s.append(h("option", { value: o }, o)); s.value = value; return s; };
  const num = (value, min, max, step) => h("input", { type: "number", value, min, max, step, style: "width:7em" });
  const c = {
    model: sel(models.map((m) => m.name), model.get("model")), context: num(model.get("context"), 1, 10000000, 1000),
    batch: num(model.get("batch"), 1, 4096, 1), cache: sel(Object.keys(dtypes), "fp16"), weights: sel(Object.keys(dtypes), "bf16"),
    gpu: sel(Object.keys(gpus), model.get("gpu")), n: sel(["1", "2", "4", "8"], String(model.get("n_gpus"))),
  };
  const root = h("div", { class: "minillm-explorable", "data-explorable": "sizing" });
  const out = h("div", { class: "status" }), bar = h("div"), table = h("table");
  const label = (t, e) => h("label", {}, t, e);
  function draw() {
    const m = models.find((x) => x.name === c.model.value), T = Math.max(1, Math.round(+c.context.value || 1));
    const Bt = Math.max(1, Math.round(+c.batch.value || 1)), cb = dtypes[c.cache.value], wb = dtypes[c.weights.value];
    const perTok = kvBytes(m, 1, cb, 1), mha = mhaBytesPerToken(m, cb);
    const cap = capacity(m, gpus[c.gpu.value], +c.n.value, T, wb, cb, reserve);
    const need = kvBytes(m, T, cb, Bt);
    const geometry = m.attention === "MLA" ? `MLA: latent ${m.kv_lora_rank} + RoPE key ${m.qk_rope_dim} per layer, all ${m.n_heads} heads`
      : `${m.attention}: ${m.n_kv_heads} KV heads of ${m.d_head} for ${m.n_heads} query heads`;
    table.replaceChildren(
      h("tr", {}, ...["", "per token", `per ${T.toLocaleString()}-token sequence`, `batch of ${Bt}`].map((t) => h("th", {}, t))),
      h("tr", {}, ...[`${m.attention} (published)`, `${(perTok / KiB).toFixed(1)} KiB`, `${(perTok * T / GiB).toFixed(2)} GiB`, `${(need / GiB).toFixed(2)} GiB`].map((t) => h("td", {}, t))),
      h("tr", {}, ...["if full MHA", `${(mha / KiB).toFixed(1)} KiB`, `${(mha * T / GiB).toFixed(2)} GiB`, `${(mha * T * Bt / GiB).toFixed(2)} GiB`].map((t) => h("td", {}, t))));
    const fits = cap.free >= 0;
    out.textContent = `${m.name} (${geometry}, ${m.n_layers} layers): ${(mha / perTok).toFixed(1)}x smaller than MHA. ` +
      `On ${c.n.value}x ${c.gpu.value} (${(cap.total / GiB).toFixed(1)} GiB): weights ${(cap.weights / GiB).toFixed(1)} GiB (${c.weights.value}) + ` +
      `reserve ${(cap.res / GiB).toFixed(1)} GiB ` + (fits ? `leave ${(cap.free / GiB).toFixed(1)} GiB: ${cap.fit} sequence(s) of ${T.toLocaleString()} tokens fit; ` +
      `the batch of ${Bt} ${need <= cap.free ? "fits" : "does not fit"}.` : `do not fit (short by ${(-cap.free / GiB).toFixed(1)} GiB).`) +
      (T > m.max_context ? ` (Longer than the model's ${m.max_context.toLocaleString()}-token maximum.)` : "");
    const part = (bytes, color, title) => h("span", { title, style: `display:inline-block;height:14px;background:${color};width:${Math.max(0, Math.min(100, 100 * bytes / cap.total))}%` });
    bar.replaceChildren(h("div", { style: "width:100%;border:1px solid #888;line-height:0;white-space:nowrap;overflow:hidden" },
      part(cap.weights, "#888", "weights"), part(cap.res, "#ddd", "reserve"), part(Math.min(need, Math.max(cap.free, 0)), "#1f77b4", "this batch's cache")),
      h("div", { class: "note" }, "memory: gray = weights, light = reserve, blue = this batch's KV cache, white = free"));
  }
  for (const e of Object.values(c)) { e.addEventListener("input", draw); e.addEventListener("change", draw); }
  const grow = h("button", { "data-action": "double-context", onclick: () => { c.context.value = Math.round(+c.context.value * 2); draw(); } }, "context \u00d72");
  root.append(h("div", {}, label("model", c.model), label("context", c.context), grow, label("batch", c.batch)),
    h("div", {}, label("cache", c.cache), label("weights", c.weights), label("GPU", c.gpu), label("\u00d7", c.n)), out, table, bar);
  draw();
  el.append(root);
}
export default { render };
"""


# -- chapter 5 ----------------------------------------------------------------------------------------------
def online_softmax_steps(scores, tile: int) -> list[dict]:
    """The running (m, l) after each tile, as the page's JavaScript computes it (float64)."""
    x = np.asarray(scores, dtype=np.float64)
    if x.ndim != 1 or x.size == 0 or not np.isfinite(x).all():
        raise ValueError(f"scores must be a non-empty 1-D array of finite numbers, got shape {x.shape}")
    if isinstance(tile, bool) or int(tile) != tile or tile < 1:
        raise ValueError(f"tile must be an integer >= 1, got {tile!r}")
    out, m, l = [], -math.inf, 0.0
    for start in range(0, x.size, int(tile)):
        block = x[start:start + int(tile)]
        m_new = max(m, float(block.max()))
        rescale = math.exp(m - m_new) if math.isfinite(m) else 0.0
        l = l * rescale + float(np.exp(block - m_new).sum())
        out.append({"tile": len(out), "block": block, "m_old": m, "m": m_new, "rescale": rescale, "l": l})
        m = m_new
    return out


def online_softmax_explorable(scores, tile: int = 4):
    """Chapter 5's step-through as an offline widget (or, without anywidget, printed)."""
    steps = online_softmax_steps(scores, tile)
    cls = widget_class("OnlineSoftmaxExplorable", _SOFTMAX_JS, {"scores": "list", "tile": "int"})
    if cls is None:
        print("(anywidget is not installed: the steps as text)")
        for s in steps:
            print(f"tile {s['tile']}: m {s['m_old']:.2f} -> {s['m']:.2f}, rescale {s['rescale']:.3f}, l = {s['l']:.4f}")
        return None
    return cls(scores=[float(v) for v in np.asarray(scores, dtype=np.float64)], tile=int(tile))


# -- chapter 7 ----------------------------------------------------------------------------------------------
_OPS = {"add": 2, "append": 3, "fork": 3, "release": 2}


def replay_paged_script(num_blocks: int, block_size: int, script) -> list[dict[str, list[int]]]:
    """Run a scenario through the real ``PagedKVCache``: the block tables after each operation.

    ``script``: operations ``["add", seq]``, ``["append", seq, n_tokens]``, ``["fork", src, dst]``,
    ``["release", seq]``: the same the page's JavaScript replays.
    """
    cache = PagedKVCache(n_layers=1, n_kv_heads=1, d_head=1, num_blocks=num_blocks, block_size=block_size)
    states = []
    for op in script:
        if not isinstance(op, (list, tuple)) or not op or op[0] not in _OPS or len(op) != _OPS[op[0]]:
            raise ValueError(f"bad operation {op!r}: use one of add/append/fork/release with their arguments")
        if op[0] == "add":
            cache.add_sequence(op[1])
        elif op[0] == "append":
            n = op[2]
            cache.append(op[1], np.zeros((1, n, 1, 1), np.float32), np.zeros((1, n, 1, 1), np.float32))
        elif op[0] == "fork":
            cache.fork(op[1], op[2])
        else:
            cache.release(op[1])
        states.append({k: [int(b) for b in v] for k, v in cache.block_tables.items()})
    cache.check_invariants()
    return states


def paged_allocator_explorable(num_blocks: int, block_size: int, script):
    """Chapter 7's block pool as an offline widget (or, without anywidget, printed)."""
    states = replay_paged_script(num_blocks, block_size, script)
    cls = widget_class("PagedAllocatorExplorable", _ALLOCATOR_JS,
                        {"num_blocks": "int", "block_size": "int", "script": "list", "expected": "dict"})
    if cls is None:
        print("(anywidget is not installed: the scenario as text)")
        for op, tables in zip(script, states):
            print(f"{' '.join(map(str, op)):16s} " + "  ".join(f"{s}: {t}" for s, t in tables.items()))
        return None
    return cls(num_blocks=int(num_blocks), block_size=int(block_size), script=[list(op) for op in script],
               expected=states[-1] if states else {})


# -- chapter 3 ----------------------------------------------------------------------------------------------
_MODEL_FIELDS = ("name", "attention", "n_params_b", "n_layers", "n_heads", "n_kv_heads", "d_head",
                 "kv_lora_rank", "qk_rope_dim", "max_context")
_DTYPES = ("fp16", "bf16", "fp8", "int8", "int4")


def sizing_explorable(model: str = "Llama 3.1 70B", context: int = 32_000, batch: int = 1, gpu: str = "H200",
                      n_gpus: int = 2, reserve: float = 0.10):
    """Chapter 3's KV-cache calculator as an offline widget (or, without anywidget, printed)."""
    cap = capacity(model, gpu, context, weight_dtype="bf16", cache_dtype="fp16", activation_reserve=reserve,
                   n_gpus=n_gpus)  # also validates the arguments
    cls = widget_class("SizingExplorable", _SIZING_JS, {
        "models": "list", "gpus": "dict", "dtypes": "dict", "model": "str", "context": "int", "batch": "int",
        "gpu": "str", "n_gpus": "int", "reserve": "float"})
    if cls is None:
        m = MODELS[model]
        print("(anywidget is not installed: the default setting as text)")
        print(f"{model}: {m.kv_bytes_per_token() / 1024:.1f} KiB per token in fp16 "
              f"({m.mha_kv_bytes_per_token() / 1024:.1f} KiB with full MHA); "
              f"{m.kv_bytes(context, batch=batch) / GIB:.2f} GiB for {batch} x {context:,} tokens")
        print(cap.summary())
        return None
    models = [{f: getattr(m, f) for f in _MODEL_FIELDS} for m in MODELS.values()]
    gpus = {name: g.memory_bytes for name, g in GPUS.items()}  # what each device reports, in bytes
    return cls(models=models, gpus=gpus, dtypes={d: DTYPE_BYTES[d] for d in _DTYPES}, model=model,
               context=int(context), batch=int(batch), gpu=gpu, n_gpus=int(n_gpus), reserve=float(reserve))
