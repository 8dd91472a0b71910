"""A targeted parser for the Prometheus text exposition format.

Why not `prometheus_client.parser`: it builds a metric family object for every line of every
payload, ~9.5 ms for one exporter's 54 KB; at 1,000 nodes every 15 s that alone is most of a core.
The collector needs a dozen metric names out of hundreds, so this parser looks at the name first
(one regex scan in C over the payload) and fully parses labels and values only for the wanted
lines, ~0.3 ms per payload (bench/bench_collector.py measures both side by side). The lines it
does parse follow the rules of the reference parser (prometheus/common expfmt/text_parse.go):
blanks and tabs may lead the line and separate the name, the label set and the value; escaped
label values (backslash, quote, newline); a value as Go's ParseFloat reads it (`NaN`, `+Inf`,
`-Inf`, no `_` digit separators as Python's float() would take); an optional millisecond
timestamp, a base-10 int64; no duplicate label names and no `__name__` label. Comments and blank
lines are ignored; trailing whitespace (a CR before the newline) is tolerated, as
prometheus_client tolerates it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection
from typing import NamedTuple

# One label pair: name="value", the value may hold escaped quotes and backslashes.
_LABEL = re.compile(
    r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\]*(?:\\.[^"\\]*)*)"[ \t]*(?:,|$)'
)
# What follows the name or the label set: the value as Go's strconv.ParseFloat spells it (ASCII
# digits, no `_`, no hex: expfmt rejects `p`), then an optional base-10 timestamp.
_VALUE_TIMESTAMP = re.compile(
    r"[ \t]*([+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf(?:inity)?)|nan)"
    r"(?:[ \t]+([+-]?[0-9]+))?\s*",
    re.IGNORECASE | re.ASCII,
)
_INT64 = 2**63
_ESCAPE = re.compile(r"\\(.)")
_UNESCAPED = {"n": "\n", "\\": "\\", '"': '"'}


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float
    timestamp_ms: int | None = None


class ParseError(ValueError):
    """A wanted line is not valid exposition format; the message quotes the line number."""


def parse(text: str, wanted: Collection[str]) -> list[Sample]:
    """The samples of `text` whose metric name is in `wanted`, in payload order.

    Lines of other metrics are skipped unparsed, so garbage there goes unnoticed; a malformed
    wanted line raises ParseError (the caller records the target as failed: half a node's
    GPUs would be worse than none).
    """
    out: list[Sample] = []
    for match in _line_finder(frozenset(wanted)).finditer(text):
        try:
            out.append(_parse_line(match.group(1), match.group(2)))
        except ValueError as err:
            number = text.count("\n", 0, match.start()) + 1
            raise ParseError(f"line {number}: {err}: {match.group(0)[:200]!r}") from None
    return out


@functools.lru_cache(maxsize=16)
def _line_finder(wanted: frozenset[str]) -> re.Pattern[str]:
    """A regex for the lines of the wanted metrics: the scan over the payload runs in C."""
    names = "|".join(re.escape(n) for n in sorted(wanted, key=len, reverse=True))
    # The name ends at a label set, blank or the line's end: `up:extra` is another metric.
    # Leading blanks and tabs are skipped, as the reference parser's startOfLine does.
    return re.compile(rf"^[ \t]*({names})(?=[{{\s]|$)(.*)$", re.MULTILINE)


def _parse_line(name: str, rest: str) -> Sample:
    labels: dict[str, str] = {}
    rest = rest.lstrip(" \t")  # `name {...}`: a blank may part the name and its label set
    if rest.startswith("{"):
        close = rest.rfind("}")
        if close == -1:
            raise ValueError("unterminated label set")
        labels = _parse_labels(rest[1:close])
        rest = rest[close + 1 :]
    match = _VALUE_TIMESTAMP.fullmatch(rest)
    if not match:
        raise ValueError("expected a value and an optional timestamp")
    timestamp = None if match.group(2) is None else int(match.group(2))
    if timestamp is not None and not -_INT64 <= timestamp < _INT64:
        raise ValueError("timestamp out of int64 range")
    return Sample(name, labels, float(match.group(1)), timestamp)


def _parse_labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    pos = 0
    text = text.rstrip()
    pairs = 0
    while pos < len(text):
        match = _LABEL.match(text, pos)
        if not match:
            raise ValueError(f"bad label at {text[pos : pos + 40]!r}")
        label, value = match.groups()
        if "\\" in value:
            value = _ESCAPE.sub(lambda m: _UNESCAPED.get(m.group(1), "\\" + m.group(1)), value)
        labels[label] = value
        pairs += 1
        pos = match.end()
    # Checked once per line, not per pair: the loop above is the parser's hot path.
    if len(labels) < pairs:
        raise ValueError("duplicate label names")
    if "__name__" in labels:
        raise ValueError("label name '__name__' is reserved")
    return labels
