"""Where the exporter's GPUs come from: NVML (pynvml), or an installed backend by name.

A backend is an entry point of the group `sing.exporter_backends` (pyproject.toml), loaded only
when `sing exporter --fake` names it, as the collector loads its job sources: the product never
imports one, so sing's own fake nodes (`fake`, in sing.testing) sit above every layer
(docs/architecture.md). A backend is a callable `(source, state_file)` returning an object
whose `node(name, root)` gives a BackendNode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol

from sing.errors import UserError

GROUP = "sing.exporter_backends"


@dataclass(frozen=True)
class BackendNode:
    """One node of a backend: an object with pynvml's functions, and where its files are
    (sysfs, procfs, the job mapping; None: the settings' own) with what keeps them current."""

    nvml: Any
    roots: tuple[str, str, str] | None = None
    before_read: Callable[[], None] | None = None


class Backend(Protocol):
    def node(self, name: str | None, root: Path | None) -> BackendNode: ...


def load_backend(name: str, source: str, state_file: str | None) -> Backend:
    """The installed backend `name`, made from `source` (e.g. a device description)."""
    installed = {ep.name: ep for ep in entry_points(group=GROUP)}
    if name not in installed:
        raise UserError(
            f"no exporter backend {name!r} is installed (entry point group {GROUP!r}); "
            f"installed: {', '.join(sorted(installed)) or 'none'}"
        )
    return installed[name].load()(source, state_file)
