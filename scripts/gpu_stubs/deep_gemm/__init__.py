"""Import-only stand-in for DeepGEMM on GPU images that lack it (put on PYTHONPATH by scripts/gpu-env.sh).

SGLang 0.5.17's EAGLE/NEXTN draft worker imports ``sglang.srt.layers.attention.dsa_backend`` while it
captures its CUDA graphs, and that module runs ``import deep_gemm`` at import time, so speculative
decoding dies on an image without DeepGEMM even for models that never use DeepSeek sparse attention.
This module lets the import succeed; any use of it raises. gpu-env.sh also sets
SGLANG_ENABLE_JIT_DEEPGEMM=0 so SGLang's fp8 GEMM paths do not mistake this stub for the real library.
"""

__version__ = "0.0.0+replayssm-stub"


def __getattr__(name):
    raise ImportError(
        f"deep_gemm.{name}: DeepGEMM is not installed on this machine (this is replayssm-sglang's "
        "import-only stub from scripts/gpu_stubs); install sgl-deep-gemm to use DeepSeek sparse attention"
    )
