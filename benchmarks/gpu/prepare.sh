#!/usr/bin/env bash
# Run HERE (a machine with PyPI), from the repository root, before a call to the
# lent GPU machine: that machine has python3 3.12 with torch/numpy but no flwr or
# Ray, and reaches no network. Fills two git-ignored folders that the call carries:
#   .whl/      cp312 wheels of flwr 1.42.0 and what it needs beyond that image,
#              plus ray-trim.tar.xz: Ray 2.55.1 without its Java jars, RLlib and
#              the dashboard's source maps (its wheel alone is 74 MB, over the
#              64 MiB a call carries; this is ~20 MB)
#   .gpu_head/ lips_flwr as committed at HEAD (the code measured)
# With --study, also .gpu_data/ for device_batched.sh study (the pre-registered study's
# GPU regime, no Ray): .gpu_data/whl/ (the wheels above but Ray) and
# .gpu_data/fashion-mnist/ (Debian's IDX files, ~30 MB), carried without .whl (64 MiB).
set -euo pipefail
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
grep -qx '/.gpu_head/' .git/info/exclude || echo /.gpu_head/ >> .git/info/exclude
mkdir -p .whl
plat=()
for p in manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do
  plat+=(--platform "${p}_x86_64")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${plat[@]}" --platform any -d .whl \
  flwr==1.42.0 alembic==1.20.1 annotated-types==0.8.0 cffi==2.1.1 cryptography==50.0.2 \
  fastapi==0.138.2 grpcio-health-checking==1.81.1 iterators==0.0.2 jsonschema==4.26.0 \
  jsonschema-specifications==2025.9.1 mako==1.4.3 prompt-toolkit==3.0.53 pycparser==3.12 \
  pycryptodome==3.24.1 pydantic==2.14.4 pydantic-core==2.50.5 referencing==0.37.0 \
  rpds-py==2026.9.1 sqlalchemy==2.1.9 starlette==1.3.1 tomli==2.5.0 tomli-w==1.2.0 \
  typing-inspection==0.4.5 uvicorn==0.49.0 wcwidth==0.9.4 grpcio==1.85.3 protobuf==6.33.6 \
  greenlet==3.5.6 httptools==0.9.0 watchfiles==1.3.0 websockets==17.4 python-dotenv==1.2.4 \
  typer==0.20.1 click==8.5.1 rich==14.3.4 packaging==25.0 typing_extensions==4.16.0 \
  certifi==2026.10.19.post1 pathspec==1.1.1 anyio==4.16.0
if [ ! -f .whl/ray-trim.tar.xz ]; then
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux2014_x86_64 -d "$tmp" ray==2.55.1
  (cd "$tmp" && unzip -q ray-*.whl && rm -rf ray-*.whl ray/jars ray/rllib \
     ray/dashboard/client/build/static/js/*.map && mkdir ray/jars \
   && tar -cf - ray ray-*.dist-info | xz -9 -T0 > ray-trim.tar.xz)
  mv "$tmp/ray-trim.tar.xz" .whl/ && rm -rf "$tmp"
fi
rm -rf .gpu_head && mkdir .gpu_head && git archive HEAD lips_flwr | tar -x -C .gpu_head
git rev-parse --short HEAD > .gpu_head/COMMIT
du -sh .whl .gpu_head
if [ "${1:-}" = "--study" ]; then
  grep -qx '/.gpu_data/' .git/info/exclude || echo /.gpu_data/ >> .git/info/exclude
  rm -rf .gpu_data && mkdir -p .gpu_data/whl
  cp .whl/*.whl .gpu_data/whl/
  cp -r /usr/share/datasets/fashion-mnist .gpu_data/fashion-mnist
  du -sh .gpu_data
fi
