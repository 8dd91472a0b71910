"""`sing job JOB_ID`: one job's efficiency on one screen, with plain-language notes.

The notes are data (`job_notes.toml`, or the file named by [thresholds] notes_file): a SQL
condition over the job's figures and a message template, so admins change wording and
thresholds without touching code. A condition is only arithmetic and comparisons of figures,
thresholds and literals (checked before it runs): no functions, subqueries or statements, so a
notes file cannot read or write files through DuckDB.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Collection
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

import duckdb

from sing import tables
from sing.config import Config, Thresholds
from sing.errors import UserError
from sing.signals import GPU_SIGNALS, GpuSignal
from sing.tables import Column, hours, scaled_bytes
from sing.warehouse.analytics import (
    JOB_COVERAGE_SQL,
    JOB_GPU_SQL,
    JOB_HOST_NODE_SQL,
    JOB_HOST_SQL,
    JOB_RDMA_SQL,
    JOB_SIGNALS_SQL,
)
from sing.warehouse.coverage import DEFAULT_NEEDS, CoverageNeeds, coverage_words, partial_data_note
from sing.warehouse.rollups import IDLE_SAMPLE_UTIL

DEFAULT_NOTES = Path(__file__).with_name("job_notes.toml")
# The registered signals' per-job figures (sing/signals.py), e.g. mean_mem_util.
SIGNAL_FIGURES = tuple(s.figure for s in GPU_SIGNALS)
GIB = 2**30
# A requeued job's runs (`job_runs`), oldest first.
RUN_COLUMNS = (
    Column("run", "run"),
    Column("start_time", "start (UTC)"),
    Column("end_time", "end (UTC)", missing="running"),
    hours("run_s", "run time", missing="running"),
    Column("state", "state"),
    Column("num_gpus", "GPUs"),
    Column("nodes", "node list", width=40),
)


def load_notes(path: Path | None) -> list[dict[str, str]]:
    path = path or DEFAULT_NOTES
    try:
        notes = tomllib.loads(path.read_text()).get("note", [])
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise UserError(f"job notes file {path}: {err}") from err
    probe = _Blank({name: 0.5 for name in _FIGURE_NAMES})
    for n, note in enumerate(notes, start=1):
        if set(note) != {"when", "say"}:
            raise UserError(f"{path}: note {n} needs exactly the keys 'when' and 'say'")
        try:
            note["say"].format_map(probe)
        except (ValueError, KeyError, IndexError, TypeError) as err:
            raise UserError(
                f"{path}: note {n}: message {note['say']!r} is not valid: {err}"
            ) from err
    return notes


def site_notes(config: Config) -> list[dict[str, str]]:
    """The site's notes: [thresholds] notes_file (relative to the config file), else ours."""
    notes_file = config.thresholds.notes_file
    return load_notes(config.resolve_path(notes_file) if notes_file else None)


def job_report(
    con: duckdb.DuckDBPyConnection,
    job_id: str,
    thresholds: Thresholds,
    notes: list[dict[str, str]],
    now: datetime | None = None,
    cluster: str | None = None,
    needs: CoverageNeeds = DEFAULT_NEEDS,
    running_accounting: Callable[[str], RunningAccounting] | None = None,
) -> dict[str, Any]:
    """Everything `sing job` shows: the job's figures with their coverage (sampled every
    `needs.interval_s`), per-GPU and per-node rows, notes; under `needs.min_coverage` the first
    note says the figures rest on part of the job's data.

    Job ids repeat across clusters: `cluster` picks one; without it an id found in several
    clusters is an error naming them. Slurm's own figures come from the job record once the
    job ended (sacct); for a running job, from `running_accounting(cluster)` (sstat, asked
    only then)."""
    now = now or datetime.now(UTC)
    cluster = _job_cluster(con, job_id, cluster)
    params = {
        "since": datetime(1970, 1, 1, tzinfo=UTC),
        "until": now,
        "now": now,
        "idle_sample": IDLE_SAMPLE_UTIL,
        "cluster": cluster,
        "job_id": job_id,
        "interval_s": needs.interval_s,
    }
    rows = con.sql(
        f"SELECT * FROM ({JOB_COVERAGE_SQL}) WHERE cluster = $cluster AND job_id = $job_id",
        params=params,
    ).pl()
    if rows.is_empty():
        state = con.execute(
            "SELECT state FROM jobs WHERE cluster = ? AND job_id = ?", [cluster, job_id]
        ).fetchone()
        raise UserError(f"job {job_id} has not started (state {state[0]})")
    job = rows.row(0, named=True)
    key = {"cluster": cluster, "job_id": job_id}
    signals = []  # the registered signals' figures (sing/signals.py), if any are registered
    if SIGNAL_FIGURES:
        signals = con.execute(
            f"SELECT * EXCLUDE (cluster, job_id) FROM ({JOB_SIGNALS_SQL}) "
            "WHERE cluster = $cluster AND job_id = $job_id",
            key,
        ).fetchall()
    figures = signals[0] if signals else (None,) * len(SIGNAL_FIGURES)
    job |= dict(zip(SIGNAL_FIGURES, figures, strict=True))
    job["per_gpu"] = (
        con.sql(
            f"""
        SELECT node, gpu_index, util_sum / samples AS mean_util, util_max AS max_util,
               sm_sum / nullif(sm_samples, 0) AS mean_sm_active,
               mem_peak_bytes AS peak_mem_bytes, mem_total_bytes AS gpu_mem_bytes, energy_j
        FROM ({JOB_GPU_SQL}) WHERE cluster = $cluster AND job_id = $job_id
        ORDER BY node, gpu_index
        """,
            params=key,
        )
        .pl()
        .to_dicts()
    )
    job["per_node_rdma"] = (
        con.sql(
            f"""
        SELECT node, tx_bytes, rx_bytes
        FROM ({JOB_RDMA_SQL}) WHERE cluster = $cluster AND job_id = $job_id ORDER BY node
        """,
            params=key,
        )
        .pl()
        .to_dicts()
    )
    host = con.sql(
        f"SELECT * EXCLUDE (cluster, job_id) FROM ({JOB_HOST_SQL}) "
        "WHERE cluster = $cluster AND job_id = $job_id",
        params=key | {"now": now},
    ).pl()
    job |= host.row(0, named=True) if not host.is_empty() else dict.fromkeys(host.columns)
    job["per_node_host"] = (
        con.sql(
            f"""
        SELECT node, cpu_s, cpuset_cpus, mem_peak_bytes, mem_limit_bytes, io_read_bytes,
               io_write_bytes
        FROM ({JOB_HOST_NODE_SQL}) WHERE cluster = $cluster AND job_id = $job_id ORDER BY node
        """,
            params=key,
        )
        .pl()
        .to_dicts()
    )
    job["runs"] = (
        con.sql(
            """
        SELECT row_number() OVER (ORDER BY start_time) AS run, start_time, end_time,
               epoch(end_time - start_time) AS run_s, state, exit_code, num_gpus, nodes, sluid
        FROM job_runs WHERE cluster = $cluster AND job_id = $job_id ORDER BY start_time
        """,
            params=key,
        )
        .pl()
        .to_dicts()
    )
    job |= _slurm_accounting(con, cluster, job_id)
    if job["state"] == "RUNNING" and running_accounting is not None:
        job |= running_accounting(cluster)
    job["accounting_check"] = accounting_check(job)
    partial = partial_data_note(job["coverage"], needs)
    job["notes"] = (
        ([partial] if partial else [])
        + evaluate_notes(con, job, thresholds, notes)
        + job["accounting_check"]
    )
    return job


# How far apart the node's cgroup figures and Slurm's own accounting may be before `sing job`
# says so: |a - b| / max(a, b). CPU seconds count the same thing both ways (the job's tasks'
# user + system time), so more than a tenth apart means a gap in one of them; memory is measured
# differently (the cgroup's high-water mark counts page cache; Slurm's MaxRSS, sampled every
# JobAcctGatherFrequency, is the tasks' resident memory), so only a quarter apart is worth a word.
CPU_TOLERANCE = 0.10
MEMORY_TOLERANCE = 0.25


def _slurm_accounting(con: duckdb.DuckDBPyConnection, cluster: str, job_id: str) -> dict:
    """Slurm's own figures for an ended job (sacct's TotalCPU and seff's memory), NULL for a
    running job, a job from another scheduler, or a warehouse written before they existed."""
    cursor = con.execute("SELECT * FROM jobs WHERE cluster = ? AND job_id = ? LIMIT 1",
                         [cluster, job_id])  # fmt: skip
    names = [d[0] for d in cursor.description]
    row = dict(zip(names, cursor.fetchone() or (), strict=False))
    figures = {name: row.get(name) for name in ("slurm_cpu_s", "slurm_max_rss_bytes")}
    source = "sacct" if any(v is not None for v in figures.values()) else None
    return figures | {"slurm_source": source, "slurm_error": None}


class RunningAccounting(TypedDict):
    """Slurm's figures for a running job so far (sstat), or why they could not be read."""

    slurm_cpu_s: float | None
    slurm_max_rss_bytes: int | None
    slurm_source: str | None  # "sstat"; None when sstat had no running step or failed
    slurm_error: str | None  # the command's error, said in the notes


def apart(a: float | None, b: float | None) -> float | None:
    """How far apart two figures are, as a share of the larger; None when one is unknown."""
    if a is None or b is None or max(a, b) <= 0:
        return None
    return abs(a - b) / max(a, b)


def accounting_check(job: dict[str, Any]) -> list[str]:
    """The node's cgroup figures against Slurm's accounting, in words, where they differ by
    more than the tolerances: a user comparing `sing job` with seff should know which is which
    and that the difference is known, not a bug in either."""
    said = []
    if job.get("slurm_error"):
        said.append(f"Slurm's figures for this running job could not be read: {job['slurm_error']}")
    running = job.get("slurm_source") == "sstat"
    slurm = "Slurm's accounting so far (sstat)" if running else "Slurm's accounting"
    tool = "sstat shows" if running else "seff and sacct (TotalCPU) show"
    cgroup_cpu, slurm_cpu = job.get("cpu_core_s"), job.get("slurm_cpu_s")
    if (gap := apart(cgroup_cpu, slurm_cpu)) is not None and gap > CPU_TOLERANCE:
        lag = (
            "lag behind by up to a collector interval and miss what ran while the node was not read"
            if running
            else "miss what ran after the last reading or while the node was not read"
        )
        said.append(
            f"{slurm} says {_cpu_amount(slurm_cpu)} of CPU, the node's cgroups "
            f"{_cpu_amount(cgroup_cpu)} ({gap:.0%} apart). {tool} Slurm's figure; the figures "
            f"above are the cgroups', which {lag}."
        )
    cgroup_mem, slurm_mem = job.get("host_mem_peak_bytes"), job.get("slurm_max_rss_bytes")
    if (gap := apart(cgroup_mem, slurm_mem)) is not None and gap > MEMORY_TOLERANCE:
        said.append(
            f"{slurm} says the job's peak memory was "
            f"{scaled_bytes(slurm_mem, binary=True)}, the node's cgroups "
            f"{scaled_bytes(cgroup_mem, binary=True)} ({gap:.0%} apart). "
            f"{'sstat' if running else 'seff'} shows Slurm's "
            "figure (its tasks' largest resident memory, sampled); the cgroups' peak also "
            "counts page cache and catches peaks between samples."
        )
    return said


def _cpu_amount(seconds: float) -> str:
    """CPU time in core-hours, or core-seconds for short jobs (under 0.1 core-hour)."""
    if seconds >= 360:
        return f"{seconds / 3600:.1f} core-hours"
    return f"{seconds:.1f} core-seconds"


def _job_cluster(con: duckdb.DuckDBPyConnection, job_id: str, cluster: str | None) -> str:
    """The cluster of the job `job_id`, checked to exist (and to be the only one)."""
    found = [
        row[0]
        for row in con.execute(
            "SELECT DISTINCT cluster FROM jobs WHERE job_id = ? AND (? IS NULL OR cluster = ?) "
            "ORDER BY cluster",
            [job_id, cluster, cluster],
        ).fetchall()
    ]
    if not found:
        where = f" of cluster {cluster}" if cluster else ""
        raise UserError(f"no job {job_id}{where} in the warehouse")
    if len(found) > 1:
        raise UserError(
            f"job {job_id} is in several clusters ({', '.join(found)}): name one with --cluster"
        )
    return found[0]


def evaluate_notes(
    con: duckdb.DuckDBPyConnection,
    job: dict[str, Any],
    thresholds: Thresholds,
    notes: list[dict[str, str]],
) -> list[str]:
    figures = {**_derived(job), **asdict(thresholds)}
    figures = {k: v for k, v in figures.items() if isinstance(v, int | float | str) or v is None}
    names = list(figures)
    select = ", ".join(f"${n} AS {n}" for n in names)
    said = []
    for note in notes:
        _check_condition(note["when"], names)
        try:
            hit = con.execute(
                f"SELECT coalesce(({note['when']}), false) FROM (SELECT {select})", figures
            ).fetchone()[0]
        except duckdb.Error as err:
            raise UserError(f"job note condition {note['when']!r} is not valid SQL: {err}") from err
        if hit:
            said.append(note["say"].format_map(_Blank(figures)))
    return said


# A condition's tokens: names, numbers, 'text' literals, comparison and arithmetic operators.
_TOKEN = re.compile(
    r"\s*(?:(?P<name>[A-Za-z_]\w*)|(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
    r"|'[^']*'|<=|>=|<>|!=|[<>=+\-*/%()])"
)
_KEYWORDS = frozenset({"and", "or", "not", "is", "null", "true", "false", "between"})


def _check_condition(when: str, names: Collection[str]) -> None:
    """Refuse a condition that is more than figures, literals and operators."""
    pos, end = 0, len(when.rstrip())
    while pos < end:
        token = _TOKEN.match(when, pos)
        if not token:
            bad = when[pos:].strip()[:20]
            raise UserError(
                f"job note condition {when!r}: {bad!r} is not allowed "
                "(figures, numbers, 'text', comparisons, arithmetic, AND/OR/NOT)"
            )
        name = token.group("name")
        if name and name.lower() not in _KEYWORDS and name not in names:
            raise UserError(f"job note condition {when!r}: {name!r} is not a figure or threshold")
        pos = token.end()


def _derived(job: dict[str, Any]) -> dict[str, Any]:
    """The job's figures plus friendlier units; unknown figures stay NULL (no note fires: an
    unknown RDMA total is not evidence of a job that does not talk)."""
    out = dict(job)
    rdma = job.get("rdma_bytes_per_node_hour")
    out["rdma_gb_per_node_hour"] = None if rdma is None else rdma / 1e9
    out["peak_mem_gib"] = (job.get("peak_mem_bytes") or 0) / GIB
    out["gpu_mem_gib"] = (job.get("gpu_mem_bytes") or 0) / GIB
    for figure in HOST_MEMORY_FIGURES:
        value = job.get(f"{figure}_bytes")
        out[f"{figure}_gib"] = None if value is None else value / GIB
    return out


# Host memory figures (`<name>_bytes` from JOB_HOST_SQL) a note may also use in GiB (`<name>_gib`).
HOST_MEMORY_FIGURES = (
    "host_mem_peak",
    "node_mem_peak",
    "host_mem_req",
    "node_mem_req",
    "suggested_mem",
)


# Names a note's message may use (checked when the notes file is loaded).
_FIGURE_NAMES = (
    "job_id",
    "user",
    "account",
    "partition",
    "state",
    "num_nodes",
    "num_gpus",
    "gpu_hours",
    "mean_util",
    "mean_sm_active",
    "idle_share",
    "idle_gpu_hours",
    "gpus_never_used",
    "gpus_sampled",
    "coverage",
    "peak_mem_bytes",
    "gpu_mem_bytes",
    "energy_j",
    "rdma_bytes_per_node_hour",
    "rdma_gb_per_node_hour",
    "peak_mem_gib",
    "gpu_mem_gib",
    "run_s",
    "queue_s",
    "cpu_core_s",
    "alloc_cores",
    "mean_cores_used",
    "cpu_efficiency",
    "host_mem_ratio",
    "io_read_bytes",
    "io_write_bytes",
    *(f"{figure}_{unit}" for figure in HOST_MEMORY_FIGURES for unit in ("bytes", "gib")),
    *SIGNAL_FIGURES,
)


class _Blank(dict):
    """format_map helper: a name a note uses but the job lacks prints as '?'."""

    def __missing__(self, key: str) -> str:
        return "?"


def render(job: dict[str, Any]) -> str:
    """The human screen of `sing job`."""
    run_h = (job["run_s"] or 0) / 3600
    lines = [
        f"Job {job['job_id']}  user {job['user']}  account {job['account']}  "
        f"partition {job['partition']}",
        f"State {job['state']}  exit code {_na(job['exit_code'])}  "
        f"{job['num_nodes']} node(s), {job['num_gpus']} GPU(s)  run time {run_h:.2f} h  "
        f"queued {(job['queue_s'] or 0) / 3600:.2f} h  "
        f"time limit {_limit(job.get('time_limit_s'))}",
        f"Nodes: {', '.join(job['nodes'] or [])}",
        "",
        f"GPU-hours allocated {job['gpu_hours']:.1f}   idle GPU-hours "
        f"{job['idle_gpu_hours'] or 0:.1f}   energy {_amount(job['energy_j'], 3.6e6, 'kWh')}",
        f"GPU utilization  {_bar(job['mean_util'])}{_beside(coverage_words(job['coverage']))}"
        f"  SM activity  {_bar(job['mean_sm_active'])}",
        f"Peak GPU memory  {_memory(job['peak_mem_bytes'], job['gpu_mem_bytes'])}",
        *(_signal_line(s, job.get(s.figure)) for s in GPU_SIGNALS),
        *(_host_lines(job) if job["per_node_host"] else []),
        "",
        "Per GPU:",
    ]
    for g in job["per_gpu"]:
        lines.append(
            f"  {g['node']}:{g['gpu_index']}  util {_bar(g['mean_util'])}  "
            f"mem {_memory(g['peak_mem_bytes'], g['gpu_mem_bytes'])}"
        )
    if job["per_node_host"]:
        lines += ["Per node (CPU and host memory):", *_host_node_lines(job)]
    if job["per_node_rdma"]:
        lines.append("RDMA per node:")
        for r in job["per_node_rdma"]:
            lines.append(
                f"  {r['node']}  sent {scaled_bytes(r['tx_bytes'])}  "
                f"received {scaled_bytes(r['rx_bytes'])}"
            )
    if len(job["runs"]) > 1:
        lines += ["", "Runs (requeued; the figures above are the last run's):"]
        lines += ["  " + line for line in tables.render(job["runs"], RUN_COLUMNS).splitlines()]
    if job["notes"]:
        lines += ["", "Notes:"] + [f"  * {n}" for n in job["notes"]]
    return "\n".join(lines)


def _host_lines(job: dict[str, Any]) -> list[str]:
    """The job's CPU, host memory and disk I/O over all its nodes."""
    cores = job["mean_cores_used"]
    used = "" if cores is None else f" ({cores:.1f} of {_na(job['alloc_cores'])} cores in use)"
    lines = [
        f"CPU efficiency   {_bar(job['cpu_efficiency'])}{used}",
        f"Peak host memory {_host_memory(job['host_mem_peak_bytes'], job['host_mem_req_bytes'])}",
        f"Disk I/O         read {scaled_bytes(job['io_read_bytes'])}, "
        f"written {scaled_bytes(job['io_write_bytes'])}",
    ]
    if slurm := slurm_figures(job):
        lines.append(f"{slurm[0]:17}{slurm[1]}")
    return lines


def slurm_figures(job: dict[str, Any]) -> tuple[str, str] | None:
    """Slurm's own figures for the job beside the cgroups' CPU, as (label, words), the label
    naming the tool a user would compare with: "Slurm (sstat)" while the job runs, "Slurm
    (seff)" after; None when Slurm gave none. `sing job` and the Job page show the same."""
    cpu_s, rss = job.get("slurm_cpu_s"), job.get("slurm_max_rss_bytes")
    if cpu_s is None and rss is None:
        return None
    cpu = "n/a" if cpu_s is None else _cpu_amount(cpu_s)
    source = "Slurm (sstat)" if job.get("slurm_source") == "sstat" else "Slurm (seff)"
    cgroups = "n/a" if job["cpu_core_s"] is None else _cpu_amount(job["cpu_core_s"])
    return source, (
        f"CPU {cpu}, memory {scaled_bytes(rss, binary=True)}; the node's cgroups: CPU {cgroups}"
    )


def _host_node_lines(job: dict[str, Any]) -> list[str]:
    """Each node's CPU cores in use on average and its peak host memory."""
    run_s = job["run_s"] or 0
    lines = []
    for n in job["per_node_host"]:
        busy = None if n["cpu_s"] is None or not run_s else n["cpu_s"] / run_s
        lines.append(
            f"  {n['node']}  CPU {'n/a' if busy is None else f'{busy:.1f}'} of "
            f"{_na(n['cpuset_cpus'])} cores  "
            f"memory {_host_memory(n['mem_peak_bytes'], n['mem_limit_bytes'])}"
        )
    return lines


def _host_memory(peak: int | None, requested: int | None) -> str:
    """Peak host memory beside what the job asked for (or its cgroup allowed)."""
    of = f" of {scaled_bytes(requested, binary=True)} requested" if requested else ""
    return f"{scaled_bytes(peak, binary=True)}{of}"


def _signal_line(signal: GpuSignal, value: float | None) -> str:
    """A registered signal's per-job figure: a bar for a ratio, else the number and its unit."""
    label = f"{signal.label or signal.key} ({signal.per_job})"
    if signal.shown_as == "ratio":
        return f"{label:<16} {_bar(value)}"
    return f"{label:<16} {'n/a' if value is None else f'{value:.4g} {signal.shown_as}'}"


def _bar(ratio: float | None, width: int = 20) -> str:
    if ratio is None:
        return "[" + " " * width + "]  n/a"
    filled = round(max(0.0, min(1.0, ratio)) * width)
    return "[" + "#" * filled + "." * (width - filled) + f"] {ratio:4.0%}"


def _beside(words: str) -> str:
    """`words` in parentheses after a figure, nothing when there are none."""
    return f" ({words})" if words else ""


def _amount(value: float | None, per_unit: float, unit: str) -> str:
    """`value` in `unit` with two decimals, or "unknown" (a figure sing could not measure)."""
    return "unknown" if value is None else f"{value / per_unit:.2f} {unit}"


def _memory(peak: int | None, total: int | None) -> str:
    """A GPU's peak memory beside its total, so a person sees how full it was."""
    of = f" of {scaled_bytes(total, binary=True)}" if total else ""
    return f"{scaled_bytes(peak, binary=True)}{of}"


def _limit(seconds: int | None) -> str:
    """The job's time limit in hours; Slurm's UNLIMITED (or a source without one) is "none"."""
    return "none" if seconds is None else f"{seconds / 3600:.2f} h"


def _na(value: object) -> str:
    return "n/a" if value is None else str(value)
