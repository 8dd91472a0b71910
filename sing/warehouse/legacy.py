"""The warehouse format before Delta Lake (schema version 2), read only by the upgrade.

Files were named `<first>-<last>-<tag>.parquet`, the range of write sequence numbers of the
data they held; a merged file whose range covered others superseded them. Samples lived in
`<table>/day=D/`, records in `<table>/` (the newest `recorded_at` per key won), rollups in
`_rollups/<rollup>/day=D/`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from pathlib import Path

from sing.digits import ascii_digits

ROLLUP_DIR = "_rollups"


@dataclass(frozen=True, order=True)
class DataFile:
    first: int
    last: int
    tag: str
    path: Path

    @classmethod
    def parse(cls, path: Path) -> DataFile | None:
        if path.name.startswith(".") or path.suffix != ".parquet":
            return None
        parts = path.stem.split("-")
        if len(parts) != 3 or not (ascii_digits(parts[0]) and ascii_digits(parts[1])):
            return None
        return cls(int(parts[0]), int(parts[1]), parts[2], path)

    def covers(self, other: DataFile) -> bool:
        """This (merged) file supersedes `other`: its range holds other's and is larger."""
        return (
            self.first <= other.first
            and other.last <= self.last
            and (self.last - self.first) > (other.last - other.first)
        )


def data_files(directory: Path) -> list[DataFile]:
    if not directory.is_dir():
        return []
    found = (DataFile.parse(p) for p in directory.iterdir())
    return sorted(f for f in found if f is not None)


def live_files(directory: Path) -> list[DataFile]:
    """The files the old readers used: every file no merged file supersedes."""
    found = data_files(directory)
    merged = [f for f in found if f.last > f.first]
    return [f for f in found if not any(m.covers(f) for m in merged)]


def day_dirs(base: Path) -> dict[date, Path]:
    if not base.is_dir():
        return {}
    out = {
        date.fromisoformat(d.name[4:]): d
        for d in base.iterdir()
        if d.is_dir() and d.name.startswith("day=")
    }
    return dict(sorted(out.items()))
