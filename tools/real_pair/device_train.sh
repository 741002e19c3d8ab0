#!/bin/bash
# Issue 21 on the lent H200, one device call: train the pair (tools/real_pair/train_pair.py) on this
# machine's Python sources while the engine harness (tools/sglang_h200/h200.sh, BUNDLE = its carried
# bundle) installs itself and runs its `equal` part (which also builds SGLang's JIT kernels for the
# `pair` part of the next call). Leaves the pair in /tmp/pair (kept while the machine stays warm) and
# returns pair.tar.gz, summary.json and train_log.jsonl in $OUT.
# Usage (repo root on the device): bash tools/real_pair/device_train.sh BUNDLE [train_pair.py args]
set -u
B=$1; shift
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')"
S="$(python3 -c 'import site; print(site.getsitepackages()[0])')"
rm -rf /tmp/pair
( python3 tools/real_pair/train_pair.py --out /tmp/pair --device cuda --corpus-root "$R" --corpus-root "$S" "$@" \
    > /tmp/train.log 2>&1; echo "train rc=$?" >> /tmp/train.log ) &
TRAIN=$!
H200_BUDGET_S=${H200_BUDGET_S:-420} bash "$B/harness/h200.sh" "$B" equal
wait $TRAIN
grep -v "Writing model" /tmp/train.log | tail -40
cp /tmp/pair/summary.json /tmp/pair/train_log.jsonl "$OUT/" 2>/dev/null
tar -czf "$OUT/pair.tar.gz" -C /tmp pair
ls -la "$OUT"
