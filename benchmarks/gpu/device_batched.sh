#!/usr/bin/env bash
# Run ON the lent GPU machine, from the repository root, after `bash benchmarks/gpu/prepare.sh --study`
# here (it fills .whl/, .gpu_head/ and .gpu_data/). No Ray: the batched Grid runs in-process.
#   bench (issue #14: 100 ResNet8 clients, stacked vs auto vs the compute floor, FLOPs, bf16):
#     run(command="bash benchmarks/gpu/device_batched.sh bench", carry=[".gpu_data", ".gpu_head"], timeout_s=560)
#   study (issue #15, regime b: PROTOCOL.md, resumable; the runs come back in $OUT/prereg-gpu.tar.gz,
#   the finished ones and the stopped ones' staging folders (.staging/: their partial results and state,
#   git-ignored). Unpack it into docs/results/prereg/ here and call again, carrying both folders, to
#   continue where the runs stopped):
#     run(command="bash benchmarks/gpu/device_batched.sh study", timeout_s=590,
#         carry=[".gpu_data", ".gpu_head", "docs/results/prereg/prereg-fmnist-gpu-dir0.1",
#                "docs/results/prereg/.staging"])
#   (a stopped run's state is its checkpoint and 100 clients' FedBN state, ~3 MB for FashionCNN; a call
#   carries 64 MiB at most: check `du -shc` of the paths first, and lower STUDY_JOBS, which bounds
#   the runs left stopped, if they do not fit. The runner continues a stopped run only under the same
#   identity: the same code, run config and engine; dataset-path may differ)
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/log") 2>&1
export PYTHONUNBUFFERED=1 WHEELS=.gpu_data/whl
source benchmarks/gpu/install.sh
case "${1:-bench}" in
  bench)
    timeout -k 15 "${BENCH_TIMEOUT:-500}" python3 benchmarks/bench_engines.py --gpu --json "$OUT/engines.json"
    rc=$? ;;
  study)
    # Stops itself before the call's limit; a stopped run continues from its last round next call.
    # One run per core (prereg.py gives each one BLAS thread): a run's CPU time is mostly its
    # 100 ClientApp calls a round (~6.4 ms each outside training, stacked, on the development machine,
    # benchmarks/README.md section 8), the GPU trains the stacked clients.
    timeout -k 15 "${STUDY_TIMEOUT:-520}" python3 examples/paper/prereg.py run --regime gpu \
      --jobs "${STUDY_JOBS:-$(nproc)}" \
      --set "dataset-path='$PWD/.gpu_data/fashion-mnist'"
    rc=$?
    tar -czf "$OUT/prereg-gpu.tar.gz" -C docs/results/prereg prereg-fmnist-gpu-dir0.1 \
      $(cd docs/results/prereg && ls -d .staging/prereg-fmnist-gpu-dir0.1 2>/dev/null) 2>/dev/null
    cp docs/results/prereg/report.md "$OUT/" 2>/dev/null ;;
  *) echo "usage: device_batched.sh bench|study"; exit 2 ;;
esac
nvidia-smi --query-gpu=memory.used,clocks.sm,clocks.mem,temperature.gpu --format=csv
echo "exit $rc"; exit $rc
