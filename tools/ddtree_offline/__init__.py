"""ddtree_offline: the offline reference engine for DDTree tree speculative decoding.

A pure-torch, batch-1 decode loop over Hugging Face causal LMs running target-only
autoregressive decoding, DFlash-style linear drafts and DDTree (one tree-masked target forward
per round, KV compaction of the accepted path), with lossless T=0 / seeded T>0 sampling. The DDTree
core (tree builder, acceptance walk, positional Gumbel sampling) is imported from the patch series
(:mod:`ddtree_offline.core`), never re-implemented.

Modules: :mod:`.models` (tiny random-weight targets, local checkpoints), :mod:`.drafters`
(``SyntheticDrafter``), :mod:`.engine` (``OfflineEngine``), :mod:`.cli` (``python -m ddtree_offline``).
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
