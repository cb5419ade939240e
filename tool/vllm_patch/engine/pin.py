"""The pin: the exact upstream vLLM release a series applies to, and the later releases its
line is also proven on (``#: also = 0.20.1 0.20.2``). This module owns the pin's format:
it parses the ``#:`` fields and writes them back."""

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
    also: tuple[str, ...] = ()

    @property
    def releases(self) -> tuple[str, ...]:
        """Every release the line is proven on: the pin, then the declared ``also`` ones."""
        return (self.version, *self.also)

    def matches_version(self, found: str) -> bool:
        """True when `found` is the pinned release, local labels (``+vp.x``) aside."""
        return _same_release(found, self.version)

    def covers(self, found: str) -> bool:
        """True when `found` is the pinned release or one declared with ``also``."""
        return any(_same_release(found, release) for release in self.releases)

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


def _same_release(found: str, release: str) -> bool:
    try:
        return Version(found).public == Version(release).public
    except InvalidVersion:
        return False


PIN_KEYS = ("version", "tag", "commit", "sdist", "wheel")
# Optional keys: ``also``, the later releases the line is proven on (CI checks it against them).
PIN_FIELDS = (*PIN_KEYS, "also")


def parse_artifact(key: str, value: str, where: str = "series") -> Artifact:
    """Parse ``FILENAME sha256:HEX``."""
    parts = value.split()
    if len(parts) != 2 or not parts[1].startswith("sha256:"):
        raise InputError(f"{where}: pin '{key}' must read 'FILENAME sha256:HEX', got {value!r}")
    digest = parts[1][len("sha256:"):].lower()
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise InputError(f"{where}: pin '{key}' has a malformed sha256: {parts[1]!r}")
    return Artifact(parts[0], digest)


def _also(value: str, version: str, where: str) -> tuple[str, ...]:
    """The ``also`` releases: valid versions, none twice, none the pin itself."""
    seen: list[str] = []
    for release in value.split():
        try:
            Version(release)
        except InvalidVersion:
            raise InputError(f"{where}: pin 'also' names {release!r}, which is not a valid version") from None
        if any(_same_release(release, r) for r in (version, *seen)):
            raise InputError(f"{where}: pin 'also' names {release} twice (or the pinned version itself)")
        seen.append(release)
    return tuple(seen)


def pin_from_fields(fields: dict[str, str], where: str = "series") -> Pin:
    """Build a Pin from the ``#:`` lines of a series file (`where` names it in messages)."""
    missing = [k for k in PIN_KEYS if k not in fields]
    if missing:
        raise InputError(f"{where}: the pin lacks {', '.join(missing)} (lines '#: KEY = VALUE')")
    try:
        Version(fields["version"])
    except InvalidVersion:
        raise InputError(f"{where}: pin version {fields['version']!r} is not a valid version") from None
    return Pin(
        version=fields["version"],
        tag=fields["tag"],
        commit=fields["commit"].lower(),
        sdist=parse_artifact("sdist", fields["sdist"], where),
        wheel=parse_artifact("wheel", fields["wheel"], where),
        also=_also(fields.get("also", ""), fields["version"], where),
    )


def pin_lines(pin: Pin) -> list[str]:
    """The pin as a series file's ``#:`` lines (what `pin_from_fields` reads back)."""
    lines = [f"#: version = {pin.version}", f"#: tag = {pin.tag}", f"#: commit = {pin.commit}",
             f"#: sdist = {pin.sdist.filename} sha256:{pin.sdist.sha256}",
             f"#: wheel = {pin.wheel.filename} sha256:{pin.wheel.sha256}"]
    return lines + ([f"#: also = {' '.join(pin.also)}"] if pin.also else [])
