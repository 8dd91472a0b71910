"""A targeted parser for the Prometheus text exposition format.

Why not `prometheus_client.parser`: it builds a metric family object for every line of every
payload, ~9.5 ms for one exporter's 54 KB; at 1,000 nodes every 15 s that alone is most of a core.
The collector needs a dozen metric names out of hundreds, so this parser looks at the name first
(one regex scan in C over the payload) and fully parses labels and values only for the wanted
lines, ~0.3 ms per payload (bench/bench_collector.py measures both side by side). The lines it
does parse follow the rules of the reference parser (prometheus/common expfmt/text_parse.go):
blanks and tabs may lead the line and separate the name, the label set and the value; escaped
label values (backslash, quote, newline; any other escape is an error); quoted UTF-8 names
(`{"my.metric","dotted.label"="v"} 1`, prometheus/common 0.62+); a value as Go's ParseFloat
reads it (`NaN`, `+Inf`, `-Inf`, no `_` digit separators as Python's float() would take); an
optional millisecond
timestamp, a base-10 int64; no duplicate label names and no `__name__` label. Comments and blank
lines are ignored; trailing whitespace (a CR before the newline) is tolerated, as
prometheus_client tolerates it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection
from typing import NamedTuple

# A quoted string of the format: escaped quotes, backslashes and newlines inside.
_QUOTED = r'"([^"\\]*(?:\\.[^"\\]*)*)"'
# One label pair: name="value".
_LABEL = re.compile(rf"[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*{_QUOTED}[ \t]*(?:,|$)")
# Since the UTF-8 names of prometheus/common 0.62 a label name may be quoted ("dotted.label"="v"),
# and a quoted string alone in the braces is the metric's name (`{"my.metric",a="b"} 1`, anywhere
# in the braces). Tried only where _LABEL does not match, so common pages pay nothing for it.
_QUOTED_LABEL = re.compile(rf"[ \t]*{_QUOTED}(?:[ \t]*=[ \t]*{_QUOTED})?[ \t]*(?:,|$)")
# What follows the name or the label set: the value as Go's strconv.ParseFloat spells it (ASCII
# digits, no `_`, no hex: expfmt rejects `p`), then an optional base-10 timestamp.
_VALUE_TIMESTAMP = re.compile(
    r"[ \t]*([+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf(?:inity)?)|nan)"
    r"(?:[ \t]+([+-]?[0-9]+))?\s*",
    re.IGNORECASE | re.ASCII,
)
# The fast path's label set: quoted strings without escapes, no `}` outside them. Its common
# form, pairs without blanks (`a="b",c="d"`), is read by _PLAIN_PAIR; any other by _LABEL and
# _QUOTED_LABEL.
_LABEL_SET = r'[^"\\\n}]*(?:"[^"\\\n]*"[^"\\\n}]*)*'
_PLAIN_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="[^"]*"'
_PLAIN_LABELS = re.compile(rf"(?:{_PLAIN_LABEL},)*(?:{_PLAIN_LABEL})?")
_PLAIN_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')
_INT64 = 2**63
_BRACE_LINE = re.compile(r"\n[ \t]*\{")  # a literal first character: the scan runs at C speed
_ESCAPE = re.compile(r"\\(.?)", re.DOTALL)
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
    wanted = frozenset(wanted)
    if not wanted:
        return []
    # Lines that open with `{` (a quoted name) are rare: only the complete parse reads them.
    brace_first = _has_brace_line(text)
    if not brace_first:
        try:
            return _parse_fast(text, wanted)
        except ValueError:
            pass  # a malformed wanted line: the complete parse names it
    return _parse_complete(text, wanted, brace_first)


def wanted_lines(text: str, wanted: Collection[str]) -> list[str] | None:
    """The raw lines of the wanted metrics, in payload order: to tell that a page's lines are
    as before without parsing them. None where a line opens with `{` (its name is quoted
    inside: only a parse tells whether it is wanted)."""
    if _has_brace_line(text):
        return None
    return _raw_line_finder(frozenset(wanted)).findall(f"\n{text}\n")


def _has_brace_line(text: str) -> bool:
    return text.lstrip(" \t").startswith("{") or _BRACE_LINE.search(text) is not None


@functools.lru_cache(maxsize=32)
def _raw_line_finder(wanted: frozenset[str]) -> re.Pattern[str]:
    """Whole lines of a newline-framed payload whose name is wanted, as `_line_finder` tells
    them apart, each with the newline before it (a literal first character: the scan runs at
    C speed)."""
    return re.compile(rf"\n[ \t]*(?:{_trie(wanted)})(?=[{{\s])[^\n]*")


def _parse_fast(text: str, wanted: frozenset[str]) -> list[Sample]:
    """The common lines, `name{a="b",c="d"} value [timestamp]` without escapes, found by one
    regex scan (in C) with their label sets and values; any other wanted line is parsed by
    `_parse_line`. A ValueError means some wanted line is malformed: `_parse_complete` says
    which."""
    out: list[Sample] = []
    append = out.append
    new = tuple.__new__  # Sample's own __new__ is a Python function: one call more per line
    # A page repeats its label sets (one per GPU, for each of its metrics): each is read once,
    # and its samples share the dict (read-only to every consumer).
    label_sets: dict[str, dict[str, str]] = {"": {}}
    # Every line ends in a newline and follows one, so the scan looks for one literal character.
    for name, labels, value, timestamp, rest in _fast_finder(wanted).findall(f"\n{text}\n"):
        if not value:  # not the plain form
            append(_parse_line(name, rest))
            continue
        label_dict = label_sets.get(labels)
        if label_dict is None:
            label_dict = label_sets[labels] = _label_set(labels)
        stamp = None
        if timestamp:
            stamp = int(timestamp)
            if not -_INT64 <= stamp < _INT64:
                raise ValueError("timestamp out of int64 range")
        append(new(Sample, (name, label_dict, float(value), stamp)))
    return out


def _label_set(text: str) -> dict[str, str]:
    """A label set without escapes: its common form read by one regex, any other pair by pair."""
    if _PLAIN_LABELS.fullmatch(text):
        pairs = _PLAIN_PAIR.findall(text)
        labels = dict(pairs)
        if len(labels) < len(pairs):
            raise ValueError("duplicate label names")
        if "__name__" in labels:
            raise ValueError("label name '__name__' is reserved")
        return labels
    labels, name = _parse_labels(text)
    if name is not None:
        raise ValueError("a second metric name in the label set")
    return labels


def _parse_complete(text: str, wanted: frozenset[str], brace_first: bool) -> list[Sample]:
    """Every wanted line by `_parse_line`; a malformed one raises ParseError with its number."""
    out: list[Sample] = []
    for match in _line_finder(wanted, brace_first).finditer(text):
        try:
            name, rest = match.groups()
            sample = _parse_line(name, rest)
            if name or sample.name in wanted:  # a line opening with `{` names itself inside
                out.append(sample)
        except ValueError as err:
            number = text.count("\n", 0, match.start()) + 1
            raise ParseError(f"line {number}: {err}: {match.group(0)[:200]!r}") from None
    return out


@functools.lru_cache(maxsize=32)
def _fast_finder(wanted: frozenset[str]) -> re.Pattern[str]:
    """A regex for the wanted lines of a newline-framed payload: the name, then the plain form's
    label set, value (never empty) and timestamp, or else the line after the name, for
    `_parse_line`. The names are a trie, so the scan reads each line's name once rather than
    trying every wanted name in turn."""
    plain = rf"(?:\{{({_LABEL_SET})\}})? ([-+0-9.eE]+|[-+]?Inf|NaN)(?: (-?[0-9]+))?(?=\n)"
    return re.compile(rf"\n[ \t]*({_trie(wanted)})(?:{plain}|(?=[{{\s])([^\n]*))")


def _trie(words: Collection[str]) -> str:
    """A regex matching exactly `words`, sharing their prefixes (`a(?:bc|d)` for abc, ad)."""
    tree: dict = {}
    for word in words:
        node = tree
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}
    return _trie_regex(tree)


def _trie_regex(node: dict) -> str:
    children = sorted(node.items())
    branches = [re.escape(char) + _trie_regex(child) for char, child in children if char]
    if not branches:
        return ""
    body = branches[0] if len(branches) == 1 else f"(?:{'|'.join(branches)})"
    return f"(?:{body})?" if "" in node else body


@functools.lru_cache(maxsize=32)
def _line_finder(wanted: frozenset[str], brace_first: bool) -> re.Pattern[str]:
    """A regex for the lines of the wanted metrics: the scan over the payload runs in C."""
    names = "|".join(re.escape(n) for n in sorted(wanted, key=len, reverse=True))
    # The name ends at a label set, blank or the line's end: `up:extra` is another metric.
    # Leading blanks and tabs are skipped, as the reference parser's startOfLine does. A line
    # opening with `{` carries its (quoted) name inside the braces, so it is always parsed.
    names = rf"(?:{names})(?=[{{\s]|$)"
    if brace_first:
        names += r"|(?=\{)"
    return re.compile(rf"^[ \t]*({names})(.*)$", re.MULTILINE)


def _parse_line(name: str, rest: str) -> Sample:
    labels: dict[str, str] = {}
    rest = rest.lstrip(" \t")  # `name {...}`: a blank may part the name and its label set
    if rest.startswith("{"):
        close = rest.rfind("}")
        if close == -1:
            raise ValueError("unterminated label set")
        labels, quoted_name = _parse_labels(rest[1:close])
        if quoted_name is not None:
            if name:
                raise ValueError("a second metric name in the label set")
            name = quoted_name
        rest = rest[close + 1 :]
    if not name:
        raise ValueError("no metric name")
    match = _VALUE_TIMESTAMP.fullmatch(rest)
    if not match:
        raise ValueError("expected a value and an optional timestamp")
    timestamp = None if match.group(2) is None else int(match.group(2))
    if timestamp is not None and not -_INT64 <= timestamp < _INT64:
        raise ValueError("timestamp out of int64 range")
    return Sample(name, labels, float(match.group(1)), timestamp)


def _parse_labels(text: str) -> tuple[dict[str, str], str | None]:
    """The label set's pairs, and the metric name where the set carries it quoted."""
    labels: dict[str, str] = {}
    name = None
    pos = 0
    text = text.rstrip()
    pairs = 0
    while pos < len(text):
        match = _LABEL.match(text, pos)
        if match:
            label, value = match.groups()
        else:
            match = _QUOTED_LABEL.match(text, pos)
            if not match:
                raise ValueError(f"bad label at {text[pos : pos + 40]!r}")
            quoted, value = match.groups()
            if value is None:  # a lone string: the metric's name, once
                if name is not None:
                    raise ValueError(f"a second metric name {quoted!r}")
                name = _unescape(quoted)
                pos = match.end()
                continue
            label = _unescape(quoted)
        if "\\" in value:
            value = _unescape(value)
        labels[label] = value
        pairs += 1
        pos = match.end()
    # Checked once per line, not per pair: the loop above is the parser's hot path.
    if len(labels) < pairs:
        raise ValueError("duplicate label names")
    if "__name__" in labels:
        raise ValueError("label name '__name__' is reserved")
    return labels, name


def _unescape(text: str) -> str:
    """The format's three escapes; any other (`\\t`) is an error, as in the Go parser."""
    return _ESCAPE.sub(_escaped, text) if "\\" in text else text


def _escaped(match: re.Match[str]) -> str:
    try:
        return _UNESCAPED[match.group(1)]
    except KeyError:
        raise ValueError(f"invalid escape sequence '\\{match.group(1)}'") from None
