"""Fuzzing the site configuration (sing/config.py) with Hypothesis.

Properties: any file gives a Config whose sections read as their dataclasses or a ConfigError,
nothing else; a section that reads has every field of its declared type. A section's own value
checks may raise sing.errors.UserError instead ([trace] k = 0).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import tempfile
import types
import typing
from pathlib import Path
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from sing.config import KNOWN_SECTIONS, Config, ConfigError
from sing.errors import UserError
from tests.fuzzing import fuzz
from tests.test_config import schema

FIELDS = {s: [f.name for f in dataclasses.fields(schema(s))] for s in KNOWN_SECTIONS}
HINTS = {s: typing.get_type_hints(schema(s)) for s in KNOWN_SECTIONS}
# What tomllib can hand over: TOML has no null.
SCALAR = st.one_of(
    st.text(max_size=6), st.integers(), st.floats(), st.booleans(),
    st.datetimes(timezones=st.none() | st.just(dt.UTC)), st.dates(), st.times(),
)  # fmt: skip
TOML_VALUE = st.recursive(
    SCALAR,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=3,
)


# Known sections (sometimes an unknown one) with known keys (sometimes a typo).
SECTION = st.one_of(
    st.tuples(
        st.just(name),
        st.dictionaries(st.sampled_from([*FIELDS.get(name, []), "warehous"]), TOML_VALUE)
        | TOML_VALUE,
    )
    for name in [*KNOWN_SECTIONS, "thresold"]
)
CONFIG_DATA = st.lists(SECTION, max_size=3).map(dict)


def has_type(value: Any, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(has_type(value, option) for option in args)
    if origin in (list, tuple):
        return isinstance(value, origin) and all(has_type(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(has_type(v, args[1]) for v in value.values())
    if hint is type(None):
        return value is None
    return isinstance(value, hint) and (hint is bool) == isinstance(value, bool)


def read_every_section(config: Config) -> None:
    for name in KNOWN_SECTIONS:
        try:
            section = config.section(name, schema(name))
        except (ConfigError, UserError):
            continue
        for field in dataclasses.fields(section):
            value = getattr(section, field.name)
            assert has_type(value, HINTS[name][field.name]), (name, field.name, value)


@fuzz(1000)
@given(CONFIG_DATA)
@example({"executor": {"local_gpus": [True]}})  # true is not a GPU index
@example({"trace": {"k": 0}})  # checked by TraceSettings itself (UserError)
def test_any_settings_read_typed_or_give_a_config_error(data: dict[str, Any]) -> None:
    try:
        config = Config(data)
    except ConfigError:
        return
    read_every_section(config)


@fuzz(1500)
@given(st.binary(max_size=80) | st.text(max_size=80).map(str.encode))
@example(b"[site]\ncluster = '\xff'\n")  # not UTF-8
@example(b'[site]\ncluster = "a\x00b"\n')  # a NUL in a path-like value is valid TOML
def test_any_file_gives_a_config_or_a_config_error(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "sing.toml"
        path.write_bytes(raw)
        try:
            config = Config.load(path)
        except ConfigError:
            return
    read_every_section(config)
