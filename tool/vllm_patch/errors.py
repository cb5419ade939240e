"""Error types, each mapped to the exit code the CLI documents.

Exit codes: 0 everything as asked, 1 a patch does not check or apply,
2 a usage or environment error (bad input, pin mismatch, unwritable target,
busy lock). Every error carries a one-line message meant for the user.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .lifecycle.rebase import RebaseResult

EXIT_OK = 0
EXIT_PATCH_FAILED = 1
EXIT_USAGE = 2


class VllmPatchError(Exception):
    """Base class: a clear one-line message and an exit code."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InputError(VllmPatchError):
    """A malformed series, patch file or target file."""


class PinMismatch(VllmPatchError):
    """The target's vLLM version or commit is not the one the series is pinned to."""


class TargetError(VllmPatchError):
    """The target cannot be read or written safely (read-only, symlinks, RECORD drift...)."""


class LockBusy(VllmPatchError):
    """Another vllm-patch run holds the target's lock."""


class DownloadError(VllmPatchError):
    """A download failed or its sha256 did not match."""


class UpstreamError(VllmPatchError):
    """git failed on the upstream cache repository, or a 3-way merge could not run."""


class CheckNotRun(VllmPatchError):
    """An ``Obsolete-If:`` check could not run (pytest missing, its test not found): no verdict."""


class PatchFailed(VllmPatchError):
    """At least one patch is ambiguous, conflicting or partially applied."""

    exit_code = EXIT_PATCH_FAILED


class RebaseConflict(PatchFailed):
    """A patch needs a hand merge; the rebase waits for --continue or --abort. Defined here, not in
    lifecycle.rebase, so the CLI can catch it (through operations) without importing GitPython at start."""

    def __init__(self, result: RebaseResult, message: str) -> None:
        super().__init__(message)
        self.result = result
