#!/usr/bin/env bash
# One GPU call for the verify work: bf16 correctness (pytest -m gpu tests/test_verify_kernels.py) and
# the verify benchmark (scripts/bench_verify.py). Needs the SGLang 0.5.17 cp312 wheel in .whl/ (carried):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_34_x86_64 -d .whl sglang==0.5.17
# Usage on the GPU machine: OUT=<dir> REPLAYSSM_COMMIT=<hash> bash scripts/gpu_verify.sh [test_timeout] [bench_timeout]
set -uo pipefail
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/sglang-0.5.17-*.whl || exit 1
python3 -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/rs . >/dev/null || exit 1
export PYTHONPATH=/tmp/rs:/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv
timeout "${1:-300}" python3 -P -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_verify_kernels.py 2>&1 \
    | tail -60 | tee "$OUT/gpu-tests.log"
timeout "${2:-260}" python3 -P scripts/bench_verify.py --tune --out "$OUT" 2>&1 | tee "$OUT/bench.log" | grep -v "^tune"
ls -la "$OUT"
