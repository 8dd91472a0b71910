"""A collector's process stays small: polars is never imported by the collector's own work
(opening the warehouse, seeding its counters, a round, a job sync's merge, a scheduler command
that failed, the scheduled jobs of a site without policy rules or reports), nor pandas, which
pyarrow would import (sing/collector/lean.py) though it stays importable; and a
running `sing collector` has neither loaded. Polars is 31 MB resident, pandas 28 MB;
bench/bench_collector.py measures a `sing collector` process against its memory target."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.ports import free_port
from tests.test_collector_scrape import running, sing, wait_for

REPO = Path(__file__).resolve().parent.parent

COLLECTOR_WORK = """
import json, sys
from sing.collector.lean import keep_process_lean
keep_process_lean()  # as `sing collector` starts
import pyarrow as pa
from sing.cli import collector  # the `sing collector` command's module and what it imports
from sing.health.detect import detection_job
from sing.collector.service import Collector
from sing.collector.settings import CollectorSettings
from sing.collector.targets import target_from
from sing.config import Config
from sing.executors.base import CommandError
from sing.warehouse.store import Warehouse

wh = Warehouse(sys.argv[1])
for state in ("RUNNING", "COMPLETED"):  # a job synced twice: the second append is a merge
    wh.append("jobs", pa.table({"job_id": ["7"], "cluster": ["c"], "state": [state]}))
nobody = [target_from("127.0.0.1:9", {"node": "n1"})]  # refused: a round that writes `scrapes`
work = Collector(Config({}), CollectorSettings(metrics_port=0, scrape_timeout_s=1), wh,
                 lambda: nobody)
round = work.scrape_round()
work._command_failed(CommandError("sacct", "timeout", "sacct did not answer"))  # recorded
states = wh.connect().execute("SELECT state FROM jobs").fetchall()
failures = wh.connect().execute("SELECT command FROM command_failures").fetchall()
policy = collector.scheduled_policy(Config({}), wh)  # what a long-running collector schedules
detection_job(Config({}), wh, pull=False)
loaded = sorted(m for m in ("polars", "pandas") if m in sys.modules)
import pandas  # importable all along, for whatever does use it (a site's source plugin)
rows = len(pa.table({"a": [1, 2]}).to_pandas())
print(json.dumps({"modules": loaded, "to_pandas": rows,
                  "states": states, "failures": failures, "targets": round.targets,
                  "up": round.up, "policy": policy}))
"""


def test_a_collectors_work_imports_neither_polars_nor_pandas(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", COLLECTOR_WORK, str(tmp_path / "wh")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result == {
        "modules": [],
        "to_pandas": 2,
        "states": [["COMPLETED"]],
        "failures": [["sacct"]],
        "targets": 1,
        "up": 0,
        "policy": None,  # no rules: tests/test_policy_cli.py schedules a round where there are
    }


def test_a_running_collector_loads_neither_pandas_nor_polars(tmp_path: Path) -> None:
    """The real command, its rounds logged: the shared objects it has mapped include pyarrow's
    and DuckDB's (both used from its start), but none of pandas or polars."""
    (tmp_path / "sing.toml").write_text("")
    argv = sing("-v", "--config", str(tmp_path / "sing.toml"), "--warehouse", str(tmp_path / "wh"),
                "collector", f"--target=127.0.0.1:{free_port()}", "--interval=0.5",
                "--metrics-port=0")  # fmt: skip
    log = tmp_path / "collector.log"
    with running(argv, log) as proc:
        wait_for(lambda: log.read_text().count("round: RoundSummary") >= 2, what="two rounds")
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
    libraries = {line.split()[-1] for line in maps.splitlines() if line.endswith(".so")
                 or ".so." in line}  # fmt: skip
    loaded = {p for p in PACKAGES for lib in libraries if f"/{p}/" in lib or f"/_{p}." in lib}
    assert loaded == {"pyarrow", "duckdb"}, sorted(libraries)
    assert "Traceback" not in log.read_text()


# Their shared objects: under a directory of the package's name, or DuckDB's `_duckdb.*.so`.
PACKAGES = {"pyarrow", "duckdb", "pandas", "polars"}
