"""The site configuration file: lookup order, overrides, and errors that say what to fix.

Also keeps sing.example.toml and docs/configuration.md true to the code: every section and key
the dataclasses define appears in both, and the example file passes validation.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sing import config as config_module
from sing.collector.inventory import DEFAULT as DEFAULT_INVENTORY
from sing.collector.inventory import executor_inventory
from sing.collector.plugins import load_source
from sing.config import KNOWN_SECTIONS, Config, ConfigError, SiteSettings, Thresholds
from sing.errors import UserError
from tests.test_analytics import ROOT, run_sing

# The dataclass that owns each section, as "module:class".
SECTION_SCHEMAS = {
    "site": "sing.config:SiteSettings",
    "thresholds": "sing.config:Thresholds",
    "exporter": "sing.exporters.settings:ExporterSettings",
    "collector": "sing.collector.settings:CollectorSettings",
    "executor": "sing.executors.settings:ExecutorSettings",
    "scheduler": "sing.scheduler.settings:SchedulerSettings",
    "dashboard": "sing.dashboards.settings:DashboardSettings",
    "roles": "sing.dashboards.settings:RoleSettings",
    "trace": "sing.traces.settings:TraceSettings",
    "demo": "sing.demo.settings:DemoSettings",
    "policy": "sing.policy.settings:PolicySettings",
    "accounting": "sing.accounting.settings:AccountingSettings",
    "health": "sing.health.settings:HealthSettings",
}
EXAMPLE = ROOT / "sing.example.toml"
DOC = ROOT / "docs" / "configuration.md"


def schema(section: str) -> type:
    module, name = SECTION_SCHEMAS[section].split(":")
    return getattr(importlib.import_module(module), name)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture(autouse=True)
def no_ambient_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Tests see no $SING_CONFIG/$SING_WAREHOUSE and no ./sing.toml of the developer."""
    monkeypatch.delenv("SING_CONFIG", raising=False)
    monkeypatch.delenv("SING_WAREHOUSE", raising=False)
    monkeypatch.chdir(tmp_path)


# ---- lookup and defaults ------------------------------------------------------------------


def test_no_file_gives_defaults() -> None:
    config = Config.load()
    assert config.path is None
    assert config.site == SiteSettings()
    assert config.thresholds == Thresholds()
    assert config.warehouse_dir() == Path("var/warehouse")


def test_lookup_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    system = write(tmp_path / "system.toml", '[site]\ncluster = "from-etc"\n')
    env = write(tmp_path / "env.toml", '[site]\ncluster = "from-env"\n')
    flag = write(tmp_path / "flag.toml", '[site]\ncluster = "from-flag"\n')
    monkeypatch.setattr(config_module, "SYSTEM_CONFIG", system)
    assert Config.load().site.cluster == "from-etc"
    assert Config.load().path == system.resolve()
    monkeypatch.setenv("SING_CONFIG", str(env))
    assert Config.load().site.cluster == "from-env"
    assert Config.load(flag).site.cluster == "from-flag"


def test_the_current_directory_is_not_searched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    local = write(tmp_path / "sing.toml", '[site]\ncluster = "from-cwd"\n')
    assert Config.load().site.cluster == "campus"
    assert "ignoring ./sing.toml" in caplog.text
    assert Config.load("sing.toml").path == local.resolve()  # named explicitly: read


HOSTILE_MODULE = """
from pathlib import Path
Path(__file__).with_name("imported.flag").write_text("their code ran")
def run(*args):
    pass
"""


def test_a_hostile_sing_toml_in_the_current_directory_runs_no_code(tmp_path: Path) -> None:
    """Someone's directory holds a sing.toml naming their module as the job source. Running
    `sing collector` there (as `python -m`, so the directory is even on sys.path) reads
    neither; named with --config, the file is read but the source is refused, not imported."""
    write(tmp_path / "evil_source.py", HOSTILE_MODULE)
    write(tmp_path / "sing.toml", '[collector]\njob_sync = "evil_source:run"\n')
    command = [sys.executable, "-m", "sing.cli", "collector", "--once", "--target", "127.0.0.1:9"]
    env = {k: v for k, v in os.environ.items() if k not in ("SING_CONFIG", "SING_WAREHOUSE")}
    run = functools.partial(
        subprocess.run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    implicit = run(command)
    assert "ignoring ./sing.toml" in implicit.stderr
    assert "0/1 targets up" in implicit.stdout  # the collector did run, without the file
    explicit = run([*command[:3], "--config", "sing.toml", *command[3:]])
    assert explicit.returncode == 1
    assert "job_sync = 'evil_source:run' is not an installed source" in explicit.stderr
    assert not (tmp_path / "imported.flag").exists()


def test_missing_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config file .*nope.toml does not exist"):
        Config.load(tmp_path / "nope.toml")


def test_warehouse_override_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "etc"
    site.mkdir()
    config = Config.load(write(site / "sing.toml", '[site]\nwarehouse = "data/wh"\n'))
    # A relative setting is relative to the config file's directory, not the CWD.
    assert config.warehouse_dir() == site.resolve() / "data" / "wh"
    monkeypatch.setenv("SING_WAREHOUSE", "/srv/env-wh")
    assert config.warehouse_dir() == Path("/srv/env-wh")
    assert config.warehouse_dir("/srv/flag-wh") == Path("/srv/flag-wh")
    absolute = Config.load(write(site / "abs.toml", '[site]\nwarehouse = "/srv/wh"\n'))
    monkeypatch.delenv("SING_WAREHOUSE")
    assert absolute.warehouse_dir() == Path("/srv/wh")


def test_int_is_accepted_where_float_is_expected(tmp_path: Path) -> None:
    config = Config.load(write(tmp_path / "c.toml", "[thresholds]\nidle_util = 0\n"))
    assert config.thresholds.idle_util == 0.0 and isinstance(config.thresholds.idle_util, float)


# ---- errors that say what to fix ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "section", "message"),
    [
        (
            "[thresold]\nidle_util = 0.1\n",
            "site",
            "unknown section [thresold] (did you mean 'thresholds'?)",
        ),
        (
            "[site]\nwarehous = 'x'\n",
            "site",
            "[site] has unknown key 'warehous' (did you mean 'warehouse'?)",
        ),
        (
            "[thresholds]\nidle_util = 'high'\n",
            "thresholds",
            "[thresholds] idle_util must be float, got 'high'",
        ),
        (
            "[thresholds]\nidle_util = true\n",
            "thresholds",
            "[thresholds] idle_util must be float, got True",
        ),
        ("[site]\ncluster = 5\n", "site", "[site] cluster must be str, got 5"),
        ("site = 5\n", "site", "[site] must be a table, not int"),
        ("[site\n", "site", "not valid TOML"),
        ("[collector]\ntargets = 'a:1'\n", "collector", "[collector] targets must be a list"),
        ("[collector]\ntargets = ['a:1', 2]\n", "collector", "[collector] targets[1] must be str"),
        (
            "[executor]\nlocal_gpus = ['0']\n",
            "executor",
            "[executor] local_gpus = ['0'] is not one of",
        ),
    ],
)
def test_bad_settings_name_file_and_key(
    tmp_path: Path, text: str, section: str, message: str
) -> None:
    path = write(tmp_path / "site.toml", text)
    with pytest.raises(ConfigError) as err:
        Config.load(path).section(section, schema(section))
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_unknown_key_lists_the_valid_ones(tmp_path: Path) -> None:
    config = Config.load(write(tmp_path / "c.toml", "[thresholds]\nzzz = 1\n"))
    with pytest.raises(ConfigError, match="valid keys: idle_util, low_util, ") as err:
        _ = config.thresholds
    assert "did you mean" not in str(err.value)  # nothing close: no guess


def test_sing_exits_2_on_a_bad_config(tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.toml", "[thresold]\nidle_util = 0.1\n")
    out = run_sing("--config", str(bad), "report", "cluster")
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"sing: configuration error: {bad}: unknown section [thresold] (did you mean "
        "'thresholds'?); known sections: " + ", ".join(KNOWN_SECTIONS)
    )
    out = run_sing("--config", str(tmp_path / "missing.toml"), "report", "cluster")
    assert out.returncode == 2
    assert "missing.toml does not exist" in out.stderr


def test_sing_uses_the_configured_warehouse(tmp_path: Path) -> None:
    """--warehouse beats $SING_WAREHOUSE beats [site] warehouse (relative to the file)."""
    config = write(tmp_path / "sing.toml", '[site]\nwarehouse = "configured"\ncluster = "lab"\n')
    tiny = ("demo-data", "--nodes", "1", "--gpus-per-node", "1", "--days", "0.05")
    env = {"SING_WAREHOUSE": str(tmp_path / "env")}
    assert run_sing("--config", str(config), *tiny).returncode == 0
    assert run_sing("--config", str(config), *tiny, env=env).returncode == 0
    flag = run_sing("--config", str(config), "--warehouse", str(tmp_path / "flag"), *tiny, env=env)
    assert flag.returncode == 0 and str(tmp_path / "flag") in flag.stdout
    for name in ("configured", "env", "flag"):
        assert (tmp_path / name / "nodes").is_dir(), name
    out = run_sing(
        "--config", str(config), "warehouse", "sql", "SELECT DISTINCT cluster FROM nodes"
    )
    assert out.stdout.split() == ["cluster", "lab"]


# ---- the example file and the reference page stay true to the code ------------------------


def test_schema_map_covers_every_known_section() -> None:
    assert sorted(SECTION_SCHEMAS) == sorted(KNOWN_SECTIONS)


def test_example_config_is_valid_and_complete() -> None:
    """Every key appears, set to a valid value or (when TOML cannot say "unset") commented out."""
    config = Config.load(EXAMPLE)
    assert sorted(config.data) == sorted(KNOWN_SECTIONS)
    text = EXAMPLE.read_text()
    for section in KNOWN_SECTIONS:
        config.section(section, schema(section))
        block = text.split(f"[{section}]\n", 1)[1].split("\n[", 1)[0]
        commented = re.findall(r"^# ?(\w+) = ", block, re.MULTILINE)
        fields = [f.name for f in dataclasses.fields(schema(section))]
        assert sorted([*config.data[section], *commented]) == sorted(fields), section


def test_reference_page_documents_every_key() -> None:
    text = DOC.read_text()
    for section in KNOWN_SECTIONS:
        assert f"## [{section}]" in text, section
        block = text.split(f"## [{section}]", 1)[1].split("\n## ", 1)[0]
        for field in dataclasses.fields(schema(section)):
            assert re.search(rf"`{field.name}`", block), f"[{section}] {field.name}"


def test_a_source_named_before_the_move_under_sing_is_read_as_its_new_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A site's sing.toml written before sing's packages moved under `sing.` still collects,
    and the log says what to write now; an old name that was never installed stays refused."""
    config = Config({"executor": {"kind": "slurm"}})
    old = "collector.inventory:executor_inventory"
    assert load_source(old, config, DEFAULT_INVENTORY, "node_inventory") is executor_inventory
    assert "write 'sing.collector.inventory:executor_inventory'" in caplog.text
    with pytest.raises(UserError, match="is not an installed source"):
        load_source("collector.evil:run", config, DEFAULT_INVENTORY, "node_inventory")
