#!/bin/bash
# GPU end-to-end driver (runs on the GPU machine from the repo root; needs .bundle/ carried):
#   bash scripts/gpu_e2e.sh [args for scripts/gpu_e2e.py]
# Unpacks the SGLang 0.5.17 bundle to /tmp/site, applies our patch series when one exists, generates the tiny
# GDN and KDA checkpoints (scripts/make_tiny_model.py, deterministic), then runs scripts/gpu_e2e.py.
# Env: E2E_MODELS="gdn kda" (which tiny models to build), E2E_INIT=decisive|random (make_tiny_model --init; decisive,
# the default, has decisive greedy margins so the correctness comparison separates kernels; random is the chaotic
# checkpoint of the runs up to 2026-11-29; same shapes either way), E2E_APPLY_SERIES=0 (measure unpatched SGLang),
# E2E_SAVE_CACHES=1 (return the JIT caches), E2E_FI_CACHE / E2E_TRITON_CACHE (carried caches; default .gpu/).
# Typical call: run(command="bash scripts/gpu_e2e.sh --arms conventional,upstream_replayssm", carry=[".bundle", ".gpu"]).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/e2e-out}; mkdir -p "$OUT"
t0=$(date +%s)
# SGLang 0.5.17 from the bundle (or this Python), replayssm_sglang laid out as installed
. scripts/gpu-env.sh || exit 2
SITE=$SGLANG_TARGET
export PYTHONPATH=$PYTHONPATH:$PWD/scripts/gpu_hooks
# the device gets the working tree without .git: write the commit to .gpu/COMMIT here before the call
# .gpu/COMMIT first: the device copy may carry a stale .git (2026-11-29: rev-parse there named an older commit)
export REPLAYSSM_COMMIT=${REPLAYSSM_COMMIT:-$(cat .gpu/COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo "?")}
# JIT caches from an earlier call (carry .gpu): flashinfer's gemma_rmsnorm build (~80 s) and Triton's kernels
# (~60 s in the first server's first prefill-graph capture). Save them with E2E_SAVE_CACHES=1 and copy the
# returned tarballs to .gpu/ here.
FI=${E2E_FI_CACHE:-.gpu/fi-cache.tar.xz}; TC=${E2E_TRITON_CACHE:-.gpu/triton-cache.tar.xz}
if [ -f "$FI" ]; then mkdir -p ~/.cache && tar -xJf "$FI" -C ~/.cache && echo "flashinfer JIT cache restored"; fi
if [ -f "$TC" ]; then mkdir -p ~/.triton && tar -xJf "$TC" -C ~/.triton && echo "Triton cache restored"; fi
# our patch series, applied to a COPY of the sglang package (/tmp/ours) that only the `ours` arm puts first
# on its PYTHONPATH: conventional and upstream_replayssm keep running pristine SGLang in the same call.
# E2E_APPLY_SERIES=0 skips it (the `ours` arm is then skipped with a message).
export REPLAYSSM_SERIES_APPLIED=0 E2E_OURS_PATH=/tmp/ours
if [ "${E2E_APPLY_SERIES:-1}" = 1 ] && [ -s patches/sglang-0.5.17/series ] && grep -qv '^\s*#' patches/sglang-0.5.17/series; then
  rm -rf /tmp/ours && mkdir -p /tmp/ours && cp -r $SITE/sglang $SITE/sglang-*.dist-info /tmp/ours/
  if python3 -m replayssm_sglang.cli apply --target /tmp/ours; then export REPLAYSSM_SERIES_APPLIED=1;
  else echo "patch series did not apply: the ours arm will be skipped"; fi
fi
python3 -c "import sglang, transformers, torch; print('sglang', sglang.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__, torch.cuda.get_device_name(0))" || exit 3
MODELS=()
for m in ${E2E_MODELS:-gdn kda}; do
  case $m in
    gdn) arch=qwen3_next ;;
    kda) arch=kimi_linear ;;
    *) echo "unknown model $m"; exit 2 ;;
  esac
  python3 scripts/make_tiny_model.py --arch $arch --out /tmp/models/$m --init "${E2E_INIT:-decisive}" || exit 4
  MODELS+=(--model $m=/tmp/models/$m)
done
echo "models ready at $(( $(date +%s) - t0 ))s"
python3 scripts/gpu_e2e.py "${MODELS[@]}" --out "$OUT" "$@"
rc=$?
if [ "${E2E_SAVE_CACHES:-${E2E_SAVE_FI_CACHE:-0}}" = 1 ]; then
  [ -d ~/.cache/flashinfer ] && tar -C ~/.cache -cf - flashinfer | xz -T0 -6 > "$OUT/fi-cache.tar.xz"
  [ -d ~/.triton/cache ] && tar -C ~/.triton -cf - cache | xz -T0 -6 > "$OUT/triton-cache.tar.xz"
  ls -la "$OUT"/*-cache.tar.xz
fi
exit $rc
