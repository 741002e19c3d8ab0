"""ddtree-deploy: ship DDTree to GPU eval hosts as a strict patch series against a pinned SGLang."""

__version__ = "0.1.0"
