"""The `fake` exporter backend: nodes of scripted GPUs with their files (`sing exporter --fake`)."""

from __future__ import annotations

from pathlib import Path

from sing.exporters.backends import BackendNode
from sing.testing.fake_nvml import FakeNvml, StateFile, load_description
from sing.testing.fake_world import FakeWorld


class FakeNodes:
    """Fake nodes of one device description (YAML) or recording (.jsonl), sharing the runtime
    overrides of `state_file` (re-read when it changes)."""

    def __init__(self, source: str, state_file: str | None) -> None:
        self.description = load_description(source)
        self.state = StateFile(state_file) if state_file else None

    def node(self, name: str | None, root: Path | None) -> BackendNode:
        """Node `name`'s NVML; with `root`, also its /sys, /proc and job files there, kept in
        step with its state before every read."""
        nvml = FakeNvml(self.description, self.state, name)
        if root is None:
            return BackendNode(nvml)
        world = FakeWorld(root, nvml)
        return BackendNode(nvml, world.roots, world.sync)
