"""Compile minillm's Triton kernels for sm_90 on a machine without a GPU and report their resources.

    python benchmarks/aot_resources.py                  # backward v2 table configs and the sweep, bf16
    python benchmarks/aot_resources.py --impl v5        # backward v5 (dQ by TMA reductions) and its sweep
    python benchmarks/aot_resources.py --impl v6        # backward v6's dK/dV side (one warp-specialized loop) and its
                                                        # sweep, beside v4's (three loops) on the same tiles
    python benchmarks/aot_resources.py --kernel paged   # the paged decode kernel per (num_warps, num_stages)
    python benchmarks/aot_resources.py --kernel paged --merge ticket   # ... merging in the last program
    python benchmarks/aot_resources.py --kernel paged --ir   # ... and how each compiled loop moves its data
    python benchmarks/aot_resources.py --kernel forward      # the causal d=128 forward v2 (host descriptors): two key
                                                             # loops against one with the diagonal behind a branch

Triton compiles ahead of time for any target (its wheel ships ptxas and cuobjdump), so registers,
spills (the stack frame ptxas had to use) and shared memory can be read without a device; they
match what the compiled kernel reports on the H200 (checked on the forward at (128, 128, 8, 3):
255 registers, 229376 bytes of shared memory, as in results/flash_attention_tune_h200.json).
Timing still needs the GPU. minillm.kernels switches to the interpreter when there is no CUDA, so
this script loads the kernel module's source as a standalone module with the interpreter off.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402


def load_compiled(name: str, relative_imports: dict[str, str]):
    """minillm/kernels/<name>.py as a module whose @triton.jit functions are compilable (not interpreted)."""
    src = (ROOT / "minillm" / "kernels" / f"{name}.py").read_text()
    for old, new in relative_imports.items():
        src = src.replace(old, new)
    path = Path(tempfile.mkdtemp()) / f"{name}_aot.py"  # @triton.jit reads the source back from the file
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"{name}_aot", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


STUB = "INTERPRETED = False\ncheck_placement = check_tensors = None"


def load_flash_attention():
    """minillm/kernels/flash_attention.py, compilable: its relative imports replaced (the launch helpers are host
    code: only the @triton.jit kernels are used)."""
    return load_compiled("flash_attention", {"from ..attention import": "from minillm.attention import",
                                             "from . import INTERPRETED, check_placement, check_tensors": STUB,
                                             "from .launch import bind, cdiv, fast_launch, fast_path_on, next_power_of_2":
                                                 "bind = cdiv = fast_launch = fast_path_on = next_power_of_2 = None"})


def compile_sm90(kernel, types: dict, consts: dict, warps: int, stages: int) -> dict:
    """Compile for sm_90 (16-byte-aligned pointers and strides, as torch allocates) and read the cubin's resources."""
    target = GPUTarget("cuda", 90, 32)
    backend = triton.compiler.make_backend(target)
    names = kernel.arg_names
    sig = {n: "constexpr" if n in consts else types[n] for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if n not in consts and (types[n].startswith("*") or re.fullmatch(r"s[a-z]{1,3}[bhnsk]", n))}
    src = triton.compiler.ASTSource(fn=kernel, constexprs=consts, signature=sig, attrs=attrs)
    cc = triton.compile(src, target=target, options=backend.parse_options({"num_warps": warps,
                                                                          "num_stages": stages}).__dict__)
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cc.asm["cubin"])
        f.flush()
        res = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+)", res)
    return {"regs": int(m.group(1)), "stack_bytes": int(m.group(2)), "shared_bytes": cc.metadata.shared,
            "ttgir": cc.asm["ttgir"], "warps": cc.metadata.num_warps,
            "setmaxnreg": sorted({int(n) for n in re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+)",
                                                            cc.asm["ptx"])})}


def loop_loads(ttgir: str) -> str:
    """How the main loop of a kernel's TTGIR (its last scf.for) moves data: loads into registers (tt.load),
    asynchronous copies to shared memory and the number of copy groups each wait leaves in flight."""
    body = ttgir[ttgir.rindex("scf.for"):]
    waits = re.findall(r"ttg.async_wait .*?\{num = (\d+)", body)
    dots = [m.start() for m in re.finditer(r"tt\.dot |ttng\.warp_group_dot ", body)]
    issues = [m.start() for m in re.finditer(r"tt\.load |ttg\.async_copy_global_to_local", body)]
    after = sum(i > max(dots) for i in issues) if dots else 0
    return (f"loop: {body.count('tt.load ')} loads to registers, "
            f"{body.count('ttg.async_copy_global_to_local')} async copies to shared memory, "
            f"{body.count('ttg.local_alloc')} register-to-shared copies, waits leave {waits or 'none'} in flight; "
            f"{after} of its {len(issues)} loads and copies issued after the step's last dot")


def tma_loop(ttgir: str) -> str:
    """How v3's main loop (the first scf.for: the unmasked blocks) moves data: TMA copies issued, barrier
    waits, and how many copies come after the step's last dot (those are the next blocks', in flight while
    the following steps compute)."""
    start = ttgir.index("scf.for")
    body = ttgir[start:ttgir.index("scf.yield", start)]
    dots = [m.start() for m in re.finditer(r"tt\.dot |ttng\.warp_group_dot ", body)]
    copies = [m.start() for m in re.finditer(r"ttng\.async_tma_copy_global_to_local", body)]
    after = sum(c > max(dots) for c in copies) if dots else 0
    return (f"loop: {len(copies)} TMA copies, {body.count('ttng.wait_barrier')} barrier waits, "
            f"{after} of the copies issued after the step's last dot")


def tma_resources(kernel, types: dict, consts: dict, warps: int, stages: int) -> str:
    """One line on a TMA kernel compiled for sm_90: registers, stack, shared memory and how its main loop moves
    data (``tma_loop``), or the compile error (out of shared memory at compile time)."""
    try:
        r = compile_sm90(kernel, types, consts, warps, stages)
    except Exception as e:
        return f"ERROR {type(e).__name__}: {str(e)[:80]}"
    return f"regs {r['regs']} stack {r['stack_bytes']} B smem {r['shared_bytes'] / 1024:.1f} KiB  {tma_loop(r['ttgir'])}"


# per backward version: the sweep list in flash_attention_bwd_bench.py, and the kernel's constexprs
BWD_VERSIONS = {"v2": ("SWEEP", dict(TMA=False, SIDE=0)), "v3": ("SWEEP_TMA", dict(TMA=True, SIDE=0)),
                "v5": ("SWEEP_ATOMIC", dict(TMA=True, SIDE=1, DQ_ATOMIC=2)),
                "v6": ("SWEEP_WS", dict(TMA=True, SIDE=1, ONE_LOOP=True))}
# v6 is also compiled as v4's dK/dV side (three loops, not specialized) on the same tiles and warps, for comparison
BWD_BESIDE = {"v6": ("v4", dict(TMA=True, SIDE=1))}


def backward(args):
    fa = load_flash_attention()
    import torch

    kern = fa._bwd_kernel_v2
    sweep_name, flags = BWD_VERSIONS[args.impl]
    types = {n: "i32" for n in kern.arg_names}
    types.update({n: "*bf16" for n in ("Q", "K", "V", "DO", "DQ", "DK", "DV")})
    types.update(LSE2="*fp32", DELTA="*fp32", sm_scale="fp32", qk_scale="fp32")
    if flags.get("DQ_ATOMIC"):
        types["DQ"] = "*fp32"
    if flags["TMA"]:
        fa._ensure_allocator = lambda: None
    sweep = load_sweep(sweep_name)
    forms = [(args.impl, flags)] + ([BWD_BESIDE[args.impl]] if args.impl in BWD_BESIDE else [])
    print(f"backward {args.impl}" + (f" (and {forms[1][0]}'s loops on the same tiles)" if len(forms) > 1 else "")
          + f"\n{'D':>4s} {'config':34s} {'causal':>6s} {'GQA':>4s} {'form':>4s} {'regs':>5s} {'stack B':>8s} "
          f"{'smem KiB':>8s} {'warps':>5s}  setmaxnreg")
    for d in args.head_dims:
        configs = [fa._bwd_blocks(d, torch.bfloat16, interpreted=False, impl=args.impl)] + [c for c in sweep
                                                                                             if d <= 128]
        if args.quick:
            configs = configs[:1]
        if args.impl in BWD_BESIDE:  # the other version's own table tiles too (v4: 8 warps at D = 128, not 4)
            configs.append(fa._bwd_blocks(d, torch.bfloat16, interpreted=False, impl=BWD_BESIDE[args.impl][0]))
        for cfg in dict.fromkeys(configs):
            m1, n1, m2, n2, w, s = cfg[:6]
            for causal in (False, True):
                for gqa in (False, True):  # GROUP == 1 is specialized to a constant by Triton
                    for form, form_flags in (forms[1:] if cfg == configs[-1] and args.impl in BWD_BESIDE else forms):
                        bd = max(16, triton.next_power_of_2(d))
                        consts = dict(HEAD_DIM=d, BLOCK_D=bd, BLOCK_M1=m1, BLOCK_N1=n1, BLOCK_M2=m2, BLOCK_N2=n2,
                                      CAUSAL=causal, PAD_D=bd != d, IEEE=False, **form_flags)
                        if form_flags.get("DQ_ATOMIC"):
                            consts["ROTATE"] = bool(cfg[6]) if len(cfg) > 6 else True
                        for name, default in (("DQ_ATOMIC", 0), ("ROTATE", False), ("ONE_LOOP", False)):
                            consts.setdefault(name, default)  # constexprs with defaults: else typed as i32 here
                        if not gqa:
                            consts["GROUP"] = 1
                        try:
                            r = compile_sm90(kern, types, consts, w, s)
                            shown = (f"{r['regs']:5d} {r['stack_bytes']:8d} {r['shared_bytes'] / 1024:8.1f} "
                                     f"{r['warps']:5d}  {r['setmaxnreg'] or '-'}")
                        except Exception as e:  # e.g. out of resources at compile time
                            shown = f"ERROR {type(e).__name__}: {str(e)[:80]}"
                        print(f"{d:4d} {str(cfg):34s} {str(causal):>6s} {str(gqa):>4s} {form:>4s} {shown}", flush=True)


def load_sweep(name: str = "SWEEP"):
    """The literal list of tuples ``name = [...]`` in flash_attention_bwd_bench.py, read without importing it
    (the bench imports torch.cuda)."""
    text = (ROOT / "benchmarks" / "flash_attention_bwd_bench.py").read_text()
    block = text[text.index(f"\n{name} = [") + len(name) + 4:]
    return eval(block[:block.index("]\n") + 1])


def paged(args):
    pa = load_compiled("paged_attention", {"from ..paged.attention import": "from minillm.paged.attention import",
                                           "from . import INTERPRETED, check_placement, check_tensors": STUB,
                                           # the launch helpers are host code: only the @triton.jit kernels are used
                                           "from .launch import cdiv, fast_launch, next_power_of_2":
                                               "cdiv = fast_launch = next_power_of_2 = None",
                                           "from .flash_attention import _ensure_allocator, _num_sms":
                                               "_ensure_allocator = _num_sms = None"})
    kern = pa._paged_decode_kernel
    types = {n: "i32" for n in kern.arg_names}
    types.update({n: "*bf16" for n in ("Q", "KC", "VC")})
    types.update({n: "*fp32" for n in ("M_OUT", "L_OUT", "O_OUT")})
    types.update(TABLE="*i32", LENS="*i32", qk_scale="fp32", OUT="*bf16", TICKETS="*i32")
    # bf16, GQA 32/8, D=128, block size 16, 4 splits (B=16 on an H200); merge "launch" or "ticket"
    consts = dict(BLOCK_SIZE=16, HEAD_DIM=128, BLOCK_D=128, GROUP_PAD=16, TILE=64, IEEE=False, SPLITS_PAD=4,
                  DIRECT=False, TICKET=args.merge == "ticket", PREFETCH=False, PDL=False,
                  PDL_EARLY=False, TMA=False, K_DESC=None, V_DESC=None)
    print(f"merge={args.merge}\n{'warps':>5s} {'stages':>6s} {'regs':>5s} {'stack B':>8s} {'smem KiB':>8s}")
    for w in (2, 4, 8):
        for s in (1, 2, 3, 4):
            r = compile_sm90(kern, types, consts, w, s)
            print(f"{w:5d} {s:6d} {r['regs']:5d} {r['stack_bytes']:8d} {r['shared_bytes'] / 1024:8.1f}"
                  + (f"  {loop_loads(r['ttgir'])}" if args.ir else ""), flush=True)
    if args.tma:  # v3 of the loop (TMA=True): whole blocks per step, each block's K and V boxes through host descriptors
        print("v3 (TMA=True), host descriptors, one split (DIRECT); tile = tokens per step (whole blocks)")
        for bs, tile in ((64, 64), (128, 128), (16, 64), (16, 128)):
            desc = f"tensordesc<bf16[{bs},128]>"
            for w in (4, 8):
                for st in (2, 3, 4):
                    c3 = {**consts, "BLOCK_SIZE": bs, "TILE": tile, "TMA": True, "DIRECT": True, "SPLITS_PAD": 2}
                    c3.pop("K_DESC"), c3.pop("V_DESC")
                    shown = tma_resources(kern, {**types, "K_DESC": desc, "V_DESC": desc}, c3, w, st)
                    print(f"block {bs:3d} tile {tile:3d} warps {w} stages {st}: {shown}", flush=True)
    if args.ir:  # v2 of the loop (prefetch=True) at its tiles and warps; its loop ignores num_stages
        print("v2 (PREFETCH=True), num_stages=1")
        for tile in (32, 64):
            for w in (4, 8):
                r = compile_sm90(kern, types, {**consts, "TILE": tile, "PREFETCH": True}, w, 1)
                print(f"tile {tile:3d} warps {w}: regs {r['regs']} stack {r['stack_bytes']} B smem "
                      f"{r['shared_bytes'] / 1024:.1f} KiB  {loop_loads(r['ttgir'])}", flush=True)


def heads(args) -> None:
    """The all-heads paged kernel (minillm/kernels/paged_heads.py): one (block_size * Hkv, D) box per step."""
    mod = load_compiled("paged_heads", {"from . import INTERPRETED\n": "INTERPRETED = False\n",
                                        "from .launch import next_power_of_2": "next_power_of_2 = None",
                                        "from .flash_attention import _ensure_allocator, _num_sms":
                                            "_ensure_allocator = _num_sms = None",
                                        "from .paged_attention import _merge_splits_kernel, _shared_per_sm, "
                                        "decode_dims, split_plan":
                                            "_merge_splits_kernel = _shared_per_sm = decode_dims = split_plan = None"})
    kern = mod._paged_heads_kernel

    types = {n: "i32" for n in kern.arg_names}
    types.update({n: "*bf16" for n in ("Q", "KC", "VC", "OUT")})
    types.update({n: "*fp32" for n in ("M_OUT", "L_OUT", "O_OUT")})
    types.update(TABLE="*i32", LENS="*i32", qk_scale="fp32")
    print("all-heads kernel, host descriptors; bf16, Hq=32, Hkv=8, D=128; DIRECT: one split")
    for bs in (16, 32):
        desc = f"tensordesc<bf16[{bs * 8},128]>"
        for direct in (True, False):
            for w in (4, 8):
                for st in (2, 3, 4):
                    consts = dict(BLOCK_SIZE=bs, HKV=8, GROUP=4, HQ_PAD=32, HEAD_DIM=128, DIRECT=direct, IEEE=False)
                    shown = tma_resources(kern, {**types, "K_DESC": desc, "V_DESC": desc}, consts, w, st)
                    print(f"block {bs:3d} {'direct' if direct else 'split '} warps {w} stages {st}: {shown}",
                          flush=True)


def forward(args) -> None:
    """The causal D=128 forward v2 on host descriptors, bf16, at its two tile settings: the diagonal in a second,
    masked loop (DIAG_BRANCH False) against one loop with the diagonal's tiles masked behind a branch (True): registers,
    shared memory, its key loops (scf.for), TMA copies in all and the ones inside the last loop (a pipelined loop issues
    the copies of later tiles there), and its scf.if (the branch)."""
    fa = load_flash_attention()
    kern = fa._fwd_kernel_tma
    types = {n: "i32" for n in kern.arg_names}
    types.update({n: "*bf16" for n in ("Q", "K", "V", "O")})
    types.update(LSE="*fp32", qk_scale="fp32")
    print("forward v2, causal, D=128, bf16, host descriptors, the LSE through its descriptor")
    for bm, bn, w, st in ((64, 64, 4, 3), (128, 128, 8, 3)):
        types.update(Q_DESC=f"tensordesc<bf16[{bm},128]>", O_DESC=f"tensordesc<bf16[{bm},128]>",
                     K_DESC=f"tensordesc<bf16[{bn},128]>", V_DESC=f"tensordesc<bf16[{bn},128]>",
                     LSE_DESC=f"tensordesc<fp32[{bm}]>")
        for branch in (False, True):
            consts = dict(HEAD_DIM=128, BLOCK_D=128, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=True, EVEN_N=True, IEEE=False,
                          WS=False, PERSISTENT=False, LSE_STORE=2, PART=0, DIAG_BRANCH=branch)
            r = compile_sm90(kern, types, consts, w, st)
            g = r["ttgir"]
            start = g.rindex("scf.for")
            indent = start - g.rindex("\n", 0, start) - 1 - len(g[g.rindex("\n", 0, start) + 1:start].lstrip())
            last = g[start:g.index("\n" + " " * (indent + 2) + "scf.yield", start)]  # the loop's own yield, not its if's
            print(f"{bm} x {bn}, {w} warps, {st} stages, {'one loop, branch' if branch else 'two loops'}: "
                  f"regs {r['regs']} stack {r['stack_bytes']} B smem {r['shared_bytes'] / 1024:.1f} KiB; "
                  f"{g.count('scf.for')} loops, {g.count('async_tma_copy_global_to_local')} TMA copies "
                  f"({last.count('async_tma_copy_global_to_local')} inside the last loop), {g.count('scf.if')} scf.if",
                  flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", choices=["backward", "paged", "heads", "forward"], default="backward")
    ap.add_argument("--head-dims", type=int, nargs="+", default=[128, 64])
    ap.add_argument("--impl", choices=list(BWD_VERSIONS), default="v2", help="backward: which version's sweep")
    ap.add_argument("--quick", action="store_true", help="backward: the table's config only, not the sweep")
    ap.add_argument("--merge", choices=["launch", "ticket"], default="launch", help="paged: how splits are merged")
    ap.add_argument("--tma", action="store_true", help="paged: also v3 of the loop (TMA, host descriptors)")
    ap.add_argument("--ir", action="store_true", help="paged: also how the main loop moves data (from the TTGIR), "
                    "and v2 of the loop")
    args = ap.parse_args(argv)
    {"backward": backward, "paged": paged, "heads": heads, "forward": forward}[args.kernel](args)


if __name__ == "__main__":
    main()
