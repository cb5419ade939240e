"""Where a series goes: a git checkout, an installed vLLM, or a plain tree."""

from __future__ import annotations

from pathlib import Path

from ..errors import TargetError
from .base import Target
from .site_packages import SitePackagesTarget, find_dist_info, site_packages_of
from .tree import TreeTarget

KINDS = ("auto", "checkout", "site-packages", "tree")


def open_target(spec: str, kind: str = "auto", python: str | None = None) -> Target:
    """Open a target from the CLI's ``--target`` value (a path or ``site-packages``)."""
    if python:
        return SitePackagesTarget(site_packages_of(python))
    if spec == "site-packages":
        import sys
        return SitePackagesTarget(site_packages_of(sys.executable))
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise TargetError(f"target {spec} is not a directory")
    path = path.resolve()
    if kind == "auto":
        if (path / ".git").exists():
            kind = "checkout"
        elif find_dist_info(path, required=False) is not None:
            kind = "site-packages"
        else:
            kind = "tree"
    if kind == "checkout":
        from .checkout import CheckoutTarget  # GitPython is slow to import: only when needed
        return CheckoutTarget(path)
    if kind == "site-packages":
        return SitePackagesTarget(path)
    return TreeTarget(path)


__all__ = ["KINDS", "SitePackagesTarget", "Target", "TreeTarget", "open_target"]
