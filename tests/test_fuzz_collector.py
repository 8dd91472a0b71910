"""Fuzzing the Prometheus exposition parser (sing.collector.promtext) with Hypothesis.

Properties: any text gives samples or a ParseError, nothing else; the fast path reads what the
line-by-line parse reads (or fails as it fails); a payload written by the format's rules
(escaped label values, NaN/Inf, timestamps) parses back to what was written.
"""

from __future__ import annotations

import math

from hypothesis import example, given
from hypothesis import strategies as st

from sing.collector.promtext import ParseError, Sample, _parse_complete, parse
from tests.fuzzing import fuzz

WANTED = ("DCGM_FI_DEV_GPU_UTIL", "sing_gpu_util", "up")
NAME = st.sampled_from(WANTED)
LABEL_NAME = st.builds(str.__add__, st.sampled_from("aZ_"), st.text("gpu_ID09", max_size=6))
LABEL_VALUE = st.text(st.sampled_from('ab "\\\n{},=é\x00'), max_size=12)
VALUE = st.floats(allow_nan=True, allow_infinity=True)
TIMESTAMP = st.none() | st.integers(-(2**63), 2**63 - 1)


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(sample: Sample) -> str:
    labels = ",".join(f'{k}="{escape(v)}"' for k, v in sample.labels.items())
    value = "NaN" if math.isnan(sample.value) else repr(sample.value).replace("inf", "Inf")
    stamp = "" if sample.timestamp_ms is None else f" {sample.timestamp_ms}"
    return f"{sample.name}{{{labels}}} {value}{stamp}"


SAMPLES = st.builds(
    Sample, NAME, st.dictionaries(LABEL_NAME, LABEL_VALUE, max_size=4), VALUE, TIMESTAMP
)
# Lines near the format: a wanted name, then anything made of the format's own pieces.
PIECES = st.sampled_from(['{', '}', '"', "\\", "=", ",", " ", "\t", "\n", "\r", "#", ":", "NaN",
                          "+Inf", "1e3", "0x1", "1_0", "a", "gpu", "\u00b2", "\x00"])  # fmt: skip
NEAR = st.lists(st.one_of(NAME, PIECES, SAMPLES.map(render)), max_size=30).map("".join)


@fuzz(1500)
@given(st.one_of(NEAR, st.text(max_size=200)))
def test_any_text_gives_samples_or_a_parse_error(text: str) -> None:
    try:
        samples = parse(text, WANTED)
    except ParseError:
        return
    for sample in samples:
        assert sample.name in WANTED


@fuzz(1500)
@given(st.one_of(NEAR, st.lists(SAMPLES.map(render), max_size=6).map("\n".join)))
def test_the_fast_path_reads_what_the_complete_parse_reads(text: str) -> None:
    def outcome(read):
        try:
            return [(s.name, s.labels, repr(s.value), s.timestamp_ms) for s in read()]
        except ParseError as err:
            return str(err)

    fast = outcome(lambda: parse(text, WANTED))
    assert fast == outcome(lambda: _parse_complete(text, frozenset(WANTED), brace_first=True))


@fuzz(500)
@given(SAMPLES, st.text("_:aZ9", min_size=1, max_size=4))
@example(Sample("up", {}, 1.0), ":extra")  # colons are legal in names: up:extra is not up
def test_lines_of_other_metrics_are_skipped(sample: Sample, suffix: str) -> None:
    other = sample._replace(name=sample.name + suffix)
    assert parse(render(other) + "\n", WANTED) == []


@fuzz(800)
@given(st.lists(SAMPLES, max_size=6))
def test_written_samples_parse_back(samples: list[Sample]) -> None:
    text = "".join(f"# HELP x y\n{render(s)}\n" for s in samples)
    parsed = parse(text, WANTED)
    assert len(parsed) == len(samples)
    for got, want in zip(parsed, samples, strict=True):
        assert (got.name, got.labels, got.timestamp_ms) == (
            want.name,
            want.labels,
            want.timestamp_ms,
        )
        assert got.value == want.value or (math.isnan(got.value) and math.isnan(want.value))
