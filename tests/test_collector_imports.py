"""A collector's process stays small: polars is never imported by the collector's own work
(opening the warehouse, seeding its counters, a round, a job sync's merge, a scheduler command
that failed, the scheduled jobs of a site without policy rules or reports). Polars is 31 MB
resident; bench/bench_collector.py measures a `sing collector` process against its memory
target."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

COLLECTOR_WORK = """
import json, sys
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
print(json.dumps({"modules": sorted(m for m in ("polars",) if m in sys.modules),
                  "states": states, "failures": failures, "targets": round.targets,
                  "up": round.up, "policy": policy}))
"""


def test_a_collectors_work_never_imports_polars(tmp_path: Path) -> None:
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
        "states": [["COMPLETED"]],
        "failures": [["sacct"]],
        "targets": 1,
        "up": 0,
        "policy": None,  # no rules: tests/test_policy_cli.py schedules a round where there are
    }
