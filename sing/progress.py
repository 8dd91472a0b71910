"""A progress line for long commands, on stderr and only when stderr is a terminal.

A person at a terminal sees that `sing demo-data` or `sing simulate` is working and how far it
got; a pipe, a log file or cron gets nothing, so output that scripts read never changes.
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import TextIO

REDRAW_S = 0.5  # how often the line is redrawn while nothing advances (the elapsed time)


class Progress:
    """`with Progress("demo-data", total=336, unit="h") as p: ... p.update(24)`.

    The line is `label: done/total unit (pct %), N s` (without a total: `label: N s`), redrawn in
    place by a background thread, so it also moves while one step takes long; the last state
    stays on the screen when the block ends.
    """

    def __init__(
        self, label: str, total: int | None = None, unit: str = "", stream: TextIO | None = None
    ) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.stream = stream if stream is not None else sys.stderr
        self.shown = _is_terminal(self.stream)
        self.done = 0
        self.note = ""
        self._start = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._tick, daemon=True)

    def __enter__(self) -> Progress:
        if self.shown:
            self._start = time.monotonic()
            self._draw()
            self._thread.start()
        return self

    def update(self, done: int, note: str = "") -> None:
        """`done` of the total are done; `note` names what is being done now (a policy)."""
        self.done = done
        self.note = note
        if self.shown:
            self._draw()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self.shown:
            self._stop.set()
            self._thread.join()
            self._draw(end="\n")

    def line(self) -> str:
        elapsed = f"{time.monotonic() - self._start:.0f} s"
        if self.total is None:
            text = f"{self.label}: {elapsed}"
        else:
            pct = 100 * self.done / self.total if self.total else 100.0
            unit = f" {self.unit}" if self.unit else ""
            text = f"{self.label}: {self.done}/{self.total}{unit} ({pct:.0f} %), {elapsed}"
        return f"{text}  {self.note}" if self.note else text

    def _draw(self, end: str = "") -> None:
        with self._lock:
            self.stream.write("\r\x1b[K" + self.line() + end)  # back to column 0, clear the line
            self.stream.flush()

    def _tick(self) -> None:
        while not self._stop.wait(REDRAW_S):
            self._draw()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False
