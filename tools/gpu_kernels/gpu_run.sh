#!/bin/bash
# One device call for the builder (issue 11): tools/gpu_kernels/gpu_suite.py (kernel vs heap oracle, sync-free, CUDA
# graphs, start-up capture), then tools/bench/bench_builder.py (ours vs UNO vs the torch builder vs the reference
# heap, the GEMM bound).
#
#   make bench-gpu-bundle                      # here: writes .gpu/src (never committed: it holds SGLang files)
#   bash tools/gpu_kernels/gpu_run.sh [BUNDLE]  # there, from the repo root; BUNDLE defaults to .gpu
#
# Results go to $OUT (default /tmp/gpu-out): machine.txt, gpu_suite-h200.{log,json}, builder-h200.{md,json,png}.
# Time limits per part: SUITE_T (s, default 200) and BENCH_T (default 330); BENCH_ARGS is passed to the bench.
set -u
B=${1:-.gpu}
OUT=${OUT:-/tmp/gpu-out}
if [ ! -f "$B/src/sglang/srt/speculative/ddtree_utils.py" ]; then
    echo "error: $B/src holds no built ddtree_utils.py" >&2
    echo "fix: run \`make bench-gpu-bundle\` on the machine with the snapshot, and carry .gpu" >&2
    exit 2
fi
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$OUT/machine.txt"
export PYTHONUNBUFFERED=1
# gpu_suite imports the heap oracle from ddtree_offline (tools/), not installed on a bare GPU machine.
timeout -k 5 "${SUITE_T:-200}" env PYTHONPATH="tools${PYTHONPATH:+:$PYTHONPATH}" python3 tools/gpu_kernels/gpu_suite.py \
    --src "$B/src" --json "$OUT/gpu_suite-h200.json" > "$OUT/gpu_suite-h200.log" 2>&1
echo "gpu_suite rc=$?"
grep -E "^FAIL|Error" "$OUT/gpu_suite-h200.log" | head -20
tail -5 "$OUT/gpu_suite-h200.log"
# shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
timeout -k 5 "${BENCH_T:-330}" python3 tools/bench/bench_builder.py --device cuda --src "$B/src" \
    --uno "$B/src/sglang/kernels/ops/speculative/uno_tree.py" ${BENCH_ARGS:-} \
    --out "$OUT/builder-h200.md" --json "$OUT/builder-h200.json" --plot "$OUT/builder-h200.png" 2>&1 | tail -40
echo "bench rc=${PIPESTATUS[0]}"
