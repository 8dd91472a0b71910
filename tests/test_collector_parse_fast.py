"""The parser's fast path (sing.collector.promtext `_parse_fast`, issue 33) against its complete,
line-by-line parse and against prometheus_client's parser, on real pages from other projects:
dcgm-exporter's (three drivers, MIG included), node_exporter's InfiniBand collector, a
Prometheus server's own page (every metric type), sing's exporter; and on the lines that leave
the fast path (escapes, blanks, tabs, CR line ends, quoted names, exotic values).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sing.collector.convert import (
    GPU_INFO,
    GPU_METRICS,
    JOB_INFO,
    JOB_MAPPING,
    NODE_EXPORTER_RDMA,
    RDMA_METRICS,
    RDMA_SATURATED,
    WANTED,
)
from sing.collector.health import HEALTH_METRICS
from sing.collector.jobhost import HOST_WANTED
from sing.collector.promtext import ParseError, Sample, _parse_complete, parse

FIXTURES = Path(__file__).parent / "fixtures"
PAGES = [
    *sorted((FIXTURES / "dcgm" / "pages").glob("*.txt")),
    FIXTURES / "node_exporter_ib" / "e2e-output-infiniband.txt",
    FIXTURES / "textparse" / "alltypes.237mfs.prom.txt",
    FIXTURES / "exporter" / "golden.prom",
    FIXTURES / "exporter" / "h200-metrics.txt",
]


def complete(text: str, wanted: set[str] | frozenset[str]) -> list[Sample]:
    """The line-by-line parse alone (every wanted line by `_parse_line`)."""
    return _parse_complete(text, frozenset(wanted), brace_first=False)


def key(s: Sample) -> tuple:
    value = "nan" if math.isnan(s.value) else repr(float(s.value))
    return (s.name, sorted(s.labels.items()), value, s.timestamp_ms)


def names(text: str) -> set[str]:
    """The metric names of a page's sample lines."""
    return set(re.findall(r"^[ \t]*([a-zA-Z_:][a-zA-Z0-9_:]*)", text, re.MULTILINE))


def client_samples(text: str) -> list[Sample]:
    """prometheus_client's reading of a page, in sing's terms (a counter's line without `_total`
    under the name on the line, which prometheus_client gives the suffix)."""
    on_page = names(text)
    return [
        Sample(
            s.name if s.name in on_page else s.name.removesuffix("_total"),
            s.labels,
            s.value,
            None if s.timestamp is None else round(s.timestamp * 1e3),
        )
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_real_pages_read_the_same_on_both_paths(page: Path) -> None:
    text = page.read_text()
    for wanted in (WANTED, names(text)):  # sing's names, then every line of the page
        fast = parse(text, wanted)
        assert [key(s) for s in fast] == [key(s) for s in complete(text, wanted)]
    assert len(parse(text, names(text))) == len(client_samples(text)) > 0


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_real_pages_give_prometheus_clients_samples(page: Path) -> None:
    text = page.read_text()
    ours, theirs = parse(text, names(text)), client_samples(text)
    assert sorted(map(key, ours)) == sorted(map(key, theirs))  # the same samples, any order


# Lines the fast path hands to the line-by-line parse, or reads itself in an uncommon form.
UNCOMMON = [
    'm{a="x\\"y\\\\z\\nw"} 1',  # escapes
    'm{b="2",a="1"} 1',  # labels in any order
    'm{a="1", b="2" ,} 1',  # blanks in the label set, a trailing comma
    'm{a="}, =\\"{"} 1',  # the format's own characters inside a value
    'm {a="1"}\t 2 1700000000000',  # blanks and a tab around the label set and value
    "\t m 3",  # leading blanks
    'm{a="1"} 4\r',  # a CR line end
    'm{"dotted.label"="v"} 6',  # a quoted label name
    "m +Inf",
    "m -Inf",
    "m NaN",
    "m infinity",
    "m -1.5e-3 -42",  # negative timestamp
    "m 1e+09 1700000000123",
    "m{} 7",
    'm{a=""} 8',
]


@pytest.mark.parametrize("line", UNCOMMON)
def test_uncommon_lines_read_as_the_complete_parse_and_prometheus_client_read_them(
    line: str,
) -> None:
    text = f'# HELP m help\n{line}\nother{{a="1"}} 1\n'
    ours = parse(text, {"m"})
    assert len(ours) == 1
    assert [key(s) for s in ours] == [key(s) for s in complete(text, {"m"})]
    if "dotted" not in line:  # prometheus_client predates quoted names
        assert [key(s) for s in ours] == [key(s) for s in client_samples(line.rstrip() + "\n")]


def test_a_page_mixing_both_paths_keeps_its_order_and_shares_nothing_wrong() -> None:
    text = (
        'm{gpu="0",uuid="a"} 1\n'
        'm{gpu="0",uuid="a"} 2 1000\n'  # the same label set again: one dict, equal samples
        'm{gpu="1", uuid="b"} 3\n'  # a blank: read pair by pair
        'm{gpu="2",uuid="c\\\\"} 4\n'  # an escape: the line-by-line parse
        'm{uuid="a",gpu="0"} 5\n'
    )
    assert parse(text, {"m"}) == [
        Sample("m", {"gpu": "0", "uuid": "a"}, 1.0),
        Sample("m", {"gpu": "0", "uuid": "a"}, 2.0, 1000),
        Sample("m", {"gpu": "1", "uuid": "b"}, 3.0),
        Sample("m", {"gpu": "2", "uuid": "c\\"}, 4.0),
        Sample("m", {"gpu": "0", "uuid": "a"}, 5.0),
    ]


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ('m{a="1",a="2"} 1', "duplicate label names"),
        ('m{__name__="x"} 1', "label name '__name__' is reserved"),
        ('m{a="1"} 1_000', "expected a value"),
        ("m 1 99999999999999999999", "timestamp out of int64 range"),
        ('m{a="1"} 1 2 3', "expected a value"),
        ('m{a="1"} \u0661', "expected a value"),  # float() would read it as 1.0
        ('m{"n",a="1"} 1', "a second metric name"),
    ],
)
def test_a_malformed_line_after_plain_ones_fails_with_its_line_number(
    line: str, error: str
) -> None:
    text = 'm{a="1"} 1\nother 2\n' + line + "\n"
    with pytest.raises(ParseError, match=rf"^line 3: {error}"):
        parse(text, {"m"})


def test_read_node_dispatches_on_disjoint_name_sets() -> None:
    # read_node tries the health names first (the most numerous): right only while no name is
    # in two sets
    sets = [GPU_METRICS, RDMA_METRICS, NODE_EXPORTER_RDMA, HEALTH_METRICS, HOST_WANTED]
    sets.append({JOB_INFO, JOB_MAPPING, GPU_INFO, RDMA_SATURATED})
    assert sum(len(s) for s in sets) == len(set().union(*sets)) == len(WANTED)
