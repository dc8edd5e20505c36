#!/usr/bin/env bash
# Run ON the lent GPU machine, from the repository root, with .whl and .gpu_head
# carried (benchmarks/gpu/prepare.sh made them):
#   run(command="bash benchmarks/gpu/device_run.sh", carry=[".whl", ".gpu_head"], timeout_s=420)
# Logs and rows go to $OUT (log, rows.json). Extra arguments go to bench_gpu.py.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/log") 2>&1
export PYTHONUNBUFFERED=1
echo "== probe"; date -u; uname -r; nproc; head -3 /proc/meminfo; df -h /dev/shm | tail -1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
which python3; python3 -V
python3 -c "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available(), 'numpy', numpy.__version__)" || exit 3
echo "== install"; t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 4
tar -xJf .whl/ray-trim.tar.xz -C /tmp/site || exit 5
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
export RAY_memory_monitor_refresh_ms=0   # the VM's RAM may read low at start
# measure lips_flwr as committed (the working tree may hold someone's unfinished edits)
rm -rf lips_flwr && cp -r .gpu_head/lips_flwr . && echo "lips_flwr at $(cat .gpu_head/COMMIT)"
python3 -c "import flwr, ray, lips_flwr; print('flwr', flwr.__version__, 'ray', ray.__version__)" || exit 6
which flwr flower-superlink; echo "install took $(( $(date +%s) - t0 ))s"
echo "== bench"
timeout -k 15 "${BENCH_TIMEOUT:-360}" python3 benchmarks/bench_gpu.py --json "$OUT/rows.json" "$@"
rc=$?
nvidia-smi --query-gpu=memory.used,clocks.sm,clocks.mem,temperature.gpu --format=csv
echo "bench exit $rc"; exit $rc
