# Sourced by the GPU scripts (scripts/gpu-quickstart, scripts/gpu_e2e.sh), from the repo root.
# Makes SGLang 0.5.17 and replayssm_sglang importable on the GPU machine:
#  - SGLang: the one already installed in this Python if it is 0.5.17; otherwise the offline bundle
#    (.bundle/*.tar.xz, built on a machine with PyPI by `python scripts/gpu_bundle.py`) unpacked to $SITE;
#    otherwise `pip install sglang==0.5.17` (needs the internet).
#  - replayssm_sglang: this source tree, with replayssm_sglang/kernels linked to kernels/ (the installed
#    layout; patches/ is found beside the package in a checkout), no pip and no network.
# Exports PYTHONPATH, SGLANG_TARGET (the folder that holds sglang/) and the offline/NCCL variables.
SITE=${SITE:-/tmp/site}
_t0=$(date +%s)
if python3 -c "import importlib.metadata as m,sys; sys.exit(m.version('sglang')!='0.5.17')" 2>/dev/null; then
  SGLANG_TARGET=$(python3 -c "import importlib.util,os; print(os.path.dirname(list(importlib.util.find_spec('sglang').submodule_search_locations)[0]))")
elif ls .bundle/*.tar.xz >/dev/null 2>&1; then
  if [ ! -f "$SITE/.unpacked" ]; then
    mkdir -p "$SITE"
    for b in .bundle/*.tar.xz; do (xz -dc -T0 "$b" | tar -xf - -C "$SITE") & done; wait
    touch "$SITE/.unpacked"
    echo "bundle unpacked to $SITE in $(( $(date +%s) - _t0 ))s: $(du -sh "$SITE" | cut -f1)"
  fi
  SGLANG_TARGET=$SITE
else
  echo "installing sglang==0.5.17 from PyPI (no .bundle/ here)"
  python3 -m pip install -q "sglang==0.5.17" || { echo "could not install sglang 0.5.17: build .bundle/ with scripts/gpu_bundle.py on a machine with PyPI"; return 2 2>/dev/null || exit 2; }
  SGLANG_TARGET=$(python3 -c "import importlib.util,os; print(os.path.dirname(list(importlib.util.find_spec('sglang').submodule_search_locations)[0]))")
fi
# replayssm_sglang from this source tree, in its installed layout: `python -m sglang.launch_server` puts the
# working directory first on sys.path, so the tree itself must resolve replayssm_sglang.kernels (a copy
# elsewhere would be shadowed by it). The link is git-ignored.
[ -e replayssm_sglang/kernels ] || ln -s ../kernels replayssm_sglang/kernels
# DeepGEMM: SGLang's NEXTN/EAGLE draft worker imports it while capturing graphs (dsa_backend); images
# without it get an import-only stub, and SGLang's JIT DeepGEMM stays off.
STUB_PATH=""
if ! PYTHONPATH=$SGLANG_TARGET python3 -c "import deep_gemm" 2>/dev/null; then
  STUB_PATH=$PWD/scripts/gpu_stubs
  export SGLANG_ENABLE_JIT_DEEPGEMM=0
fi
export SGLANG_TARGET
export PYTHONPATH=$SGLANG_TARGET:$PWD${STUB_PATH:+:$STUB_PATH}${PYTHONPATH:+:$PYTHONPATH}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
