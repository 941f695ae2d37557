"""Code that patched SGLang calls. Each patch in patches/ is a few lines that call into here.

Modules here may import SGLang (they only run inside it); nothing else in replayssm_sglang does.
"""
