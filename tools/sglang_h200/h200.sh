#!/bin/bash
# The H200 harness's entry on the device machine. Usage (from the repo root there):
#   bash .carry-12/harness/h200.sh .carry-12 PART...   PART: checks | equal | time | time:<case> | soak ...
# pair / pair:<case>,...: the trained pair in $H200_PAIR (tools/real_pair; run_engine.py --part pair).
# walk-dist: the T > 0 walk's per-node distribution on CUDA through FlashInfer's real renorm kernels
#   (tests/sglang/_walk_sampling_harness.py --device cuda; needs flashinfer.tar.xz in the carry).
# fi-prebuild: JIT-compile FlashInfer's attention/sampling modules (needs flashinfer.tar.xz in the carry);
#   then H200_ATTENTION_BACKEND=flashinfer (and H200_SAMPLING_BACKEND=flashinfer, PAIR_DTYPE=bfloat16,
#   PAIR_MIXED=1) run the pair / time parts on it.
# soak: tools/soak/soak.py on that pair, graphs on (SOAK_REQUESTS, default 5000; summary + logs to $OUT).
# H200_ENGINE_ARGS (e.g. "--profile ddtree-B16-graphs") is passed to run_engine.py in the time:/equal: parts.
# Installs the carried wheels into /tmp/site, unpacks the patched sglang into /tmp/sgl, puts the
# shims first on PYTHONPATH, runs the parts, and leaves logs / JSON / the JIT cache under $OUT.
set -u
B=$(cd "$1" && pwd); shift
OUT=${OUT:-/tmp/h200-out}; mkdir -p "$OUT"
# (once per machine: a second h200.sh in the same call, e.g. before/after runs, reuses /tmp/site and /tmp/jit)
[ -f /tmp/site/.installed ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$B"/wheels/*.whl >/tmp/pip.log 2>&1 && touch /tmp/site/.installed; } || { tail -20 /tmp/pip.log; exit 3; }
# FlashInfer (issue 22; tools/sglang_h200/flashinfer_bundle.py --carry): unpacked into /tmp/site; its JIT
# builds go to /tmp/fi-ws (kept while the machine stays warm); H200_FLASHINFER=1 makes the two shims
# that exist only for its absence step aside (shims/sitecustomize.py, sgl_kernel renorms).
if [ -f "$B/flashinfer.tar.xz" ]; then
  [ -f /tmp/site/.flashinfer ] || { tar -xJf "$B/flashinfer.tar.xz" -C /tmp/site && touch /tmp/site/.flashinfer; } || exit 3
  export H200_FLASHINFER=1 FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws FLASHINFER_JIT_PREBUILD_MAX_JOBS=16 MAX_JOBS=16
fi
rm -rf /tmp/sgl; mkdir -p /tmp/sgl && tar -xJf "$B/sglang.tar.xz" -C /tmp/sgl || exit 3
# H200_OVERLAY=<tar.xz> (e.g. the bundle's before.tar.xz): patched files unpacked over the tree;
# H200_TAG names this run's output files (time-before-<cases>.json ...).
if [ -n "${H200_OVERLAY:-}" ]; then tar -xJf "$H200_OVERLAY" -C /tmp/sgl || exit 3; echo "overlay: $H200_OVERLAY $(cat "$B/before.ref" 2>/dev/null)"; fi
T=${H200_TAG:+-$H200_TAG}
export SGLANG_JIT_CACHE_DIR=/tmp/jit; mkdir -p /tmp/jit
[ -f "$B/jit-cache.tar.gz" ] && [ ! -f /tmp/jit/.unpacked ] && tar -xzf "$B/jit-cache.tar.gz" -C /tmp/jit && touch /tmp/jit/.unpacked
export PYTHONPATH="$B/harness/shims:/tmp/sgl:/tmp/site:$B/harness"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 H200_SHIM_LOG=/tmp/shims.log
# float32 runs compare tokens exactly: Triton's tl.dot on fp32 inputs defaults to TF32 (SGLang's triton
# attention kernels pass no input_precision), which on the H100 soak flipped 8 of 1,512 greedy answers at
# top-2 gaps of 1.5e-3..5.8e-3 (target-only vs DDTREE, either way). ieee keeps fp32 exact enough to compare.
export TRITON_F32_DEFAULT=${TRITON_F32_DEFAULT:-ieee}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch,triton;print("torch",torch.__version__,"triton",triton.__version__,torch.cuda.get_device_name())'
rc=0
START=$SECONDS; BUDGET=${H200_BUDGET_S:-530}   # parts stop in time for the epilogue below
for part in "$@"; do
  left=$((BUDGET - (SECONDS - START))); [ $left -le 20 ] && { echo "=== part $part skipped: no time left"; continue; }
  echo "=== part $part $(date -u +%T) (${left}s left)"
  case "$part" in
    checks) timeout -k 5 $left python3 "$B/harness/check_ops.py" --device cuda 2>&1 | tee "$OUT/checks.log" | grep -v " ok " ;
            timeout -k 5 $left python3 "$B/harness/import_chain.py" 2>&1 | tail -20 ;;
    fi-prebuild) timeout -k 5 $left python3 tools/sglang_h200/flashinfer_bundle.py --prebuild --head-dim ${FI_HEAD_DIMS:-64 128} 2>&1 | tail -15 || rc=1 ;;
    walk-dist) timeout -k 5 $left python3 tests/sglang/_walk_sampling_harness.py --device cuda > "$OUT/walk-dist.log" 2>&1 || rc=1
            grep -v '^REPORT' "$OUT/walk-dist.log" | tail -25 ;;
    equal) timeout -k 5 $left python3 "$B/harness/run_engine.py" --part equal --out "$OUT/equal.json" --case-timeout ${CASE_TIMEOUT:-150} 2>&1 | tee "$OUT/equal.log" | grep -E "^(CASE|EQUAL|  \\|)" | cut -c1-1500 || rc=1 ;;
    time) timeout -k 5 $left python3 "$B/harness/run_engine.py" --part time --out "$OUT/time.json" --case-timeout ${CASE_TIMEOUT:-200} 2>&1 | tee "$OUT/time.log" | grep -E "^(CASE|  \\|)" | cut -c1-1500 || rc=1 ;;
    pair|pair:*) c=${part#pair}; c=${c#:}; timeout -k 5 $left python3 "$B/harness/run_engine.py" --part pair --pair "${H200_PAIR:?H200_PAIR=<pair dir>}" --max-new-tokens ${PAIR_NEW_TOKENS:-128} --pair-dtype ${PAIR_DTYPE:-float32} ${c:+--only ${c//,/ }} --out "$OUT/pair$T${c:+-${c//,/_}}.json" --case-timeout ${CASE_TIMEOUT:-200} 2>&1 | tee "$OUT/pair$T.log" | grep -E "^(CASE|EQUAL|  \\|)" | cut -c1-1500 || rc=1 ;;
    soak) timeout -k 5 $left python3 tools/soak/soak.py --model "${H200_PAIR:?H200_PAIR=<pair dir>}/target" --draft "$H200_PAIR/draft" \
            --device cuda --dtype float32 --cuda-graphs --requests ${SOAK_REQUESTS:-5000} --clients 64 --max-running-requests 64 \
            --context-length 512 --max-new-tokens 64 --max-total-tokens ${SOAK_POOL:-4096} --budget ${SOAK_BUDGET:-16} \
            --time-limit-s $((left - 220)) --reference-eager --engine-arg sampling_backend=pytorch --out /tmp/soak 2>&1 | tail -30 || rc=1
          cp /tmp/soak/summary.json "$OUT/soak-summary.json"; tar -czf "$OUT/soak.tar.gz" -C /tmp soak ;;
    time:*|equal:*) p=${part%%:*}; c=${part#*:}; timeout -k 5 $left python3 "$B/harness/run_engine.py" --part $p --only ${c//,/ } --out "$OUT/$p$T-${c//,/_}.json" --case-timeout ${CASE_TIMEOUT:-200} ${H200_ENGINE_ARGS:-} 2>&1 | tee "$OUT/$p$T-${c//,/_}.log" | grep -E "^(CASE|EQUAL|  \\|)" | cut -c1-1500 || rc=1 ;;
  esac
done
(cd /tmp/jit && tar -czf "$OUT/jit-cache.tar.gz" . 2>/dev/null); ls -la "$OUT"
sort -u /tmp/shims.log 2>/dev/null | sed 's/ pid=.*//' | sort -u > "$OUT/shims-used.txt"; cat "$OUT/shims-used.txt"
exit $rc
