"""The demo's job sync: the collector calls it (`[collector] job_sync`) like a Slurm sync.

It reads the simulated executor's records file and upserts `jobs` and `job_gpus`; records
are versioned by `recorded_at`, so syncing the same file twice changes nothing.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pyarrow as pa

from demo.settings import DemoSettings
from sing.config import Config
from sing.errors import UserError
from warehouse.store import Warehouse


def sync(config: Config, warehouse: Warehouse) -> int:
    """Upsert every job in the records file; returns the number of jobs."""
    settings = config.section("demo", DemoSettings)
    path = config.resolve_path(settings.records_file)
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return 0
    except json.JSONDecodeError as err:
        raise UserError(f"{path}: not valid JSON: {err}") from err
    cluster = data["cluster"]
    jobs, gpus = [], []
    for record in data["jobs"]:
        held = record.pop("gpus")
        times = {k: _time(record[k]) for k in ("submit_time", "start_time", "end_time")}
        jobs.append({**record, **times, "cluster": cluster})
        for node, indices in held.items():
            for index in indices:
                gpus.append(
                    {
                        "job_id": record["job_id"],
                        "cluster": cluster,
                        "node": node,
                        "gpu_index": index,
                        "start_time": times["start_time"],
                        "end_time": times["end_time"],
                    }
                )
    if jobs:
        warehouse.append("jobs", pa.Table.from_pylist(jobs))
    if gpus:
        warehouse.append("job_gpus", pa.Table.from_pylist(gpus))
    return len(jobs)


def _time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None
