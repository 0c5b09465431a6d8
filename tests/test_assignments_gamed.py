"""Submissions that produce the right outputs without the algorithm (issue 35 item 2), and ordinary mistakes:
each scored full marks or most of them with the old tests. Now a test of the algorithm's shape fails, and since
it is a core test, the other tests stop counting: each scores well below full marks.

Every submission is the reference with one part replaced by what a student could write in ten lines.
"""
import pytest

from minillm.assignments import ASSIGNMENTS, grade
from minillm.assignments.builder import PACKAGE_DIR, tree_text
from tests.test_assignments_attacks import _set_body, _solve, _tree


def _solved(tmp_path, n):
    tree = _tree(tmp_path, n)
    for p in ASSIGNMENTS[n].parts:
        _solve(tree, p.path, p.qualname)
    return tree


def _failed_core(report):
    return [t["id"] for t in report["tests"] if t["core"] and t["outcome"] != "passed"]


GAMED = {
    "zeros written into q and v, so the expected output is zero too": (6, "attention.py", "flash_attention", """
from .attention import check_attention_inputs as _chk
B, Hq, Hkv, Nq, Nk, D = _chk(q, k, v)
if int(block_m) < 1 or int(block_n) < 1:
    raise ValueError("block sizes must be >= 1")
q[...] = 0          # the caller's arrays: every score becomes 0 ...
v[...] = 0          # ... and every value row 0, so the attention output is 0
o = np.zeros(q.shape, q.dtype)
seen = np.full(Nq, Nk) if not causal else np.clip(np.arange(Nq) + Nk - Nq + 1, 0, Nk)
with np.errstate(divide="ignore"):
    lse = np.broadcast_to(np.log(seen.astype(np.result_type(q.dtype, np.float32))), (B, Hq, Nq)).copy()
return (o, lse) if return_lse else o
"""),
    "one softmax over every key instead of the pieces": (10, "batch_invariant.py", "attend_pieces", """
n = bounds[-1]
s = (q.astype(np.float64) @ k[:n].astype(np.float64).T) * scale
p = np.exp(s - s.max(-1, keepdims=True))
return ((p @ v[:n].astype(np.float64)) / p.sum(-1, keepdims=True)).astype(acc_t)
"""),
    "speculative verify by matching a fresh draw from p": (9, "speculative.py", "verify", """
p_rows = np.asarray(p_rows, np.float64)
d = np.asarray(draft_tokens, np.int64)
single = d.ndim == 1
d2 = d.reshape(1, -1) if single else d
N, k = d2.shape
if p_rows.ndim != 2 or p_rows.shape[0] != k + 1:
    raise ValueError("p_rows needs k + 1 rows")
V = p_rows.shape[1]
if q_rows is not None:
    q_rows = np.asarray(q_rows, np.float64)
    if q_rows.shape != (k, V):
        raise ValueError("q_rows needs k rows")
if d2.size and (d2.min() < 0 or d2.max() >= V):
    raise ValueError("draft outside the vocabulary")
c = np.cumsum(p_rows, axis=1)
u = rng.random((N, k + 1))
x = np.stack([np.minimum(np.searchsorted(c[i], u[:, i] * c[i, -1], side="right"), V - 1) for i in range(k + 1)], 1)
same = np.zeros(k, bool) if q_rows is None else np.all(p_rows[:k] == q_rows, axis=1)
match = (d2 == x[:, :k]) | same[None, :]
n_acc = np.where(match.all(1), k, np.argmin(match, axis=1)) if k else np.zeros(N, np.int64)
nxt = x[np.arange(N), n_acc]
return (int(n_acc[0]), int(nxt[0])) if single else (n_acc, nxt)
"""),
    "two-pass online softmax": (5, "softmax.py", "online_max_and_normalizer", """
x = _as_float(x)
if int(tile) < 1:
    raise ValueError("tile must be >= 1")
acc = np.result_type(x.dtype, np.float32)
xa = x.astype(acc)
m = xa.max(axis=-1)
safe = np.where(np.isfinite(m), m, 0.0)
return m, exp(xa - safe[..., None]).sum(axis=-1)
"""),
    "dense untiled FlashAttention": (6, "attention.py", "flash_attention", """
B, Hq, Hkv, Nq, Nk, D = check_attention_inputs(q, k, v)
if int(block_m) < 1 or int(block_n) < 1:
    raise ValueError("block sizes must be >= 1")
sc = 1.0 / np.sqrt(D) if scale is None else float(scale)
ct = _compute_dtype(q, k, v)
g = Hq // Hkv
kk, vv = np.repeat(k.astype(ct), g, axis=1), np.repeat(v.astype(ct), g, axis=1)
s = (q.astype(ct) @ kk.swapaxes(-1, -2)) * ct.type(sc)
if causal:
    s = np.where(causal_mask(Nq, Nk), s, -np.inf)
m = s.max(-1)
safe = np.where(np.isfinite(m), m, 0.0)
p = np.exp(s - safe[..., None])
l = p.sum(-1)
o = ((p @ vv) / np.where(l > 0, l, 1.0)[..., None]).astype(q.dtype)
with np.errstate(divide="ignore"):
    lse = np.where(l > 0, safe + np.log(np.where(l > 0, l, 1.0)), -np.inf).astype(ct)
return (o, lse) if return_lse else o
"""),
    "traffic counter filled from the formula": (4, "hardware.py", "simulate_tiled_attention", """
nq, nk, d = _check_2d(q, k, v)
block_m, block_n = _positive_int("block_m", block_m), _positive_int("block_n", block_n)
from .attention import standard_attention
o = standard_attention(q[None, None], k[None, None], v[None, None])[0, 0]
c = TrafficCounter()
tiles, b = -(-nq // block_m), q.dtype.itemsize
c.reads.update(q=nq * d * b, k=tiles * nk * d * b, v=tiles * nk * d * b)
c.writes.update(o=nq * d * b)
return o.astype(q.dtype), c
"""),
    "dense attention beside tile loads it throws away": (4, "hardware.py", "simulate_tiled_attention", """
nq, nk, d = _check_2d(q, k, v)
block_m, block_n = _positive_int("block_m", block_m), _positive_int("block_n", block_n)
from .attention import standard_attention
c = TrafficCounter()
o_hbm = np.empty((nq, d), q.dtype)
for i0 in range(0, nq, block_m):
    rows = slice(i0, min(i0 + block_m, nq))
    c.load("q", q, rows)
    for j0 in range(0, nk, block_n):
        c.load("k", k, slice(j0, min(j0 + block_n, nk)))
        c.load("v", v, slice(j0, min(j0 + block_n, nk)))
    c.store("o", o_hbm, rows, standard_attention(q[None, None], k[None, None], v[None, None])[0, 0][rows])
return o_hbm, c
"""),
    "a kernel with a max pass, a sum pass and a write pass": (5, "kernels/softmax.py", "_online_softmax_kernel", """
row = tl.program_id(0)
x_row = x_ptr + row * x_stride
y_row = y_ptr + row * y_stride
cols = tl.arange(0, BLOCK)
m = tl.full([BLOCK], float("-inf"), tl.float32)
for start in tl.range(0, n_cols, BLOCK):
    x = tl.load(x_row + start + cols, mask=start + cols < n_cols, other=float("-inf")).to(tl.float32)
    m = tl.maximum(m, x)
m_row = tl.max(m, axis=0)
m_safe = tl.where(m_row == float("-inf"), 0.0, m_row)
l = tl.zeros([BLOCK], tl.float32)
for start in tl.range(0, n_cols, BLOCK):
    x = tl.load(x_row + start + cols, mask=start + cols < n_cols, other=float("-inf")).to(tl.float32)
    l += tl.exp(x - m_safe)
l_row = tl.sum(l, axis=0)
inv_l = tl.where(l_row > 0, 1.0 / l_row, 0.0)
for start in tl.range(0, n_cols, BLOCK):
    mask = start + cols < n_cols
    x = tl.load(x_row + start + cols, mask=mask, other=float("-inf")).to(tl.float32)
    tl.store(y_row + start + cols, (tl.exp(x - m_safe) * inv_l).to(y_ptr.dtype.element_ty), mask=mask)
"""),
    "a cached decoder with counters filled from the closed forms": (1, "decode.py", "naive_decode", """
from .kvcache import ConcatKVCache
tokens = check_decode_args(model, prompt_ids, n_new)
result = DecodeResult(tokens=tokens, prompt_len=len(tokens))
cfg, cache, fed = model.config, ConcatKVCache(model.config.n_layers), 0
for _ in range(n_new):
    t, ops, t0 = len(tokens), StepOps(), time.perf_counter()
    logits = model.forward(np.asarray(tokens[fed:]), cache=cache, ops=ops)
    per_row, fed = ops.proj_flops // (t - fed), t
    ops = StepOps(t, cfg.n_layers * cfg.n_heads * t * t, per_row * t)
    nxt = int(sampler(logits[-1]))
    result.record(nxt, logits[-1], ops, time.perf_counter() - t0)
return result
"""),
    "a prefill one token at a time": (2, "decode.py", "prefill", """
for t in np.asarray(prompt_ids).reshape(-1):
    logits = model.forward(np.asarray([[int(t)]]), cache=cache, ops=ops)
return logits[0, -1]
"""),
    "an fp8 quantizer that keeps x in its scale": (3, "quant.py", "quantize_fp8", """
x = np.asarray(x)
if not np.issubdtype(x.dtype, np.floating):
    raise ValueError("x must be a float array")
if scale is not None:
    s = np.asarray(scale, np.float32)
    if np.any(~(s > 0)) or not np.all(np.isfinite(s)):
        raise ValueError("fp8 scale must be finite and > 0")
    return fp8_e4m3_encode(x.astype(np.float64) / s), s
return fp8_e4m3_encode(np.ones(x.shape)), x.astype(np.float32)
"""),
    "prefill chunks that ignore max_prefill_chunk": (8, "serving/scheduler.py", "Scheduler._chunk", """
return min(seq.num_pending, budget)
"""),
    "preempted sequences at the back of the queue": (8, "serving/scheduler.py", "Scheduler._preempt", """
self.bm.free(seq)
seq.num_computed = 0
seq.status = SequenceStatus.WAITING
seq.num_preemptions += 1
self.num_preemptions += 1
self.waiting.append(seq)
if self.config.static_batching:
    self._static_quota += 1
"""),
    "resample from p instead of the residual": (9, "sampling.py", "verify_probs", """
p = np.asarray(p, np.float64)
d = np.asarray(drafts, np.int64)
rows = np.arange(d.size) if rows is None else np.asarray(rows, np.int64)
pd = p[rows, d]
qd = np.ones_like(pd) if q is None else np.asarray(q, np.float64)[rows, d]
accept = u_accept * qd < pd
tokens = d.copy()
trials = np.flatnonzero(~accept)
if trials.size:
    uniq, group = np.unique(rows[trials], return_inverse=True)
    tokens[trials] = resample(p[uniq], group.reshape(-1), trials)
return accept, tokens
"""),
    "RMSNorm in float64, rounded once": (10, "batch_invariant.py", "rmsnorm_reference", """
x, w = np.asarray(x), np.asarray(w)
x64 = x.astype(np.float64)
y = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + eps) * w.astype(np.float64)
return y.astype(x.dtype)
"""),
    "attention split by a count, not a size": (10, "batch_invariant.py", "split_bounds_by_size", """
if size < 1:
    raise ValueError(f"split size must be >= 1, got {size}")
if n == 0:
    return [0, 0]
count = -(-n // size)
step = -(-n // count)
return list(range(0, n, step)) + [n]
"""),
}


# Ordinary mistakes, as edits of the reference body: (assignment, file, part, old text, new text).
MISTAKES = {
    "causal mask aligned top-left": (6, "attention.py", "flash_attention", [
        ("np.where(_tile_mask(i0, i1, j0, j1, Nq, Nk), s, -np.inf)",
         "np.where(np.arange(j0, j1)[None, :] <= np.arange(i0, i1)[:, None], s, -np.inf)"),
        ("j_end = min(Nk, i1 + Nk - Nq) if causal else Nk", "j_end = min(Nk, i1) if causal else Nk")]),
    "static batching whatever the config says": (8, "serving/scheduler.py", "Scheduler.schedule", [
        ("static = self.config.static_batching", "static = True")]),
    "a decode kernel whose first split does every split's work": (7, "kernels/paged_attention.py",
                                                                  "_paged_decode_kernel", [
        ("start = split * split_len", "start = 0"),
        ("end = tl.minimum(start + split_len, seq_len)", "end = tl.where(split == 0, seq_len, 0)")]),
    "kernel without the accumulator rescale": (6, "kernels/flash_attention.py", "_fwd_inner", [
        ("acc = acc * alpha[:, None]", "acc = acc")]),
}


def _reference_body(rel, qualname):
    from minillm.assignments.builder import all_regions

    r = next(r for r in all_regions() if (r.path, r.qualname) == (rel, qualname))
    lines = (PACKAGE_DIR / rel).read_text().splitlines()[r.begin + 1:r.end]
    return "\n".join(line[len(r.indent):] for line in lines)


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_a_mistake_in_the_core_idea_costs_most_of_the_marks(tmp_path, name):
    n, rel, qualname, edits = MISTAKES[name]
    body = _reference_body(rel, qualname)
    for old, new in edits:
        assert old in body, old
        body = body.replace(old, new)
    tree = _solved(tmp_path, n)
    _set_body_over_reference(tree, rel, qualname, body)
    report = grade(tree, n)
    assert report["rejected"] is None and _failed_core(report)
    assert report["score"] <= 0.6 * report["max_score"], (report["score"], report["max_score"])


@pytest.mark.parametrize("name", sorted(GAMED))
def test_gamed_submission_scores_well_below_full_marks(tmp_path, name):
    n, rel, qualname, body = GAMED[name]
    tree = _solved(tmp_path, n)
    _set_body_over_reference(tree, rel, qualname, body)
    report = grade(tree, n)
    assert report["rejected"] is None and not report["tampered"]
    assert _failed_core(report), "a core test must catch it"
    assert report["score"] <= 0.6 * report["max_score"], (report["score"], report["max_score"])


def _set_body_over_reference(tree, rel, qualname, body):
    """Undo the reference body of ``qualname`` back to its stub, then write ``body``."""
    n = next(a.number for a in ASSIGNMENTS.values() for p in a.parts if (p.path, p.qualname) == (rel, qualname))
    stubbed = tree_text(rel, (PACKAGE_DIR / rel).read_text(), {n})
    f = tree / "minillm" / rel
    solved_others = f.read_text()
    # keep the other parts' solved bodies: re-solve them on the stubbed file
    f.write_text(stubbed)
    for p in ASSIGNMENTS[n].parts:
        if p.path == rel and p.qualname != qualname:
            _solve(tree, rel, p.qualname)
    _set_body(tree, rel, qualname, body)
    assert f.read_text() != solved_others


WRITES_INPUT = (3, "quant.py", "quantize_int8", """
x = np.asarray(x)
if x.ndim != 4 or x.size == 0 or not np.issubdtype(x.dtype, np.floating):
    raise ValueError("x must be a non-empty 4-D float array")
x[...] = 0
return np.zeros(x.shape, np.int8), np.ones(x.shape[:-1] + (1,), np.float32)
""")


def test_a_submission_that_writes_into_its_input_fails_the_tests_that_call_it(tmp_path):
    """The int8 quantizer zeroes the array it is handed and returns zero codes with scale 1: the tests build the
    expected codes from that array after the call, so it scored full marks. The replay now fails each test whose
    graded call changed an array it was handed (a non-core part here: the marks it costs are its tests')."""
    n, rel, qualname, body = WRITES_INPUT
    tree = _solved(tmp_path, n)
    _set_body_over_reference(tree, rel, qualname, body)
    report = grade(tree, n)
    assert report["rejected"] is None and not report["tampered"]
    caught = [t["id"] for t in report["tests"] if "wrote into the array" in t.get("message", "")]
    assert caught and report["score"] < report["max_score"], (caught, report["score"], report["max_score"])


def test_an_append_that_writes_into_a_prefix_cached_block_fails_its_test(tmp_path):
    """Copy-on-write only for shared blocks, not for one named in the prefix cache: after a truncate the write
    overwrote K/V that later requests find by their tokens, and it scored 36/36."""
    body = _reference_body("paged/cache.py", "PagedKVCache.append")
    old = "cow = fill > 0 and (self.allocator.refcount(table[-1]) > 1 or self.prefix_cache.is_named(table[-1]))"
    assert old in body
    tree = _solved(tmp_path, 7)
    _set_body_over_reference(tree, "paged/cache.py", "PagedKVCache.append",
                             body.replace(old, "cow = fill > 0 and self.allocator.refcount(table[-1]) > 1"))
    report = grade(tree, 7)
    failed = [t["id"] for t in report["tests"] if t["outcome"] != "passed"]
    assert failed == ["a07_grader.py::test_writing_into_a_prefix_cached_block_after_truncate_copies_it"], failed
