"""Shim for ``sglang.kernels.ops.speculative.verify_sampling`` on the H200 harness (sitecustomize).

What it replaces: on CUDA the real module binds ``tree_speculative_sampling_target_only`` to SGLang's
JIT CUDA kernel (``kernels/ops/speculative/verify_sampling.py:23-26`` -> ``sampling.py:50``), whose build
includes FlashInfer's headers (``kernels/jit/utils/deps.py:56`` raises "Cannot find flashinfer
package"); FlashInfer is not on the H200 machine. DFlash's start-up sampling rehearsal calls it
(``srt/speculative/dflash_worker_v2.py:861`` -> ``dflash_utils.py:1012``), so DFLASH and DDTREE engines
died there.

What it binds instead: ``tree_speculative_sampling_target_only = None``, which is how SGLang itself
describes a build without that kernel (the module's own contract: "A name is None where the platform has
no kernel for it"); ``chain_speculative_sampling_triton`` is the real one (the module's non-NPU branch).
SGLang then reports ``is_dflash_sampling_verify_available() == False`` (``dflash_utils.py:46-52``) and
takes its own no-kernel paths: the generic ``model_runner.prewarm_sampling()`` (``dflash_worker_v2.py:802``)
and greedy-only verification. Why the code under test is unchanged: the harness decodes greedily
(temperature 0), where DFLASH and DDTREE verify with the greedy path whatever this name holds; only the
start-up memory rehearsal for non-greedy verification is skipped.
"""

from sglang.kernels.ops.speculative.reject_sampling import chain_speculative_sampling_triton

tree_speculative_sampling_target_only = None

__all__ = ["chain_speculative_sampling_triton", "tree_speculative_sampling_target_only"]
