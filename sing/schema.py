"""The warehouse's tables: names, columns and types are the contract every part writes to.

All times are UTC (`timestamp[us, UTC]`), all quantities SI: bytes, watts, joules, seconds,
ratios 0-1. Columns may be added (readers use union-by-name), never renamed silently: a rename is
a migration in `sing.warehouse.migrations`.

Two kinds of table:
- *samples* (append-only, partitioned by UTC day): `gpu_samples`, `rdma_samples`, `scrapes`.
- *records* (upserted: the newest `recorded_at` per key wins): `jobs`, `job_runs`, `job_gpus`,
  `nodes`.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from sing.signals import GPU_SIGNALS

UTC_TS = pa.timestamp("us", tz="UTC")


@dataclass(frozen=True)
class Table:
    name: str
    schema: pa.Schema
    key: tuple[str, ...] = ()  # records: the upsert key; samples: empty
    time_column: str | None = None  # samples: the column that picks the day partition
    doc: str = ""
    # samples: raw telemetry, which `raw_retention_days` may remove once rolled up and a full
    # collector buffer may drop; not the small tables that are the only record of what
    # happened (the audit trail, health readings, incident notes)
    raw: bool = True

    @property
    def is_samples(self) -> bool:
        return self.time_column is not None


def _schema(*fields: tuple[str, pa.DataType]) -> pa.Schema:
    return pa.schema([pa.field(name, dtype) for name, dtype in fields])


TABLES: dict[str, Table] = {
    t.name: t
    for t in (
        Table(
            "nodes",
            _schema(
                ("node", pa.string()),
                ("gpus", pa.int16()),  # 0: the node left the cluster (or has no GPU) from then
                ("gpu_model", pa.string()),
                ("gpu_memory_bytes", pa.int64()),
                ("partition", pa.string()),
                ("cluster", pa.string()),
                # This version of the node holds from here until the node's next version; a row
                # without it (older warehouses) holds from the beginning of time.
                ("valid_from", UTC_TS),
                # Who said so: "exporter", "sinfo", "exporter+sinfo", "import" or "synthetic".
                ("source", pa.string()),
                ("recorded_at", UTC_TS),
            ),
            key=("cluster", "node", "valid_from"),
            doc="Inventory of GPU nodes with history: one row per node version, for capacity.",
        ),
        Table(
            "jobs",
            _schema(
                ("job_id", pa.string()),
                ("cluster", pa.string()),
                ("user", pa.string()),
                ("account", pa.string()),
                ("partition", pa.string()),
                ("name", pa.string()),
                ("qos", pa.string()),  # the scheduler's quality of service, where it has one
                ("submit_time", UTC_TS),
                ("start_time", UTC_TS),
                ("end_time", UTC_TS),
                ("state", pa.string()),
                ("exit_code", pa.int32()),
                ("num_nodes", pa.int32()),
                ("gpus_per_node", pa.int32()),
                ("num_gpus", pa.int32()),
                ("time_limit_s", pa.int64()),
                ("nodes", pa.list_(pa.string())),
                ("interactive", pa.bool_()),
                # Declared software of the job profile as a JSON object, e.g. {"torch": "2.3"}.
                ("dependencies", pa.string()),
                # Slurm 26.05+: the SLUID of the job's current run (new on every requeue), e.g.
                # "s0G2J8K4P1XY05"; NULL before 26.05 and for other executors.
                ("sluid", pa.string()),
                # Slurm's own accounting of the job, SI units, NULL where unknown (never 0;
                # docs/executors.md, "CPU and memory"): CPUs allocated and memory requested (the
                # job's total, per-node and per-CPU requests included), from squeue while it
                # runs and sacct once it ended; then seff's figures, from sacct: the user +
                # system CPU time of all its steps, and the largest over its steps of the sum
                # of the step's task RSS peaks.
                ("alloc_cpus", pa.int32()),
                ("req_mem_bytes", pa.int64()),
                ("slurm_cpu_s", pa.float64()),
                ("slurm_max_rss_bytes", pa.int64()),
                ("recorded_at", UTC_TS),
            ),
            key=("cluster", "job_id"),
            doc="One row per job; the newest record of a job wins (running -> finished).",
        ),
        Table(
            "job_runs",
            _schema(
                ("job_id", pa.string()),
                ("cluster", pa.string()),
                # The run's start: its key (a requeued job keeps its id; each run starts anew).
                ("start_time", UTC_TS),
                ("sluid", pa.string()),  # Slurm 26.05+: the run's own SLUID; NULL before
                ("submit_time", UTC_TS),
                ("end_time", UTC_TS),  # NULL while the run goes on
                # The run's own end: REQUEUED, NODE_FAIL, PREEMPTED for a run that was requeued.
                ("state", pa.string()),
                ("exit_code", pa.int32()),
                ("nodes", pa.list_(pa.string())),
                ("num_gpus", pa.int32()),
                ("recorded_at", UTC_TS),
            ),
            key=("cluster", "job_id", "start_time"),
            doc="Every run of a job that started (a requeued job has several); `jobs` holds the "
            "newest.",
        ),
        Table(
            "job_gpus",
            _schema(
                ("job_id", pa.string()),
                ("cluster", pa.string()),
                ("node", pa.string()),
                ("gpu_index", pa.int16()),
                ("gpu_uuid", pa.string()),
                ("start_time", UTC_TS),
                ("end_time", UTC_TS),
                ("recorded_at", UTC_TS),
            ),
            key=("cluster", "job_id", "node", "gpu_index"),
            doc="Which GPU a job held, and when.",
        ),
        Table(
            "gpu_samples",
            _schema(
                ("ts", UTC_TS),
                ("node", pa.string()),
                ("gpu_index", pa.int16()),
                ("gpu_uuid", pa.string()),
                ("util", pa.float32()),
                ("sm_active", pa.float32()),
                ("mem_used_bytes", pa.int64()),
                ("mem_total_bytes", pa.int64()),
                ("power_w", pa.float32()),
                ("energy_j", pa.float64()),
                # Joules since this GPU's previous sample (counter resets handled), set by the
                # writer; NULL for a GPU's first sample or when the counter is unknown.
                ("energy_delta_j", pa.float64()),
                ("temp_c", pa.float32()),
                # The job holding this GPU at `ts`, stamped when the sample is written.
                ("job_id", pa.string()),
                # The cluster the node belongs to, so every job join is keyed by cluster too.
                ("cluster", pa.string()),
                # The registered signals (sing/signals.py), in SI units.
                *((s.key, getattr(pa, s.arrow_type)()) for s in GPU_SIGNALS),
            ),
            time_column="ts",
            doc="One row per GPU per scrape.",
        ),
        Table(
            "rdma_samples",
            _schema(
                ("ts", UTC_TS),
                ("node", pa.string()),
                ("device", pa.string()),
                ("port", pa.int16()),
                ("tx_bytes", pa.int64()),
                ("rx_bytes", pa.int64()),
                ("tx_packets", pa.int64()),
                ("rx_packets", pa.int64()),
                # Bytes since this port's previous sample (resets handled), set by the writer.
                ("tx_delta_bytes", pa.int64()),
                ("rx_delta_bytes", pa.int64()),
                # The job holding most of this node's GPUs at `ts`, stamped when written.
                ("job_id", pa.string()),
                ("cluster", pa.string()),
            ),
            time_column="ts",
            doc=(
                "One row per RDMA port per scrape; counters in bytes (IB words already x4); "
                "NULL counters and deltas where the exporter reported the counter unknown "
                "(a saturated 32-bit counter)."
            ),
        ),
        Table(
            "job_host_samples",
            _schema(
                ("ts", UTC_TS),
                ("cluster", pa.string()),
                ("node", pa.string()),
                ("job_id", pa.string()),
                ("sluid", pa.string()),  # Slurm 26.05+: the run whose cgroup was read
                # CPU seconds the job's cgroup on this node has run (user + system), and since
                # the job's previous sample there (a lower value: a new cgroup, e.g. a requeued
                # run: counted from zero), set by the writer; NULL for the first or unknown.
                ("cpu_s", pa.float64()),
                ("cpu_delta_s", pa.float64()),
                ("cpuset_cpus", pa.int32()),  # CPUs in the job's cpuset on this node
                ("mem_used_bytes", pa.int64()),
                # The most memory the cgroup used at once since it was made (memory.peak, v1's
                # max_usage_in_bytes; NULL where the kernel has none), and its limit.
                ("mem_peak_bytes", pa.int64()),
                ("mem_limit_bytes", pa.int64()),
                ("io_read_bytes", pa.int64()),
                ("io_write_bytes", pa.int64()),
                ("io_read_delta_bytes", pa.int64()),
                ("io_write_delta_bytes", pa.int64()),
            ),
            time_column="ts",
            doc="One row per Slurm job per node per scrape: its cgroup's CPU time, memory and "
            "I/O there (docs/exporter.md); NULL where the node's cgroups do not offer one.",
        ),
        Table(
            "scrapes",
            _schema(
                ("ts", UTC_TS),
                ("target", pa.string()),
                ("node", pa.string()),
                ("up", pa.bool_()),
                ("duration_s", pa.float64()),
                ("samples", pa.int32()),
                ("error", pa.string()),
                # Values of the page dropped because they fit no column (an integer beyond
                # int64, a GPU index beyond int16), and why: "mem_used_bytes_out_of_range=1, ...";
                # the rest of the page is stored. NULL: a failed scrape, or an older collector.
                ("dropped", pa.int32()),
                ("dropped_reasons", pa.string()),
            ),
            time_column="ts",
            doc="One row per scrape attempt of a target (up=false with the error).",
        ),
        Table(
            "policy_events",
            _schema(
                ("ts", UTC_TS),
                ("cluster", pa.string()),
                ("job_id", pa.string()),  # NULL for messages about no one job (digests)
                ("user", pa.string()),
                ("account", pa.string()),
                ("rule", pa.string()),  # the [policy.rules.NAME]; NULL for reports and digests
                # "evaluation" (a rule's verdict on a job), "message" or "action".
                ("event", pa.string()),
                # evaluation: violating, recovered, exempt, stale, ended, changed;
                # message: notify, warn, cancelled, held (waits: detail says why), job_end,
                # weekly_digest, monthly_digest;
                # action: cancel, left_alone; drain_intent, then drain (sing.policy.drain: detail
                # names the node and the intent).
                ("outcome", pa.string()),
                ("deadline", UTC_TS),  # a warning's: the job is cancelled after it
                ("channel", pa.string()),  # message: email or webhook; action: the executor kind
                ("recipient", pa.string()),
                ("dry_run", pa.bool_()),  # true: decided and logged, nothing sent or done
                ("ok", pa.bool_()),  # false: the send or the action failed (see detail)
                ("actor", pa.string()),  # who or what acted: "sing policy run@host", a user
                ("detail", pa.string()),  # JSON: the evidence (figures) or the error
            ),
            time_column="ts",
            doc="The audit trail of the waste policies: every verdict, message and action.",
            raw=False,
        ),
        Table(
            "health_samples",
            _schema(
                ("ts", UTC_TS),
                ("cluster", pa.string()),
                ("node", pa.string()),
                ("component", pa.string()),  # "gpu", "rdma" or "node"
                # gpu: the GPU's index ("0"); rdma: "device/port" ("mlx5_0/1"); node: ""
                ("device", pa.string()),
                ("gpu_uuid", pa.string()),  # gpu only
                # What was read, e.g. "xid_79", "ecc_uncorrected_volatile", "row_remap_failed",
                # "link_downed" (the list: docs/health.md); counters as counts, flags 0/1.
                ("signal", pa.string()),
                ("value", pa.float64()),
            ),
            time_column="ts",
            doc=(
                "GPU and network health readings, one row per series when its value changes "
                "(and a series' first reading after the collector starts)."
            ),
            raw=False,
        ),
        Table(
            "incidents",
            _schema(
                ("incident_id", pa.string()),
                ("cluster", pa.string()),
                ("node", pa.string()),
                ("device", pa.string()),  # the GPU index or "device/port"; NULL: the whole node
                # xid, ecc, row_remap, link, node_down, service_request, other
                ("class", pa.string()),
                ("source", pa.string()),  # "auto" (from a signal) or "manual"
                ("signal", pa.string()),  # auto: the signal that opened it, e.g. "xid_79"
                ("opened_at", UTC_TS),
                ("closed_at", UTC_TS),  # NULL while open
                ("opened_by", pa.string()),
                ("closed_by", pa.string()),
                ("resolution", pa.string()),  # how it ended (the closing note)
                ("jobs", pa.list_(pa.string())),  # jobs running on the node when it opened
                ("evidence", pa.string()),  # JSON: the readings that opened it
                ("recorded_at", UTC_TS),
            ),
            key=("cluster", "incident_id"),
            doc="Hardware and service incidents; the newest record wins (open -> closed).",
        ),
        Table(
            "incident_notes",
            _schema(
                ("ts", UTC_TS),
                ("cluster", pa.string()),
                ("incident_id", pa.string()),
                ("event", pa.string()),  # opened, note, closed
                ("author", pa.string()),
                ("text", pa.string()),
            ),
            time_column="ts",
            doc="The history of each incident: opening, notes and closing, who and when.",
            raw=False,
        ),
        Table(
            "health_rounds",
            _schema(
                ("cluster", pa.string()),
                # The newest reading time each source had when the last detection round read
                # it: the next round starts after them, so a restart neither repeats nor skips.
                ("samples_until", UTC_TS),  # of health_samples
                ("scrapes_until", UTC_TS),  # of scrapes
                ("round_at", UTC_TS),
                ("seconds", pa.float64()),  # how long the round took
                ("opened", pa.int32()),  # incidents it opened
                ("noted", pa.int32()),  # notes it added to incidents already open
                ("recorded_at", UTC_TS),
            ),
            key=("cluster",),
            doc="Where incident detection stands (sing/health/detect.py): its last round, per "
            "cluster.",
        ),
        Table(
            "command_failures",
            _schema(
                ("ts", UTC_TS),
                ("cluster", pa.string()),
                ("command", pa.string()),  # the scheduler command: "squeue", "sacct", "sinfo"...
                ("reason", pa.string()),  # "timeout" or "failed" (sing.executors.base.CommandError)
                ("error", pa.string()),  # what it said, e.g. "squeue timed out after 30 s: ..."
                ("actor", pa.string()),  # who ran it: "sing collector@head1"
            ),
            time_column="ts",
            doc="Scheduler commands that failed or timed out (the collector's job sync), "
            "for `sing doctor head`.",
            raw=False,
        ),
        Table(
            "sim_runs",
            _schema(
                ("run_id", pa.string()),
                ("policy", pa.string()),
                ("trace", pa.string()),
                ("nodes", pa.int32()),
                ("gpus_per_node", pa.int32()),
                ("jobs", pa.int64()),
                ("window_s", pa.float64()),
                ("gpu_assignment", pa.float64()),
                ("busy_assignment", pa.float64()),
                ("mean_wait_s", pa.float64()),
                ("p50_wait_s", pa.float64()),
                ("p95_wait_s", pa.float64()),
                ("p99_wait_s", pa.float64()),
                ("max_wait_s", pa.float64()),
                ("mean_jct_s", pa.float64()),
                ("mean_bounded_slowdown", pa.float64()),
                ("jain_fairness", pa.float64()),
                ("worst_user_mean_wait_s", pa.float64()),
                ("starved_jobs", pa.int64()),
                ("jobs_per_s", pa.float64()),
                ("settings", pa.string()),  # the [scheduler] settings as a JSON object
                ("recorded_at", UTC_TS),
            ),
            key=("run_id", "policy"),
            doc="One row per policy of a `sing simulate` run (sing/scheduler/metrics.py defines "
            "them).",
        ),
    )
}


def table(name: str) -> Table:
    try:
        return TABLES[name]
    except KeyError:
        raise KeyError(f"unknown table {name!r}; tables: {', '.join(TABLES)}") from None
