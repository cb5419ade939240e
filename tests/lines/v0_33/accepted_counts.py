"""The check the tests of patch 0002's bounds share: in-range accepted counts leave a kernel's results alone."""

from __future__ import annotations

from collections.abc import Callable

import torch

Run = Callable[[list[int]], tuple[torch.Tensor, torch.Tensor]]


def assert_valid_counts_unchanged(patched: Run, release: Run, valid: list[list[int]], rows: int,
                                  row_output: Callable[[torch.Tensor, int], torch.Tensor], what: str = "") -> None:
    """Each count vector of `valid` gives the release's output and state, bit for bit, on the tree under test;
    and on the release every in-range count gives each request another output, so the comparison could see
    a bound that moved an in-range count."""
    results = {}
    for counts in valid:
        out, after = patched(counts)
        out0, after0 = release(counts)
        torch.testing.assert_close(out, out0, rtol=0, atol=0, msg=lambda m, c=counts: f"{what}counts {c}: {m}")
        torch.testing.assert_close(after, after0, rtol=0, atol=0, msg=lambda m, c=counts: f"{what}counts {c}: {m}")
        results[tuple(counts)] = out0
    for r in range(rows):
        outs = [row_output(results[tuple(c)], r) for c in valid]
        assert not any(torch.equal(a, b) for i, a in enumerate(outs) for b in outs[i + 1:]), \
            f"{what}request {r}: two in-range counts give the same output"
