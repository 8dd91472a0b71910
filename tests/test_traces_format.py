"""The format's single field list and its versions, the [trace] config section, pseudonyms."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sing.config import Config
from sing.errors import UserError
from sing.traces.anonymize import hmac_sha256_hex, pseudonymize
from sing.traces.format import RESOURCES
from sing.traces.importers import import_trace
from sing.traces.package import ReleaseInfo, write_trace
from sing.traces.read import read_nodes
from sing.traces.settings import TraceSettings
from sing.traces.validate import validate

DOC = Path(__file__).parents[1] / "docs" / "trace-format.md"
FIXTURES = Path(__file__).parent / "fixtures" / "traces"


def test_doc_describes_every_field():
    text = DOC.read_text()
    for resource in RESOURCES.values():
        for field in resource.fields:
            unit = field.unit or ""
            assert f"| {field.name} | " in text and f"| {unit} |" in text, field.name


def test_pseudonym_is_keyed_hmac_sha256():
    key = b"release-2025-key-0123456789abcdef"
    values = pa.array(["alice", None, "alice", "bob"])
    got = pseudonymize(values, key, "u").to_pylist()
    expected = "u_" + hmac.new(key, b"u:alice", hashlib.sha256).hexdigest()[:16]
    assert got[0] == got[2] == expected and got[1] is None and got[3] != expected
    assert pseudonymize(values, key, "u", distinct=True).to_pylist() == got
    assert got[0] != "u_" + hashlib.sha256(b"u:alice").hexdigest()[:16]  # not a bare hash


@pytest.mark.parametrize("key_bytes", [16, 32, 64, 65, 200])
def test_hmac_from_precomputed_pads_equals_hmac_new(key_bytes):
    key = bytes((7 * i + key_bytes) % 256 for i in range(key_bytes))  # > 64 bytes: hashed first
    mac = hmac_sha256_hex(key, b"j:")
    for message in (b"", b"1", b"12345678", "r\u00e9sum\u00e9".encode(), b"x" * 200):
        assert mac(message) == hmac.new(key, b"j:" + message, hashlib.sha256).hexdigest()


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


def test_privacy_keys_are_checked(tmp_path):
    file = tmp_path / "sing.toml"
    file.write_text(
        '[trace]\nnode_aliases = "random"\nlinkage = "user"\npartitions = ["gpu"]\n'
        'time_resolution_s = 3600\nduration_ratio = 1.5\nquasi_identifiers = ["shape", "submit"]\n'
    )
    settings = Config.load(file).section("trace", TraceSettings)
    assert (settings.node_aliases, settings.linkage, settings.partitions) == (
        "random",
        "user",
        ("gpu",),
    )
    assert settings.quasi_identifiers == ("shape", "submit") and settings.duration_ratio == 1.5
    for text, message in (
        ('node_aliases = "hostname"', "node_aliases = 'hostname'"),
        ('linkage = "everyone"', "linkage = 'everyone'"),
        ('quasi_identifiers = ["name"]', "quasi_identifiers: name unknown"),
        ("time_resolution_s = -1", "time_resolution_s < 0"),
        ("duration_ratio = 0.5", "duration_ratio < 1"),
    ):
        file.write_text(f"[trace]\n{text}\n")
        with pytest.raises(UserError, match=message):
            Config.load(file).section("trace", TraceSettings)


def test_release_of_format_1_1_still_validates(tmp_path):
    """A 1.1 release (no gpu_request, gpu_model_request or nodes) is valid for a 1.2 reader."""
    jobs = pq.read_table(
        import_trace("helios", FIXTURES / "helios_cluster_log.csv", tmp_path / "new")
        / "jobs.parquet"
    ).drop_columns(["gpu_request", "gpu_model_request"])
    info = ReleaseInfo(title="old", release_start=datetime(2020, 4, 1, tzinfo=UTC))
    old = write_trace(tmp_path / "old", jobs, info)
    package = json.loads((old / "datapackage.json").read_text())
    package["sing_format"]["version"] = package["version"] = "1.1"
    (old / "datapackage.json").write_text(json.dumps(package))
    assert validate(old) == [] and read_nodes(old) is None
    assert "gpu_request" not in (old / "jobs.csv").read_text().splitlines()[0]


@pytest.mark.parametrize("column", ["submit_s", "start_s", "end_s"])
def test_negative_times_are_invalid(tmp_path, column):
    """Times count from release_start: a negative one is before the release began."""
    jobs = pq.read_table(
        import_trace("helios", FIXTURES / "helios_cluster_log.csv", tmp_path / "src")
        / "jobs.parquet"
    )
    values = jobs[column].to_pylist()
    values[0] = -5.0
    jobs = jobs.set_column(jobs.schema.get_field_index(column), column, pa.array(values))
    info = ReleaseInfo(title="bad", release_start=datetime(2020, 4, 1, tzinfo=UTC))
    out = write_trace(tmp_path / "bad", jobs, info)
    assert f"jobs.parquet: field {column} has -5.0, below its minimum 0" in validate(out)
