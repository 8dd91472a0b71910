"""The `--record` format: one JSON line per reading, replayed by the fake NVML.

A frame holds what the GPU source read, in the fake's own keys and SI units, plus the readings
that failed, so a replay reproduces both values and failures:
`{"t": unix_seconds, "driver_version": "...", "gpus": [{"index": 0, "uuid": "GPU-...",
"util": 0.0, "power_w": 71.2, ..., "errors": {"ecc": "not_supported"}}]}`
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sing.errors import UserError

if TYPE_CHECKING:  # the fake NVML replays recordings and must not import the exporter it checks
    from sing.exporters.gpu import NodeReading


def frame_of(reading: NodeReading, t: float) -> dict[str, Any]:
    return {
        "t": round(t, 3),
        "driver_version": reading.driver_version,
        "gpus": [
            {"index": g.index, "uuid": g.uuid, **g.values, "errors": g.errors} for g in reading.gpus
        ],
    }


class Recorder:
    """Appends one frame per fresh reading; each line is flushed so a kill loses at most one."""

    def __init__(self, path: str | Path) -> None:
        try:
            self._file = open(path, "w")  # noqa: SIM115 - lives as long as the exporter
        except OSError as err:
            raise UserError(f"--record {path}: cannot write: {err.strerror}") from err
        self._lock = threading.Lock()

    def write(self, reading: NodeReading) -> None:
        with self._lock:
            self._file.write(json.dumps(frame_of(reading, time.time())) + "\n")
            self._file.flush()

    def close(self) -> None:
        self._file.close()


def load_recording(path: str | Path) -> list[dict[str, Any]]:
    frames = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as err:
        raise UserError(f"recording {path}: cannot read: {err.strerror}") from err
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            frame = json.loads(line)
            if not isinstance(frame.get("t"), int | float) or not isinstance(frame["gpus"], list):
                raise ValueError("needs a number t and a list gpus")
        except (ValueError, KeyError, AttributeError) as err:
            raise UserError(f"recording {path} line {number}: not a frame: {err}") from err
        frames.append(frame)
    if not frames:
        raise UserError(f"recording {path}: no frames")
    return frames
