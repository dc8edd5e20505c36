#!/usr/bin/env bash
# Run ON the lent GPU machine, from the repository root, with .whl and .gpu_head
# carried (benchmarks/gpu/prepare.sh made them):
#   run(command="bash benchmarks/gpu/device_run.sh", carry=[".whl", ".gpu_head"], timeout_s=420)
# Logs and rows go to $OUT (log, rows.json). Extra arguments go to bench_gpu.py.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/log") 2>&1
export PYTHONUNBUFFERED=1
source benchmarks/gpu/install.sh
python3 -c "import ray; print('ray', ray.__version__)" || exit 6
which flwr flower-superlink
echo "== bench"
timeout -k 15 "${BENCH_TIMEOUT:-360}" python3 benchmarks/bench_gpu.py --json "$OUT/rows.json" "$@"
rc=$?
nvidia-smi --query-gpu=memory.used,clocks.sm,clocks.mem,temperature.gpu --format=csv
echo "bench exit $rc"; exit $rc
