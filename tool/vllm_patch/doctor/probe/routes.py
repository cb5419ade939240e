"""The route the installed multi-query verify kernel's planner takes on a device, per preset and K+1.

vLLM (patch 0003 of the current line) decides it once per attention layout before the first capture: the
planner's tilings, best first, those whose staged operands exceed the device's shared memory left out
(``tq_mq_verify_candidates``), each confirmed by a launch of the compiled kernel (``tq_mq_verify_select``
with ``tq_mq_verify_probe``); none left, or ``VLLM_TURBOQUANT_ATTENTION_KERNEL=decode``, and decodes take
the release's decode kernel and verify batches its per-request path. Here the same functions of the
installed file are called: with a GPU, as vLLM calls them (the launches included); with given limits (a
stub, or no GPU), the planner alone.
"""

from __future__ import annotations

import functools
import os
from types import ModuleType

from .reference import Layout

ROUTE_ENV = "VLLM_TURBOQUANT_ATTENTION_KERNEL"
MULTI_QUERY = "multi-query"
RELEASE = "release"


def _row(group: int, head_dim: int, preset: str, k1: int) -> dict:
    return {"group": group, "head_dim": head_dim, "preset": preset, "k1": k1}


def _fallback(row: dict, why: str, refused: list[str] | None = None) -> dict:
    return {**row, "route": RELEASE, "why": why, "refused": refused or []}


def route_table(kernel: ModuleType, limits, shapes: list[tuple[int, int]], presets: list[str], k1s: list[int],
                probe: dict | None = None, flydsl: bool = False) -> list[dict]:
    """One row per (G, head dim) of `shapes`, preset and K+1: the tiles and score precision the planner
    takes, the shared memory its staged operands need against the limit, whether a launch confirmed them;
    or the release's route and why. `limits` is the kernel's own ``TQMQLimits`` (``None``: no device, the
    widest tiles); `probe` the keyword arguments ``tq_mq_verify_probe`` takes besides the shape (a GPU)."""
    rows = []
    for group, head_dim in shapes:
        for preset in presets:
            lay = Layout.of(preset, head_dim)
            for k1 in k1s:
                row = _row(group, head_dim, preset, k1)
                if os.environ.get(ROUTE_ENV, "").strip().lower() == "decode":
                    rows.append(_fallback(row, f"{ROUTE_ENV}=decode"))
                elif flydsl:
                    rows.append(_fallback(row, "FlyDSL is available (gfx950): its SoA cache layout"))
                elif not kernel.tq_mq_verify_supports(head_dim):
                    rows.append(_fallback(row, f"head dim {head_dim} is not a power of two in 16..256"))
                else:
                    rows.append(_plan(kernel, limits, row, lay, probe))
    return rows


def _plan(kernel: ModuleType, limits, row: dict, lay: Layout, probe: dict | None) -> dict:
    k1, group, head_dim = row["k1"], row["group"], row["head_dim"]
    args = (k1, group, head_dim, lay.mse_bits, lay.key_fp8, limits)
    if probe is not None:
        fits = functools.partial(kernel.tq_mq_verify_probe, k1=k1, group=group, head_dim=head_dim,
                                 mse_bits=lay.mse_bits, key_fp8=lay.key_fp8, key_packed_size=lay.key_packed_size,
                                 value_bits=lay.value_bits, limits=limits, **probe)
        tiles, refused = kernel.tq_mq_verify_select(*args, fits)
        confirmed = tiles is not None
    else:
        candidates = kernel.tq_mq_verify_candidates(*args)
        tiles, refused, confirmed = (candidates[0] if candidates else None), [], False
    limit = getattr(limits, "max_shared", None)
    if tiles is None:
        why = "; ".join(refused) if refused else "no tiling's operands fit the shared memory"
        return _fallback(row, f"{why} ({limit} B per block)" if limit else why, refused)
    staged = kernel.tq_mq_staged_bytes(tiles.block_m, tiles.block_n, head_dim, lay.mse_bits, lay.key_fp8,
                                       tiles.precision)
    return {**row, "route": MULTI_QUERY, "block_m": tiles.block_m, "m_tiles": tiles.m_tiles,
            "block_n": tiles.block_n, "precision": "float16" if lay.key_fp8 else tiles.precision,
            "tiles": f"BLOCK_M {tiles.block_m} x {tiles.m_tiles}, BLOCK_N {tiles.block_n}", "shared": staged,
            "limit": limit, "confirmed": confirmed, "refused": refused, "why": None, "_tiles": tiles}
