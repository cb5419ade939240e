"""``python -m vllm_patch``: the same entry point as the console script."""

from .entry import run

run()
