"""A long-running collector's process kept small: what its libraries would load or keep that
the collector never uses (measured at 1,000 nodes in docs/collector.md, "Measured"). The
allocators' settings give way to the environment variables that choose them.

Only `sing collector` calls `keep_process_lean`: it changes the whole process (its allocators,
what its libraries know of pandas), which a library caller or a test must not have done to it.
"""

from __future__ import annotations

import ctypes
import importlib.abc
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

import pyarrow as pa

# glibc's malloc.h: mallopt's parameter for the most arenas (heaps) the process may have.
M_ARENA_MAX = -8
ARENAS = 2


def keep_process_lean() -> None:
    """Apply the three measures below to this process, before its threads start."""
    arrow_buffers_from_malloc()
    cap_malloc_arenas()
    leave_pandas_unloaded()


def arrow_buffers_from_malloc() -> None:
    """Arrow's buffers from the C library's malloc: its default pool (mimalloc) kept 25 MB
    more and was no faster. `ARROW_DEFAULT_MEMORY_POOL` chooses otherwise."""
    if "ARROW_DEFAULT_MEMORY_POOL" not in os.environ:
        pa.set_memory_pool(pa.system_memory_pool())


def cap_malloc_arenas() -> None:
    """At most ARENAS heaps, as `MALLOC_ARENA_MAX=2` would give (which, or glibc's tunable
    `glibc.malloc.arena_max`, chooses otherwise). glibc gives each thread that finds a heap busy
    one of its own, up to 8 per core, and the pages the fetch threads read are then spread over
    as many heaps, each keeping its free memory. Nothing is done on another C library (no
    `mallopt`)."""
    if "MALLOC_ARENA_MAX" in os.environ or "arena_max" in os.environ.get("GLIBC_TUNABLES", ""):
        return
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(M_ARENA_MAX, ARENAS)


class PandasRefused(importlib.abc.MetaPathFinder):
    """Makes `import pandas` fail as if it were not installed."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname.partition(".")[0] == "pandas":
            raise ModuleNotFoundError(f"{fullname} refused for a moment", name=fullname)
        return None


def leave_pandas_unloaded() -> None:
    """pyarrow imports pandas at its first array whenever it is installed, only to recognise
    pandas objects: 28 MB that a collector, which makes none, would keep. It tries once and
    remembers the outcome, so it is made to try now, while pandas is refused. Then pandas is
    importable again for whatever does use it (a site's source plugin; `pa.table(frame)`,
    `from_pandas` and `to_pandas` work), but pyarrow takes a bare Series for a plain sequence
    (a categorical becomes strings, a nullable integer with NA fails). Should a later pyarrow
    try again, pandas is simply loaded (tests/test_collector_imports.py would say so)."""
    if "pandas" in sys.modules:
        return
    refused = PandasRefused()
    sys.meta_path.insert(0, refused)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(refused)
