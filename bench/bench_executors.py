"""How fast job records flow from Slurm output into the warehouse, and local job start latency.

A day on a busy campus cluster is ~10-50k jobs; `sing jobs sync` parses that day's sacct output
and writes it as one batch. Input: the jobs captured from the real Slurm harness, repeated with
fresh ids. Run: .venv/bin/python bench/bench_executors.py
"""

from __future__ import annotations

import copy
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sing.executors.local import LocalExecutor  # noqa: E402
from sing.executors.profile import JobProfile  # noqa: E402
from sing.executors.records import to_tables  # noqa: E402
from sing.executors.settings import ExecutorSettings  # noqa: E402
from sing.executors.slurm import SlurmExecutor  # noqa: E402
from sing.executors.slurm_parse import parse_sacct, parse_squeue  # noqa: E402
from sing.executors.sync import sync  # noqa: E402
from sing.warehouse.store import Warehouse  # noqa: E402

DATA = ROOT / "tests" / "executors_data"
JOBS = 20_000


def scaled(path: Path, n: int) -> tuple[str, str]:
    """The captured dump with `n` jobs (ids 1..n) and the matching `sacct -P` text."""
    dump = json.loads(path.read_text())
    samples = dump["jobs"]
    jobs = []
    for i in range(n):
        job = copy.deepcopy(samples[i % len(samples)])
        job["job_id"] = i + 1
        jobs.append(job)
    dump["jobs"] = jobs
    return json.dumps(dump), "".join(f"{i + 1}|user{i % 50}|{i % 3}:0\n" for i in range(n))


def timed(label: str, fn, n: int):
    start = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - start
    print(f"{label:<44} {elapsed * 1000:9.1f} ms  {n / elapsed:>10,.0f} jobs/s")
    return result, elapsed


def main() -> None:
    sacct_json, sacct_text = scaled(DATA / "sacct_v0.0.38.json", JOBS)
    squeue_json, _ = scaled(DATA / "squeue_v0.0.38.json", JOBS)
    sizes = f"sacct JSON {len(sacct_json) / 1e6:.1f} MB, squeue {len(squeue_json) / 1e6:.1f} MB"
    print(f"{JOBS:,} jobs; {sizes}")
    _, t_load = timed("json.loads alone (sacct)", lambda: json.loads(sacct_json), JOBS)
    records, t_parse = timed(
        "parse_sacct (JSON + -P text -> records)",
        lambda: parse_sacct(sacct_json, sacct_text, "campus"),
        JOBS,
    )
    print(f"  parse overhead over json.loads: {t_parse / t_load:.1f}x")
    timed("parse_squeue (with GPU indices)", lambda: parse_squeue(squeue_json, "campus"), JOBS)
    timed("to_tables (records -> Arrow)", lambda: to_tables(records, records[0].end_time), JOBS)

    with tempfile.TemporaryDirectory() as tmp:
        outputs = {"squeue": '{"jobs": []}', "sacct --json": sacct_json, "sacct -X": sacct_text}

        def replay(argv, stdin=None):
            return outputs[argv[0] if argv[0] == "squeue" else " ".join(argv[:2])]

        executor = SlurmExecutor("campus", ExecutorSettings(), replay)
        wh = Warehouse(Path(tmp) / "wh")
        _, t_first = timed(
            "sync: first (parse + 2 warehouse appends)", lambda: sync(executor, wh), JOBS
        )
        _, t_again = timed("sync: re-run (idempotent upsert)", lambda: sync(executor, wh), JOBS)
        count = wh.connect().execute("SELECT count(*) FROM jobs").fetchone()[0]
        print(f"  rows after two syncs: {count:,} (expected {JOBS:,})")

        local = LocalExecutor("campus", Path(tmp) / "local", gpus=[0, 1], node="box")
        latencies = []
        for _ in range(5):
            job_id = local.enqueue(JobProfile(name="b", commands="true", gpus_per_node=1))
            record = local.supervise(job_id)
            latencies.append((record.start_time - record.submit_time).total_seconds() * 1000)
        print(f"local executor submit->start (in-process supervisor): "
              f"median {sorted(latencies)[2]:.1f} ms over 5 jobs")  # fmt: skip


if __name__ == "__main__":
    main()
