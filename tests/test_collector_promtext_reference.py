"""sing.collector.promtext against the reference parsers: the same samples as prometheus_client's
parser on valid lines, and a ParseError where the Go parser (prometheus/common expfmt/text_parse.go,
the parser behind client_golang and promtool) rejects the line.

The accepted lines are taken from the scenarios of prometheus/common expfmt/text_parse_test.go
(testTextParse, scenarios 1 to 3: "various whitespace", "the evil summary"), plus the cases of
issue 28: a blank between the name and `{`, several blanks before the value, leading blanks.
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sing.collector.client import PayloadError, fetch
from sing.collector.promtext import ParseError, Sample, parse
from tests.http_stub import serving

ACCEPTED = [
    # prometheus/common expfmt/text_parse_test.go, scenario 1 (minimal case).
    "minimal_metric 1.234",
    "another_metric -3e3 103948",
    "no_labels{} 3",
    # Scenario 2 (counters & gauges, various whitespace, escape sequences).
    'name{labelname="val1",basename="basevalue"} NaN',
    'name {labelname="val2",basename="base\\"v\\\\al\\nue"} 0.23 1234567890',
    'name2{labelname="val2"\t,basename   =   "basevalue2"\t\t} +Inf 54321',
    'name2{ labelname = "val1" , }-Inf',
    # Scenario 3 (the evil summary): negative timestamp, leading zero, leading blanks.
    "decoy -1 -2",
    'my_summary_sum{n1="val2"} 08 15',
    '  my_summary{n1="val1",n2="val2",quantile="-12.34",} NaN',
    # Issue 28.
    'metric {a="b"} 1',
    'metric{a="b"}  1',
    '\tmetric{a="b"} 1',
    " \t metric 1 1700000000123",
    "metric\t1",
    "metric 1.",
    "metric .5e-3",
    "metric Infinity",
    "metric 1 ",
]

# Rejected by the Go parser: parseFloat refuses `_` and `p`, ParseInt(s, 10, 64) refuses `_`,
# fractions and overflow, startLabelName refuses `__name__` and duplicate names, startTimestamp
# refuses anything after the timestamp. Python's float() and int() would take the first four.
REJECTED = [
    "metric 1_000",
    "metric 1 1_000",
    "metric 0x1p-2",
    "metric \u0661",  # ARABIC-INDIC DIGIT ONE: float() reads it as 1.0
    "metric 1 1.5",
    "metric 1 99999999999999999999",
    "metric 1 2 3",
    'metric{a="b",a="c"} 1',
    'metric{__name__="other"} 1',
    'metric{a="b"} 1_0',
]


def reference(line: str) -> list[Sample]:
    """What prometheus_client makes of the line, in sing.collector.promtext's terms."""
    return [
        Sample(
            s.name,
            s.labels,
            s.value,
            None if s.timestamp is None else round(s.timestamp * 1000),
        )
        for family in text_string_to_metric_families(line + "\n")
        for s in family.samples
    ]


def without_comments(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def same(ours: list[Sample], theirs: list[Sample]) -> bool:
    def key(s: Sample) -> tuple:
        return (s.name, s.labels, "nan" if math.isnan(s.value) else s.value, s.timestamp_ms)

    return [key(s) for s in ours] == [key(s) for s in theirs]


@pytest.mark.parametrize("line", ACCEPTED)
def test_accepted_lines_give_prometheus_clients_samples(line: str) -> None:
    name = line.strip().split("{")[0].split()[0]
    ours = parse("# HELP other help\n" + line + "\n", {name})
    assert len(ours) == 1
    assert same(ours, reference(line)), (ours, reference(line))


@pytest.mark.parametrize("line", REJECTED)
def test_lines_the_go_parser_rejects_fail_the_target(line: str) -> None:
    with pytest.raises(ParseError, match=r"^line 2: "):
        parse("# HELP metric help\n" + line + "\n", {"metric"})


def test_prometheus_client_rejects_the_same_lines_where_it_checks() -> None:
    # Where prometheus_client checks (digit separators, duplicate and reserved labels) it agrees
    # with the Go parser; the rejected list is not a sing invention.
    for line in ["metric 1_000", 'metric{a="b",a="c"} 1', 'metric{__name__="other"} 1']:
        with pytest.raises(ValueError):
            reference(line)


def test_a_bad_wanted_line_fails_the_page_and_a_bad_other_line_is_ignored() -> None:
    # sing's policy (docs/collector.md): a malformed wanted line fails the whole target, as the Go
    # parser fails the whole page; lines of metrics sing does not read are not parsed at all.
    good = "other_metric 1_000\n  metric 2\n"
    assert parse(good, {"metric"}) == [Sample("metric", {}, 2.0)]
    with pytest.raises(ParseError, match=r"^line 3: duplicate label name"):
        parse(good + 'metric{a="b",a="c"} 1\n', {"metric"})


def test_leading_blanks_keep_the_line_number_in_errors() -> None:
    with pytest.raises(ParseError, match=r"^line 2: .*'  metric 1_000'"):
        parse("# comment\n  metric 1_000\n", {"metric"})


# --- Every scenario of the Go parser's own test file (tests/fixtures/expfmt/README.md) ---

GO_TESTS = Path(__file__).parent / "fixtures" / "expfmt" / "text_parse_test.go"

# Error scenarios of testTextParseError that sing accepts or never reads, each a documented design
# choice (docs/collector.md "The text format"): sing parses only the lines of the metrics it
# wants (and every line opening with `{`, whose name is inside), and reads no comment (HELP and
# TYPE lines), so checks that need a TYPE line or another metric's line are not made; a last
# line without its newline is read, as prometheus_client reads it.
NOT_READ = {
    0: "last line without a newline: read, as prometheus_client reads it",
    7: "quantile label checked only for a TYPE summary: sing reads no TYPE line",
    12: "second HELP line: comments are not read",
    13: "second TYPE line: comments are not read",
    14: "TYPE after samples: comments are not read",
    15: "unknown TYPE: comments are not read",
    16: "bad name in a comment: comments are not read",
    17: "a name sing does not want is not parsed",
    19: "le label checked only for a TYPE histogram",
    32: "le label checked only for a TYPE histogram",
    33: "quantile label checked only for a TYPE summary",
    41: "valid in UTF-8 mode (errUTF8 is empty)",
    42: "valid in UTF-8 mode (errUTF8 is empty)",
    43: "histogram counts checked only for a TYPE histogram",
    44: "histogram counts checked only for a TYPE histogram",
    45: "histogram counts checked only for a TYPE histogram",
    46: "histogram counts checked only for a TYPE histogram",
}


def go_inputs(function: str) -> list[str]:
    """The `in:` strings of one scenario list of the Go test file, decoded as Go decodes them."""
    source = GO_TESTS.read_text()
    body = source[source.index(f"func {function}(t testing.TB)") :]
    body = body[: body.index("\nfunc ")]
    inputs = []
    for match in re.finditer(r'\bin:\s+(`[^`]*`|"(?:[^"\\]|\\.)*")', body):
        literal = match.group(1)
        if literal.startswith("`"):
            inputs.append(literal[1:-1])
        else:  # an interpreted Go string: the same escapes as a Python bytes literal here
            raw = ast.literal_eval("b" + literal)
            inputs.append(raw.decode("utf-8", errors="surrogateescape"))
    return inputs


def test_the_go_file_has_every_scenario() -> None:
    assert len(go_inputs("testTextParse")) == 18
    assert len(go_inputs("testTextParseError")) == 48


@pytest.mark.parametrize("index", range(18))
def test_go_valid_scenarios_give_prometheus_clients_samples(index: int) -> None:
    # Compared with the comments left out, as sing reads no comment: prometheus_client would
    # otherwise name a TYPE counter's samples `_total` and refuse the TYPE gauge_histogram.
    text = go_inputs("testTextParse")[index]
    theirs = reference(without_comments(text))
    ours = parse(text, {s.name for s in theirs})
    assert same(ours, theirs), (ours, theirs)


@pytest.mark.parametrize("index", [i for i in range(48) if i not in NOT_READ])
def test_go_error_scenarios_fail_the_target(index: int) -> None:
    text = go_inputs("testTextParseError")[index]
    if "\udcbd" in text:  # not UTF-8: the scrape itself refuses the page, before parsing
        page = text.encode("utf-8", errors="surrogateescape")
        with serving(lambda path: page) as address, pytest.raises(PayloadError, match="UTF-8"):
            fetch(f"http://{address}/metrics", timeout_s=5, max_bytes=1 << 20)
        return
    names = {"metric", "foo", "metric.name", "a\udcc5z", "another.name", "bla", "blubber"}
    with pytest.raises(ParseError):
        parse(text, names)


@pytest.mark.parametrize("index", sorted(NOT_READ))
def test_go_error_scenarios_sing_does_not_check_are_the_documented_ones(index: int) -> None:
    # What sing makes of them: no error, and no sample that is not a valid one of a wanted name.
    text = go_inputs("testTextParseError")[index]
    for sample in parse(text, {"metric", "metric_name", "request_duration_microseconds_count"}):
        assert math.isfinite(sample.value) or math.isnan(sample.value)


# --- prometheus/prometheus model/textparse (tests/fixtures/textparse/README.md) ---


def test_a_real_prometheus_page_gives_prometheus_clients_samples() -> None:
    text = (
        Path(__file__).parent / "fixtures" / "textparse" / "alltypes.237mfs.prom.txt"
    ).read_text()
    theirs = reference(without_comments(text))
    ours = parse(text, {s.name for s in theirs})
    assert len(ours) == 1857
    assert same(ours, theirs)


def test_promparse_utf8_names_give_the_scraped_samples() -> None:
    # TestUTF8PromParse's input (a quoted name anywhere in the braces, blanks around `=`, a
    # trailing comma, escapes in quoted names) with Prometheus' expected series.
    text = (
        '{"go.gc_duration_seconds",quantile="0"} 4.9351e-05\n'
        '{"go.gc_duration_seconds",quantile="0.25",} 7.424100000000001e-05\n'
        '{ "go.gc_duration_seconds", quantile = "1.0", a = "b" } 8.3835e-05\n'
        '{"go.gc_duration_seconds_count"} 99\n'
        '{"Heizölrückstoßabdämpfung 10€ metric with \\"interesting\\" {character\\nchoices}",'
        '"strange©™\\n\'quoted\' \\"name\\""="6"} 10.0\n'
    )
    odd = 'Heizölrückstoßabdämpfung 10€ metric with "interesting" {character\nchoices}'
    wanted = {"go.gc_duration_seconds", "go.gc_duration_seconds_count", odd}
    assert parse(text, wanted) == [
        Sample("go.gc_duration_seconds", {"quantile": "0"}, 4.9351e-05),
        Sample("go.gc_duration_seconds", {"quantile": "0.25"}, 7.424100000000001e-05),
        Sample("go.gc_duration_seconds", {"quantile": "1.0", "a": "b"}, 8.3835e-05),
        Sample("go.gc_duration_seconds_count", {}, 99.0),
        Sample(odd, {"strange©™\n'quoted' \"name\"": "6"}, 10.0),
    ]
    assert same(parse(text, wanted), reference(text))


# TestPromParseErrors and TestPromNullByteHandling: the inputs Prometheus' scrape parser refuses,
# all but three: `# TYPE #` and `# HELP #` (sing reads no comment) and an invalid UTF-8 value (the
# scrape refuses the page before parsing, as test_go_error_scenarios_fail_the_target checks).
PROMPARSE_REJECTED = [
    "a",
    "a{b='c'} 1\n",
    "a{b=\n",
    'a{\xff="foo"} 1\n',
    '{"a", "b = "c"}',
    '{"a",b\\nc="d"} 1',
    "a true\n",
    'something_weird{problem="',
    'empty_label_name{=""} 0',
    "{A}0",
    "foo 1_2\n",
    "foo 0x1p-3\n",
    "foo 0x1P-3\n",
    "foo 0 1_2\n",
    '{a="ok"} 1',
    'a{b=\x00"ssss"} 1\n',
    'a{b="\x00',
    'a{b\x00="hiih"}\t1',
    "a 0 1\x00",
]
PROMPARSE_ACCEPTED = ['null_byte_metric{a="abc\x00"} 1', 'a{b="\x00ss"} 1\n', 'a{b="\x00"} 1\n']


@pytest.mark.parametrize("text", PROMPARSE_REJECTED)
def test_what_prometheus_refuses_fails_the_target(text: str) -> None:
    wanted = {"a", "foo", "something_weird", "empty_label_name"}
    with pytest.raises(ParseError):
        parse(text, wanted)


def test_what_prometheus_takes_with_null_bytes_is_read() -> None:
    for text in PROMPARSE_ACCEPTED:
        assert len(parse(text, {"a", "null_byte_metric"})) == 1
    # `a\x00{...}` is a metric named `a\x00` to sing, not `a`: no sample of `a`, no error.
    assert parse('a\x00{b="ddd"} 1', {"a"}) == []
