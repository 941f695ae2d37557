#!/bin/bash
# One-command GPU run for the decode kernels (run on the GPU machine from the repo root, carrying .gpu/kwhl, or
# .bundle for the KDA CUDA baseline conv_cuda as well):
#   bash scripts/gpu_kernels.sh [bench args]
# .gpu/kwhl (filled by `bash scripts/gpu-kernel-wheels` on a machine with PyPI) holds cp312 wheels: sglang 0.5.17 (its fla kernels are the baselines; loaded by path, see
# kernels/upstream.py) and, for SGLang's KDA CUDA row-streaming decode, apache-tvm-ffi, pybase64, pydantic
# (+ pydantic-core, annotated-types, typing-inspection). Steps: GPU tests (fp32 and bf16 states against the
# float64 reference), then scripts/bench_kernels.py; results land in $OUT (and benchmarks/results/).
# Env: STREAM_STUDY=1 runs scripts/stream_floor_study.py (per-tile against persistent programs; STREAM_DTYPES,
# STREAM_ARGS); TILE_STUDY=1 first runs scripts/tile_dots_study.py (the tile reduction on the tensor cores, bf16 and fp8 tiles;
# about a minute); GPU_TESTS=0 skips the tests; BENCH=0 the benchmark; TEST_X='' runs every selected test past a failure (default -x);
# TEST_K is the pytest -k expression (default "gpu_real and v3": the v3
# kernel's GPU cases; v1's and v2's passed on 2026-11-29); BENCH_ARGS overrides the benchmark arguments
# (default: v3 launch-config sweep at B=256, then conv, upstream, v1 (ours_r16, ours_L1) and v3 (v3_r16,
# v3_r32, v3_r16_rows, v3_L1) at B = 1, 32, 128, 256); BENCH_SETS runs several argument sets (';' between them), each
# cut at BENCH_TIMEOUT, into kernels-<stamp>-s<i>.txt and one tar of their JSON, tables and plots.
# Budget: about 5 minutes in all (tests cut at 90 s, the benchmark at 210 s; the JSON is written after
# every batch size, so a cut run still leaves results).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kernels-out}; mkdir -p "$OUT"
t0=$(date +%s)
if ls .gpu/kwhl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/kwhl/*.whl \
    || { echo "wheel install failed"; exit 2; }
elif ls .bundle/*.tar.xz >/dev/null 2>&1; then
  # the end-to-end bundle instead (carry .bundle, not .gpu/kwhl: both exceed the 64 MiB a call carries): all of
  # SGLang's imports, so the KDA CUDA row-streaming baseline (conv_cuda; SGLang's own server uses it for fp32
  # states at B >= 8) loads; the kwhl set stops at `starlette` in its import chain
  . scripts/gpu-env.sh || exit 2
else
  echo "neither .gpu/kwhl/*.whl nor .bundle/*.tar.xz: carry one of them"; exit 2
fi
# the source tree as the installed layout: kernels/ is replayssm_sglang.kernels
[ -e replayssm_sglang/kernels ] || ln -s ../kernels replayssm_sglang/kernels
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export REPLAYSSM_COMMIT=${REPLAYSSM_COMMIT:-$(cat .gpu/COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)}
# the CUDA main launch's cubins, prebuilt on the CPU machine (scripts/cuda_prebuild.py); a missing one is compiled
# here by the image's nvcc (kernels/cuda_main.py finds it on PATH or in /usr/local/cuda). Carry .gpu/cubin.tar.xz
# (written beside the folder by the prebuild, ~1.5 MB for ~300 cubins) where .gpu/cubin (~18 MB) would push a call past
# the 64 MiB it carries
if [ -f .gpu/cubin.tar.xz ]; then
  mkdir -p /tmp/cubin && tar -C /tmp/cubin --strip-components=1 -xJf .gpu/cubin.tar.xz && export REPLAYSSM_CUBIN_DIR=/tmp/cubin
elif ls .gpu/cubin/*.cubin >/dev/null 2>&1; then
  mkdir -p /tmp/cubin && cp .gpu/cubin/*.cubin /tmp/cubin/ && export REPLAYSSM_CUBIN_DIR=/tmp/cubin
fi
echo "nvcc: $(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || echo none); cubins: $(ls /tmp/cubin 2>/dev/null | wc -l)"
echo "setup $(( $(date +%s) - t0 ))s; commit $REPLAYSSM_COMMIT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.total --format=csv,noheader
if [ "${TILE_STUDY:-0}" = 1 ]; then
  for td in bf16 fp8_e4m3; do
    timeout ${STUDY_TIMEOUT:-120} python3 scripts/tile_dots_study.py --tile-dtype $td \
      --out "$OUT/tile-dots-gpu-$(date -u +%Y%m%d-%H%M)-$td.json" 2>&1 | tail -12
  done
  echo "study $(( $(date +%s) - t0 ))s"
fi
if [ "${STREAM_STUDY:-0}" = 1 ]; then
  # scripts/stream_floor_study.py: the plain step's memory pattern per tile vs persistent, prefetching programs
  for td in ${STREAM_DTYPES:-bf16 fp8_e4m3}; do
    timeout ${STUDY_TIMEOUT:-150} python3 scripts/stream_floor_study.py --tile-dtype $td ${STREAM_ARGS:-} \
      --out "$OUT/stream-floor-$(date -u +%Y%m%d-%H%M)-$td.json" 2>&1 | tail -30
  done
  echo "stream study $(( $(date +%s) - t0 ))s"
fi
if [ "${GPU_TESTS:-1}" = 1 ]; then
  timeout ${TEST_TIMEOUT:-90} python3 -m pytest -q ${TEST_X--x} -p no:cacheprovider tests/test_decode_kernels.py -k "${TEST_K:-gpu_real and v3}" 2>&1 \
    | tail -15 | tee "$OUT/kernels-gpu-tests.txt"
  echo "tests $(( $(date +%s) - t0 ))s"
fi
bench() {  # $1: the results' stem; $2: the benchmark's arguments
  timeout ${BENCH_TIMEOUT:-210} python3 scripts/bench_kernels.py --out "$OUT/$1.json" $2 2>&1 | tee "$OUT/$1.txt"
  python3 scripts/bench_kernels.py --table "$OUT/$1.json" > "$OUT/$1.md" 2>&1 || true
}
stamp=$(date -u +%Y%m%d-%H%M)
if [ "${BENCH:-1}" = 0 ]; then
  echo "BENCH=0: no benchmark"
elif [ -n "${BENCH_SETS:-}" ]; then
  # several benchmark runs in one call (argument sets separated by ';'), kernels-<stamp>-s<i>.*: their JSON, table
  # and plot go into one tar beside their stdout (the device returns at most 8 files)
  i=0; IFS=';' read -ra sets <<< "$BENCH_SETS"
  for a in "${sets[@]}"; do
    i=$((i + 1)); echo "== set $i: $a"; bench "kernels-$stamp-s$i" "$a"
  done
  (cd "$OUT" && tar -cf "kernels-$stamp-sets.tar" kernels-$stamp-s*.json kernels-$stamp-s*.md kernels-$stamp-s*.png \
    2>/dev/null; rm -f kernels-$stamp-s*.json kernels-$stamp-s*.md kernels-$stamp-s*.png)
else
  bench "kernels-$stamp" "${BENCH_ARGS:---impl v1,v3 --v3-sweep --batches 1,32,128,256}"
fi
echo "total $(( $(date +%s) - t0 ))s"
