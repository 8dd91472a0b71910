"""The `[demo]` section: where the live demo keeps its files (written by `sing demo`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DemoSettings:
    state_file: str = "state.json"  # what the fake exporters show, rewritten every tick
    records_file: str = "jobs.json"  # job records the collector's job sync reads
