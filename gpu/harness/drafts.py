"""The draft tokens a Model Runner V2 speculator proposes, recorded in the engine's process.

Two engines that differ only in how the drafter runs (its K-1 decode steps as one fused CUDA graph, or one graph
per step after an eager metadata rebuild) must propose the same drafts. Their outputs cannot tell: the target
verifies every draft, so a wrong draft only lowers acceptance, which the random test models keep near zero
anyway. The proposals themselves can: ``install`` wraps ``propose`` of every V2 speculator class the engine has
imported, and while ``recording`` is active each outermost call appends its drafts (one list of K tokens per
request) to the log. Reading them waits for the device, so the benchmarks record outside their timed runs.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from harness.methods import speculator_classes, wrap_once

_STATE: dict[str, Any] = {"log": None, "depth": 0}


def _wrap(propose):
    @functools.wraps(propose)
    def recorded(self, *args, **kwargs):
        _STATE["depth"] += 1
        try:
            drafts = propose(self, *args, **kwargs)
        finally:
            _STATE["depth"] -= 1
        if _STATE["log"] is not None and _STATE["depth"] == 0 and drafts is not None:
            _STATE["log"].append(drafts.tolist())
        return drafts

    return recorded


def install() -> int:
    """Wrap ``propose`` where a speculator class defines it (once); returns how many classes are wrapped."""
    return sum(wrap_once(cls, "propose", _wrap, "__vp_recorded__") for cls in speculator_classes())


@contextlib.contextmanager
def recording() -> Iterator[list[list[list[int]]]]:
    """The proposals made while the block runs, in order: each a list of per-request draft lists."""
    log: list[list[list[int]]] = []
    _STATE["log"] = log
    try:
        yield log
    finally:
        _STATE["log"] = None


def first_difference(a: list, b: list) -> str | None:
    """None when two logs of proposals are equal, else where they first differ."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"proposal {i} of {len(a)}: {x} against {y}"
    if len(a) != len(b):
        return f"{len(a)} proposals against {len(b)}"
    return None
