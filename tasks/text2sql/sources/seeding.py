"""Seeded random generators derived from names, so every generated artefact is a pure function of its seed."""

from __future__ import annotations

import hashlib
import random


def derived_rng(*parts: object) -> random.Random:
    """A generator seeded from the parts' text; Python's hash() is salted per process, sha256 is not."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))
