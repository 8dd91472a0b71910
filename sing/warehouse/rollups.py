"""Rollups: small per-day summaries that keep reports fast over a year of samples.

Each rollup is one SQL aggregation over one sample table. It is written to Parquet when a day is
closed and compacted, and evaluated live over the raw samples of days not yet rolled up (today),
so reports see the same numbers either way. The rollups store sums and counts, never means, so
days add up exactly, and they are keyed by job (samples carry their job id from ingest), which
keeps per-job figures exact where a plain time-bucket rollup would blur jobs that start or end
inside a bucket.

Every rollup keeps the samples' `cluster` (NULL in samples written before samples carried one;
readers take NULL as the warehouse's only cluster, see `sing.warehouse.analytics.HOME_CLUSTER`), so
job ids and node names of different clusters never mix.

Which days are stored: every rollup is a Delta table partitioned by day, and each of its files
summarises exactly one raw data file of the source table, named in the rollup file's name:
`of-<raw file>` while that raw file is live, `kept-<raw file>` once retention removed the raw
file (the summary is then all that is left). Raw files are immutable and never reused, so a
rollup file of a live raw file is exact; a raw file that compaction removed makes its `of-`
rollup stale (its rows live on in the merged file). `plan_day` applies that rule per day, so the
view is exact before and after compaction, with late samples and after retention.

Energy is kept two ways: the sum of the per-sample counter deltas (`energy_delta_j`, resets
already handled by the writer) with the day's first delta, so a reader can leave out each GPU's
first sample of a job (its delta reaches back before the job); and the counter's min/max, the
fallback for samples written before deltas existed. RDMA keeps, besides the sums of deltas, how
many samples had an unknown counter (NULL: a saturated 32-bit counter), so a job's traffic with
a blind spot reads as unknown instead of too small. A job's cgroup counters (CPU seconds, I/O
bytes) start at zero with the job, so its use on a node is the counter's first value plus its
deltas (a requeued run's new cgroup counts from zero again), kept with the highest value, which
covers a gap in the deltas (sing.warehouse.analytics.job_host_node_sql).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from sing.signals import GPU_SIGNALS

# A sample below this utilisation counts as an idle sample (the GPU did essentially nothing).
IDLE_SAMPLE_UTIL = 0.01


@dataclass(frozen=True)
class Rollup:
    name: str
    source: str  # the sample table it summarises
    select: str  # SQL over the relation named `src`
    doc: str
    # Its columns follow sing/signals.py, so files written by an older sing lack the newest:
    # its view reads its files by column name (each file's footer at every connect).
    grows: bool = False


def _signal_sums() -> str:
    """Per registered signal (sing/signals.py): sum, count and maximum of its samples."""
    return "".join(
        f"sum({s.key}) AS {s.key}_sum, count({s.key}) AS {s.key}_samples, "
        f"max({s.key}) AS {s.key}_max, "
        for s in GPU_SIGNALS
    )


ROLLUPS: dict[str, Rollup] = {
    r.name: r
    for r in (
        Rollup(
            "job_gpu_usage",
            "gpu_samples",
            f"""
            SELECT cluster, job_id, node, gpu_index, ts::DATE AS day,
                   count(*) AS samples,
                   sum(util) AS util_sum,
                   max(util) AS util_max,
                   sum(sm_active) AS sm_sum,
                   count(sm_active) AS sm_samples,
                   count(*) FILTER (WHERE util < {IDLE_SAMPLE_UTIL}) AS idle_samples,
                   max(mem_used_bytes) AS mem_peak_bytes,
                   max(mem_total_bytes) AS mem_total_bytes,
                   min(energy_j) AS energy_min_j,
                   max(energy_j) AS energy_max_j,
                   sum(energy_delta_j) AS energy_delta_sum_j,
                   count(energy_delta_j) AS energy_delta_samples,
                   arg_min_null(energy_delta_j, ts) AS first_energy_delta_j,
                   sum(power_w) AS power_sum,
                   min(ts) AS first_ts,
                   max(ts) AS last_ts
            FROM src WHERE job_id IS NOT NULL
            GROUP BY ALL
            """,
            "Per job, GPU and day: sums and counts of utilisation, memory peak, energy.",
        ),
        Rollup(
            "gpu_hourly",
            "gpu_samples",
            """
            SELECT date_trunc('hour', ts) AS hour, ts::DATE AS day, cluster, node, gpu_index,
                   count(*) AS samples,
                   count(job_id) AS assigned_samples,
                   sum(util) AS util_sum,
                   sum(sm_active) AS sm_sum,
                   count(sm_active) AS sm_samples,
                   sum(power_w) AS power_sum,
                   sum(mem_used_bytes)::DOUBLE AS mem_used_sum
            FROM src
            GROUP BY ALL
            """,
            "Per GPU and hour: how many samples were assigned to a job and how busy the GPU was.",
        ),
        Rollup(
            "job_rdma_usage",
            "rdma_samples",
            """
            SELECT cluster, job_id, node, ts::DATE AS day,
                   count(*) AS samples,
                   sum(tx_delta_bytes)::BIGINT AS tx_bytes,
                   sum(rx_delta_bytes)::BIGINT AS rx_bytes,
                   -- neither counter nor delta: the exporter could not know them
                   count(*) - count(coalesce(tx_delta_bytes, tx_bytes)) AS tx_unknown_samples,
                   count(*) - count(coalesce(rx_delta_bytes, rx_bytes)) AS rx_unknown_samples,
                   min(ts) AS first_ts,
                   max(ts) AS last_ts
            FROM src WHERE job_id IS NOT NULL
            GROUP BY ALL
            """,
            "Per job, node and day: RDMA bytes sent and received, samples with unknown counters.",
        ),
        Rollup(
            "node_rdma_hourly",
            "rdma_samples",
            """
            SELECT date_trunc('hour', ts) AS hour, ts::DATE AS day, cluster, node,
                   sum(tx_delta_bytes)::BIGINT AS tx_bytes,
                   sum(rx_delta_bytes)::BIGINT AS rx_bytes
            FROM src
            GROUP BY ALL
            """,
            "Per node and hour: RDMA bytes sent and received.",
        ),
        Rollup(
            "job_host_usage",
            "job_host_samples",
            """
            SELECT cluster, job_id, node, ts::DATE AS day,
                   count(*) AS samples,
                   arg_min_null(cpu_s, ts) AS first_cpu_s,
                   sum(cpu_delta_s) AS cpu_delta_sum_s,
                   max(cpu_s) AS cpu_max_s,
                   max(cpuset_cpus) AS cpuset_cpus,
                   max(greatest(mem_peak_bytes, mem_used_bytes)) AS mem_peak_bytes,
                   max(mem_limit_bytes) AS mem_limit_bytes,
                   arg_min_null(io_read_bytes, ts) AS first_io_read_bytes,
                   sum(io_read_delta_bytes)::BIGINT AS io_read_delta_sum_bytes,
                   max(io_read_bytes) AS io_read_max_bytes,
                   arg_min_null(io_write_bytes, ts) AS first_io_write_bytes,
                   sum(io_write_delta_bytes)::BIGINT AS io_write_delta_sum_bytes,
                   max(io_write_bytes) AS io_write_max_bytes,
                   min(ts) AS first_ts,
                   max(ts) AS last_ts
            FROM src WHERE job_id IS NOT NULL
            GROUP BY ALL
            """,
            "Per job, node and day: its cgroup's CPU seconds and I/O bytes (first value, deltas, "
            "highest), memory peak and limit, cpuset size.",
        ),
        Rollup(
            "job_gpu_signals",
            "gpu_samples",
            f"""
            SELECT cluster, job_id, node, gpu_index, ts::DATE AS day, {_signal_sums()}
                   count(*) AS samples
            FROM src WHERE job_id IS NOT NULL
            GROUP BY ALL
            """,
            "Per job, GPU and day: sums, counts and maxima of the registered signals.",
            grows=True,
        ),
    )
}


def rollups_of(source: str) -> list[Rollup]:
    return [r for r in ROLLUPS.values() if r.source == source]


OF = "of-"  # the rollup of a live raw file
KEPT = "kept-"  # the rollup of a raw file retention removed


class NamedFile(Protocol):
    @property
    def stem(self) -> str: ...


F = TypeVar("F", bound=NamedFile)
R = TypeVar("R", bound=NamedFile)


def plan_day(raw: Sequence[F], rolled: Sequence[R]) -> tuple[list[R], list[F]]:
    """(stored rollup files, raw files to aggregate live) for one day of one rollup.

    `kept-` files always count, and their raw file (still live only in the moment between the
    two commits of retention) is never aggregated again. The day's other raw files are either
    all summarised by current `of-` files, which are then read, or all aggregated live, so a
    late sample yields one row per key, not a stored and a live one."""
    kept = [r for r in rolled if r.stem.startswith(KEPT)]
    kept_sources = {r.stem.removeprefix(KEPT) for r in kept}
    pending = [f for f in raw if f.stem not in kept_sources]
    pending_stems = {f.stem for f in pending}
    current = [r for r in rolled if r.stem.startswith(OF) and r.stem[len(OF) :] in pending_stems]
    if {r.stem[len(OF) :] for r in current} == pending_stems:
        return kept + current, []
    return kept, pending
