"""The open trace format, version 1: every table's fields with type, unit and meaning.

This list is the single source of truth: the Parquet schemas, the CSV encoding, the Frictionless
`datapackage.json`, the validator and docs/trace-format.md all follow from it, so the format
cannot drift between the writer and its description.

Times are seconds since the release's declared start (`release_start` in datapackage.json, UTC),
never wall-clock times: a release shifts every time to its own origin. An export whose origin is
secret (the default) declares 1970-01-01, as PAI does, and says so in its "anonymization" block.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from sing.health.failures import FAILURE_CLASSES

FORMAT_NAME = "sing-trace"
# 1.1: datapackage.json "anonymization"; a secret time origin. 1.2: jobs.gpu_request (shares of
# one GPU), jobs.gpu_model_request and jobs.failure_class; the optional `nodes` resource (the
# cluster's inventory) and `incidents` resource. 1.3: jobs.submit_bin_s, jobs.run_bin_ratio,
# jobs.gpus_min and gpus_max, the precision each job was released at. Each step only adds, so a 1.3
# reader reads 1.0-1.2 releases.
FORMAT_VERSION = "1.3"

STATES = (
    "completed",
    "failed",
    "cancelled",
    "timeout",
    "node_fail",
    "out_of_memory",
    "preempted",
    "running",
    "pending",
    "unknown",
)
EXIT_CLASSES = ("success", "error", "signal")
# The incident classes of the warehouse's `incidents` table (sing/schema.py).
INCIDENT_CLASSES = ("xid", "ecc", "row_remap", "link", "node_down", "service_request", "other")


@dataclass(frozen=True)
class Field:
    name: str
    type: pa.DataType
    unit: str | None
    description: str
    required: bool = False
    enum: tuple[str, ...] = ()
    minimum: float | None = None
    json_object: bool = False  # a JSON object stored as text (Frictionless type "object")

    @property
    def frictionless_type(self) -> str:
        if self.json_object:
            return "object"
        if pa.types.is_list(self.type):
            return "array"
        if pa.types.is_integer(self.type):
            return "integer"
        if pa.types.is_floating(self.type):
            return "number"
        if pa.types.is_boolean(self.type):
            return "boolean"
        return "string"

    def descriptor(self) -> dict:
        """This field as a Frictionless Table Schema field (with `unit` as an extra property)."""
        out: dict = {"name": self.name, "type": self.frictionless_type}
        out["description"] = self.description
        if self.unit:
            out["unit"] = self.unit
        constraints: dict = {}
        if self.required:
            constraints["required"] = True
        if self.enum:
            constraints["enum"] = list(self.enum)
        if self.minimum is not None:
            constraints["minimum"] = self.minimum
        if constraints:
            out["constraints"] = constraints
        return out


@dataclass(frozen=True)
class Resource:
    name: str
    description: str
    fields: tuple[Field, ...]
    primary_key: tuple[str, ...]
    optional: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([pa.field(f.name, f.type, nullable=not f.required) for f in self.fields])

    def field(self, name: str) -> Field:
        return next(f for f in self.fields if f.name == name)


S, INT, F, B = pa.string(), pa.int64(), pa.float64(), pa.bool_()

JOBS = Resource(
    "jobs",
    "One row per job submitted in the release window.",
    (
        Field("job_id", S, None, "Pseudonymous job id (keyed HMAC, or the source's own id).", True),
        Field(
            "user",
            S,
            None,
            "Pseudonymous user id (keyed HMAC-SHA256); one per job unless the release links users.",
        ),
        Field(
            "group",
            S,
            None,
            "Pseudonymous group (lab/account), one per job unless linked; 'other' = small groups.",
        ),
        Field("submit_s", F, "s", "Submit time, seconds since release_start.", True, minimum=0),
        Field(
            "start_s",
            F,
            "s",
            "Start time, seconds since release_start; empty if never run.",
            minimum=0,
        ),
        Field(
            "end_s",
            F,
            "s",
            "End time, seconds since release_start; the window end if cut.",
            minimum=0,
        ),
        Field("run_s", F, "s", "Run time (end - start, or the source's duration).", minimum=0),
        Field("queue_s", F, "s", "Queueing delay, start - submit.", minimum=0),
        Field(
            "submit_bin_s",
            F,
            "s",
            "Precision of this job's times: its true submit time lies in the bin of this width "
            "(from the time origin) that holds submit_s; 0 or empty = exact.",
            minimum=0,
        ),
        Field(
            "run_bin_ratio",
            F,
            "ratio",
            "Precision of this job's durations: its true run and queue times lie in the bucket "
            "[ratio^n, ratio^(n+1)) that holds run_s and queue_s; 1 or empty = exact.",
            minimum=1,
        ),
        Field(
            "gpus_min",
            INT,
            "GPUs",
            "Precision of this job's size: empty = exact; else its true GPU count lies in "
            "[gpus_min, gpus_max], num_gpus is a count from that range (its pool's), and "
            "num_nodes, gpus_per_node and nodes are empty (a rare large shape).",
            minimum=1,
        ),
        Field(
            "gpus_max", INT, "GPUs", "Upper end of the GPU count's range (see gpus_min).", minimum=1
        ),
        Field("state", S, None, "Final (or last seen) job state.", True, enum=STATES),
        Field(
            "exit_class", S, None, "Exit code class: success (0), error, signal.", enum=EXIT_CLASSES
        ),
        Field(
            "failure_class",
            S,
            None,
            "Why it ended: success, user_error (failed, out of memory), timeout, node_failure "
            "(node failed, or the job failed there during a hardware incident), preemption, "
            "cancelled; empty while running or unknown.",
            enum=FAILURE_CLASSES,
        ),
        Field("partition", S, None, "Scheduler partition or virtual cluster."),
        Field("num_nodes", INT, "nodes", "Nodes allocated (or requested).", minimum=0),
        Field("gpus_per_node", INT, "GPUs", "GPUs per node.", minimum=0),
        Field("num_gpus", INT, "GPUs", "GPUs in total (fractional shares rounded up).", minimum=0),
        Field("gpu_model", S, None, "GPU model; 'other' where a rare shape was generalised."),
        Field(
            "gpu_request",
            F,
            "GPUs",
            "GPUs requested; a share of one GPU is a fraction (0.25); empty = num_gpus.",
            minimum=0,
        ),
        Field(
            "gpu_model_request",
            S,
            None,
            "GPU model(s) the job was constrained to, as the source lists them; empty = any.",
        ),
        Field("time_limit_s", INT, "s", "Requested wall-time limit.", minimum=0),
        Field("interactive", B, None, "Interactive session rather than a batch job."),
        Field("censored", B, None, "Cut by the window: not finished by the release end.", True),
        Field(
            "dependencies",
            S,
            None,
            'Declared software (JSON object package -> version, e.g. {"torch": "2.3"}).',
            json_object=True,
        ),
        Field(
            "nodes",
            pa.list_(S),
            None,
            "Renamed nodes the job ran on: n1, n2, ... per job, or one alias per node (n001, ...).",
        ),
        Field("gpu_util_mean", F, "ratio", "Mean GPU utilisation over all samples of held GPUs."),
        Field("gpu_util_p50", F, "ratio", "Median over held GPUs of each GPU's mean utilisation."),
        Field("gpu_util_max", F, "ratio", "Highest utilisation sample of any held GPU."),
        Field("sm_active_mean", F, "ratio", "Mean SM activity over all samples of held GPUs."),
        Field("sm_active_p50", F, "ratio", "Median over held GPUs of each GPU's mean SM activity."),
        Field("gpu_mem_peak_bytes", INT, "bytes", "Peak GPU memory used on any held GPU."),
        Field("energy_j", F, "J", "GPU energy of the held GPUs (sum of per-GPU counter deltas)."),
        Field("rdma_tx_bytes", INT, "bytes", "RDMA bytes sent, all nodes of the job."),
        Field("rdma_rx_bytes", INT, "bytes", "RDMA bytes received, all nodes of the job."),
        Field("node_rdma_tx_bytes", pa.list_(INT), "bytes", "RDMA bytes sent per node (as nodes)."),
        Field("node_rdma_rx_bytes", pa.list_(INT), "bytes", "RDMA bytes received per node."),
    ),
    primary_key=("job_id",),
)

TIMESERIES = Resource(
    "job_timeseries",
    "Per job, node and minute: GPU and RDMA activity of the job's GPUs on that node.",
    (
        Field("job_id", S, None, "Job, as jobs.job_id.", True),
        Field("node", S, None, "Renamed node, as in jobs.nodes.", True),
        Field("minute_s", INT, "s", "Start of the minute, seconds since release_start.", True),
        Field("gpus", INT, "GPUs", "GPUs of the job sampled on this node in this minute."),
        Field("gpu_util", F, "ratio", "Mean utilisation of those GPUs."),
        Field("sm_active", F, "ratio", "Mean SM activity of those GPUs."),
        Field("gpu_mem_used_bytes", INT, "bytes", "Sum over those GPUs of their peak memory used."),
        Field("gpu_power_w", F, "W", "Sum over those GPUs of their mean power draw."),
        Field("rdma_tx_bytes", INT, "bytes", "RDMA bytes sent by the node in this minute."),
        Field("rdma_rx_bytes", INT, "bytes", "RDMA bytes received by the node in this minute."),
    ),
    primary_key=("job_id", "node", "minute_s"),
    optional=True,
)

NODES = Resource(
    "nodes",
    "One row per node of the cluster: its inventory (the cluster a simulator replays on).",
    (
        Field("node", S, None, "Node alias (as in jobs.nodes where those name nodes).", True),
        Field("gpus", INT, "GPUs", "GPUs on the node.", minimum=0),
        Field("gpu_model", S, None, "Model of the node's GPUs; empty for a node without GPUs."),
    ),
    primary_key=("node",),
    optional=True,
)

INCIDENTS = Resource(
    "incidents",
    "Hardware incidents and service requests open during the release window, no notes.",
    (
        Field("incident", S, None, "Incident number in this release: i1, i2, ... as opened.", True),
        Field(
            "node",
            S,
            None,
            "Node alias as in jobs.nodes; empty where the release names nodes per job (n1, ...).",
        ),
        Field("class", S, None, "What it was (the enum).", True, enum=INCIDENT_CLASSES),
        Field(
            "opened_s",
            F,
            "s",
            "Opened, seconds since release_start (the window start if before), at the start of "
            "its time bin.",
            True,
        ),
        Field(
            "closed_s",
            F,
            "s",
            "Closed, seconds since release_start, at the start of its time bin; empty if still "
            "open at the window end.",
        ),
    ),
    primary_key=("incident",),
    optional=True,
)

RESOURCES = {r.name: r for r in (JOBS, TIMESERIES, NODES, INCIDENTS)}
# Fields a release may leave out by policy ([trace] drop); identity and timing fields stay.
# Needed to read a release: run time, and the precision its times are known to.
KEPT_ALWAYS = ("run_s", "submit_bin_s", "run_bin_ratio", "gpus_min", "gpus_max")
DROPPABLE = tuple(f.name for f in JOBS.fields if not f.required and f.name not in KEPT_ALWAYS)


def conform(resource: Resource, data: pa.Table, dropped: tuple[str, ...] = ()) -> pa.Table:
    """Cast `data` to the resource's schema in field order: missing columns become nulls."""
    columns, fields = [], []
    for f in resource.fields:
        if f.name in dropped:
            continue
        if f.name in data.column_names:
            columns.append(data.column(f.name).cast(f.type))
        else:
            columns.append(pa.nulls(data.num_rows, f.type))
        fields.append(pa.field(f.name, f.type))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def state_sql(raw: str) -> str:
    """SQL normalising a source's state string (Slurm, Philly, Helios, PAI, Acme) to STATES."""
    s = f"upper(trim({raw}))"
    return f"""CASE
        WHEN {raw} IS NULL THEN 'unknown'
        WHEN {s} IN ('COMPLETED', 'PASS', 'TERMINATED', 'SUCCEEDED', 'SUCCESS') THEN 'completed'
        WHEN {s} IN ('FAILED', 'FAIL', 'BOOT_FAIL', 'DEADLINE') THEN 'failed'
        WHEN {s} LIKE 'CANCEL%' OR {s} IN ('KILLED', 'REVOKED') THEN 'cancelled'
        WHEN {s} = 'TIMEOUT' THEN 'timeout'
        WHEN {s} = 'NODE_FAIL' THEN 'node_fail'
        WHEN {s} = 'OUT_OF_MEMORY' THEN 'out_of_memory'
        WHEN {s} IN ('PREEMPTED', 'REQUEUED') THEN 'preempted'
        WHEN {s} IN ('RUNNING', 'COMPLETING', 'SUSPENDED') THEN 'running'
        WHEN {s} IN ('PENDING', 'WAITING', 'QUEUED') THEN 'pending'
        ELSE 'unknown' END"""


def exit_class_sql(code: str) -> str:
    """SQL classing an exit code as EXIT_CLASSES: 0 success, 128 and above signal, else error."""
    return f"""CASE WHEN {code} IS NULL THEN NULL WHEN {code} = 0 THEN 'success'
        WHEN {code} >= 128 THEN 'signal' ELSE 'error' END"""
