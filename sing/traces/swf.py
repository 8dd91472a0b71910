"""Export a trace as Standard Workload Format (SWF 2.2) for HPC scheduling simulators.

SWF has processors, not GPUs: here one processor is one GPU. Users, groups and partitions become
1-based numbers in order of first name; unknown values are -1, as SWF asks.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from sing.errors import UserError
from sing.times import parse_time
from sing.traces import sql
from sing.traces.read import read_package, read_table

SWF_SQL = """
SELECT row_number() OVER (ORDER BY submit_s, job_id) AS job,
       round(submit_s)::BIGINT AS submit,
       coalesce(round(queue_s)::BIGINT, -1) AS wait,
       coalesce(round(run_s)::BIGINT, -1) AS run,
       coalesce(num_gpus, -1) AS procs,
       -1 AS cpu_used, -1 AS mem_used,
       coalesce(num_gpus, -1) AS req_procs,
       coalesce(time_limit_s, -1) AS req_time,
       -1 AS req_mem,
       CASE state WHEN 'completed' THEN 1 WHEN 'cancelled' THEN 5
                  WHEN 'failed' THEN 0 WHEN 'timeout' THEN 0 WHEN 'node_fail' THEN 0
                  WHEN 'out_of_memory' THEN 0 ELSE -1 END AS status,
       CASE WHEN "user" IS NULL THEN -1 ELSE dense_rank() OVER (ORDER BY "user") END AS uid,
       CASE WHEN "group" IS NULL THEN -1 ELSE dense_rank() OVER (ORDER BY "group") END AS gid,
       -1 AS executable,
       CASE WHEN partition IS NULL THEN -1 ELSE dense_rank() OVER (ORDER BY partition) END AS queue,
       -1 AS partition_number, -1 AS preceding, -1 AS think
FROM jobs ORDER BY job
"""


def write_swf(trace_dir: str | Path, out_file: str | Path) -> int:
    """Write the trace's jobs as an SWF file; returns the number of jobs."""
    package = read_package(trace_dir)
    jobs = read_table(trace_dir)
    for name in ("user", "group", "partition", "time_limit_s"):
        if name not in jobs.column_names:
            raise UserError(f"{trace_dir}: field {name} was dropped; SWF export needs it")
    con = sql.connect()
    con.register("jobs", jobs)
    rows = pl.from_arrow(con.sql(SWF_SQL).to_arrow_table())
    queues = con.sql(
        "SELECT DISTINCT partition FROM jobs WHERE partition IS NOT NULL ORDER BY 1"
    ).fetchall()
    start = parse_time(package["release_start"], "release_start")
    header = [
        "; Version: 2.2",
        f"; Computer: {package.get('title', 'GPU cluster')}",
        f"; UnixStartTime: {int(start.timestamp())}",
        "; TimeZoneString: UTC",
        f"; StartTime: {start.isoformat()}",
        f"; MaxJobs: {rows.height}",
        f"; MaxRecords: {rows.height}",
        "; Note: converted by sing from the open trace format; one processor = one GPU",
        *(f"; Queue: {i} {name}" for i, (name,) in enumerate(queues, start=1)),
    ]
    out = Path(out_file)
    tmp = out.with_name(f".{out.name}.tmp")
    with open(tmp, "w") as fh:
        fh.write("\n".join(header) + "\n")
        rows.write_csv(fh, separator=" ", include_header=False)
    tmp.rename(out)
    return rows.height
