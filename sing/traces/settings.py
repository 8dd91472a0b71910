"""The [trace] section of the site config: the anonymization policy applied to every export.

The defaults are measured against the re-identification attack of `sing.traces.linkage` (a cluster
user who can run `sacct -a`): at these settings it links no user to their jobs. Each option
that gives researchers more precision says what it costs in docs/trace-format.md.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from sing.errors import UserError
from sing.traces.format import DROPPABLE

KEY_BYTES = 32
# The last rung's GPU-count classes, by their lowest counts: 1, 2-3, 4-127, 128-4095,
# 4096-131071. Coarse above 4 on purpose: a few people each run the large shapes (4, 8, 16, 32,
# 64 GPUs), and only together do they make a pool.
GPUS_CLASS_EDGES = (1, 2, 4, 128, 4096, 131072)
MAX_SHIFT_S = 7 * 86_400  # a secret time origin lies up to this long before the window
ANY = "*"  # in an allow-list: every name
DEFAULT_DROP = ("dependencies", "partition", "start_s", "end_s", "queue_s", "time_limit_s")
RARE_SHAPE_POLICIES = ("generalize", "suppress", "keep")
NODE_ALIASES = ("per_job", "random", "name_order")
LINKAGES = ("none", "group", "user")
# What the k rule groups jobs by: the resource shape (nodes, GPUs per node, GPU model) and the
# released values a cluster user can also read off `sacct -a` for every job.
# Declared software counts too: jobs that declare the same stack can be pooled like a pseudonym.
QUASI_IDENTIFIERS = (
    "shape",
    "submit",
    "run",
    "queue",
    "time_limit",
    "outcome",
    "partition",
    "group",
    "dependencies",
)
# Public packages whose names say nothing about a person; anything else (a lab's own package,
# a private fork) is left out unless the site lists it.
PUBLIC_PACKAGES = (
    "python",
    "cuda",
    "cudnn",
    "nccl",
    "torch",
    "torchvision",
    "tensorflow",
    "jax",
    "jaxlib",
    "numpy",
    "scipy",
    "pandas",
    "scikit-learn",
    "transformers",
    "accelerate",
    "deepspeed",
    "vllm",
    "triton",
    "mpi4py",
    "openmpi",
    "horovod",
)


@dataclass(frozen=True)
class TraceSettings:
    """Anonymization policy. Defaults are safe for a public release."""

    # A cell of jobs (equal values of `quasi_identifiers`) is released only when it holds at
    # least k distinct users and no user holds more than half its jobs; groups with fewer than
    # k users merge into "other"; resource shapes used by fewer users are handled by
    # `rare_shapes` first.
    k: int = 5
    # generalize: a rare shape's GPU model becomes "other", and jobs whose cell is still rare
    # are left out; suppress: rare jobs are left out; keep: no change (no k rule at all).
    rare_shapes: str = "generalize"
    quasi_identifiers: tuple[str, ...] = QUASI_IDENTIFIERS
    # Submit times are rounded down to this many seconds (0 = exact).
    time_resolution_s: int = 86_400
    # Run and queue times are rounded to buckets growing by this factor (1 = exact).
    duration_ratio: float = 2.0
    # A job whose cell fails the k rule at that precision is coarsened rather than left out
    # (rare_shapes = "generalize"): its submit time to bins of up to this many seconds, then
    # its durations to buckets squaring up to this factor, then its GPU model to "other"
    # (`ladder`). Each job publishes the precision it got (submit_bin_s, run_bin_ratio).
    max_time_resolution_s: int = 604_800
    max_duration_ratio: float = 256.0
    # true: times count from a secret origin up to a week before --since, and the release
    # does not say when it starts; false: from --since, published as release_start.
    time_shift: bool = True
    # per_job: a job's nodes are n1, n2, ... in its own list (count and order only); random: one
    # secret alias per node for the whole release; name_order: n001, n002, ... by node name.
    node_aliases: str = "per_job"
    # Partition names that may ship raw (["*"]: all); any other becomes a keyed pseudonym.
    partitions: tuple[str, ...] = ()
    # Package names kept in `dependencies`; ["*"] keeps any name that looks like a package.
    packages: tuple[str, ...] = PUBLIC_PACKAGES
    # none: every job gets its own user and group pseudonym; group: one pseudonym per group,
    # users per job; user: one pseudonym per user and per group (links a user's jobs).
    linkage: str = "none"
    # Optional jobs fields left out of every release. By default those that, with the k rule
    # over them, would leave out most jobs: what software a job declared, its partition, its
    # queueing (start, end and queue times; submit and run times stay) and its time limit.
    drop: tuple[str, ...] = DEFAULT_DROP
    # File holding the release's secret HMAC key (hex). Empty: a fresh random key per export,
    # so releases are unlinkable. Reuse a key file on purpose to link releases.
    key_file: str = ""
    # Text for the datasheet.
    title: str = "GPU cluster job trace"
    collected_by: str = "sing (telemetry, accounting and trace analytics for GPU clusters)"
    write_csv: bool = True
    # A release that keeps a smaller share of the window's jobs, or of their GPU-hours, is not
    # written (0: only one that keeps none of a window's jobs is refused).
    min_kept_share: float = 0.0

    @classmethod
    def precise(cls, **overrides) -> TraceSettings:
        """sing 1.0's policy, the most precise release: exact times from --since, node aliases
        in name order, raw partition and package names, one pseudonym per user, and the k rule
        over the resource shape only."""
        values = {
            "time_resolution_s": 0,
            "duration_ratio": 1.0,
            "time_shift": False,
            "node_aliases": "name_order",
            "partitions": (ANY,),
            "packages": (ANY,),
            "linkage": "user",
            "quasi_identifiers": ("shape",),
            "drop": (),
        }
        return cls(**(values | overrides))

    def __post_init__(self) -> None:
        if self.k < 1:
            raise UserError(f"[trace] k must be at least 1, got {self.k}")
        for name, value, allowed in (
            ("rare_shapes", self.rare_shapes, RARE_SHAPE_POLICIES),
            ("node_aliases", self.node_aliases, NODE_ALIASES),
            ("linkage", self.linkage, LINKAGES),
        ):
            if value not in allowed:
                raise UserError(f"[trace] {name} = {value!r}; use one of " + ", ".join(allowed))
        bad = [q for q in self.quasi_identifiers if q not in QUASI_IDENTIFIERS]
        if bad:
            raise UserError(
                f"[trace] quasi_identifiers: {', '.join(bad)} unknown; use any of "
                + ", ".join(QUASI_IDENTIFIERS)
            )
        if self.time_resolution_s < 0:
            raise UserError(f"[trace] time_resolution_s < 0: {self.time_resolution_s}")
        if self.duration_ratio < 1:
            raise UserError(f"[trace] duration_ratio < 1: {self.duration_ratio}")
        if self.max_time_resolution_s < self.time_resolution_s:
            raise UserError(
                f"[trace] max_time_resolution_s {self.max_time_resolution_s} is finer than "
                f"time_resolution_s {self.time_resolution_s}"
            )
        if self.max_duration_ratio < self.duration_ratio:
            raise UserError(
                f"[trace] max_duration_ratio {self.max_duration_ratio:g} is finer than "
                f"duration_ratio {self.duration_ratio:g}"
            )
        if not 0 <= self.min_kept_share <= 1:
            raise UserError(f"[trace] min_kept_share: a share 0-1, not {self.min_kept_share}")
        bad = [d for d in self.drop if d not in DROPPABLE]
        if bad:
            raise UserError(
                f"[trace] drop: {', '.join(bad)} cannot be dropped; droppable: "
                + ", ".join(DROPPABLE)
            )


@dataclass(frozen=True)
class Rung:
    """One precision a job can be released at: submit-time bins of `resolution_s` seconds (0 =
    exact), duration buckets growing by `ratio` (1 = exact), the GPU model or "other"."""

    resolution_s: int
    ratio: float
    model_hidden: bool = False
    outcome_hidden: bool = False  # state "unknown", no exit or failure class
    # nodes and GPUs per node hidden, the GPU count known to its class (GPUS_CLASS_EDGES)
    shape_hidden: bool = False


def ladder(settings: TraceSettings, span_s: int) -> list[Rung]:
    """The precisions tried in turn for the jobs whose cell still fails the k rule: the
    configured one; with rare_shapes = "generalize", then coarser submit bins (x7 at a time,
    a day becomes a week, up to max_time_resolution_s), then one bin of `span_s` (from the
    time origin past the window's end: the submit time says nothing), then duration buckets
    squared (x4, x16, x256), then the GPU model hidden, then the outcome, then the shape (the
    GPU count to its class, GPUS_CLASS_EDGES: a rare large job's). A job's published
    precision names its rung, and so the pool of jobs it was released among (with the default
    factors each rung's cells are unions of the last's)."""
    rungs = [Rung(settings.time_resolution_s, settings.duration_ratio)]
    if settings.rare_shapes != "generalize":
        return rungs
    res, ratio = settings.time_resolution_s, settings.duration_ratio
    while 0 < res < settings.max_time_resolution_s:
        res = min(res * 7, settings.max_time_resolution_s)
        rungs.append(Rung(res, ratio))
    res = max(res, span_s)
    rungs.append(Rung(res, ratio))
    while ratio < settings.max_duration_ratio:
        ratio = min(ratio * ratio if ratio > 1 else 2.0, settings.max_duration_ratio)
        rungs.append(Rung(res, ratio))
    rungs.append(Rung(res, ratio, model_hidden=True))
    rungs.append(Rung(res, ratio, model_hidden=True, outcome_hidden=True))
    rungs.append(Rung(res, ratio, True, True, shape_hidden=True))
    return rungs


def load_key(key_file: str | Path | None) -> bytes:
    """The release key: read from `key_file` (created with a new random key if missing), or a
    fresh random key that is never stored when no file is named."""
    if not key_file:
        return secrets.token_bytes(KEY_BYTES)
    path = Path(key_file).expanduser()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(KEY_BYTES) + "\n")
    try:
        key = bytes.fromhex(path.read_text().strip())
    except ValueError:  # UnicodeDecodeError too: a binary file
        raise UserError(f"{path}: key file must hold one hex string") from None
    if len(key) < 16:
        raise UserError(f"{path}: key is {len(key)} bytes; need at least 16 (32 recommended)")
    return key
