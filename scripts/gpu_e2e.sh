#!/bin/bash
# GPU end-to-end driver (runs on the GPU machine from the repo root; needs .bundle/ carried):
#   bash scripts/gpu_e2e.sh [args for scripts/gpu_e2e.py]
# Unpacks the SGLang 0.5.17 bundle to /tmp/site, applies our patch series when one exists, generates the tiny
# GDN and KDA checkpoints (scripts/make_tiny_model.py, deterministic), then runs scripts/gpu_e2e.py.
# Env: E2E_MODELS="gdn kda" (which tiny models to build), E2E_FI_CACHE=path to a carried flashinfer JIT cache
# tarball (.gpu/fi-cache.tar.xz); the script saves the cache it ends with to $OUT/fi-cache.tar.xz when
# E2E_SAVE_FI_CACHE=1.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/e2e-out}; mkdir -p "$OUT"
SITE=/tmp/site
t0=$(date +%s)
if [ ! -f $SITE/.unpacked ]; then
  mkdir -p $SITE
  ls .bundle/*.tar.xz >/dev/null || { echo "no .bundle/*.tar.xz (run scripts/gpu_bundle.py here, carry .bundle)"; exit 2; }
  for b in .bundle/*.tar.xz; do (xz -dc -T0 "$b" | tar -xf - -C $SITE) & done; wait
  touch $SITE/.unpacked
fi
echo "bundle unpacked in $(( $(date +%s) - t0 ))s: $(du -sh $SITE | cut -f1)"
export PYTHONPATH=$SITE:$PWD:$PWD/scripts/gpu_hooks
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export REPLAYSSM_COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo "${REPLAYSSM_COMMIT:-?}")
if [ -n "${E2E_FI_CACHE:-}" ] && [ -f "$E2E_FI_CACHE" ]; then
  mkdir -p ~/.cache && tar -xJf "$E2E_FI_CACHE" -C ~/.cache && echo "flashinfer JIT cache restored"
fi
# our patch series (none yet for 0.5.17 -> the `ours` arm is skipped by gpu_e2e.py)
# E2E_APPLY_SERIES=0 measures unpatched SGLang even when a series exists.
export REPLAYSSM_SERIES_APPLIED=0
if [ "${E2E_APPLY_SERIES:-1}" = 1 ] && [ -s patches/sglang-0.5.17/series ] && grep -qv '^\s*#' patches/sglang-0.5.17/series; then
  if python3 -m replayssm_sglang.cli apply --target $SITE; then export REPLAYSSM_SERIES_APPLIED=1;
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
  python3 scripts/make_tiny_model.py --arch $arch --out /tmp/models/$m || exit 4
  MODELS+=(--model $m=/tmp/models/$m)
done
echo "models ready at $(( $(date +%s) - t0 ))s"
python3 scripts/gpu_e2e.py "${MODELS[@]}" --out "$OUT" "$@"
rc=$?
if [ "${E2E_SAVE_FI_CACHE:-0}" = 1 ] && [ -d ~/.cache/flashinfer ]; then
  tar -C ~/.cache -cf - flashinfer | xz -T0 -6 > "$OUT/fi-cache.tar.xz"; ls -la "$OUT/fi-cache.tar.xz"
fi
exit $rc
