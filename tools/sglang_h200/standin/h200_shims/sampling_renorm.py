"""Stand-in for ``sglang.kernels.ops.sampling.renorm`` on the H200 harness (redirected by sitecustomize).

What it replaces: on CUDA the real module binds ``top_k_renorm_prob`` / ``top_p_renorm_prob`` to
FlashInfer's ``flashinfer.sampling.top_{k,p}_renorm_probs`` (``kernels/ops/sampling/renorm.py:9-13``,
0.5.23), and FlashInfer is not on the H200 machine (no network, no wheel small enough to carry).
DFlash's CUDA sampling prewarm calls them at start-up (``srt/speculative/dflash_worker_v2.py:861`` ->
``dflash_utils.py:114``), so DFLASH and DDTREE engines died there.

What it binds instead: SGLang's own Triton renormalization, the one its ROCm branch of the same module
uses (``renorm.py:14-20`` -> ``kernels/ops/sampling/renorm_triton.py``), compiled by Triton for real.
Why the code under test is unchanged: the harness decodes greedily, so these ops only run in the
prewarm rehearsal (which sizes a memory headroom, not tokens); the DFlash / DDTree workers, EAGLE's
verify and the samplers call the same names with the same arguments as on a host with FlashInfer.
"""

from sglang.kernels.ops.sampling.renorm_triton import top_k_renorm_probs_triton as top_k_renorm_prob
from sglang.kernels.ops.sampling.renorm_triton import top_p_renorm_probs_triton as top_p_renorm_prob

__all__ = ["top_k_renorm_prob", "top_p_renorm_prob"]
