"""Scheduling policies and the trace replay simulator (docs/scheduler.md).

The replay's hot modules (COMPILED) may also run as C extensions built from these same sources by
mypyc (`make native`, sing.scheduler.native), several times faster. Importing the package puts such
a build ahead of the sources, but only while its fingerprint matches them: an edited source is never
shadowed by a stale build, it runs as pure Python until the next build. SING_NATIVE=0 forces pure
Python; SING_NATIVE=DIR uses the build in DIR instead of build/native in the checkout.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

COMPILED = ("lane", "cluster", "core", "simulate")  # built together: calls between them are C
SOURCES = Path(__file__).resolve().parent
CHECKOUT = SOURCES.parents[1]  # the repository: sing/scheduler/ lies two levels down
DEFAULT_BUILD = CHECKOUT / "build" / "native"


def build_dir() -> Path | None:
    """Where a compiled build is looked for; None when SING_NATIVE=0 asks for pure Python."""
    chosen = os.environ.get("SING_NATIVE", "")
    if chosen in ("0", "off"):
        return None
    return Path(chosen) if chosen else DEFAULT_BUILD


def fingerprint() -> str:
    """What a build must match: the compiled modules' sources and this interpreter."""
    digest = hashlib.sha256(sys.implementation.cache_tag.encode())
    for name in COMPILED:
        digest.update(name.encode() + b"\0" + (SOURCES / f"{name}.py").read_bytes())
    return digest.hexdigest()


def _use_build() -> bool:
    where = build_dir()
    try:
        current = where is not None and (where / "FINGERPRINT").read_text().strip() == fingerprint()
    except OSError:
        return False
    if current:
        __path__.insert(0, str(where / "sing" / "scheduler"))
    return current


NATIVE = _use_build()  # whether this process replays with the compiled build
