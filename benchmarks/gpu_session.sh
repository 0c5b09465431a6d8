#!/usr/bin/env bash
# The GPU side of the book: the compiled tests and every benchmark suite, one device command per case, each
# under the device tool's 10 minutes. From the checkout's root:
#   run(command="bash benchmarks/gpu_session.sh tests")           # every pytest `gpu` test (compiled kernels, serving)
#   run(command="bash benchmarks/gpu_session.sh hardware")        # chapter 4; the launch overhead of chapter 6
#   run(command="bash benchmarks/gpu_session.sh flash")           # chapters 4, 6: forward, forward+backward, flex
#   run(command="bash benchmarks/gpu_session.sh paged")           # chapter 7
#   run(command="bash benchmarks/gpu_session.sh serving")         # chapter 8: the tiny model, then the 1B shape
#   run(command="bash benchmarks/gpu_session.sh decode-b1")       # chapter 8: small-batch decode vs gpt-fast's loop
#   run(command="bash benchmarks/gpu_session.sh serving-client")  # chapter 8: the server under load, from a client
#   run(command="bash benchmarks/gpu_session.sh speculative")     # chapters 9, 10: the benchmark, then the engine's
#   run(command="bash benchmarks/gpu_session.sh composed")        # chapter 10: the float32 ladder, both models
#   run(command="bash benchmarks/gpu_session.sh composed-study")  # chapter 10: the bf16 study
#   run(command="bash benchmarks/gpu_session.sh batch-invariant") # chapter 11: the mode's cost and payoff
#   run(command="bash benchmarks/gpu_session.sh ab LABEL")        # issue 33's before/after timing of the defaults
#   run(command="bash benchmarks/gpu_session.sh ab-host LABEL")   # issue 33: the N=1K step's host time, part by part
# A suite writes its record into $OUT/results/<suite>_<gpu>.json, a copy of the suite's results files made first, so
# the file comes back with the new record in place of the old and every other record as it was (the device tool
# returns at most 8 files, so only that suite's files are copied): copy it into
# benchmarks/results/, run `python -m benchmarks index`, and commit both. Console output goes to $OUT/<case>.log.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/results"
export PYTHONUNBUFFERED=1

# suite LIMIT_S ARGS...: one suite run in its own process under LIMIT_S seconds (then interrupted: the harness
# still saves what the run measured), its record into $OUT/results
suite() {
  local limit=$1; shift
  cp benchmarks/results/"$1"_*.json "$OUT/results/" 2>/dev/null
  timeout -s INT -k 30 "$limit" python3 -m benchmarks "$@" --results "$OUT/results" >> "$LOG" 2>&1
  local rc=$?
  echo "$* rc=$rc"; tail -3 "$LOG" | cut -c1-200
}

# gpu_tests LIMIT_S SHARDS: the `gpu` tests in SHARDS parallel pytest processes (compiled tests mostly wait on
# Triton's CPU-bound compiles), each interrupted after LIMIT_S seconds (pytest still prints what failed)
gpu_tests() {
  local S=/tmp/gpu_shards; rm -rf "$S"; mkdir -p "$S"
  python3 -m pytest --collect-only -q -p no:cacheprovider -m gpu tests 2>/dev/null | grep '::' > "$S/ids"
  split -n "r/$2" "$S/ids" "$S/shard."
  for f in "$S"/shard.*; do
    ( mapfile -t ids < "$f"; timeout -s INT -k 30 "$1" python3 -m pytest -q -p no:cacheprovider -rfEs "${ids[@]}" \
        > "$f.log" 2>&1 ) &
  done
  wait
  echo "tests: $(wc -l < "$S/ids") collected"
  grep -h -E "passed|failed|error" "$S"/shard.*.log | grep -v "^FAILED" | cut -c1-200
  grep -h -E "^(FAILED|ERROR)" "$S"/shard.*.log | cut -c1-300 | head -20
  cat "$S"/shard.*.log >> "$LOG"
}

CASE=${1:-tests}
LOG="$OUT/$CASE.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$LOG"
case "$CASE" in
tests)
  gpu_tests 540 4 ;;
hardware)
  suite 300 hardware
  suite 200 hardware --part launch ;;
flash)  # the grid in three processes, each adding its rows to the one record
  P="minillm sdpa_flash sdpa_cudnn sdpa_efficient"
  suite 120 flash --modes fwd --providers $P
  suite 180 flash --modes fwd+bwd --providers $P --no-memory --append
  suite 240 flash --modes fwd fwd+bwd --providers flex --seq-lens 1024 4096 16384 --bwd-seq-lens 1024 4096 \
    --no-memory --append ;;
paged)
  suite 580 paged ;;
serving)  # one model per process, both in the one record
  suite 290 serving --models tiny --hf-requests 64
  suite 290 serving --models llama1b --hf-requests 64 --append ;;
decode-b1)  # the engine against the compiled static-cache loop at batch 1/8/64, and the step profile
  suite 580 serving --models llama1b --parts gptfast roofline profile --record decode_small_batch ;;
serving-client)  # the server's web stack from wheels carried in build/wheels_serve (the machine has no index)
  [ -d build/wheels_serve ] && python3 -m pip install -q --no-index --find-links build/wheels_serve fastapi uvicorn httpx
  suite 570 serving_client ;;
speculative)
  suite 420 speculative --parts b1 b1_fp32 1b
  suite 160 speculative --parts engine ;;
composed)
  suite 290 composed --models tiny
  suite 290 composed --models llama1b --append ;;
composed-study)
  suite 580 composed --study --budget-s 320 ;;
batch-invariant)
  suite 580 batch_invariant ;;
ab)  # label the tree: PYTHONPATH=<tree> bash benchmarks/gpu_session.sh ab old (kernel_defaults_ab.py --compare ...)
  timeout 580 python3 benchmarks/kernel_defaults_ab.py --label "${2:?a label}" --out "$OUT/ab_$2.json" >> "$LOG" 2>&1
  echo "ab rc=$?"; tail -5 "$LOG" ;;
ab-host)  # the same, labelled by tree: the host's time in each part of a synchronized N=1K step, and per launch
  timeout 300 python3 benchmarks/kernel_defaults_ab.py --host-parts --label "${2:?a label}" --out "$OUT/host_$2.json" \
    >> "$LOG" 2>&1
  echo "ab-host rc=$?"; tail -6 "$LOG" ;;
*)
  echo "unknown case $CASE: see the head of $0"; exit 2 ;;
esac
