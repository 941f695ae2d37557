"""Weight-load audit for the end-to-end GPU runs (only on PYTHONPATH when REPLAYSSM_LOAD_AUDIT is set).

SGLang's loaders leave a parameter the checkpoint does not name uninitialised, silently. This hook fills
every parameter with NaN before `DefaultModelLoader.load_weights_and_postprocess` and, after it, appends
one JSON line per loaded model to $REPLAYSSM_LOAD_AUDIT: the parameters still (partly) NaN, i.e. not
written by the checkpoint. Python imports `sitecustomize` in every process (SGLang's scheduler
subprocesses included); the hook patches lazily, when sglang's loader module is first imported.
"""
import importlib.abc
import importlib.util
import json
import os
import sys

_TARGET = "sglang.srt.model_loader.loader"


def _patch(mod):
    import torch

    cls = mod.DefaultModelLoader
    orig = cls.__dict__["load_weights_and_postprocess"]
    fn = orig.__func__ if isinstance(orig, staticmethod) else orig

    def wrapped(model, weights, target_device):
        with torch.no_grad():
            for p in model.parameters():
                if p.dtype.is_floating_point:
                    p.data.fill_(float("nan"))
        out = fn(model, weights, target_device)
        bad = []
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dtype.is_floating_point and p.numel():
                    frac = float(torch.isnan(p.data).float().mean())
                    if frac > 0:
                        bad.append([name, list(p.shape), round(frac, 4)])
        n = sum(1 for _ in model.named_parameters())
        rec = {"model": type(model).__name__, "params": n, "not_loaded": bad}
        with open(os.environ["REPLAYSSM_LOAD_AUDIT"], "a") as f:
            f.write(json.dumps(rec) + "\n")
        return out

    setattr(cls, "load_weights_and_postprocess", staticmethod(wrapped))


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        orig_exec = spec.loader.exec_module

        def exec_module(module):
            orig_exec(module)
            try:
                _patch(module)
            except Exception as e:  # never break the server over the audit
                print(f"[load-audit] patch failed: {e!r}", file=sys.stderr)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("REPLAYSSM_LOAD_AUDIT"):
    sys.meta_path.insert(0, _Finder())

# chain to any other sitecustomize further down the path (the image may have one)
_here = os.path.dirname(os.path.abspath(__file__))
_rest = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.origin and os.path.dirname(os.path.abspath(_spec.origin)) != _here:
    _m = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_m)
