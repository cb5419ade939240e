"""GDN speculative-decoding state recovery (line v0.20, patches 0004 and 0005): the pristine and the patched tree."""

from __future__ import annotations


