"""vllm-patch: an ordered, pinned series of fixes for vLLM and the tool that applies it."""

__version__ = "0.1.0"
