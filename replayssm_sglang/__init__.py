"""replayssm_sglang: ReplaySSM decoding for SGLang's GDN and KDA layers.

Layout (one owner per fact):
  pin.py         the upstream pin (SGLang version + pristine hashes of every patched file)
  patching.py    the patch-series engine (apply / revert / status / check / refresh)
  cli.py         the `replayssm-sglang` console script
  reference.py   float64 reference recurrences (written from the math, used by every test)
  ring.py        the ring protocol: L, T, committed count h, flush rule, commit
  kernels/       Triton kernels (installed as replayssm_sglang.kernels)
"""

__version__ = "0.1.0"
