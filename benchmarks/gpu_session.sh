#!/usr/bin/env bash
# Every GPU check and benchmark of chapters 5-10, one device command per case (each under the tool's 10 minutes):
#   Here, once:  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#                  --platform manylinux_2_28_x86_64 -d .whl numpy==2.3.5      (.whl is git-ignored; carry it)
#   Then:        run(command="bash benchmarks/gpu_session.sh validate", carry=[".whl"])
#                run(command="bash benchmarks/gpu_session.sh bench")
#                run(command="bash benchmarks/gpu_session.sh tests")
#                run(command="bash benchmarks/gpu_session.sh serving-tiny")   # chapter 8
#                run(command="bash benchmarks/gpu_session.sh serving-1b")
#                run(command="bash benchmarks/gpu_session.sh kernels2")      # issue 12: backward v2, paged study
#                run(command="bash benchmarks/gpu_session.sh kernels3-sweep")  # issue 12 round 2: versions x tiles
#                run(command="bash benchmarks/gpu_session.sh kernels3-sweep2") #   follow-up sweeps, paged study
#                run(command="bash benchmarks/gpu_session.sh kernels3-final")  #   checks of the defaults, grids
#                run(command="bash benchmarks/gpu_session.sh kernels3-confirm", carry=[".whl"])  # what came after it
#                run(command="bash benchmarks/gpu_session.sh kernels4-a", carry=[".whl"])  # round 3: checks, bwd v5
#                run(command="bash benchmarks/gpu_session.sh kernels4-repeat")  # wrong results that come and go
#                run(command="bash benchmarks/gpu_session.sh kernels4-final", carry=[".whl"])  #   the LSE fix
#                run(command="bash benchmarks/gpu_session.sh kernels5-diag")  # next: D=64 causal 1K, paged B=16
#                run(command="bash benchmarks/gpu_session.sh kernels5-b")     # the N=1K step: host against GPU
#                run(command="bash benchmarks/gpu_session.sh kernels5-c")     # v2 up to 1K queries, every D
#                run(command="bash benchmarks/gpu_session.sh kernels5-d")     # the descriptor LSE store, N=1K again
#                run(command="bash benchmarks/gpu_session.sh kernels6")       # the fast launch path, N=1K again
#                run(command="bash benchmarks/gpu_session.sh kernels7")       # every compiled test, fast path on
#                run(command="bash benchmarks/gpu_session.sh kernels8")       # plans: a seen call replays
#                run(command="bash benchmarks/gpu_session.sh kernels8-b")     #   all flash tests, N=1K again
#                run(command="bash benchmarks/gpu_session.sh kernels8-c")     #   causal d=128 forward tiles
#                run(command="bash benchmarks/gpu_session.sh kernels9")       # the final launch code: tests, N=1K
#                run(command="bash benchmarks/gpu_session.sh kernels10")      # paged v2 loop; tests kernels9 missed
#                run(command="bash benchmarks/gpu_session.sh kernels10-b")    # paged v1: tiles x warps x stages x merges
#                run(command="bash benchmarks/gpu_session.sh kernels10-c")    # paged: what a call is made of
#                run(command="bash benchmarks/gpu_session.sh kernels11")      # paged: the merge by PDL, tests, grid
#                run(command="bash benchmarks/gpu_session.sh kernels11-b")    # paged: PDL released early or late
#                run(command="bash benchmarks/gpu_session.sh kernels13")      # paged: a block's memory order (hnd)
#                run(command="bash benchmarks/gpu_session.sh kernels13-b")    # paged: the v3 loop (TMA whole blocks)
#                run(command="bash benchmarks/gpu_session.sh kernels13-c")    # paged: v3 the default at B=16, grid
#                run(command="bash benchmarks/gpu_session.sh kernels13-d")    #   the grid again (kernels13-c's stopped)
#                run(command="bash benchmarks/gpu_session.sh kernels13-e")    #   v3: descriptors made on the host
#                run(command="bash benchmarks/gpu_session.sh kernels13-f")    #   host descriptors on: grid, elsewhere
#                run(command="bash benchmarks/gpu_session.sh kernels13-g")    # flash forward: host descriptors
#                run(command="bash benchmarks/gpu_session.sh kernels13-h")    #   the same, d=128 only (device time)
#                run(command="bash benchmarks/gpu_session.sh kernels13-i")    # host descriptors by the fast launch
#                run(command="bash benchmarks/gpu_session.sh kernels14")      # paged v3: several 16-token blocks a step
#                run(command="bash benchmarks/gpu_session.sh kernels14-b")    #   v3 the default up to 2x the SMs: grid
#                run(command="bash benchmarks/gpu_session.sh kernels14-c")    #   2 stages past the SMs; grid, 64 too
#                run(command="bash benchmarks/gpu_session.sh kernels14-d")    #   stages by shared memory; the grid again
#                run(command="bash benchmarks/gpu_session.sh kernels14-e")    #   B=24 with the default of kernels14-d
#                run(command="bash benchmarks/gpu_session.sh kernels15")      # paged: one box per block, all KV heads
#                run(command="bash benchmarks/gpu_session.sh kernels16")      # the flash grid again, flex everywhere
#                run(command="bash benchmarks/gpu_session.sh kernels17")      # causal d=128: v2, host descriptors
#                run(command="bash benchmarks/gpu_session.sh kernels18")      # paged v1: one split, deep pipelines
#                run(command="bash benchmarks/gpu_session.sh kernels19")      # causal forward: grouped heaviest first
#                run(command="bash benchmarks/gpu_session.sh kernels20")      # tests after review; v2 host tiles
#                run(command="bash benchmarks/gpu_session.sh kernels21")      # causal forward in two launches (v6/v7)
#                run(command="bash benchmarks/gpu_session.sh kernels22")      # causal forward: diagonal first (v8)
#                run(command="bash benchmarks/gpu_session.sh kernels23")      # v2 host tiles, 4K-16K, repeated
#                run(command="bash benchmarks/gpu_session.sh kernels24")      # 64 x 64 host tiles below 8K; the grid
#                run(command="bash benchmarks/gpu_session.sh kernels25")      # v6 again: float32 partial O, small resume
#                run(command="bash benchmarks/gpu_session.sh kernels26")      # v6 default from 16K; the grid
#                run(command="bash benchmarks/gpu_session.sh kernels27")      # v6 tests' shared reference; study fix
#                run(command="bash benchmarks/gpu_session.sh kernels28")      # causal forward: one masked WS loop (v9/v10)
#                run(command="bash benchmarks/gpu_session.sh kernels29")      #   v9/v10 masking past the diagonal only;
#                                                                               #   v2 host descriptors at 1K-2K
#                run(command="bash benchmarks/gpu_session.sh kernels30")      #   v9/v10 on host descriptors; v2 host 1K
#                run(command="bash benchmarks/gpu_session.sh kernels31")      # the grid: v2 host descriptors from 1K
#                run(command="bash benchmarks/gpu_session.sh kernels32")      # forward / cuDNN ratios in 5 rounds
#                run(command="bash benchmarks/gpu_session.sh kernels33")      # causal order's group size, v2 host
#                run(command="bash benchmarks/gpu_session.sh kernels34")      #   group size 256 against 512 elsewhere
#                run(command="bash benchmarks/gpu_session.sh kernels35")      #   v2 host: narrower key tiles, 1K-8K
#                run(command="bash benchmarks/gpu_session.sh kernels36")      #   every light flash test, final code
#                run(command="bash benchmarks/gpu_session.sh kernels37")      #   the N=1K training step, host threshold
#                run(command="bash benchmarks/gpu_session.sh kernels38")      # plans for host descriptors; lazy rescale
#                run(command="bash benchmarks/gpu_session.sh kernels39")      #   the N=1K step's host time, per part
#                run(command="bash benchmarks/gpu_session.sh kernels40")      #   host descriptors encoded once per address
#                run(command="bash benchmarks/gpu_session.sh kernels41")      #   one threshold: the N=1K step again
#                run(command="bash benchmarks/gpu_session.sh kernels42")      #   the session's last code, compiled tests
#                run(command="bash benchmarks/gpu_session.sh kernels43")      #   after review: A/B step study, tests again
#                run(command="bash benchmarks/gpu_session.sh kernels44")      #   which training steps capture in a graph
#                run(command="bash benchmarks/gpu_session.sh kernels45")      #   ... and why not
#                run(command="bash benchmarks/gpu_session.sh kernels46")      #   a first fix, which did not hold
#                run(command="bash benchmarks/gpu_session.sh kernels47")      #   the cause, and its fix checked
#                run(command="bash benchmarks/gpu_session.sh kernels48")      # issue 12: the step study, every test
#                run(command="bash benchmarks/gpu_session.sh kernels48-heavy")
#                run(command="bash benchmarks/gpu_session.sh kernels49")      #   the causal diagonal behind a branch
#                run(command="bash benchmarks/gpu_session.sh kernels50")      #   ... with 128 x 128 tiles, at 16K
#                run(command="bash benchmarks/gpu_session.sh kernels51")      #   the new defaults: tests, rounds
#                run(command="bash benchmarks/gpu_session.sh kernels52")      #   ... and the recorded grid
#                run(command="bash benchmarks/gpu_session.sh kernels53")      #   ... and the N=1K training step
#                run(command="bash benchmarks/gpu_session.sh composed")       # chapter 10: the composed ladder
# numpy 2.3.5 is needed only for the interpreter leg: triton 3.6's interpreter breaks on numpy >= 2.4.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"

PROVIDERS="minillm sdpa_flash sdpa_cudnn sdpa_efficient"
# the compiled kernel tests, and the -k expression of their heavy parametrizations (one compile each)
KERNEL_TESTS="tests/test_kernels_launch.py tests/test_kernels_flash_attention.py tests/test_kernels_paged_attention.py
  tests/test_kernels_paged_prefill.py tests/test_kernels_softmax.py tests/test_paged_cache.py tests/test_torch_model.py
  tests/test_serving_torch_runner.py"
HEAVY="impls_match_reference or tile_shapes_split"

# flash_grid: the recorded flash grid (forward, then forward+backward, then flex beside both) into
# $OUT/flash_attention_h200.{json,txt}, as kernels16, 17 and 19 ran it
flash_grid() {
  J="$OUT/flash_attention_h200.json"; TX="$OUT/flash_attention_h200.txt"
  timeout 100 python3 benchmarks/flash_attention_bench.py --modes fwd --providers $PROVIDERS --out "$J" > "$TX" 2>&1
  echo "fwd rc=$?"
  timeout 150 python3 benchmarks/flash_attention_bench.py --modes fwd+bwd --providers $PROVIDERS --no-memory \
    --append --out "$J" >> "$TX" 2>&1; echo "fwd+bwd rc=$?"
  timeout 150 python3 benchmarks/flash_attention_bench.py --modes fwd fwd+bwd --providers flex --seq-lens 1024 4096 16384 \
    --bwd-seq-lens 1024 4096 --no-memory --append --out "$J" >> "$TX" 2>&1; echo "flex rc=$?"
}  # (400 s at most: a case that calls it keeps its other steps under 200 s, inside one device call's 600 s)

# run_shards NAME N TIMEOUT < ids: the test ids on stdin in N parallel pytest processes (the compiled tests mostly
# wait on Triton compiles, which are CPU-bound), each under TIMEOUT seconds (then interrupted: pytest still prints
# its summary and the failures so far); prints the summaries and failures and collects the logs into $OUT/NAME.txt
run_shards() {
  local name=$1 n=$2 limit=$3 S=/tmp/shards_$1 T
  rm -rf "$S"; mkdir -p "$S"; T="$S/log"
  grep '::' > "$S/ids"
  split -n "r/$n" "$S/ids" "$S/shard."
  for f in "$S"/shard.*; do
    ( mapfile -t ids < "$f"; timeout -s INT -k 30 "$limit" python3 -m pytest -q -p no:cacheprovider -rfEs "${ids[@]}" \
        > "$T.${f##*.}.txt" 2>&1 ) &
  done
  wait
  echo "tests: $(wc -l < "$S/ids") collected"; grep -h -E "passed|failed|error" "$T".*.txt | grep -v "^FAILED" | cut -c1-200
  grep -h -E "^(FAILED|ERROR)" "$T".*.txt | cut -c1-300 | head -20
  cat "$T".*.txt > "$OUT/$name.txt"
}
# flash_shards NAME SHARDS TIMEOUT EXPR: the flash tests matching EXPR, through run_shards
flash_shards() {
  python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_kernels_flash_attention.py -k "$4" 2>/dev/null \
    | run_shards "$1" "$2" "$3"
}
# grid_and_causal: flash_grid, then its causal forward rows of minillm and cuDNN
grid_and_causal() {
  flash_grid
  grep -E "^fwd +(64|128) .*True +(minillm|sdpa_cudnn)" "$TX" | cut -c1-90
}
case "${1:-validate}" in
validate)  # leg 2 (interpreter vs compiled), the tile sweep, leg 3 (compiled kernels vs references)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/np .whl/numpy-*.whl >/dev/null 2>&1
  CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1 PYTHONPATH=/tmp/np:. timeout 90 \
    python3 benchmarks/check_interpreter_vs_compiled.py dump /tmp/interp.npz
  timeout 60 python3 benchmarks/check_interpreter_vs_compiled.py compare /tmp/interp.npz > "$OUT/interp_vs_compiled.txt" 2>&1
  tail -1 "$OUT/interp_vs_compiled.txt"
  timeout 150 python3 benchmarks/flash_attention_tune.py --out "$OUT/flash_attention_tune_h200.json" \
    > "$OUT/flash_attention_tune_h200.txt" 2>&1
  tail -4 "$OUT/flash_attention_tune_h200.txt"
  timeout 300 python3 -m pytest -v -p no:cacheprovider tests/test_kernels_paged_attention.py tests/test_paged_cache.py \
    tests/test_kernels_softmax.py tests/test_kernels_flash_attention.py tests/test_torch_model.py > "$OUT/kernel_tests.txt" 2>&1
  tail -3 "$OUT/kernel_tests.txt" ;;
bench)  # each script rewrites its JSON after every row, so a cut-short run keeps what it measured
  timeout 140 python3 benchmarks/paged_attention_bench.py --out "$OUT/paged_attention_h200.json" > "$OUT/paged_attention_h200.txt" 2>&1
  tail -2 "$OUT/paged_attention_h200.txt"
  J="$OUT/flash_attention_h200.json"; T="$OUT/flash_attention_h200.txt"
  timeout 90 python3 benchmarks/flash_attention_bench.py --modes fwd --providers $PROVIDERS --out "$J" > "$T" 2>&1
  timeout 150 python3 benchmarks/flash_attention_bench.py --modes fwd+bwd --providers $PROVIDERS --no-memory --append \
    --out "$J" >> "$T" 2>&1
  # flex_attention compiles once per shape (seconds each), so it gets a subset of the grid
  timeout 80 python3 benchmarks/flash_attention_bench.py --modes fwd --providers flex --seq-lens 1024 4096 16384 \
    --no-memory --append --out "$J" >> "$T" 2>&1
  timeout 60 python3 benchmarks/flash_attention_bench.py --modes fwd+bwd --providers flex --seq-lens 4096 --no-memory \
    --append --out "$J" >> "$T" 2>&1
  grep -c . "$T"; tail -3 "$T" ;;
paged)  # the paged decode benchmark alone (after retuning its defaults)
  timeout 140 python3 benchmarks/paged_attention_bench.py --out "$OUT/paged_attention_h200.json" > "$OUT/paged_attention_h200.txt" 2>&1
  tail -2 "$OUT/paged_attention_h200.txt" ;;
overhead)  # host cost vs kernel time of short calls
  timeout 120 python3 benchmarks/launch_overhead.py --out "$OUT/launch_overhead_h200.json" > "$OUT/launch_overhead_h200.txt" 2>&1
  cat "$OUT/launch_overhead_h200.txt" ;;
tests)  # leg 3 again after retuning: the compiled kernels against the references (gpu-marked tests included)
  timeout 420 python3 -m pytest -v -p no:cacheprovider tests/test_kernels_paged_attention.py tests/test_paged_cache.py \
    tests/test_kernels_flash_attention.py tests/test_kernels_softmax.py tests/test_torch_model.py > "$OUT/kernel_tests.txt" 2>&1
  tail -3 "$OUT/kernel_tests.txt" ;;
serving-tiny)  # chapter 8: GPU serving tests, then the serving benchmark on the tiny model
  timeout 200 python3 -m pytest -v -p no:cacheprovider tests/test_serving_torch_runner.py tests/test_kernels_paged_prefill.py \
    tests/test_serving_engine.py > "$OUT/serving_tests.txt" 2>&1
  tail -3 "$OUT/serving_tests.txt"
  timeout 330 python3 benchmarks/serving_bench.py --models tiny --out "$OUT/serving_tiny_h200.json" > "$OUT/serving_tiny_h200.txt" 2>&1
  tail -8 "$OUT/serving_tiny_h200.txt" ;;
serving-all)  # both in one device command: tests, tiny, then the 1B shape
  timeout 120 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_serving_torch_runner.py tests/test_kernels_paged_prefill.py \
    > "$OUT/serving_tests.txt" 2>&1
  tail -3 "$OUT/serving_tests.txt"
  timeout 150 python3 benchmarks/serving_bench.py --models tiny --hf-requests 64 --out "$OUT/serving_tiny_h200.json" \
    > "$OUT/serving_tiny_h200.txt" 2>&1
  tail -6 "$OUT/serving_tiny_h200.txt"
  timeout 300 python3 benchmarks/serving_bench.py --models llama1b --hf-requests 64 --out "$OUT/serving_1b_h200.json" \
    > "$OUT/serving_1b_h200.txt" 2>&1
  tail -8 "$OUT/serving_1b_h200.txt" ;;
serving-final)  # after fusing QKV/gate-up: the 1B batch-1 roofline and profile again; engine speculation (tiny)
  timeout 200 python3 benchmarks/serving_bench.py --models tiny --parts spec --out "$OUT/speculative_engine_h200.json" \
    > "$OUT/speculative_engine_h200.txt" 2>&1
  tail -14 "$OUT/speculative_engine_h200.txt"
  timeout 200 python3 benchmarks/serving_bench.py --models llama1b --parts roofline profile \
    --out "$OUT/serving_1b_fused_h200.json" > "$OUT/serving_1b_fused_h200.txt" 2>&1
  tail -3 "$OUT/serving_1b_fused_h200.txt" ;;
speculative)  # chapter 9: GPU tests of the speculative paths, then the engine benchmark (batch 1, batch sweep, 1B costs)
  timeout 200 python3 -m pytest -v -p no:cacheprovider tests/test_serving_torch_runner.py tests/test_sampling.py \
    > "$OUT/speculative_tests.txt" 2>&1
  tail -3 "$OUT/speculative_tests.txt"
  timeout 380 python3 benchmarks/speculative_bench.py --out "$OUT/speculative_h200.json" > "$OUT/speculative_h200.txt" 2>&1
  tail -30 "$OUT/speculative_h200.txt" ;;
serving-1b)  # chapter 8: the serving benchmark on the Llama-3.2-1B-shaped model (random bf16 weights)
  timeout 560 python3 benchmarks/serving_bench.py --models llama1b --hf-requests 64 --out "$OUT/serving_1b_h200.json" \
    > "$OUT/serving_1b_h200.txt" 2>&1
  tail -8 "$OUT/serving_1b_h200.txt" ;;
kernels2)  # issue 12, one device command (~9 min): compiled kernel tests, backward v1 vs v2 vs SDPA/flex, paged study
  # each step under its own timeout and writing its own files, so a failing or slow step never stops the next
  # the tests mostly wait on Triton compiles (CPU-bound, ~10 s each for the fp32 backward): 8 shards in parallel
  python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_kernels_flash_attention.py \
    tests/test_kernels_paged_attention.py 2>/dev/null | run_shards kernel_tests_kernels2_h200 8 180
  timeout 210 python3 benchmarks/flash_attention_bwd_bench.py --out "$OUT/flash_attention_bwd_h200.json" \
    > "$OUT/flash_attention_bwd_h200.txt" 2>&1
  echo "bwd bench rc=$?"; cut -c1-160 "$OUT/flash_attention_bwd_h200.txt" | tail -45
  timeout 150 python3 benchmarks/paged_decode_study.py --out "$OUT/paged_decode_study_h200.json" \
    > "$OUT/paged_decode_study_h200.txt" 2>&1
  echo "paged study rc=$?"; grep -E "^resources|^summary|^ *[0-9]+ +[0-9]+ \|" "$OUT/paged_decode_study_h200.txt" | cut -c1-160
  tail -2 "$OUT/paged_decode_study_h200.txt" | cut -c1-200 ;;
kernels3-sweep)  # issue 12, second round: every forward/backward version x tiles (each checked against cuDNN / v1)
  timeout 340 python3 benchmarks/flash_attention_tune.py --impls v1 v2 v3 v4 v5 --seq-lens 1024 4096 \
    --out "$OUT/flash_attention_tune_h200.json" > "$OUT/flash_attention_tune_h200.txt" 2>&1
  echo "tune rc=$?"; grep -E "^D=|ERROR|Error|WRONG" "$OUT/flash_attention_tune_h200.txt" | cut -c1-220 | head -40
  timeout 230 python3 benchmarks/flash_attention_bwd_bench.py --providers minillm_v2 minillm_v3 minillm_v4 sdpa_flash \
    sdpa_cudnn --points 128:4096 64:4096 --flex-points 128:4096 64:4096 --sweep 128:4096 --sweep-impls v3 v4 \
    --out "$OUT/flash_attention_bwd_sweep_h200.json" > "$OUT/flash_attention_bwd_sweep_h200.txt" 2>&1
  echo "bwd rc=$?"; cut -c1-170 "$OUT/flash_attention_bwd_sweep_h200.txt" | tail -50 ;;
kernels3-sweep2)  # issue 12, second round, part 2: compiled tests of the new versions, then the follow-up sweeps
  { python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_kernels_flash_attention.py \
      -k "impls or persistent or tma or tolerance or rejects or model" 2>/dev/null
    python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_kernels_paged_attention.py 2>/dev/null; } \
    | run_shards kernel_tests_kernels3_h200 12 170
  timeout 120 python3 benchmarks/flash_attention_tune.py --impls v1 v3 v5 --seq-lens 1024 4096 --causal True \
    --only v1:64,64,4,3 v1:64,64,4,4 v1:64,128,4,3 v1:64,32,4,3 v1:128,64,8,3 v3:128,128,4,2 v3:128,64,8,3 \
    v5:128,128,4,2 v5:128,128,4,2x2 v5:128,64,8,3x2 --out "$OUT/flash_attention_tune2_h200.json" \
    > "$OUT/flash_attention_tune2_h200.txt" 2>&1
  echo "tune2 rc=$?"; grep -E "^D=|WRONG" "$OUT/flash_attention_tune2_h200.txt" | cut -c1-260
  timeout 170 python3 benchmarks/flash_attention_bwd_bench.py --providers minillm_v3 minillm_v4 --points 128:4096 \
    --flex-points --sweep 128:4096 64:4096 --sweep-impls v3 v4 --out "$OUT/flash_attention_bwd_sweep2_h200.json" \
    > "$OUT/flash_attention_bwd_sweep2_h200.txt" 2>&1
  echo "bwd rc=$?"; cut -c1-170 "$OUT/flash_attention_bwd_sweep2_h200.txt" | grep -v "^ *$"
  timeout 130 python3 benchmarks/paged_decode_study.py --parts resources sweep merge sdpa --warps 2 4 --stages 1 2 3 \
    --out "$OUT/paged_decode_study_h200.json" > "$OUT/paged_decode_study_h200.txt" 2>&1
  echo "paged rc=$?"; grep -E "^resources|^summary|^ *[0-9]+ +[0-9]+ \|" "$OUT/paged_decode_study_h200.txt" | cut -c1-200
  tail -2 "$OUT/paged_decode_study_h200.txt" | cut -c1-200 ;;
kernels3-final)  # issue 12, second round, last: compiled checks of the defaults, then the recorded grids again
  { python3 -m pytest --collect-only -q -p no:cacheprovider -m gpu tests/test_kernels_flash_attention.py \
      -k "default_warp or (gpu_tolerance_rule and (v5 or v1) and not backward) or backward_gpu_tolerance" 2>/dev/null
    python3 -m pytest --collect-only -q -p no:cacheprovider -m gpu tests/test_kernels_paged_attention.py 2>/dev/null; } \
    | run_shards kernel_tests_kernels3_final_h200 10 110
  J="$OUT/flash_attention_h200.json"; TX="$OUT/flash_attention_h200.txt"
  timeout 100 python3 benchmarks/flash_attention_bench.py --modes fwd --providers $PROVIDERS \
    --out "$J" > "$TX" 2>&1; echo "fwd rc=$?"
  timeout 140 python3 benchmarks/flash_attention_bench.py --modes fwd+bwd --providers $PROVIDERS \
    --no-memory --append --out "$J" >> "$TX" 2>&1; echo "fwd+bwd rc=$?"
  timeout 90 python3 benchmarks/paged_attention_bench.py --out "$OUT/paged_attention_h200.json" \
    > "$OUT/paged_attention_h200.txt" 2>&1; echo "paged rc=$?"; tail -2 "$OUT/paged_attention_h200.txt"
  timeout 85 python3 benchmarks/flash_attention_bench.py --modes fwd fwd+bwd --providers flex --seq-lens 4096 \
    --no-memory --append --out "$J" >> "$TX" 2>&1; echo "flex rc=$?"
  grep -E "minillm|flex|cudnn|flash" "$TX" | grep -v memory | cut -c1-90 ;;
kernels3-confirm)  # issue 12: the changes made after kernels3-final, which no GPU has run yet (~6 min)
  # causal v3/v5 now run v2/v4; causal backward up to 1K queries runs v2; the interpreter-vs-compiled leg now
  # covers the TMA forward versions and the ticket merge; decode_config's B=1 L=16K entry is (4, 2)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/np .whl/numpy-*.whl >/dev/null 2>&1
  CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1 PYTHONPATH=/tmp/np:. timeout 90 \
    python3 benchmarks/check_interpreter_vs_compiled.py dump /tmp/interp.npz
  timeout 90 python3 benchmarks/check_interpreter_vs_compiled.py compare /tmp/interp.npz > "$OUT/interp_vs_compiled.txt" 2>&1
  tail -1 "$OUT/interp_vs_compiled.txt"
  python3 -m pytest --collect-only -q -p no:cacheprovider -m gpu tests/test_kernels_flash_attention.py \
    -k "gpu_tolerance_rule and not backward and True" 2>/dev/null | run_shards kernel_tests_kernels3_confirm_h200 10 120
  J="$OUT/flash_attention_n1k_recheck_h200.json"
  timeout 80 python3 benchmarks/flash_attention_bench.py --modes fwd fwd+bwd --seq-lens 1024 \
    --providers minillm sdpa_flash sdpa_cudnn sdpa_efficient --no-memory --out "$J" > "$OUT/n1k.txt" 2>&1
  timeout 100 python3 benchmarks/flash_attention_bench.py --modes fwd fwd+bwd --seq-lens 1024 --providers flex \
    --no-memory --append --out "$J" >> "$OUT/n1k.txt" 2>&1; echo "n1k rc=$?"; cat "$OUT/n1k.txt"
  timeout 60 python3 benchmarks/paged_decode_study.py --parts merge sdpa --batches 1 --lengths 16384 \
    --out "$OUT/paged_b1_16k_h200.json" > "$OUT/paged_b1_16k_h200.txt" 2>&1; tail -3 "$OUT/paged_b1_16k_h200.txt" ;;
kernels4-a)  # issue 12, third round, first command (~8 min): what no GPU has run yet, and backward v5
  # (1) interpreter vs compiled with the TMA forward versions and the ticket merge; (2) compiled tests: causal
  # v3/v5 routed to v2/v4, the new _key_range/_normalize helpers, backward v5 (TMA reductions of dQ) against
  # float64 and on ragged tile shapes; (3) backward v5 beside v3/v4, FA2 and cuDNN at N=4K, and its tile sweep
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/np .whl/numpy-*.whl >/dev/null 2>&1
  CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1 PYTHONPATH=/tmp/np:. timeout 90 \
    python3 benchmarks/check_interpreter_vs_compiled.py dump /tmp/interp.npz
  timeout 90 python3 benchmarks/check_interpreter_vs_compiled.py compare /tmp/interp.npz > "$OUT/interp_vs_compiled.txt" 2>&1
  tail -1 "$OUT/interp_vs_compiled.txt"
  python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_kernels_flash_attention.py \
    -k "(gpu_tolerance_rule and not backward and True) or (backward_gpu_tolerance_rule and v5) or (impls_match and v5) or (tile_shapes and True-False-True) or pointer_atomics" \
    2>/dev/null | run_shards kernel_tests_kernels4_h200 12 150
  timeout 330 python3 benchmarks/flash_attention_bwd_bench.py --points 128:4096 64:4096 \
    --providers minillm_v3 minillm_v4 minillm_v5 sdpa_flash sdpa_cudnn --flex-points --sweep 128:4096 64:4096 \
    --sweep-impls v5 --out "$OUT/flash_attention_bwd_v5_h200.json" > "$OUT/flash_attention_bwd_v5_h200.txt" 2>&1
  echo "bwd rc=$?"; cat "$OUT/flash_attention_bwd_v5_h200.txt" ;;
kernels4-repeat)  # (REPEAT_ARGS: more options) every forward version 20 times per shape on NaN-poisoned memory vs cuDNN; backward v3-v5 behind fwd v1
  timeout 420 python3 benchmarks/check_forward_repeats.py --bwd-impls v3 v4 v5 ${REPEAT_ARGS:-} \
    --out "$OUT/forward_repeats_h200.json" > "$OUT/forward_repeats_h200.txt" 2>&1; echo "rc=$?"
  cat "$OUT/forward_repeats_h200.txt" ;;
kernels4-final)  # issue 12, third round (~8 min, carry .whl): the LSE fix checked, and the numbers it changes
  # warp-specialized forwards (v3, v5) leave the LSE unwritten: calls that need it now run v1/v2/v4.
  # The interpreter leg compiles ~40 kernels (cut short at 90 s last time): it runs beside the test shards.
  ( python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/np .whl/numpy-*.whl >/dev/null 2>&1
    CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1 PYTHONPATH=/tmp/np:. timeout 100 \
      python3 benchmarks/check_interpreter_vs_compiled.py dump /tmp/interp.npz > /tmp/dump.txt 2>&1
    timeout 150 python3 benchmarks/check_interpreter_vs_compiled.py compare /tmp/interp.npz \
      > "$OUT/interp_vs_compiled.txt" 2>&1; echo "interp rc=$?" >> "$OUT/interp_vs_compiled.txt" ) &
  python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_kernels_flash_attention.py \
    -k "gpu_lse or training_default_path or (forward_impls_match and (v3 or v5))" 2>/dev/null \
    | run_shards kernel_tests_kernels4_final_h200 8 140
  wait; tail -1 "$OUT/interp_vs_compiled.txt"
  timeout 30 python3 benchmarks/check_forward_repeats.py --head-dims 128 --seq-lens 1024 --calls 4 \
    --impls default v3 v5 --bwd-impls v3 --bwd-fwd-impls default > "$OUT/forward_repeats_fixed_h200.txt" 2>&1
  cat "$OUT/forward_repeats_fixed_h200.txt"
  # the N=1K column as the targets read it: defaults (fwd_plan, bwd_plan) beside FA2, cuDNN and flex
  J="$OUT/flash_attention_n1k_recheck_h200.json"
  timeout 70 python3 benchmarks/flash_attention_bench.py --modes fwd fwd+bwd --seq-lens 1024 \
    --providers minillm sdpa_flash sdpa_cudnn sdpa_efficient --no-memory --out "$J" > "$OUT/n1k.txt" 2>&1
  timeout 90 python3 benchmarks/flash_attention_bench.py --modes fwd fwd+bwd --seq-lens 1024 --providers flex \
    --no-memory --append --out "$J" >> "$OUT/n1k.txt" 2>&1; echo "n1k rc=$?"; cat "$OUT/n1k.txt"
  # D=128 fwd+bwd past 1K again: the grid's rows ran the forward v5, whose LSE the backward read unwritten
  timeout 110 python3 benchmarks/flash_attention_bench.py --modes fwd+bwd --head-dims 128 --seq-lens 2048 4096 8192 16384 \
    --providers minillm sdpa_flash sdpa_cudnn --no-memory --warmup-s 1 --out "$OUT/flash_attention_fwdbwd_d128_h200.json" \
    > "$OUT/flash_attention_fwdbwd_d128_h200.txt" 2>&1; echo "grid rc=$?"; cat "$OUT/flash_attention_fwdbwd_d128_h200.txt" ;;
kernels5-diag)  # issue 12, next: where the remaining misses go (~6 min; not run yet)
  # D=64 causal N=1K: the training step took longer than the non-causal one (twice the work): kernel by kernel
  timeout 90 python3 benchmarks/profile_attention_step.py --out "$OUT/attention_step_profile_h200.json" \
    > "$OUT/attention_step_profile_h200.txt" 2>&1; cat "$OUT/attention_step_profile_h200.txt"
  # every backward version and the v2/v4 tiles at D=64, N=1K, both causal settings (~40 compiles)
  timeout 240 python3 benchmarks/flash_attention_bwd_bench.py --points 64:1024 --flex-points \
    --sweep 64:1024 --sweep-impls v2 v4 --out "$OUT/flash_attention_bwd_n1k_h200.json" \
    > "$OUT/flash_attention_bwd_n1k_h200.txt" 2>&1; echo "bwd rc=$?"; cat "$OUT/flash_attention_bwd_n1k_h200.txt"
  # paged B=16 at short L: split counts under the 4 that default_splits picks (1 writes directly, no merge launch)
  timeout 60 python3 benchmarks/paged_attention_bench.py --batches 16 --lengths 1024 4096 --block-sizes 16 \
    --sweep-splits 1 2 3 4 --sweep-tiles --out "$OUT/paged_b16_splits_h200.json" > "$OUT/paged_b16_splits_h200.txt" 2>&1
  tail -12 "$OUT/paged_b16_splits_h200.txt" ;;
kernels5-b)  # issue 12: the N=1K training step, host against GPU (~5 min)
  # host issue time, eager time and CUDA-graph replay per step, with cProfile of minillm's host functions
  timeout 150 python3 benchmarks/profile_attention_step.py --host-profile --out "$OUT/attention_step_host_h200.json" \
    > "$OUT/attention_step_host_h200.txt" 2>&1; echo "profile rc=$?"; grep -v "^    host" "$OUT/attention_step_host_h200.txt"
  grep -m 30 "^    host" "$OUT/attention_step_host_h200.txt"
  # the default plans (D=64 N=1K now v2 with the 4-warp tile) beside v2/v4, FA2, cuDNN, flex; eager and graph times
  timeout 300 python3 benchmarks/flash_attention_bwd_bench.py --points 64:1024 128:1024 --flex-points 64:1024 128:1024 \
    --providers minillm minillm_v2 minillm_v4 sdpa_flash sdpa_cudnn --sweep --graphs \
    --out "$OUT/flash_attention_n1k_graphs_h200.json" > "$OUT/flash_attention_n1k_graphs_h200.txt" 2>&1
  echo "bwd rc=$?"; cat "$OUT/flash_attention_n1k_graphs_h200.txt" ;;
kernels5-c)  # issue 12: backward v2 over at most 1K queries at every head dim (~5 min)
  python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_kernels_flash_attention.py \
    -k "training_default_path or lse_matches" | run_shards kernel_tests_kernels5 4 180 &  # beside the LSE check
  # the LSE that warp specialization drops: two other ways to store it (recomputed offsets, a descriptor)
  timeout 120 python3 benchmarks/check_ws_lse.py --out "$OUT/ws_lse_h200.json" > "$OUT/ws_lse_h200.txt" 2>&1
  echo "ws_lse rc=$?"; cat "$OUT/ws_lse_h200.txt"
  wait  # the tests, before anything is timed
  # a store variant right in every call of v3 and v5: time training with the v5 forward it allows
  V=$(python3 -c "
import json; rows = json.load(open('$OUT/ws_lse_h200.json'))['rows']
ok = [s for s in (1, 2) if all(r['lse_wrong'] == 0 and r['o_wrong'] == 0 and 'error' not in r
                               for r in rows if r['lse_store'] == s and r['impl'] in ('v3', 'v5'))
      and any(r['lse_store'] == s and r['impl'] == 'v5' for r in rows)]
print(ok[0] if ok else '')" 2>/dev/null)
  if [ -n "$V" ]; then
    timeout 120 python3 benchmarks/flash_attention_bwd_bench.py --ws-lse-store "$V" --points 128:1024 128:4096 \
      --flex-points --providers minillm sdpa_flash sdpa_cudnn --sweep --graphs \
      --out "$OUT/flash_attention_ws_lse_train_h200.json" > "$OUT/flash_attention_ws_lse_train_h200.txt" 2>&1
    echo "ws-lse training (store $V) rc=$?"; cat "$OUT/flash_attention_ws_lse_train_h200.txt"
  fi
  timeout 220 python3 benchmarks/flash_attention_bwd_bench.py --points 64:1024 128:1024 --flex-points 64:1024 128:1024 \
    --providers minillm minillm_v3 minillm_v4 sdpa_flash sdpa_cudnn --sweep --graphs \
    --out "$OUT/flash_attention_n1k_final_h200.json" > "$OUT/flash_attention_n1k_final_h200.txt" 2>&1
  echo "bwd rc=$?"; cat "$OUT/flash_attention_n1k_final_h200.txt" ;;
kernels5-d)  # issue 12: the descriptor LSE store as the default (tests), then the N=1K fwd+bwd column again (~4 min)
  python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_kernels_flash_attention.py \
    -k "training_default_path or lse_matches or lse_store or routing or impls_match" | run_shards kernel_tests_kernels5d 8 170
  timeout 200 python3 benchmarks/flash_attention_bwd_bench.py --points 64:1024 128:1024 --flex-points 64:1024 128:1024 \
    --providers minillm sdpa_flash sdpa_cudnn --sweep --graphs \
    --out "$OUT/flash_attention_n1k_lse2_h200.json" > "$OUT/flash_attention_n1k_lse2_h200.txt" 2>&1
  echo "bwd rc=$?"; cat "$OUT/flash_attention_n1k_lse2_h200.txt" ;;
kernels6)  # issue 12: the fast launch path (minillm/kernels/launch.py); every compiled kernel test, then the N=1K
  # training step with and without it beside FA2 (~8 min)
  python3 -m pytest --collect-only -q -p no:cacheprovider $KERNEL_TESTS | run_shards kernel_tests_kernels6 8 200
  timeout 120 python3 benchmarks/profile_attention_step.py --providers minillm minillm_jit sdpa_flash \
    --out "$OUT/attention_step_launch_h200.json" > "$OUT/attention_step_launch_h200.txt" 2>&1
  echo "profile rc=$?"; grep -E "^D=|host issue" "$OUT/attention_step_launch_h200.txt"
  timeout 230 python3 benchmarks/flash_attention_bwd_bench.py --points 64:1024 128:1024 --flex-points 64:1024 128:1024 \
    --providers minillm minillm_jit sdpa_flash sdpa_cudnn --sweep --graphs \
    --out "$OUT/flash_attention_n1k_launch_h200.json" > "$OUT/flash_attention_n1k_launch_h200.txt" 2>&1
  echo "bwd rc=$?"; cat "$OUT/flash_attention_n1k_launch_h200.txt" ;;
kernels6-b)  # issue 12: the host cost part by part; the compiled kernel tests, the heavy parametrizations last
  timeout 150 python3 benchmarks/host_breakdown.py --out "$OUT/host_breakdown_h200.json" \
    > "$OUT/host_breakdown_h200.txt" 2>&1; echo "breakdown rc=$?"; cat "$OUT/host_breakdown_h200.txt"
    python3 -m pytest --collect-only -q -p no:cacheprovider $KERNEL_TESTS -k "not ($HEAVY)" \
    | run_shards kernel_tests_kernels6 8 200
  python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_kernels_flash_attention.py -k "$HEAVY" \
    | run_shards kernel_tests_kernels6_heavy 8 190 ;;
kernels6-c)  # issue 12: kernels6-b again with the fast path actually taken (Triton 3.6's hooks are empty chains)
  timeout 150 python3 benchmarks/host_breakdown.py --out "$OUT/host_breakdown_h200.json" \
    > "$OUT/host_breakdown_h200.txt" 2>&1; echo "breakdown rc=$?"; cat "$OUT/host_breakdown_h200.txt"
  python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_kernels_launch.py tests/test_kernels_paged_attention.py \
    tests/test_kernels_flash_attention.py -k "launch or ticket_counters or impls_match_reference or tile_shapes_split" \
    | run_shards kernel_tests_kernels6c 8 250 ;;
kernels6-d)  # issue 12: host-side cdiv, the lse non-differentiable (no zero gradient per step), the fast path taken:
  # the launch tests, then the N=1K fwd+bwd column, then the host breakdown again (~6 min)
  timeout -s INT 70 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels_launch.py > "$OUT/kernel_tests_kernels6d.txt" 2>&1
  tail -3 "$OUT/kernel_tests_kernels6d.txt"
  timeout 200 python3 benchmarks/flash_attention_bwd_bench.py --points 64:1024 128:1024 --flex-points 64:1024 128:1024 \
    --providers minillm sdpa_flash sdpa_cudnn --sweep --graphs \
    --out "$OUT/flash_attention_n1k_fast_h200.json" > "$OUT/flash_attention_n1k_fast_h200.txt" 2>&1
  echo "bwd rc=$?"; cat "$OUT/flash_attention_n1k_fast_h200.txt"
  timeout 100 python3 benchmarks/host_breakdown.py --out "$OUT/host_breakdown_fast_h200.json" \
    > "$OUT/host_breakdown_fast_h200.txt" 2>&1; echo "breakdown rc=$?"; cat "$OUT/host_breakdown_fast_h200.txt" ;;
kernels7)  # the autograd hand-off probe (where the eager N=1K step's host time goes), then every compiled test
  # with the fast launch path active (last session ran only the launch tests, the ticket counters and part of the
  # heavy parametrizations with it; the rest ran before the hooks fix, through the binder), then the heavy ones
  timeout 100 python3 benchmarks/autograd_handoff.py --out "$OUT/autograd_handoff_h200.json" \
    > "$OUT/autograd_handoff_h200.txt" 2>&1; echo "handoff rc=$?"; grep -E "^D=" "$OUT/autograd_handoff_h200.txt"
  python3 -m pytest --collect-only -q -p no:cacheprovider $KERNEL_TESTS -k "not ($HEAVY)" \
    | run_shards kernel_tests_kernels7 14 220
  python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_kernels_flash_attention.py -k "$HEAVY" \
    | run_shards kernel_tests_kernels7_heavy 14 230 ;;
kernels8)  # issue 12: plans (a seen call replays its decisions through bound launches); the launch, flash-attention
  # (light), model and runner tests, the hand-off probe, the host breakdown, and the N=1K training step beside FA2,
  # cuDNN and flex (~8 min)
  python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_kernels_launch.py tests/test_kernels_flash_attention.py \
    tests/test_torch_model.py tests/test_serving_torch_runner.py -k "not ($HEAVY)" | run_shards kernel_tests_kernels8 14 150
  timeout 100 python3 benchmarks/autograd_handoff.py --out "$OUT/autograd_handoff_plans_h200.json" \
    > "$OUT/autograd_handoff_plans_h200.txt" 2>&1; echo "handoff rc=$?"; grep -E "^D=" "$OUT/autograd_handoff_plans_h200.txt"
  timeout 100 python3 benchmarks/host_breakdown.py --out "$OUT/host_breakdown_plans_h200.json" \
    > "$OUT/host_breakdown_plans_h200.txt" 2>&1; echo "breakdown rc=$?"; cat "$OUT/host_breakdown_plans_h200.txt"
  timeout 200 python3 benchmarks/flash_attention_bwd_bench.py --points 64:1024 128:1024 --flex-points 64:1024 128:1024 \
    --providers minillm minillm_noplans minillm_jit sdpa_flash sdpa_cudnn --graphs \
    --out "$OUT/flash_attention_n1k_plans_h200.json" > "$OUT/flash_attention_n1k_plans_h200.txt" 2>&1
  echo "bwd rc=$?"; cat "$OUT/flash_attention_n1k_plans_h200.txt" ;;
kernels8-b)  # issue 12: after the leaner Bound check, every compiled flash/launch test (heavy ones included), the host
  # breakdown again, and the N=1K training step again (the chapter's host rule picks among the runs) (~9 min)
  python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_kernels_launch.py tests/test_kernels_flash_attention.py \
    | run_shards kernel_tests_kernels8b 14 260
  timeout 90 python3 benchmarks/host_breakdown.py --out "$OUT/host_breakdown_plans2_h200.json" \
    > "$OUT/host_breakdown_plans2_h200.txt" 2>&1; echo "breakdown rc=$?"; grep -E "step|forward, no|backward, no" "$OUT/host_breakdown_plans2_h200.txt"
  timeout 170 python3 benchmarks/flash_attention_bwd_bench.py --points 64:1024 128:1024 --flex-points 64:1024 128:1024 \
    --providers minillm minillm_noplans minillm_jit sdpa_flash sdpa_cudnn --graphs --sweep \
    --out "$OUT/flash_attention_n1k_plans2_h200.json" > "$OUT/flash_attention_n1k_plans2_h200.txt" 2>&1
  echo "bwd rc=$?"; cat "$OUT/flash_attention_n1k_plans2_h200.txt" ;;
kernels8-c)  # issue 12: the causal d=128 forward, where the cuDNN targets are missed: deeper pipelines and tiles the
  # sweeps did not try (v1, v2), at N 1K/4K beside cuDNN and FA2; then fwd+bwd at d=128 N=4K beside flex (~5 min)
  timeout 170 python3 benchmarks/flash_attention_tune.py --head-dims 128 --causal True --seq-lens 1024 4096 \
    --impls v1 v2 --only v1:128,64,8,3 v1:128,64,8,4 v1:128,64,8,5 v1:64,64,4,3 v1:64,64,4,4 v1:64,128,8,3 \
    v2:128,64,8,4 v2:128,128,8,3 \
    --out "$OUT/flash_attention_tune_causal128_h200.json" > "$OUT/flash_attention_tune_causal128_h200.txt" 2>&1
  echo "tune rc=$?"; tail -14 "$OUT/flash_attention_tune_causal128_h200.txt"
  timeout 130 python3 benchmarks/flash_attention_bwd_bench.py --points 128:4096 --flex-points 128:4096 \
    --providers minillm sdpa_flash sdpa_cudnn --sweep --out "$OUT/flash_attention_fwdbwd_4k_flex_h200.json" \
    > "$OUT/flash_attention_fwdbwd_4k_flex_h200.txt" 2>&1; echo "bwd rc=$?"; cat "$OUT/flash_attention_fwdbwd_4k_flex_h200.txt" ;;
kernels9)  # issue 12: with the final launch code (bind classes once): every compiled flash/launch test (heavy ones
  # included), the host breakdown and the N=1K training step, whose fast-launch-only column is now clean (~9 min)
  python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_kernels_launch.py tests/test_kernels_flash_attention.py \
    | run_shards kernel_tests_kernels9 14 260
  timeout 90 python3 benchmarks/host_breakdown.py --out "$OUT/host_breakdown_kernels9_h200.json" \
    > "$OUT/host_breakdown_kernels9_h200.txt" 2>&1; echo "breakdown rc=$?"; grep -E "step|forward, no|backward, no" "$OUT/host_breakdown_kernels9_h200.txt"
  timeout 170 python3 benchmarks/flash_attention_bwd_bench.py --points 64:1024 128:1024 --flex-points 64:1024 128:1024 \
    --providers minillm minillm_noplans minillm_jit sdpa_flash sdpa_cudnn --graphs --sweep \
    --out "$OUT/flash_attention_n1k_kernels9_h200.json" > "$OUT/flash_attention_n1k_kernels9_h200.txt" 2>&1
  echo "bwd rc=$?"; cat "$OUT/flash_attention_n1k_kernels9_h200.txt" ;;
kernels10)  # issue 12: the N=1K step again on a fresh host; the paged decode loops (v1: Triton's pipeliner, v2: loads
  # issued a step ahead by hand) at B 1/16/64 x L 1K/4K/16K beside SDPA; the paged kernel tests and the 29 flash tests
  # kernels9's shards did not reach before their timeout (results/kernel_tests_kernels9_unrun_ids.txt) (~9 min)
  timeout 130 python3 benchmarks/flash_attention_bwd_bench.py --points 64:1024 128:1024 --flex-points 64:1024 128:1024 \
    --providers minillm minillm_noplans minillm_jit sdpa_flash sdpa_cudnn --graphs --sweep \
    --out "$OUT/flash_attention_n1k_kernels10_h200.json" > "$OUT/flash_attention_n1k_kernels10_h200.txt" 2>&1
  echo "bwd rc=$?"; grep -E "^ +(64|128) " "$OUT/flash_attention_n1k_kernels10_h200.txt"
  timeout 200 python3 benchmarks/paged_decode_study.py --parts loops sdpa --out "$OUT/paged_decode_loops_h200.json" \
    > "$OUT/paged_decode_loops_h200.txt" 2>&1; echo "loops rc=$?"; sed -n '/^summary/,$p' "$OUT/paged_decode_loops_h200.txt"
  { cat benchmarks/results/kernel_tests_kernels9_unrun_ids.txt; python3 -m pytest --collect-only -q -p no:cacheprovider \
      tests/test_kernels_paged_attention.py; } | run_shards kernel_tests_kernels10 14 200 ;;
kernels10-b)  # issue 12: the paged v1 loop where B >= 16 misses its target: splits around the default x tiles 32/64/128
  # x 4/8 warps (never timed together: the tile sweeps ran at the default 2 warps, where 128 spills) x 2/3 stages x
  # both merges, at B 16/64 x L 1K/4K beside SDPA (~4 min)
  timeout 400 python3 benchmarks/paged_decode_study.py --parts loops sdpa --batches 16 64 --lengths 1024 4096 \
    --loop-prefetch 0 --loop-tiles 32 64 128 --loop-warps 4 8 --loop-stages 2 3 --loop-merges launch ticket \
    --out "$OUT/paged_decode_v1_sweep_h200.json" > "$OUT/paged_decode_v1_sweep_h200.txt" 2>&1
  echo "sweep rc=$?"; sed -n '/^summary/,$p' "$OUT/paged_decode_v1_sweep_h200.txt"
  grep -E "^B= 16 L=  1024 loops" "$OUT/paged_decode_v1_sweep_h200.txt" | sort -k13 -g | head -3 ;;
kernels10-c)  # issue 12: the paged call's pieces at B 16/64 x L 1K/4K/16K (whole call, decode kernel alone, an empty
  # launch of the same grid) beside SDPA, to split the fixed cost per call that the chapter's fit finds (~2 min)
  timeout 200 python3 benchmarks/paged_decode_study.py --parts pieces sdpa --batches 16 64 \
    --out "$OUT/paged_decode_pieces_h200.json" > "$OUT/paged_decode_pieces_h200.txt" 2>&1
  echo "pieces rc=$?"; grep -E "pieces|sdpa_cudnn" "$OUT/paged_decode_pieces_h200.txt" ;;
kernels11)  # issue 12: the paged merge launched as a programmatic dependent (PDL): the call's pieces with and without
  # it, the paged/model/runner GPU tests (CUDA graphs with PDL inside), then the recorded grid with it (~6 min)
  timeout 100 python3 benchmarks/paged_decode_study.py --parts pieces sdpa --batches 1 16 64 \
    --out "$OUT/paged_decode_pieces_pdl_h200.json" > "$OUT/paged_decode_pieces_pdl_h200.txt" 2>&1
  echo "pieces rc=$?"; grep -E "pieces|sdpa_cudnn" "$OUT/paged_decode_pieces_pdl_h200.txt"
  python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_kernels_paged_attention.py tests/test_torch_model.py \
    tests/test_serving_torch_runner.py tests/test_paged_cache.py tests/test_kernels_paged_prefill.py \
    | run_shards kernel_tests_kernels11 14 200
  timeout 150 python3 benchmarks/paged_attention_bench.py --out "$OUT/paged_attention_pdl_h200.json" \
    > "$OUT/paged_attention_pdl_h200.txt" 2>&1; echo "bench rc=$?"; grep -E "^ +(16|64|256) " "$OUT/paged_attention_pdl_h200.txt" | grep -v "=" ;;
kernels11-b)  # issue 12: kernels11 found the merge by PDL slower; where the decode programs release it (after their
  # loads, or as they begin), against the plain launch, at B 16/64; the PDL tests (~2 min)
  timeout 100 python3 benchmarks/paged_decode_study.py --parts pieces --batches 16 64 \
    --out "$OUT/paged_decode_pieces_pdl2_h200.json" > "$OUT/paged_decode_pieces_pdl2_h200.txt" 2>&1
  echo "pieces rc=$?"; grep -E "pieces" "$OUT/paged_decode_pieces_pdl2_h200.txt"
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_paged_attention.py -k pdl 2>&1 | tail -2 ;;
kernels13)  # issue 12: the paged gap at B >= 16 is 5% streaming rate plus a fixed cost; does a block stored head-major
  # (hnd: one KV head's tokens side by side) stream faster than the engine's (slot, head, dim) pool? Same kernel,
  # same data, at every (B, L) of the study, then an hnd sweep and its pieces; the layout tests (~6 min)
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_paged_attention.py \
    -k "head_major or strided_head or matches_reference" 2>&1 | tail -2
  timeout 420 python3 benchmarks/paged_decode_study.py --parts layout sdpa \
    --out "$OUT/paged_decode_layout_h200.json" > "$OUT/paged_decode_layout_h200.txt" 2>&1
  echo "layout rc=$?"; sed -n '/^summary/,$p' "$OUT/paged_decode_layout_h200.txt" ;;
kernels13-b)  # issue 12: the v3 decode loop (tma=True: one block per step, K and V copied whole by TMA) against v1,
  # and swept over splits (one split: no merge launch) x warps x stages, at block sizes 16, 64 and 128; its tests
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_paged_attention.py \
    -k "tma or tolerance_rule or head_major" 2>&1 | tail -4
  timeout 200 python3 benchmarks/paged_decode_study.py --parts tma sdpa --block-size 16 \
    --out "$OUT/paged_decode_tma_bs16_h200.json" > "$OUT/paged_decode_tma_bs16_h200.txt" 2>&1
  echo "bs16 rc=$?"; sed -n '/^summary/,$p' "$OUT/paged_decode_tma_bs16_h200.txt"
  for bs in 64 128; do
    timeout 110 python3 benchmarks/paged_decode_study.py --parts tma sdpa --block-size $bs --batches 16 64 \
      --lengths 1024 4096 --out "$OUT/paged_decode_tma_bs${bs}_h200.json" > "$OUT/paged_decode_tma_bs${bs}_h200.txt" 2>&1
    echo "bs$bs rc=$?"; sed -n '/^summary/,$p' "$OUT/paged_decode_tma_bs${bs}_h200.txt"
  done ;;
kernels13-c)  # issue 12: v3 (TMA, one split) the default where batch * Hkv fills half to all of the SMs with blocks of
  # 64+ tokens: the compiled paged tests, the recorded paged grid with it, and the rule's edges (B 8/12/16/24/32)
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_paged_attention.py \
    tests/test_serving_torch_runner.py 2>&1 | tail -4
  timeout 150 python3 benchmarks/paged_attention_bench.py --out "$OUT/paged_attention_h200.json" \
    > "$OUT/paged_attention_h200.txt" 2>&1; echo "grid rc=$?"; grep -E "^ *(1|16|64) +(1024|4096) +(16|128|-) " \
    "$OUT/paged_attention_h200.txt" | grep -v "num_splits\|tile=" | head -40
  for bs in 64 128; do
    timeout 90 python3 benchmarks/paged_decode_study.py --parts tma sdpa --block-size $bs --batches 8 12 24 32 \
      --lengths 1024 4096 --tma-sweep-min-batch 8 --tma-warps 4 --tma-stages 3 \
      --out "$OUT/paged_decode_tma_edges_bs${bs}_h200.json" > "$OUT/paged_decode_tma_edges_bs${bs}_h200.txt" 2>&1
    echo "edges bs$bs rc=$?"; sed -n '/^summary/,$p' "$OUT/paged_decode_tma_edges_bs${bs}_h200.txt"
  done ;;
kernels13-d)  # the recorded paged grid again: kernels13-c's stopped at the tile sweep (a tile= call raised under the
  # new default; fixed: an explicit tile that is not the block size runs v1), with the default-choice test
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_paged_attention.py -k "default_runs_tma" 2>&1 | tail -1
  timeout 200 python3 benchmarks/paged_attention_bench.py --out "$OUT/paged_attention_h200.json" \
    > "$OUT/paged_attention_h200.txt" 2>&1; echo "grid rc=$?"; grep -v "num_splits\|tile=" "$OUT/paged_attention_h200.txt" ;;
kernels13-e)  # issue 12: v3 at B=16 streams at cuDNN's rate with a larger fixed cost; part of it may be the two tensor
  # descriptors every program builds in scratch memory: the same loop with them made once on the host; its tests
  timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_paged_attention.py -k "tma" 2>&1 | tail -1
  for bs in 128 64; do
    timeout 150 python3 benchmarks/paged_decode_study.py --parts tma sdpa --block-size $bs --batches 12 16 \
      --lengths 1024 4096 16384 --tma-host 0 1 --tma-warps 4 --tma-stages 3 --tma-sweep-min-batch 12 \
      --out "$OUT/paged_decode_tma_host_bs${bs}_h200.json" > "$OUT/paged_decode_tma_host_bs${bs}_h200.txt" 2>&1
    echo "host bs$bs rc=$?"; sed -n '/^summary/,$p' "$OUT/paged_decode_tma_host_bs${bs}_h200.txt"
  done ;;
kernels13-f)  # issue 12: v3 with host descriptors the default at B*Hkv in (SMs/2, SMs] with 64+-token blocks: its tests,
  # the recorded paged grid, and v3 where the rule does not pick it (B 1/32/64, block sizes 128 and 64)
  timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_paged_attention.py -k "tma or default" 2>&1 | tail -1
  timeout 170 python3 benchmarks/paged_attention_bench.py --out "$OUT/paged_attention_h200.json" \
    > "$OUT/paged_attention_h200.txt" 2>&1; echo "grid rc=$?"; grep -v "num_splits\|tile=" "$OUT/paged_attention_h200.txt"
  for bs in 128 64; do
    timeout 100 python3 benchmarks/paged_decode_study.py --parts tma sdpa --block-size $bs --batches 1 32 64 \
      --lengths 1024 4096 --tma-host 1 --tma-warps 4 --tma-stages 3 --tma-sweep-min-batch 1 \
      --out "$OUT/paged_decode_tma_others_bs${bs}_h200.json" > "$OUT/paged_decode_tma_others_bs${bs}_h200.txt" 2>&1
    echo "others bs$bs rc=$?"; sed -n '/^summary/,$p' "$OUT/paged_decode_tma_others_bs${bs}_h200.txt"
  done ;;
kernels13-g)  # issue 12: the paged v3 loop gained most from descriptors made on the host; the flash forward's TMA
  # versions build four per tile in the kernel. Where the forward misses cuDNN (causal d=128 at 1K/4K, causal d=64
  # at 1K): v1 against the TMA versions with descriptors built in the kernel and made on the host, all providers
  # timed by CUDA-graph replays in one process; the host-descriptor tests compiled
  timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_flash_attention.py -k host_desc 2>&1 | tail -1
  timeout 150 python3 benchmarks/flash_attention_tune.py --head-dims 128 --causal True --seq-lens 1024 4096 \
    --impls v1 v2 v4 --host-desc 0 1 --cudagraph --only v1:64,64,4,3 v1:128,64,8,3 v2:128,128,8,3 v2:128,64,8,3 \
    v4:128,64,8,3x1 --out "$OUT/flash_attention_tune_hostdesc128_h200.json" \
    > "$OUT/flash_attention_tune_hostdesc128_h200.txt" 2>&1; echo "d128 rc=$?"
  sed -n '/^best per point/,$p' "$OUT/flash_attention_tune_hostdesc128_h200.txt"
  timeout 90 python3 benchmarks/flash_attention_tune.py --head-dims 64 --causal True --seq-lens 1024 \
    --impls v1 v2 v4 --host-desc 0 1 --cudagraph --only v1:64,64,4,3 v2:128,64,4,3 v2:64,64,4,3 v4:128,64,4,3x1 \
    --out "$OUT/flash_attention_tune_hostdesc64_h200.json" > "$OUT/flash_attention_tune_hostdesc64_h200.txt" 2>&1
  echo "d64 rc=$?"; sed -n '/^best per point/,$p' "$OUT/flash_attention_tune_hostdesc64_h200.txt" ;;
kernels13-h)  # kernels13-g cut to the causal d=128 points, for the device time left (its tune step checks every
  # configuration's output against cuDNN's)
  timeout 170 python3 benchmarks/flash_attention_tune.py --head-dims 128 --causal True --seq-lens 4096 1024 \
    --impls v1 v2 v4 --host-desc 0 1 --cudagraph --only v1:64,64,4,3 v1:128,64,8,3 v2:128,128,8,3 \
    v4:128,64,8,3x1 --out "$OUT/flash_attention_tune_hostdesc128_h200.json" \
    > "$OUT/flash_attention_tune_hostdesc128_h200.txt" 2>&1; echo "d128 rc=$?"
  grep -E "^ *128 " "$OUT/flash_attention_tune_hostdesc128_h200.txt"; sed -n '/^best per point/,$p' "$OUT/flash_attention_tune_hostdesc128_h200.txt" ;;
kernels13-i)  # the fast launch path with host descriptors (classed by dtype and box), compiled: the paged v3 tests and
  # the forward's host-descriptor tests for v2, with the launch tests
  timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels_paged_attention.py tests/test_kernels_launch.py \
    tests/test_kernels_flash_attention.py -k "fast_launch or default_runs_tma or tma_loop_matches or (host_desc and v2) or arg_class" \
    > "$OUT/kernel_tests_kernels13i.txt" 2>&1; echo "rc=$?"; tail -5 "$OUT/kernel_tests_kernels13i.txt" ;;
kernels14)  # issue 12: the paged gap left is 16-token blocks at B=16, where v3's one-block step is too small. v3 with
  # several blocks per step (tile 64 / 128: 4 / 8 boxes per step, all in flight together) against v1 and SDPA at
  # B 16 / 32 (swept: splits x warps x stages), at B=1 over long caches, and at block size 64; the compiled tests
  timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels_paged_attention.py \
    tests/test_serving_torch_runner.py > "$OUT/kernel_tests_kernels14.txt" 2>&1; echo "tests rc=$?"
  tail -3 "$OUT/kernel_tests_kernels14.txt"
  timeout 200 python3 benchmarks/paged_decode_study.py --parts tma sdpa --block-size 16 --batches 16 32 \
    --lengths 1024 4096 16384 --tma-tiles 64 128 --tma-host 1 --tma-warps 4 8 --tma-stages 2 3 \
    --out "$OUT/paged_decode_tma_steps_bs16_h200.json" > "$OUT/paged_decode_tma_steps_bs16_h200.txt" 2>&1
  echo "bs16 rc=$?"; sed -n '/^summary/,$p' "$OUT/paged_decode_tma_steps_bs16_h200.txt"
  timeout 100 python3 benchmarks/paged_decode_study.py --parts tma sdpa --block-size 16 --batches 1 \
    --lengths 4096 16384 131072 --tma-tiles 128 --tma-host 1 --tma-warps 4 --tma-stages 3 --tma-sweep-min-batch 1 \
    --out "$OUT/paged_decode_tma_steps_b1_h200.json" > "$OUT/paged_decode_tma_steps_b1_h200.txt" 2>&1
  echo "b1 rc=$?"; sed -n '/^summary/,$p' "$OUT/paged_decode_tma_steps_b1_h200.txt"
  timeout 80 python3 benchmarks/paged_decode_study.py --parts tma sdpa --block-size 64 --batches 16 32 \
    --lengths 1024 4096 --tma-tiles 64 128 --tma-host 1 --tma-warps 4 --tma-stages 3 \
    --out "$OUT/paged_decode_tma_steps_bs64_h200.json" > "$OUT/paged_decode_tma_steps_bs64_h200.txt" 2>&1
  echo "bs64 rc=$?"; sed -n '/^summary/,$p' "$OUT/paged_decode_tma_steps_bs64_h200.txt" ;;
kernels14-b)  # issue 12: v3 the default where batch * Hkv is in (SMs/2, 2 SMs] with 64+-token blocks (B=32 ran v3 at
  # 1.03-1.12x v1): the compiled paged and serving-runner tests, and the recorded paged grid, now with B=32
  timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels_paged_attention.py \
    tests/test_serving_torch_runner.py > "$OUT/kernel_tests_kernels14b.txt" 2>&1; echo "tests rc=$?"
  tail -3 "$OUT/kernel_tests_kernels14b.txt"
  timeout 330 python3 benchmarks/paged_attention_bench.py --out "$OUT/paged_attention_h200.json" \
    > "$OUT/paged_attention_h200.txt" 2>&1; echo "grid rc=$?"; grep -v "num_splits\|tile=" "$OUT/paged_attention_h200.txt" ;;
kernels14-c)  # issue 12: at B=32 with 128-token blocks v3 ran at 0.93x cuDNN (L=1K) against 0.99x with 64-token
  # blocks: at 3 stages a 128-token program holds 136 KiB of shared memory, one per SM, and 256 programs take two
  # waves. v3 at 2 and 3 stages at B=32 (both block sizes), then the recorded grid with block sizes 16, 64, 128 and
  # v3 at 2 stages past the SM count (tma_config); the tests of the changed default
  timeout 100 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels_paged_attention.py -k "tma or default" \
    > "$OUT/kernel_tests_kernels14c.txt" 2>&1; echo "tests rc=$?"; tail -1 "$OUT/kernel_tests_kernels14c.txt"
  for bs in 128 64; do
    timeout 80 python3 benchmarks/paged_decode_study.py --parts tma sdpa --block-size $bs --batches 32 \
      --lengths 1024 4096 16384 --tma-host 1 --tma-warps 4 --tma-stages 2 3 \
      --out "$OUT/paged_decode_tma_stages_bs${bs}_h200.json" > "$OUT/paged_decode_tma_stages_bs${bs}_h200.txt" 2>&1
    echo "stages bs$bs rc=$?"; grep "num_splits=1:" "$OUT/paged_decode_tma_stages_bs${bs}_h200.txt"
  done
  timeout 300 python3 benchmarks/paged_attention_bench.py --block-sizes 16 64 128 --out "$OUT/paged_attention_h200.json" \
    > "$OUT/paged_attention_h200.txt" 2>&1; echo "grid rc=$?"; grep -v "num_splits\|tile=" "$OUT/paged_attention_h200.txt" ;;
kernels14-d)  # issue 12: kernels14-c's 2 stages past the SM count helped 128-token blocks (two programs now fit an SM)
  # and hurt 64-token ones (three fit at 3 stages already): tma_config takes fewer stages only where that lets all
  # programs be resident. The recorded grid again (block sizes 16, 64, 128) and the tests of the default, compiled
  timeout 300 python3 benchmarks/paged_attention_bench.py --block-sizes 16 64 128 --out "$OUT/paged_attention_h200.json" \
    > "$OUT/paged_attention_h200.txt" 2>&1; echo "grid rc=$?"; grep -E "^ +(16|32) " "$OUT/paged_attention_h200.txt" | grep -v "num_splits\|tile="
  timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels_paged_attention.py -k "tma or default" \
    > "$OUT/kernel_tests_kernels14d.txt" 2>&1; echo "tests rc=$?"; tail -2 "$OUT/kernel_tests_kernels14d.txt" ;;
kernels14-e)  # issue 12: the widened rule covers B=17-33 (Hkv=8); B=24 was measured only with descriptors built in the
  # kernel at 3 stages (128-token blocks 0.93 / 0.99x v1). v1 against the default v3 (host descriptors, tma_config) at
  # B=24, block sizes 128 and 64; then the several-blocks tests compiled (tma_config now sizes the step)
  for bs in 128 64; do
    timeout 70 python3 benchmarks/paged_decode_study.py --parts tma sdpa --block-size $bs --batches 24 \
      --lengths 1024 4096 16384 --tma-host 1 --tma-sweep-min-batch 999 \
      --out "$OUT/paged_decode_tma_b24_bs${bs}_h200.json" > "$OUT/paged_decode_tma_b24_bs${bs}_h200.txt" 2>&1
    echo "b24 bs$bs rc=$?"; grep -E "tma=|sdpa_cudnn" "$OUT/paged_decode_tma_b24_bs${bs}_h200.txt"
  done
  timeout 80 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels_paged_attention.py \
    -k "several_blocks or default_runs_tma or tma_config" > "$OUT/kernel_tests_kernels14e.txt" 2>&1
  echo "tests rc=$?"; tail -1 "$OUT/kernel_tests_kernels14e.txt" ;;
kernels15)  # issue 12: the paged gap left is 16-token blocks at B >= 16. In the engine's (slot, head, dim) pool a block of
  # every KV head is one contiguous run (32 KiB at 16 tokens x 8 heads, D=128): the all-heads kernel copies it as one
  # TMA box per step (minillm/kernels/paged_heads.py; interpreter-tested, AOT-compiled, never run compiled before).
  # Its compiled tests, then against v1 (and v3) and SDPA at B 1/16/32/64, swept over splits x warps x stages
  timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels_paged_heads.py \
    > "$OUT/kernel_tests_kernels15.txt" 2>&1; echo "tests rc=$?"; tail -3 "$OUT/kernel_tests_kernels15.txt"
  timeout 330 python3 benchmarks/paged_decode_study.py --parts heads sdpa --block-size 16 --batches 16 32 64 1 \
    --lengths 1024 4096 16384 --out "$OUT/paged_decode_heads_bs16_h200.json" > "$OUT/paged_decode_heads_bs16_h200.txt" 2>&1
  echo "heads rc=$?"; sed -n '/^summary/,$p' "$OUT/paged_decode_heads_bs16_h200.txt" ;;
kernels16)  # issue 12, closing: the recorded flash grid again with today's defaults (plans, the LSE fix, v5 training
  # forward, backward plans), warmed up, flex timed beside every point of N 1K/4K/16K; the N=1K training step first
  # on the fresh host, eager and from CUDA graphs (the chapter's host rule reads it) (~9 min)
  timeout 100 python3 benchmarks/flash_attention_bwd_bench.py --points 64:1024 128:1024 --flex-points 64:1024 128:1024 \
    --providers minillm sdpa_flash sdpa_cudnn --graphs --sweep \
    --out "$OUT/flash_attention_n1k_kernels16_h200.json" > "$OUT/flash_attention_n1k_kernels16_h200.txt" 2>&1
  echo "n1k rc=$?"; grep -E "^ +(64|128) " "$OUT/flash_attention_n1k_kernels16_h200.txt"
  flash_grid
  grep -E "minillm|flex|cudnn|flash" "$TX" | grep -v memory | cut -c1-90 ;;
kernels17)  # issue 12: the causal d=128 forward past 4K keys runs v2 with host descriptors by default
  # (host_descriptors_pay): its compiled tests; the default against v1 side by side in one process (causal d=128,
  # N 4K/8K/16K); then the recorded grid again, as kernels16, with the new default (~9 min)
  timeout 130 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels_flash_attention.py \
    -k "host_desc or never_replays or (training_default and 4096) or fwd_plan or plan_replay or plan_keys" \
    > "$OUT/kernel_tests_kernels17.txt" 2>&1; echo "tests rc=$?"; tail -3 "$OUT/kernel_tests_kernels17.txt"
  timeout 60 python3 benchmarks/flash_attention_bench.py --modes fwd --head-dims 128 --seq-lens 4096 8192 16384 \
    --providers minillm minillm_v1 sdpa_cudnn sdpa_flash --no-memory --causal-only \
    --out "$OUT/flash_attention_hostdesc_default_h200.json" > "$OUT/flash_attention_hostdesc_default_h200.txt" 2>&1
  echo "side by side rc=$?"; cat "$OUT/flash_attention_hostdesc_default_h200.txt"
  flash_grid
  grep -E "^fwd +128 .*True" "$TX" | cut -c1-90 ;;
kernels18)  # issue 12: the 16-token misses (B 16/32 at L=1K): v1 with one split (no merge launch) or two, deeper
  # pipelines (3-5 stages), 64/128-token tiles, 4/8 warps, beside SDPA; kernels10-b swept only half/default/double
  # splits and 2-3 stages (~4 min)
  timeout 420 python3 benchmarks/paged_decode_study.py --parts loops sdpa --batches 16 32 --lengths 1024 \
    --loop-prefetch 0 --loop-tiles 64 128 --loop-warps 4 8 --loop-stages 3 4 5 --loop-splits 1 2 4 8 \
    --out "$OUT/paged_decode_v1_deep_h200.json" > "$OUT/paged_decode_v1_deep_h200.txt" 2>&1
  echo "sweep rc=$?"; sed -n '/^summary/,$p' "$OUT/paged_decode_v1_deep_h200.txt"
  python3 - "$OUT/paged_decode_v1_deep_h200.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
for B in (16, 32):
    sd = max(r["tbps"] for r in rows if r.get("part") == "sdpa" and r["B"] == B and r.get("tbps"))
    lo = sorted((r for r in rows if r.get("part") == "loops" and r["B"] == B and r.get("tbps")), key=lambda r: -r["tbps"])
    dflt = next(r for r in lo if r.get("num_warps") is None)
    print(f"B={B}: sdpa {sd:.2f} default {dflt['tbps']:.2f} ({dflt['tbps'] / sd:.2f})")
    for r in lo[:6]:
        print(f"   {r['tbps']:.2f} ({r['tbps'] / sd:.2f}) tile {r.get('tile')} warps {r['num_warps']} stages {r['num_stages']} splits {r.get('num_splits')}")
PY
  ;;
kernels19)  # issue 12: the causal forward's grid heaviest first by groups of heads (_causal_order) instead of one head
  # at a time: compiled tests; side by side with the old order (minillm_headorder) in one process, forward and
  # forward+backward, causal, every D and N; then the recorded grid again (~10 min)
  timeout 110 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels_flash_attention.py \
    -k "causal_order or never_replays or (gpu_tolerance_rule and not backward) or lse_matches_float64" \
    > "$OUT/kernel_tests_kernels19.txt" 2>&1; echo "tests rc=$?"; tail -3 "$OUT/kernel_tests_kernels19.txt"
  timeout 85 python3 benchmarks/flash_attention_bench.py --modes fwd fwd+bwd --causal-only --no-memory \
    --providers minillm minillm_headorder sdpa_cudnn sdpa_flash --bwd-seq-lens 1024 4096 \
    --out "$OUT/flash_attention_causal_order_h200.json" > "$OUT/flash_attention_causal_order_h200.txt" 2>&1
  echo "side by side rc=$?"; grep -E "minillm" "$OUT/flash_attention_causal_order_h200.txt" | cut -c1-90
  flash_grid
  grep -E "^fwd +(64|128) .*True +(minillm|sdpa_cudnn)" "$TX" | cut -c1-90 ;;
kernels20)  # issue 12, last: the compiled tests after the review fixes (host descriptors only with both lengths past
  # the threshold, one head group for non-causal launches, NaN-filled outputs in the causal-order test), then v2 with
  # host descriptors over other tiles at causal d=128 4K/16K, where the cuDNN target is still missed (~5 min)
  timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels_flash_attention.py \
    -k "causal_order or host_desc or never_replays or fwd_plan or plan_replay or plan_keys or (training_default and 4096)" \
    > "$OUT/kernel_tests_kernels20.txt" 2>&1; echo "tests rc=$?"; tail -3 "$OUT/kernel_tests_kernels20.txt"
  timeout 200 python3 benchmarks/flash_attention_tune.py --head-dims 128 --causal True --seq-lens 4096 16384 \
    --impls v1 v2 --host-desc 1 --cudagraph --only v1:128,64,8,3 v2:128,128,8,2 v2:128,128,8,3 v2:128,128,8,4 \
    v2:128,64,8,3 v2:128,64,8,4 v2:128,64,4,3 v2:64,128,4,3 v2:64,64,4,3 v2:64,64,4,4 \
    --out "$OUT/flash_attention_tune_hostdesc_tiles_h200.json" > "$OUT/flash_attention_tune_hostdesc_tiles_h200.txt" 2>&1
  echo "tiles rc=$?"; grep -E "^ *128 " "$OUT/flash_attention_tune_hostdesc_tiles_h200.txt" | cut -c1-150 ;;
kernels21)  # (ran at commit abdd8b6; v6-v8 were reverted after kernels22, so it no longer runs as is)
  # issue 12: the causal forward in two launches (v6 / v7: the unmasked key tiles warp-specialized, then the
  # diagonal resumed from their O and LSE): compiled tests in 8 shards; v6 / v7 tiles beside the defaults (v1 at 1K,
  # v2 with host descriptors from 4K), cuDNN and FA2 from CUDA graphs at causal d=128; then eagerly, side by side
  # with the default in one process, every D and N, forward and forward+backward (~9 min)
  K21="causal_warp_specialized or (impls_match and (v6 or v7)) or (gpu_tolerance_rule and not backward and (v6 or v7))"
  K21="$K21 or (lse_matches_float64 and (v6 or v7 or None)) or (training_default and 4096)"
  python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_kernels_flash_attention.py \
    -k "$K21" 2>/dev/null | run_shards kernel_tests_kernels21 8 150
  timeout 220 python3 benchmarks/flash_attention_tune.py --head-dims 128 --causal True --seq-lens 1024 4096 16384 \
    --impls v1 v2 v6 v7 --host-desc 1 --cudagraph --repeats 5 --only v1:64,64,4,3 v2:128,128,8,3 v6:128,128,4,2 \
    v6:128,128,8,2 v6:128,64,8,3 v7:128,128,4,2x1 v7:128,128,4,2x2 v7:128,128,8,2x1 \
    --out "$OUT/flash_attention_tune_split_h200.json" > "$OUT/flash_attention_tune_split_h200.txt" 2>&1
  echo "tiles rc=$?"; grep -E "^ *128 |^D=" "$OUT/flash_attention_tune_split_h200.txt" | cut -c1-150
  timeout 150 python3 benchmarks/flash_attention_bench.py --modes fwd fwd+bwd --causal-only --no-memory \
    --providers minillm minillm_v6 minillm_v7 sdpa_cudnn sdpa_flash --bwd-seq-lens 1024 4096 \
    --out "$OUT/flash_attention_split_h200.json" > "$OUT/flash_attention_split_h200.txt" 2>&1
  echo "side by side rc=$?"; grep -E "minillm|cudnn" "$OUT/flash_attention_split_h200.txt" | cut -c1-90 ;;
kernels22)  # (ran at commit 6c5684e; reverted after, as kernels21)
  # issue 12: v8, the causal diagonal tile before the warp-specialized loop in one launch (v6's second launch
  # cost more than warp specialization saved below 16K): compiled tests in 6 shards; tiles beside v1, v2 with host
  # descriptors and v6 from CUDA graphs at causal d=128; then eagerly beside the default, every D and N (~8 min)
  K22="causal_warp_specialized or (gpu_tolerance_rule and not backward and v8) or (lse_matches_float64 and v8)"
  python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_kernels_flash_attention.py \
    -k "$K22" 2>/dev/null | run_shards kernel_tests_kernels22 6 140
  timeout 200 python3 benchmarks/flash_attention_tune.py --head-dims 128 --causal True --seq-lens 1024 4096 16384 \
    --impls v1 v2 v6 v8 --host-desc 1 --cudagraph --repeats 5 --only v1:64,64,4,3 v2:128,128,8,3 v6:128,128,4,2 \
    v8:128,128,4,2 v8:128,128,4,3 v8:128,128,8,2 v8:64,64,4,3 \
    --out "$OUT/flash_attention_tune_diag_h200.json" > "$OUT/flash_attention_tune_diag_h200.txt" 2>&1
  echo "tiles rc=$?"; grep -E "^ *128 |^D=" "$OUT/flash_attention_tune_diag_h200.txt" | cut -c1-150
  timeout 110 python3 benchmarks/flash_attention_bench.py --modes fwd --causal-only --no-memory \
    --providers minillm minillm_v6 minillm_v8 sdpa_cudnn sdpa_flash \
    --out "$OUT/flash_attention_diag_h200.json" > "$OUT/flash_attention_diag_h200.txt" 2>&1
  echo "side by side rc=$?"; grep -E "minillm|cudnn" "$OUT/flash_attention_diag_h200.txt" | cut -c1-90 ;;
kernels23)  # issue 12: v2 with host descriptors, its 128 x 128 tiles against 64 x 64 (which won at 4K in kernels20) at
  # causal d=128 4K, 8K, 16K: twice from CUDA graphs and once eagerly, cuDNN and FA2 in each process (~4 min)
  for t in g1 g2 e; do
    G=--cudagraph; [ "$t" = e ] && G=
    timeout 100 python3 benchmarks/flash_attention_tune.py --head-dims 128 --causal True --seq-lens 4096 8192 16384 \
      --impls v2 --host-desc 1 $G --only v2:128,128,8,3 v2:64,64,4,3 \
      --out "$OUT/flash_attention_hostdesc_tiles_$t.json" > "$OUT/flash_attention_hostdesc_tiles_$t.txt" 2>&1
    echo "$t rc=$?"; grep -E "^D=" "$OUT/flash_attention_hostdesc_tiles_$t.txt" | cut -c1-160
  done ;;
kernels24)  # issue 12: v2 with host descriptors on 64 x 64 tiles below HOST_DESC_SMALL_TILES_BELOW keys (kernels23): the
  # compiled tests of that path in 6 shards, then the recorded grid again (~9 min)
  K24="host_desc or never_replays or (training_default and 4096) or (gpu_tolerance_rule and not backward and v2)"
  K24="$K24 or causal_order or lse_matches_float64"
  flash_shards kernel_tests_kernels24 6 110 "$K24"
  grid_and_causal ;;
kernels25)  # issue 12: v6 back, its partial O in float32 and its second launch on smaller tiles: the compiled tests of
  # v6 in 6 shards, then where its time goes (flash_attention_split_study.py: both launches apart, six settings of
  # the second, beside the default, cuDNN and FA2) at causal d=128 4K and 16K, then 1K and 8K with the first setting
  K25="split_causal or (gpu_tolerance_rule and not backward and v6) or (lse_matches_float64 and v6) or resumes"
  flash_shards kernel_tests_kernels25 6 120 "$K25"
  timeout 230 python3 benchmarks/flash_attention_split_study.py --seq-lens 4096 16384 \
    --out "$OUT/flash_attention_split_study_h200.json" > "$OUT/flash_attention_split_study_h200.txt" 2>&1
  echo "study rc=$?"; grep -E "default|v6 |cudnn" "$OUT/flash_attention_split_study_h200.txt" | cut -c1-110
  timeout 100 python3 benchmarks/flash_attention_split_study.py --seq-lens 1024 8192 --settings 1 \
    --out "$OUT/flash_attention_split_study2_h200.json" > "$OUT/flash_attention_split_study2_h200.txt" 2>&1
  echo "study2 rc=$?"; grep -E "default|v6 |cudnn" "$OUT/flash_attention_split_study2_h200.txt" | cut -c1-110 ;;
kernels26)  # issue 12: v6 the default at d=128 causal from SPLIT_MIN_N (16K) queries and keys (kernels25): the compiled
  # tests of the forward's defaults and of v6 in 6 shards, then the recorded grid again (~5 min)
  K26="split_min_n or split_causal or resumes or host_desc or never_replays or (training_default and 4096)"
  K26="$K26 or (gpu_tolerance_rule and not backward and (v2 or v6)) or lse_matches_float64 or causal_order"
  flash_shards kernel_tests_kernels26 6 150 "$K26"
  grid_and_causal ;;
kernels27)  # issue 12, after reading the change: the two v6 GPU tests on their shared float64 reference (causal_gold),
  # and the split study's default row now records what the default ran (~2 min)
  flash_shards kernel_tests_kernels27 4 150 "split_causal or split_min_n"
  timeout 100 python3 benchmarks/flash_attention_split_study.py --seq-lens 1024 16384 --settings 1 \
    --out "$OUT/flash_attention_split_study_check_h200.json" > "$OUT/flash_attention_split_study_check_h200.txt" 2>&1
  echo "study rc=$?"; python3 -c "import json; print([(r['N'], r['ran']) for r in json.load(open('$OUT/flash_attention_split_study_check_h200.json'))['rows'] if r['provider'] == 'default'])" ;;
kernels28)  # (ran at commit f5415dd; v9 / v10 are reverted, so it no longer runs as written) issue 12: v9 / v10, the causal forward warp-specialized in one launch, every key tile in one masked loop
  # (mask built in the loop): their compiled tests in 6 shards, then the causal d=128 tune beside the default's
  # versions, cuDNN and FA2, every provider from CUDA graphs, each warp-specialized config rechecked on 5 fresh inputs
  K28="(split_causal or impls_match_reference or gpu_tolerance_rule or lse_matches_float64) and (v9 or v10)"
  flash_shards kernel_tests_kernels28 6 150 "$K28"
  timeout 300 python3 benchmarks/flash_attention_tune.py --head-dims 128 --causal True \
    --seq-lens 1024 2048 4096 8192 16384 --impls v1 v2 v6 v9 v10 --host-desc 1 --cudagraph --repeats 5 \
    --only v1:64,64,4,3 v1:128,64,8,3 v2:128,128,8,3 v2:64,64,4,3 v6:128,128,4,2 v9:128,128,4,2 v9:128,128,8,2 \
    v10:128,128,4,2x1 v10:128,128,4,2x2 --out "$OUT/flash_attention_tune_oneloop_h200.json" \
    > "$OUT/flash_attention_tune_oneloop_h200.txt" 2>&1
  echo "tune rc=$?"; sed -n '/best per point/,$p' "$OUT/flash_attention_tune_oneloop_h200.txt" | cut -c1-400 ;;
kernels29)  # (ran at commit f5415dd; no longer runs as written) issue 12: v9 / v10 with the mask behind a branch (only tiles past the diagonal: ONE_LOOP_BRANCH): their
  # fresh-input tests, then the causal d=128 tune from CUDA graphs beside v2 with host descriptors and v6; then v2 with
  # host descriptors (64 x 64) against v1 at 1K-4K, eagerly (kernels28 had it 5-6% ahead of v1 at 1K-2K from graphs)
  flash_shards kernel_tests_kernels29 5 150 "split_causal and (v9 or v10) and True"
  timeout 200 python3 benchmarks/flash_attention_tune.py --head-dims 128 --causal True \
    --seq-lens 2048 4096 8192 16384 --impls v2 v6 v9 v10 --host-desc 1 --cudagraph --repeats 5 \
    --fa-set ONE_LOOP_BRANCH=True --only v2:128,128,8,3 v2:64,64,4,3 v6:128,128,4,2 v9:128,128,4,2 \
    v10:128,128,4,2x1 --out "$OUT/flash_attention_tune_oneloop_branch_h200.json" \
    > "$OUT/flash_attention_tune_oneloop_branch_h200.txt" 2>&1
  echo "tune rc=$?"; sed -n '/best per point/,$p' "$OUT/flash_attention_tune_oneloop_branch_h200.txt" | cut -c1-400
  for R in e1 e2; do
    timeout 100 python3 benchmarks/flash_attention_tune.py --head-dims 128 --causal True --seq-lens 1024 2048 4096 \
      --impls v1 v2 --host-desc 1 --only v1:64,64,4,3 v1:128,64,8,3 v2:64,64,4,3 \
      --out "$OUT/flash_attention_tune_hostdesc_short_${R}_h200.json" > "$OUT/flash_attention_tune_hostdesc_short_${R}_h200.txt" 2>&1
    echo "eager $R rc=$?"; sed -n '/best per point/,$p' "$OUT/flash_attention_tune_hostdesc_short_${R}_h200.txt" | cut -c1-300
  done ;;
kernels30)  # (ran at commit 3b2418e; no longer runs as written) issue 12: v9 / v10 with their descriptors made on the host (TMA_HOST_DESCRIPTORS), and the default's v2
  # with host descriptors from 1K (HOST_DESC_MIN_N): the compiled tests of both, then the causal d=128 tune from CUDA graphs
  K30="(split_causal and (v9 or v10) and True) or training_default or host_desc or never_replays or causal_order"
  flash_shards kernel_tests_kernels30 6 150 "$K30"
  timeout 260 python3 benchmarks/flash_attention_tune.py --head-dims 128 --causal True \
    --seq-lens 2048 4096 8192 16384 --impls v2 v6 v9 v10 --host-desc 0 1 --cudagraph --repeats 5 \
    --only v2:128,128,8,3 v2:64,64,4,3 v6:128,128,4,2 v9:128,128,4,2 v10:128,128,4,2x1 \
    --out "$OUT/flash_attention_tune_oneloop_host_h200.json" > "$OUT/flash_attention_tune_oneloop_host_h200.txt" 2>&1
  echo "tune rc=$?"; sed -n '/best per point/,$p' "$OUT/flash_attention_tune_oneloop_host_h200.txt" | cut -c1-500 ;;
kernels31)  # issue 12: the recorded grid with v2 with host descriptors the d=128 causal default from 1K (HOST_DESC_MIN_N;
  # its compiled tests passed in kernels30), after v9 / v10 were reverted (~7 min)
  grid_and_causal ;;
kernels32)  # issue 12: the forward's ratio to cuDNN at the target points in 5 interleaved rounds, eager and from CUDA
  # graphs (cuDNN's own time at d=128 causal 4K moved 10% between grid runs while minillm's stayed within 1%)
  timeout 480 python3 benchmarks/flash_attention_ratio_study.py --rounds 5 \
    --out "$OUT/flash_attention_ratio_study_h200.json" > "$OUT/flash_attention_ratio_study_h200.txt" 2>&1
  echo "study rc=$?"; sed -n '/median ratio/,$p' "$OUT/flash_attention_ratio_study_h200.txt" ;;
kernels33)  # issue 12: the causal order's group size (CAUSAL_GROUP_PROGRAMS, chosen with 128-row tiles) for the default
  # causal d=128 path, v2 with host descriptors (64 x 64 tiles below 8K, 128 x 128 from 8K), 1K-8K from CUDA graphs:
  # one process per size, the sizes in two passes (the second in reverse order)
  for P in 1 2; do
    GS="128 256 512 1024 2048 1000000"; [ $P = 2 ] && GS="1000000 2048 1024 512 256 128"
    for G in $GS; do
      timeout 60 python3 benchmarks/flash_attention_tune.py --head-dims 128 --causal True --seq-lens 1024 2048 4096 8192 \
        --impls v2 --host-desc 1 --cudagraph --only v2:64,64,4,3 v2:128,128,8,3 --fa-set CAUSAL_GROUP_PROGRAMS=$G \
        --out "$OUT/flash_attention_tune_group_g${G}_p${P}_h200.json" > "$OUT/flash_attention_tune_group_g${G}_p${P}_h200.txt" 2>&1
      echo "G=$G pass $P rc=$?"; sed -n '/best per point/,$p' "$OUT/flash_attention_tune_group_g${G}_p${P}_h200.txt" | cut -c1-200
    done
  done ;;
kernels34)  # issue 12: CAUSAL_GROUP_PROGRAMS 256 against 512 (kernels33: +6% for v2 with host descriptors at d=128 causal 1K,
  # a tie from 2K to 8K) at the other causal defaults it orders: v1 (64 x 64) at d=64 1K-16K, v6 at d=128 16K, and the
  # d=128 1K point again; two passes, every provider from CUDA graphs
  for P in 1 2; do
    GS="256 512"; [ $P = 2 ] && GS="512 256"
    for G in $GS; do
      timeout 100 python3 benchmarks/flash_attention_tune.py --head-dims 64 128 --causal True \
        --seq-lens 1024 4096 16384 --impls v1 v2 v6 --host-desc 1 --cudagraph --repeats 1 \
        --only v1:64,64,4,3 v2:64,64,4,3 v6:128,128,4,2 --fa-set CAUSAL_GROUP_PROGRAMS=$G \
        --out "$OUT/flash_attention_tune_group2_g${G}_p${P}_h200.json" > "$OUT/g2_${G}_${P}.txt" 2>&1
      echo "G=$G pass $P rc=$?"; sed -n '/best per point/,$p' "$OUT/g2_${G}_${P}.txt" | cut -c1-200
    done
  done ;;
kernels35)  # issue 12: v2 with host descriptors on tiles not swept before (64-query tiles over 32 keys, which need less
  # shared memory, so three programs may share an SM; 64 x 64 with 2 stages), beside the default's tiles, causal d=128
  # 1K-8K, every provider from CUDA graphs, two passes (one file each)
  for P in 1 2; do
    timeout 150 python3 benchmarks/flash_attention_tune.py --head-dims 128 --causal True --seq-lens 1024 2048 4096 8192 \
      --impls v2 --host-desc 1 --cudagraph --only v2:64,64,4,3 v2:128,128,8,3 v2:64,32,4,3 v2:64,32,4,4 v2:64,64,4,2 \
      v2:64,32,4,2 --out "$OUT/flash_attention_tune_hostdesc_narrow_p${P}_h200.json" > "$OUT/narrow_p${P}.txt" 2>&1
    echo "pass $P rc=$?"; grep -E "^ 128 " "$OUT/narrow_p${P}.txt" | cut -c1-110
  done ;;
kernels36)  # issue 12, the session's last code (v9 / v10 reverted, HOST_DESC_MIN_N 1024): every flash attention test but the
  # heavy parametrizations, compiled, in 14 shards (~5 min)
  flash_shards kernel_tests_kernels36 14 270 "not ($HEAVY)" ;;
kernels37)  # issue 12: training calls (which need the LSE) take host descriptors only from HOST_DESC_MIN_N_LSE (4K): the
  # kernels31 grid had the eager d=128 causal N=1K forward + backward 28% slower with them from 1K. The N=1K step as
  # kernels16 ran it (the chapter's host rule reads it), then d=128 1K/2K with the threshold at 1K and at 4K (~4 min)
  timeout 110 python3 benchmarks/flash_attention_bwd_bench.py --points 64:1024 128:1024 --flex-points 64:1024 128:1024 \
    --providers minillm sdpa_flash sdpa_cudnn --graphs --sweep \
    --out "$OUT/flash_attention_n1k_kernels37_h200.json" > "$OUT/flash_attention_n1k_kernels37_h200.txt" 2>&1
  echo "n1k rc=$?"; grep -E "^ +(64|128) " "$OUT/flash_attention_n1k_kernels37_h200.txt"
  for L in 1024 4096; do
    timeout 70 python3 benchmarks/flash_attention_bwd_bench.py --points 128:1024 128:2048 --flex-points \
      --providers minillm sdpa_flash --graphs --sweep --fa-set HOST_DESC_MIN_N_LSE=$L \
      --out "$OUT/flash_attention_hostlse_${L}_h200.json" > "$OUT/flash_attention_hostlse_${L}_h200.txt" 2>&1
    echo "threshold $L rc=$?"; grep -E "^ +128 " "$OUT/flash_attention_hostlse_${L}_h200.txt"
  done ;;
kernels38)  # issue 12: host-descriptor calls keep plans now (launch.bind rebases the descriptors); the forward's lazy
  # rescale (FWD_LAZY_RESCALE) on trial. The compiled tests that cover them, the 1K/2K training step with the LSE
  # threshold at 1K and at 2K, then the lazy rescale against the default beside cuDNN in 5 rounds (~8 min)
  python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_kernels_launch.py tests/test_kernels_flash_attention.py \
    -k "launch or host_desc or plan or lazy or training_path" 2>/dev/null | run_shards kernel_tests_kernels38 8 200
  for L in 1024 2048; do
    timeout 70 python3 benchmarks/flash_attention_bwd_bench.py --points 128:1024 128:2048 --flex-points \
      --providers minillm sdpa_flash --graphs --sweep --fa-set HOST_DESC_MIN_N_LSE=$L \
      --out "$OUT/flash_attention_hostplan_${L}_h200.json" > "$OUT/flash_attention_hostplan_${L}_h200.txt" 2>&1
    echo "threshold $L rc=$?"; grep -E "^ +128 " "$OUT/flash_attention_hostplan_${L}_h200.txt"
  done
  timeout 150 python3 benchmarks/flash_attention_ratio_study.py --rounds 5 --head-dims 128 --causal True \
    --seq-lens 1024 2048 4096 8192 --variant FWD_LAZY_RESCALE=8.0 --out "$OUT/flash_attention_lazy_h200.json" \
    > /tmp/lazy.txt 2>&1  # (the device returns 8 files a call: the JSON holds every row and the summary)
  echo "lazy rc=$?"; sed -n '/median ratio/,$p' /tmp/lazy.txt; grep -E "Error|error" /tmp/lazy.txt | head -5
  timeout 90 python3 benchmarks/flash_attention_ratio_study.py --rounds 5 --head-dims 64 --causal False \
    --seq-lens 4096 8192 --variant FWD_LAZY_RESCALE=8.0 --out "$OUT/flash_attention_lazy64_h200.json" > /tmp/lazy64.txt 2>&1
  echo "lazy64 rc=$?"; sed -n '/median ratio/,$p' /tmp/lazy64.txt; grep -E "Error|error" /tmp/lazy64.txt | head -5 ;;
kernels39)  # issue 12: with plans, the 1K training step still ran 24% slower eagerly with the forward on host
  # descriptors (kernels38) at equal CUDA-graph time. Host issue time against GPU time per step, with cProfile's top
  # host functions: the defaults at d=64 / d=128 causal 1K, then d=128 causal with host descriptors from 1K (~2 min)
  timeout 150 python3 benchmarks/profile_attention_step.py --points 64:1024:causal 128:1024:causal --host-profile \
    --out "$OUT/attention_step_host_kernels39_h200.json" > "$OUT/attention_step_host_kernels39_h200.txt" 2>&1
  echo "defaults rc=$?"; grep -E "^D=|host issue" "$OUT/attention_step_host_kernels39_h200.txt"
  timeout 120 python3 benchmarks/profile_attention_step.py --points 128:1024:causal --host-profile \
    --fa-set HOST_DESC_MIN_N_LSE=1024 --out "$OUT/attention_step_hostdesc_kernels39_h200.json" \
    > "$OUT/attention_step_hostdesc_kernels39_h200.txt" 2>&1
  echo "host descriptors from 1K rc=$?"; grep -E "^D=|host issue" "$OUT/attention_step_hostdesc_kernels39_h200.txt" ;;
kernels40)  # issue 12: a Bound with host descriptors calls the C launcher itself, each descriptor encoded once per
  # tensor address (kernels39: Triton's wrapper cost ~100 us a call). The compiled tests that cover it (CUDA-graph
  # capture of a training step too), then the 1K step's host time and the 1K/2K training step with the LSE threshold
  # at 1K and at 2K, then inference with host descriptors from 1K against from 4K (v1 below) in 5 rounds (~8 min).
  # Only JSON files come back (the device returns 8 files a call); the console has the summaries.
  python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_kernels_launch.py tests/test_kernels_flash_attention.py \
    -k "launch or host_desc or plan or graph or training_path" 2>/dev/null | run_shards kernel_tests_kernels40 8 200
  for L in 2048 1024; do
    timeout 60 python3 benchmarks/profile_attention_step.py --points 128:1024:causal --fa-set HOST_DESC_MIN_N_LSE=$L \
      --out "$OUT/attention_step_hostraw_${L}_h200.json" > /tmp/prof_$L.txt 2>&1
    echo "profile threshold $L rc=$?"; grep -E "^D=|host issue" /tmp/prof_$L.txt
  done
  for L in 1024 2048; do
    timeout 70 python3 benchmarks/flash_attention_bwd_bench.py --points 128:1024 128:2048 --flex-points \
      --providers minillm sdpa_flash --graphs --sweep --fa-set HOST_DESC_MIN_N_LSE=$L \
      --out "$OUT/flash_attention_hostraw_${L}_h200.json" > /tmp/bwd_$L.txt 2>&1
    echo "threshold $L rc=$?"; grep -E "^ +128 " /tmp/bwd_$L.txt
  done
  timeout 120 python3 benchmarks/flash_attention_ratio_study.py --rounds 5 --head-dims 128 --causal True \
    --seq-lens 1024 2048 --variant HOST_DESC_MIN_N=4096 --out "$OUT/flash_attention_hostraw_inference_h200.json" \
    > /tmp/inf.txt 2>&1
  echo "inference rc=$?"; sed -n '/median ratio/,$p' /tmp/inf.txt; grep -E "Error" /tmp/inf.txt | head -3 ;;
kernels41)  # issue 12: HOST_DESC_MIN_N_LSE removed (training takes host descriptors from HOST_DESC_MIN_N, 1K, like
  # inference; kernels37-40 set it with --fa-set, so they run at commits before this one). The compiled tests of the
  # default paths, then the N=1K training step as kernels16 and 37 ran it (chapter 6's N=1K targets read it; ~3 min)
  python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_kernels_launch.py tests/test_kernels_flash_attention.py \
    -k "training_default_path or host_desc or graph or fwd_plan or plan_replay" 2>/dev/null | run_shards kernel_tests_kernels41 8 150
  timeout 110 python3 benchmarks/flash_attention_bwd_bench.py --points 64:1024 128:1024 --flex-points 64:1024 128:1024 \
    --providers minillm sdpa_flash sdpa_cudnn --graphs --sweep \
    --out "$OUT/flash_attention_n1k_kernels41_h200.json" > "$OUT/flash_attention_n1k_kernels41_h200.txt" 2>&1
  echo "n1k rc=$?"; grep -E "^ +(64|128) " "$OUT/flash_attention_n1k_kernels41_h200.txt" ;;
kernels42)  # issue 12, the session's last code (raw launch with cached descriptor encodings, one threshold,
  # PLAN_SETTINGS): the launch tests, then every flash attention test but the heavy parametrizations, compiled (~6 min)
  python3 -m pytest -q -p no:cacheprovider tests/test_kernels_launch.py > "$OUT/kernel_tests_kernels42_launch.txt" 2>&1
  echo "launch rc=$?"; tail -1 "$OUT/kernel_tests_kernels42_launch.txt"
  flash_shards kernel_tests_kernels42 14 270 "not ($HEAVY)" ;;
kernels43)  # issue 12, after the review: the training step with host descriptors from 1K (the default) against from
  # 4K (v1 at 1K and 2K), side by side in one process in 5 rounds, with the descriptors encoded per step; then the
  # launch tests and every flash test but the heavy ones, compiled, with skip reasons (-rs) (~6 min)
  timeout 200 python3 benchmarks/flash_attention_step_study.py --points 128:1024:causal 64:1024:causal 128:2048:causal \
    --variant HOST_DESC_MIN_N=4096 --out "$OUT/flash_attention_step_study_h200.json" > /tmp/study.txt 2>&1
  echo "study rc=$?"; sed -n '/median over rounds/,$p' /tmp/study.txt; grep -E "Error" /tmp/study.txt | head -3
  grep -oE "(minillm|variant) +eager.*encoded/step [0-9.]+" /tmp/study.txt | grep -oE "^[a-z]+|encoded/step [0-9.]+" | paste - - | sort | uniq -c
  python3 -m pytest -q -rs -p no:cacheprovider tests/test_kernels_launch.py > "$OUT/kernel_tests_kernels43_launch.txt" 2>&1
  echo "launch rc=$?"; tail -1 "$OUT/kernel_tests_kernels43_launch.txt"
  flash_shards kernel_tests_kernels43 14 270 "not ($HEAVY)"; grep -h "^SKIPPED" "$OUT/kernel_tests_kernels43.txt" | cut -c1-160 ;;
kernels44)  # issue 12: do_bench_cudagraph failed to capture the host-descriptor training step the first time per shape
  # (kernels39, 40, 43); each trial in a fresh process (~2 min)
  timeout 400 python3 benchmarks/check_graph_capture.py --out "$OUT/graph_capture_h200.json" > /tmp/cap.txt 2>&1
  echo "capture rc=$?"; cut -c1-330 /tmp/cap.txt ;;
kernels45)  # issue 12: kernels44 found the host-descriptor training step fails to capture only with plans; three more
  # trials at 1K: plans through Triton's descriptor wrapper, thread-local capture mode, plans for the backward only
  timeout 300 python3 benchmarks/check_graph_capture.py --seq-lens 1024 --only hostdesc_dobench_wrapper \
    hostdesc_thread_local hostdesc_dobench_noplan_fwd hostdesc_dobench --out "$OUT/graph_capture2_h200.json" > /tmp/cap.txt 2>&1
  echo "capture rc=$?"; cut -c1-330 /tmp/cap.txt ;;
kernels46)  # issue 12: the fix (during a capture, a host-descriptor forward decides anew instead of replaying its plan):
  # kernels44's failing trials again at 1K and 2K, then the compiled tests around it (~4 min)
  timeout 300 python3 benchmarks/check_graph_capture.py --seq-lens 1024 2048 --only hostdesc_dobench hostdesc_test_style \
    hostdesc_dobench_twice v1_dobench --out "$OUT/graph_capture_fixed_h200.json" > /tmp/cap.txt 2>&1
  echo "capture rc=$?"; cut -c1-200 /tmp/cap.txt
  python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_kernels_launch.py tests/test_kernels_flash_attention.py \
    -k "cuda_graph or host_desc or plan or training_default_path" 2>/dev/null | run_shards kernel_tests_kernels46 8 200 ;;
kernels47)  # issue 12: the cause (a Bound kept the first call's tensors in its descriptors: with an output, the autograd
  # graph of the first training step, whose gradient accumulators then broke later captures); the fix checked (~2 min)
  timeout 60 python3 benchmarks/check_graph_capture.py --seq-lens 1024 --only hostdesc_dobench hostdesc_test_style \
    --out "$OUT/graph_capture_kept_h200.json" > /tmp/cap.txt 2>&1
  echo "capture rc=$?"; cut -c1-200 /tmp/cap.txt
  timeout 90 python3 -m pytest -q -rs -p no:cacheprovider tests/test_kernels_launch.py tests/test_kernels_flash_attention.py \
    -k "cuda_graph or no_reference or replays_on_new_tensors" > "$OUT/kernel_tests_kernels47.txt" 2>&1
  echo "tests rc=$?"; tail -3 "$OUT/kernel_tests_kernels47.txt" ;;
kernels48)  # issue 12, after kernels47 confirmed the capture fix: the step study of kernels43 again (every round should
  # now capture), the refactored ratio study once (a smoke run), then every compiled kernel test but the heavy
  # parametrizations, in 14 shards (~8 min)
  timeout 190 python3 benchmarks/flash_attention_step_study.py --points 128:1024:causal 64:1024:causal 128:2048:causal \
    --variant HOST_DESC_MIN_N=4096 --out "$OUT/flash_attention_step_study_kernels48_h200.json" > /tmp/study.txt 2>&1
  echo "study rc=$?"; sed -n '/median over rounds/,$p' /tmp/study.txt; grep -E "Error|capture" /tmp/study.txt | head -3
  timeout 70 python3 benchmarks/flash_attention_ratio_study.py --rounds 1 --head-dims 128 --causal True --seq-lens 1024 \
    --variant HOST_DESC_MIN_N=4096 --out /tmp/ratio_smoke.json > /tmp/ratio.txt 2>&1
  echo "ratio smoke rc=$?"; tail -4 /tmp/ratio.txt | cut -c1-200
  python3 -m pytest --collect-only -q -p no:cacheprovider $KERNEL_TESTS -k "not ($HEAVY)" \
    | run_shards kernel_tests_kernels48 14 250 ;;
kernels48-heavy)  # the heavy parametrizations of the flash tests, compiled, at the final code (~4 min)
  python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_kernels_flash_attention.py -k "$HEAVY" \
    | run_shards kernel_tests_kernels48_heavy 14 300 ;;
kernels49)  # issue 12: the causal v2 in one key loop, the diagonal masked behind a branch (CAUSAL_DIAG_BRANCH), against
  # the two loops, beside cuDNN in 5 interleaved rounds at d=128 causal 1K-8K; then its compiled tests (~5 min)
  timeout 330 python3 benchmarks/flash_attention_ratio_study.py --head-dims 128 --causal True --seq-lens 1024 2048 4096 8192 \
    --variant CAUSAL_DIAG_BRANCH=True --out "$OUT/flash_attention_diag_branch_h200.json" > "$OUT/flash_attention_diag_branch_h200.txt" 2>&1
  echo "study rc=$?"; sed -n '/median ratio/,$p' "$OUT/flash_attention_diag_branch_h200.txt" | cut -c1-200
  timeout 150 python3 -m pytest -q -rfEs -p no:cacheprovider tests/test_kernels_flash_attention.py -k "diag_branch or plan_settings" \
    > "$OUT/kernel_tests_kernels49.txt" 2>&1; echo "tests rc=$?"; tail -3 "$OUT/kernel_tests_kernels49.txt" | cut -c1-300 ;;
kernels50)  # issue 12: kernels49 had the branch ahead at 8K (128 x 128 tiles, one program per SM) and even at 4K (64 x 64,
  # two per SM): (a) the branch with 128 x 128 tiles from 2K against the default, 7 rounds; (b) the branch at 4K and
  # 8K again, 7 rounds; (c) at 16K, v2 with the branch against the default's two-launch v6, 5 rounds (~4 min)
  R=benchmarks/flash_attention_ratio_study.py
  timeout 150 python3 $R --rounds 7 --head-dims 128 --causal True --seq-lens 2048 4096 \
    --variant CAUSAL_DIAG_BRANCH=True HOST_DESC_SMALL_TILES_BELOW=2048 --out "$OUT/flash_attention_diag_branch128_h200.json" \
    > "$OUT/flash_attention_diag_branch128_h200.txt" 2>&1
  echo "a rc=$?"; sed -n '/median ratio/,$p' "$OUT/flash_attention_diag_branch128_h200.txt" | cut -c1-200
  timeout 150 python3 $R --rounds 7 --head-dims 128 --causal True --seq-lens 4096 8192 \
    --variant CAUSAL_DIAG_BRANCH=True --out "$OUT/flash_attention_diag_branch2_h200.json" \
    > "$OUT/flash_attention_diag_branch2_h200.txt" 2>&1
  echo "b rc=$?"; sed -n '/median ratio/,$p' "$OUT/flash_attention_diag_branch2_h200.txt" | cut -c1-200
  timeout 200 python3 $R --rounds 5 --head-dims 128 --causal True --seq-lens 16384 \
    --variant CAUSAL_DIAG_BRANCH=True SPLIT_MIN_N=32768 --out "$OUT/flash_attention_diag_branch16k_h200.json" \
    > "$OUT/flash_attention_diag_branch16k_h200.txt" 2>&1
  echo "c rc=$?"; sed -n '/median ratio/,$p' "$OUT/flash_attention_diag_branch16k_h200.txt" | cut -c1-200 ;;
kernels51)  # issue 12: the new causal d=128 defaults (the diagonal behind a branch, 128 x 128 tiles from 2K, v6 from 32K):
  # every compiled kernel test but the heavy ones, the heavy forward ones, then the ratio study at every point
  # against the old defaults as the variant, 5 rounds (~6 min)
  python3 -m pytest --collect-only -q -p no:cacheprovider $KERNEL_TESTS -k "not ($HEAVY)" \
    | run_shards kernel_tests_kernels51 14 200
  python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_kernels_flash_attention.py \
    -k "test_forward_impls_match_reference or test_forward_tile_shapes_split" | run_shards kernel_tests_kernels51_heavy_fwd 14 200
  timeout 200 python3 benchmarks/flash_attention_ratio_study.py \
    --variant CAUSAL_DIAG_BRANCH=False HOST_DESC_SMALL_TILES_BELOW=8192 SPLIT_MIN_N=16384 \
    --out "$OUT/flash_attention_ratio_study_kernels51_h200.json" > "$OUT/flash_attention_ratio_study_kernels51_h200.txt" 2>&1
  echo "study rc=$?"; sed -n '/median ratio/,$p' "$OUT/flash_attention_ratio_study_kernels51_h200.txt" | cut -c1-200 ;;
kernels52)  # issue 12: the recorded flash grid at the new defaults (forward, forward+backward, flex beside both) (~6 min)
  grid_and_causal ;;
kernels53)  # issue 12: the N=1K training step at the new causal defaults (d=128 causal 1K now runs the diagonal behind
  # a branch), as kernels16, 37 and 41 ran it; chapter 6's N=1K targets read the newest run that passes its host rule
  timeout 130 python3 benchmarks/flash_attention_bwd_bench.py --points 64:1024 128:1024 --flex-points 64:1024 128:1024 \
    --providers minillm sdpa_flash sdpa_cudnn --graphs --sweep \
    --out "$OUT/flash_attention_n1k_kernels53_h200.json" > "$OUT/flash_attention_n1k_kernels53_h200.txt" 2>&1
  echo "n1k rc=$?"; grep -E "^ +(64|128) " "$OUT/flash_attention_n1k_kernels53_h200.txt" ;;
kernels54)  # issue 12: the checks left after kernels51 ran on the CPU only (the runtime-before-constexprs order,
  # the branch gated on CAUSAL, the zero-scale guard, last_forward_constexprs), compiled; then 32K, never compared:
  # v2 with the branch (SPLIT_MIN_N=65536) against the default two-launch v6, 5 interleaved rounds beside cuDNN (~5 min)
  timeout 200 python3 -m pytest -q -rfEs -p no:cacheprovider tests/test_kernels_launch.py tests/test_kernels_flash_attention.py \
    -k "runtime_parameters or diag_branch or zero_scale or plan_settings" > "$OUT/kernel_tests_kernels54.txt" 2>&1
  echo "tests rc=$?"; tail -3 "$OUT/kernel_tests_kernels54.txt" | cut -c1-300
  timeout 300 python3 benchmarks/flash_attention_ratio_study.py --rounds 5 --head-dims 128 --causal True --seq-lens 32768 \
    --variant SPLIT_MIN_N=65536 --out "$OUT/flash_attention_diag_branch32k_h200.json" \
    > "$OUT/flash_attention_diag_branch32k_h200.txt" 2>&1
  echo "32k rc=$?"; sed -n '/median ratio/,$p' "$OUT/flash_attention_diag_branch32k_h200.txt" | cut -c1-200 ;;
kernels55)  # issue 12: backward v6 (v4 with the dK/dV side in one warp-specialized loop; compiled on a CPU only so far,
  # results/aot_resources_bwd_v6_sm90.txt): its compiled tests (fresh inputs on NaN-filled memory, the tolerance rule),
  # then v6 beside v3 / v4 and cuDNN / FA2 at the version points, and v6's tile sweep at D=128 N=4K (~7 min)
  timeout 240 python3 -m pytest -q -rfEs -p no:cacheprovider tests/test_kernels_flash_attention.py \
    -k "v6 or backward_impls_match or backward_gpu_tolerance or plan_replay" > "$OUT/kernel_tests_kernels55.txt" 2>&1
  echo "tests rc=$?"; tail -3 "$OUT/kernel_tests_kernels55.txt" | cut -c1-300
  timeout 330 python3 benchmarks/flash_attention_bwd_bench.py --points 128:4096 64:4096 128:1024 \
    --providers minillm_v3 minillm_v4 minillm_v6 sdpa_flash sdpa_cudnn --flex-points --sweep 128:4096 --sweep-impls v6 \
    --out "$OUT/flash_attention_bwd_v6_h200.json" > "$OUT/flash_attention_bwd_v6_h200.txt" 2>&1
  echo "bench rc=$?"; grep -E "^ +(64|128) |causal=" "$OUT/flash_attention_bwd_v6_h200.txt" | cut -c1-200 ;;
composed)  # chapter 10: the composed ladder (HF without and with cache, engine eager, graphs, continuous batching,
  # speculation), float32 so that every rung's greedy tokens can be checked; each model under its own timeout,
  # one results file each (merge into benchmarks/results/composed_h200.json and copy to minillm/results/)
  timeout 200 python3 benchmarks/composed_bench.py --models tiny --out "$OUT/composed_tiny_h200.json" \
    > "$OUT/composed_tiny_h200.txt" 2>&1; echo "tiny rc=$?"; tail -8 "$OUT/composed_tiny_h200.txt"
  timeout 360 python3 benchmarks/composed_bench.py --models llama1b --out "$OUT/composed_1b_h200.json" \
    > "$OUT/composed_1b_h200.txt" 2>&1; echo "1b rc=$?"; tail -8 "$OUT/composed_1b_h200.txt" ;;
esac
