"""The checks the tests of patch 0002's bounds share: an out-of-range accepted count stays inside the request's
own row, and in-range counts leave a kernel's results alone."""

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


def assert_stays_in_row(run: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]], state: torch.Tensor,
                        foreign: torch.Tensor, rows: list[list[int]],
                        tokens: Callable[[torch.Tensor, int], torch.Tensor], label: str) -> None:
    """``run(state) -> (output, state after)`` with the counts under test: no slot outside every row is written,
    and neither request r's output (``tokens(output, r)``) nor its own slots change when every slot outside
    its row (``rows[r]``) is replaced by ``foreign``'s."""
    num_slots = state.shape[0]
    out, after = run(state)
    unnamed = sorted(set(range(num_slots)) - {i for row in rows for i in row})
    assert torch.equal(after[unnamed], state[unnamed]), f"{label}: wrote a slot outside every row"
    for r, own in enumerate(rows):
        others = sorted(set(range(num_slots)) - set(own))
        changed = state.clone()
        changed[others] = foreign[others]
        out2, after2 = run(changed)
        torch.testing.assert_close(
            tokens(out2, r), tokens(out, r), rtol=0, atol=0, equal_nan=True,
            msg=lambda m, r=r: f"{label}: request {r}'s output depends on slots outside its row {rows[r]}: {m}")
        torch.testing.assert_close(
            after2[own], after[own], rtol=0, atol=0, equal_nan=True,
            msg=lambda m, r=r: f"{label}: request {r}'s slots depend on slots outside its row: {m}")
