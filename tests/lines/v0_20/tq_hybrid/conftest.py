"""TurboQuant on hybrid attention + GDN/Mamba models (patch 0003): the pristine and the patched tree.

Trees (release line v0.20): its pinned release (``$VLLM_PATCH_PRISTINE_TREE`` or the cached 0.20.0 sdist) and the
release with the line's whole series applied (``$VLLM_PATCH_PATCHED_TREE`` or a session copy patched through the
tool's own apply).
Pointing ``$VLLM_PATCH_PATCHED_TREE`` at the pristine tree shows which tests the patch makes pass.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


