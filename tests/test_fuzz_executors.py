"""Fuzzing the Slurm output parsers and the job profile parser with Hypothesis.

Slurm output starts from what the real Slurm 22.05 harness printed (tests/executors_data), cut
to the fields the parsers read, with values replaced by odd JSON, near-miss strings (host lists,
Gres, TRES, comments, numbers) or removed; profiles are YAML built from the profile's keys with
odd values and tags. Property: job records or sing.errors.UserError, nothing else.
"""

from __future__ import annotations

import contextlib
import copy
import json
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from sing.errors import UserError
from sing.executors.profile import ENTRY_KEYS, ENV_KEYS, TOP_KEYS, JobProfile, parse_profile
from sing.executors.settings import ExecutorSettings
from sing.executors.slurm_parse import parse_sacct, parse_sacct_text, parse_sinfo, parse_squeue
from tests.fuzzing import fuzz

DATA = Path(__file__).parent / "executors_data"
SQUEUE_FIELDS = ("job_id", "job_state", "nodes", "time_limit", "comment", "user_name", "account",
                 "partition", "name", "submit_time", "start_time", "tres_alloc_str",
                 "gres_detail")  # fmt: skip
SACCT_FIELDS = ("job_id", "state", "time", "comment", "user", "account", "partition", "name",
                "nodes", "tres")  # fmt: skip
SACCT_TEXT = "1|singtest|3:0|gres/gpu=2\n2|root|0:0|gres/gpu=8\n3|root|0:0|\n"


def trimmed(file: str, fields: tuple[str, ...]) -> dict[str, Any]:
    dump = json.loads((DATA / file).read_text())
    return {"errors": [], "jobs": [{k: job[k] for k in fields} for job in dump["jobs"]]}


SQUEUE = trimmed("squeue_v0.0.38.json", SQUEUE_FIELDS)
SACCT = trimmed("sacct_v0.0.38.json", SACCT_FIELDS)

# Strings near what Slurm writes in the fields that are parsed further.
NEAR_MISS = st.sampled_from([
    "", " ", "None assigned", "gpu-[1-", "gpu-[1-2]", "gpu-[2-1]", "n[01-99999999]", "a,b",
    "gpu:a100:2(IDX:0-1)", "gpu(IDX:N/A)", "gpu:2(IDX:a-b)", "gpu(IDX:1,3-)", "gpu(IDX:)",
    "gpu(IDX:0-99999999)", "cpu=1,gres/gpu=2", "gres/gpu=\u00b2", "gres/gpu", "=", "sing:",
    "sing:5", "sing:[]", 'sing:{"interactive": true, "dependencies": 3}', "RUNNING",
    "COMPLETED", "FAILED extra", "\u00b2", "1:0", "1|2", "\x00",
])  # fmt: skip
NUMBERS = st.sampled_from([0, -1, 2**31, 10**20, -(10**20), 1.5, float("nan")])
NUMBER_OBJECT = st.fixed_dictionaries(
    {"set": st.booleans(), "infinite": st.booleans(), "number": NUMBERS | st.none()}
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | NUMBERS | st.text(max_size=8) | NEAR_MISS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=6,
)
VALUE = st.one_of(JSON, NEAR_MISS, NUMBERS, NUMBER_OBJECT, st.lists(NEAR_MISS, max_size=3))


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any]) -> str:
    """`base` as JSON with a few values replaced or removed, at any depth."""
    dump = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 4))):
        parent: Any = dump
        key: Any = "jobs"
        while isinstance(parent[key], dict | list) and parent[key] and draw(st.booleans()):
            parent = parent[key]
            keys = sorted(parent) if isinstance(parent, dict) else range(len(parent))
            key = draw(st.sampled_from(list(keys)))
        if isinstance(parent, dict) and draw(st.integers(0, 5)) == 0:
            del parent[key]
            if not parent:
                break
        else:
            parent[key] = draw(VALUE)
        if not isinstance(dump, dict) or "jobs" not in dump:
            break
    return json.dumps(dump)


@fuzz(2000)
@given(st.one_of(mutated(SQUEUE), st.text(max_size=50)))
@example(json.dumps({"jobs": [], "errors": 5}))
def test_squeue_gives_records_or_a_user_error(text: str) -> None:
    with contextlib.suppress(UserError):
        parse_squeue(text, "campus")


@fuzz(2000)
@given(mutated(SACCT), st.lists(NEAR_MISS | st.text(max_size=12), max_size=4))
@example(json.dumps(SACCT).replace('"type": "cpu"', '"type": null', 1), [])  # TRES without a type
def test_sacct_gives_records_or_a_user_error(text: str, extra_lines: list[str]) -> None:
    with contextlib.suppress(UserError):
        parse_sacct(text, SACCT_TEXT + "\n".join(extra_lines), "campus")


LINE_PIECES = st.sampled_from(["|", "1", "0", ":", "gpu", "gpu-1", "debug", "gpu:a100:8",
                               "(S:0-1)", ",", " ", "\u00b2", "\u0663", "-"])  # fmt: skip
LINES = st.lists(st.lists(LINE_PIECES, max_size=8).map("".join), max_size=5).map("\n".join)


@fuzz(2000)
@given(LINES | st.text(max_size=40))
@example("1|root|\u00b2:0")  # a digit to str.isdigit() that int() refuses
def test_sacct_text_and_sinfo_give_records_or_a_user_error(text: str) -> None:
    for parser in (parse_sacct_text, parse_sinfo):
        with contextlib.suppress(UserError):
            parser(text)


# ---- job profiles --------------------------------------------------------------------------

SCALARS = st.sampled_from([
    "train", "a b", "", " ", "02:00:00", "1-00:00:00", "0:00:00", "25:61:61", "\u00b2", "90",
    "3.10", "yes", "null", "~", "-1", "0", "9" * 30, "!!binary aGk=", "!!binary *", "!!float x",
    "!!timestamp 2001-13-45", "!!python/object:os.system {}", "!!set {a}", "2001-02-03",
    "script.sh", "/etc/hostname", "..", "'a\x00b'", "&a [1]", "*nope", "[1, 2]", "{a: 1}",
])  # fmt: skip
PROFILE_KEYS = st.sampled_from(TOP_KEYS + ENTRY_KEYS + ENV_KEYS + ("variables", "<<", "X"))
NODE = st.recursive(
    SCALARS | st.integers(-3, 300),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(PROFILE_KEYS, inner, max_size=4),
    max_leaves=10,
)
VALID = {"name": "t", "gpus_per_node": 1, "entry": {"commands": ["true"]}}


def profile_text(fields: dict[str, Any]) -> str:
    """YAML with the tags and anchors left as written (safe_dump would quote them)."""
    text = yaml.safe_dump({**VALID, **fields}, allow_unicode=True)
    return text.replace("'!!", "!!").replace("'&", "&").replace("'*", "*")


@fuzz(2000)
@given(
    st.one_of(
        st.dictionaries(PROFILE_KEYS, NODE, max_size=5).map(profile_text), st.text(max_size=60)
    )
)
@example("name: t\nentry: {commands: x}\ntime_limit: \u00b2\n")  # str.isdigit() but not int()
@example("name: t\nentry: {commands: x}\nnodes: !!timestamp 2001-13-45\n")  # constructor error
@example('name: t\nentry: {script: "a\\0b"}\n')  # a NUL byte in a path
@example("\x1f")  # a control character: the YAML reader refuses it before parsing
def test_profile_gives_a_profile_or_a_user_error(text: str) -> None:
    with tempfile.TemporaryDirectory() as base:
        try:
            profile = parse_profile(text, "job.yaml", ExecutorSettings(), base_dir=Path(base))
        except UserError:
            return
    assert isinstance(profile, JobProfile) and profile.nodes >= 1
