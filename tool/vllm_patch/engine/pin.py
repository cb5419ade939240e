"""The pin: the exact upstream vLLM release a series applies to."""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from ..errors import InputError


@dataclass(frozen=True)
class Artifact:
    """A file published on PyPI for the pinned release, with its sha256."""

    filename: str
    sha256: str


@dataclass(frozen=True)
class Pin:
    """Release version, git tag, commit id and the PyPI artifacts of the base."""

    version: str
    tag: str
    commit: str
    sdist: Artifact
    wheel: Artifact

    def matches_version(self, found: str) -> bool:
        """True when `found` is the pinned release, local labels (``+vp.x``) aside."""
        try:
            return Version(found).public == Version(self.version).public
        except InvalidVersion:
            return False

    def matches_commit(self, found: str) -> bool:
        """True when `found` names the pinned commit.

        vLLM's ``_version.py`` holds an abbreviated id with a ``g`` prefix
        (``gb8160878f``), git holds the full id: compare on the common prefix,
        which must be at least 7 hex digits long.
        """
        found = found.strip().lower()
        if found.startswith("g") and len(found) > 7:
            found = found[1:]
        expected = self.commit.lower()
        common = min(len(found), len(expected))
        return common >= 7 and found[:common] == expected[:common]


PIN_KEYS = ("version", "tag", "commit", "sdist", "wheel")


def parse_artifact(key: str, value: str) -> Artifact:
    """Parse ``FILENAME sha256:HEX``."""
    parts = value.split()
    if len(parts) != 2 or not parts[1].startswith("sha256:"):
        raise InputError(f"series: pin '{key}' must read 'FILENAME sha256:HEX', got {value!r}")
    digest = parts[1][len("sha256:"):].lower()
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise InputError(f"series: pin '{key}' has a malformed sha256: {parts[1]!r}")
    return Artifact(parts[0], digest)


def pin_from_fields(fields: dict[str, str]) -> Pin:
    """Build a Pin from the ``#:`` lines of a series file."""
    missing = [k for k in PIN_KEYS if k not in fields]
    if missing:
        raise InputError(f"series: the pin lacks {', '.join(missing)} (lines '#: KEY = VALUE')")
    try:
        Version(fields["version"])
    except InvalidVersion:
        raise InputError(f"series: pin version {fields['version']!r} is not a valid version") from None
    return Pin(
        version=fields["version"],
        tag=fields["tag"],
        commit=fields["commit"].lower(),
        sdist=parse_artifact("sdist", fields["sdist"]),
        wheel=parse_artifact("wheel", fields["wheel"]),
    )
