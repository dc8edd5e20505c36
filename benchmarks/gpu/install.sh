# Sourced ON the lent GPU machine by device_run.sh and device_batched.sh: probe the machine,
# install the carried wheels ($WHEELS, default .whl/, made by prepare.sh) into /tmp/site, and
# put the committed lips_flwr (.gpu_head/) in place of the working tree's. Exits on failure.
WHEELS=${WHEELS:-.whl}
echo "== probe"; date -u; uname -r; nproc; head -3 /proc/meminfo; df -h /dev/shm | tail -1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
which python3; python3 -V
python3 -c "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available(), 'numpy', numpy.__version__)" || exit 3
echo "== install"; t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$WHEELS"/*.whl || exit 4
if [ -f "$WHEELS/ray-trim.tar.xz" ]; then tar -xJf "$WHEELS/ray-trim.tar.xz" -C /tmp/site || exit 5; fi
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
export RAY_memory_monitor_refresh_ms=0   # the VM's RAM may read low at start
# measure lips_flwr as committed (the working tree may hold someone's unfinished edits)
rm -rf lips_flwr && cp -r .gpu_head/lips_flwr . && echo "lips_flwr at $(cat .gpu_head/COMMIT)"
python3 -c "import flwr, lips_flwr; print('flwr', flwr.__version__)" || exit 6
echo "install took $(( $(date +%s) - t0 ))s"
