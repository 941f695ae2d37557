#!/usr/bin/env python3
"""Load a checkpoint through SGLang 0.5.17's own model loader on CPU and list the parameters it did not write.

    python scripts/check_tiny_model_load.py DIR [DIR:draft ...]      # prints one JSON line per model

`DIR:draft` loads the NEXTN draft (for Qwen3-Next: Qwen3NextForCausalLMMTP from the checkpoint's `mtp.*`).
Every parameter is filled with NaN before SGLang's DefaultModelLoader runs (the same audit hook the GPU runs
use, scripts/gpu_hooks/sitecustomize.py); any parameter still NaN afterwards was not in the checkpoint.
Shape mismatches fail inside SGLang's weight loaders. Construction only, no forward pass: a few CUDA-only
pieces are stubbed (the current-device query, CUDA streams, the vLLM rope fallback import).
"""
from __future__ import annotations

import json
import os
import socket
import sys
import types
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
AUDIT = Path(os.environ.setdefault("REPLAYSSM_LOAD_AUDIT", f"/tmp/replayssm-load-audit-{os.getpid()}.jsonl"))
sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu_hooks"))
import sitecustomize  # noqa: E402,F401  (installs the audit hook; a no-op if already imported)

if not any(type(f).__name__ == "_Finder" for f in sys.meta_path):
    sitecustomize.sys.meta_path.insert(0, sitecustomize._Finder())

import torch  # noqa: E402

torch.get_device_module = lambda *a, **k: torch.cpu  # modules ask for the current accelerator's device
for _n in ("vllm", "vllm._custom_ops"):  # rope's non-CUDA fallback imports vLLM at construction
    sys.modules.setdefault(_n, types.ModuleType(_n))
sys.modules["vllm._custom_ops"].rotary_embedding = None


def main(specs: list[str]) -> int:
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed import parallel_state as ps
    from sglang.srt.layers.dp_attention import initialize_dp_attention
    from sglang.srt.server_args import prepare_server_args, set_global_server_args_for_scheduler
    import sglang.srt.runtime_context as rc

    rc.get_stream = lambda name: None  # no CUDA streams on CPU (models bind get_stream at import)
    from sglang.srt.model_loader import get_model

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ps.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                    distributed_init_method=f"tcp://127.0.0.1:{port}")
    ps.initialize_model_parallel(1, backend="gloo")
    for spec in specs:
        path, _, kind = spec.partition(":")
        sa = prepare_server_args(["--model-path", path, "--skip-tokenizer-init", "--device", "cpu",
                                  "--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule"])
        set_global_server_args_for_scheduler(sa)
        mc = ModelConfig.from_server_args(sa, is_draft_model=(kind == "draft"))
        initialize_dp_attention(sa, mc)
        AUDIT.unlink(missing_ok=True)
        model = get_model(model_config=mc, load_config=LoadConfig(load_format="auto"),
                          device_config=DeviceConfig("cpu"))
        rec = json.loads(AUDIT.read_text().splitlines()[-1])
        rec.update(path=path, kind=kind or "target",
                   param_names=sorted(n for n, _ in model.named_parameters()))
        print(json.dumps(rec), flush=True)
        del model
    AUDIT.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
