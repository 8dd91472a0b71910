"""The format's single field list, the [trace] config section and the pseudonym function."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import pyarrow as pa
import pytest

from sing.config import Config
from sing.errors import UserError
from traces.anonymize import pseudonymize
from traces.format import RESOURCES
from traces.settings import TraceSettings

DOC = Path(__file__).parents[1] / "docs" / "trace-format.md"


def test_doc_describes_every_field():
    text = DOC.read_text()
    for resource in RESOURCES.values():
        for field in resource.fields:
            unit = field.unit or ""
            assert f"| {field.name} | " in text and f"| {unit} |" in text, field.name


def test_pseudonym_is_keyed_hmac_sha256():
    key = b"release-2025-key-0123456789abcdef"
    got = pseudonymize(pa.array(["alice", None, "alice", "bob"]), key, "u").to_pylist()
    expected = "u_" + hmac.new(key, b"u:alice", hashlib.sha256).hexdigest()[:16]
    assert got[0] == got[2] == expected and got[1] is None and got[3] != expected
    assert got[0] != "u_" + hashlib.sha256(b"u:alice").hexdigest()[:16]  # not a bare hash


def test_trace_section_is_checked(tmp_path):
    file = tmp_path / "sing.toml"
    file.write_text('[trace]\nk = 3\ndrop = ["dependencies"]\nkey_file = "keys/release.key"\n')
    settings = Config.load(file).section("trace", TraceSettings)
    assert (settings.k, settings.drop, settings.rare_shapes) == (3, ("dependencies",), "generalize")
    file.write_text('[trace]\nrare_shapes = "hide"\n')
    with pytest.raises(UserError, match="rare_shapes = 'hide'"):
        Config.load(file).section("trace", TraceSettings)
    file.write_text('[trace]\ndrop = ["job_id"]\n')
    with pytest.raises(UserError, match="job_id cannot be dropped"):
        Config.load(file).section("trace", TraceSettings)
