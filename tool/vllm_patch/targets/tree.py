"""A plain directory tree: an unpacked sdist, or any copy of the vLLM sources."""

from __future__ import annotations

from .base import Target


class TreeTarget(Target):
    """Patched in place; the state is read from the file contents alone."""

    kind = "tree"
