"""Turn `squeue --json`, `sacct --json` and `sacct -P` output into job records.

Slurm's JSON changes shape between releases. 22.05 (openapi v0.0.38, the one CI runs) has plain
numbers, `null` for unset and a state string; 23.02+ (data_parser v0.0.39+) wraps numbers as
`{"set", "infinite", "number"}` and states as lists. Both are read here; anything else is an
error that names the command, the job and the field, never a silent zero.

Known 22.05 bug: `sacct --json` reports exit code 0 for failed jobs, so exit codes always come
from `sacct -P` text (stable across versions).

GPU counts: Slurm puts GPUs into a job's TRES (`gres/gpu=4`, `gres/gpu:a100=4`) only when
`gres/gpu` is in slurm.conf's `AccountingStorageTRES`, which is not the default (`sing doctor
head` checks it). So every figure a record carries is read, the TRES (squeue's string, sacct's
JSON list and its `-P` text) and the indices of `gres_detail` (`gpu:a100:4(IDX:0-3)`), and the
largest kept: a TRES without `gres/gpu` says nothing about GPUs, and a GPU named by index is held.
Figures that disagree are logged, one warning per listing naming the jobs and their figures.

CPU and memory (docs/executors.md, "CPU and memory"): CPUs allocated and memory requested from
the TRES (squeue's text, sacct's JSON lists: Slurm's ReqTRES `mem` is the job's total, however it
was asked); for ended jobs seff's figures (contribs/seff/seff) from sacct's steps: CPU time is the
sum of the steps' user + system time, memory the largest over steps of the step's
`TRESUsageInTot` mem, the sum of its tasks' RSS peaks. Not from `sacct -X -P`: without steps
its TotalCPU is 00:00:00 and its usage columns empty. Running jobs' usage: `sstat` (`parse_sstat`).

States: 23.02+ gives a list, the base state first and then flags (`["CANCELLED", "COMPLETING"]`).
A job COMPLETING, whatever its base state, still holds its GPUs (its epilog runs): its record
says COMPLETING and keeps the base state beside it.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

import hostlist

from sing.digits import ascii_digits
from sing.errors import UserError
from sing.executors.records import JobRecord, JobUsage, NodeRecord, exit_code_from, utc
from sing.executors.slurm_units import MIB, size_bytes, usage_tres
from sing.sluid import normal_sluid

log = logging.getLogger(__name__)

# The prefix of the job comment in which `sing submit` stores what Slurm has no field for.
COMMENT_PREFIX = "sing:"
COMPLETING = "COMPLETING"
# Squeue states in which a job holds its allocation.
HOLDING_STATES = frozenset({"RUNNING", COMPLETING, "SUSPENDED"})
# The short state codes of Slurm's text output (squeue %t, sacct's State when abbreviated).
STATE_CODES = {
    "R": "RUNNING", "CG": COMPLETING, "S": "SUSPENDED", "CF": "CONFIGURING", "PD": "PENDING",
    "CA": "CANCELLED", "CD": "COMPLETED", "F": "FAILED", "TO": "TIMEOUT", "NF": "NODE_FAIL",
    "PR": "PREEMPTED", "OOM": "OUT_OF_MEMORY", "BF": "BOOT_FAIL", "DL": "DEADLINE",
}  # fmt: skip
# Disagreeing GPU figures named in one listing's warning; the rest are counted.
SHOWN_DISAGREEMENTS = 5
# One GPU entry of gres_detail: "gpu:a100:4(IDX:2-5)", "gpu:2(IDX:0-1)", "gpu(IDX:3)".
GRES_IDX_RE = re.compile(r"gpu(?::[^:(,]+)?(?::\d+)?\(IDX:([^)]*)\)")
# The columns read from `sacct -P`, in order.
SACCT_TEXT_FIELDS = ("JobIDRaw", "User", "ExitCode", "AllocTRES")
# The columns read from `sstat -P` (one line per running step), in order.
SSTAT_FIELDS = ("JobID", "TRESUsageInTot", "TRESUsageInMax")
# `sinfo --Node` columns: node, partition (%R: without the default's "*"), generic resources.
SINFO_FORMAT = "%N|%R|%G"
# One GPU entry of a node's Gres: "gpu:a100:8", "gpu:8", "gpu:a100:8(S:0-1)".
GRES_GPU_RE = re.compile(r"(?:^|,)gpu(?::([^:(,]+))?:(\d+)")


@dataclass(frozen=True)
class JobState:
    """A job's state as Slurm gives it: the base state and the flags after it."""

    base: str
    flags: frozenset[str] = frozenset()

    @property
    def name(self) -> str:
        """The record's state: COMPLETING while the epilog holds the GPUs; REQUEUED for the run
        of a job pending again after a requeue (Slurm 24.11's sacct gives that run, start and
        end set, as ["PENDING", "REQUEUED"]; 22.05 as "REQUEUED"); else the base."""
        if COMPLETING in self.flags:
            return COMPLETING
        if self.base == "PENDING" and "REQUEUED" in self.flags:
            return "REQUEUED"
        return self.base

    @property
    def holding(self) -> bool:
        return self.name in HOLDING_STATES

    @property
    def base_if_other(self) -> str | None:
        """The base state where the record's state hides it (CANCELLED under COMPLETING)."""
        return self.base if self.base != self.name else None


def job_state(value: object) -> JobState | None:
    """A state string ("RUNNING", "CANCELLED by 1000", "CG") or a 23.02+ state list; None when
    `value` is neither."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        return None
    words = [v.split()[0].upper() for v in value if v.strip()]
    if len(words) != len(value):
        return None
    base, *flags = [STATE_CODES.get(word, word) for word in words]
    return JobState(base, frozenset(flags))


class _Job:
    """One job object of a JSON dump, with field access that names what is wrong."""

    def __init__(self, data: Any, source: str, where: str | None = None) -> None:
        if not isinstance(data, dict):
            raise UserError(f"{source}: a job entry is {type(data).__name__}, not an object")
        self.data = data
        self.where = where or f"{source}: job {data.get('job_id', '?')}"

    def get(self, path: str, required: bool = True) -> Any:
        value: Any = self.data
        for part in path.split("."):
            if not isinstance(value, dict) or part not in value:
                if not required:
                    return None
                raise UserError(f"{self.where}: field {path!r} is missing (unknown JSON shape)")
            value = value[part]
        return value

    def text(self, path: str, required: bool = True) -> str | None:
        value = self.get(path, required)
        if value is None or isinstance(value, str):
            return value or None
        raise UserError(f"{self.where}: field {path!r} should be text, got {value!r}")

    def number(self, path: str, required: bool = True) -> int | None:
        """An integer, None if unset/infinite (v0.0.38: null; v0.0.39+: {set, infinite, number})."""
        value = self.get(path, required)
        if isinstance(value, dict) and {"set", "number"} <= value.keys():
            if not value["set"] or value.get("infinite"):
                return None
            value = value["number"]
        if value is None or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        raise UserError(f"{self.where}: field {path!r} should be a number, got {value!r}")

    def time(self, path: str) -> Any:
        seconds = self.number(path)
        try:
            return utc(seconds) if seconds else None  # Slurm writes 0 for "not yet"
        except (OverflowError, ValueError, OSError) as err:
            raise UserError(f"{self.where}: field {path!r}: {seconds} is not a time") from err

    def state(self, path: str) -> JobState:
        value = self.get(path)
        state = job_state(value)
        if state is None:
            raise UserError(f"{self.where}: field {path!r} should be a job state, got {value!r}")
        return state

    def sluid(self, path: str) -> str | None:
        """A SLUID field (Slurm 26.05+, data_parser v0.0.44+); None where absent or unset ("")."""
        value = self.text(path, required=False)
        if value is None:
            return None
        sluid = normal_sluid(value)
        if sluid is None:
            raise UserError(f"{self.where}: field {path!r} should be a SLUID, got {value!r}")
        return sluid

    def nodes(self, path: str) -> tuple[str, ...]:
        value = self.text(path, required=False)
        if not value or value == "None assigned":
            return ()
        try:
            return tuple(hostlist.expand_hostlist(value))
        except hostlist.BadHostlist as err:
            raise UserError(f"{self.where}: field {path!r}: bad host list {value!r}") from err


def _load(text: str, source: str) -> list[_Job]:
    try:
        dump = json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"{source}: output is not valid JSON ({err}); truncated?") from err
    if not isinstance(dump, dict) or not isinstance(dump.get("jobs"), list):
        raise UserError(f"{source}: no 'jobs' list in the output (unknown JSON shape)")
    # An empty result is reported as an error ("Nothing found", 9003) by 22.05's sacct.
    errors = dump.get("errors") or []
    if not isinstance(errors, list):
        raise UserError(f"{source}: 'errors' is {type(errors).__name__}, not a list")
    errors = [e for e in errors if not _nothing_found(e)]
    if errors:
        raise UserError(f"{source}: Slurm reported errors: {errors}")
    return [_Job(job, source) for job in dump["jobs"]]


def _nothing_found(error: object) -> bool:
    return isinstance(error, dict) and (
        error.get("error_number") == 9003 or str(error.get("description")) == "Nothing found"
    )


def gpu_count(entries: Iterable[tuple[str, int | None]]) -> int | None:
    """GPUs in a TRES list of (name, count), e.g. [("gres/gpu", 2), ("gres/gpu:a100", 2)];
    None when it has no GPU entry (Slurm does not account `gres/gpu`, or the job has none).

    With typed GPUs Slurm lists both the total `gres/gpu` and each type `gres/gpu:TYPE`; adding
    them all would double count. The total wins; the types are summed only when it is absent.
    """
    total, typed = None, None
    for name, count in entries:
        if name == "gres/gpu":
            total = (total or 0) + (count or 0)
        elif name.startswith("gres/gpu:"):
            typed = (typed or 0) + (count or 0)
    return total if total is not None else typed


class GpuFigures:
    """The GPU figures of one listing's jobs: each job's best, the disagreements for one warning."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.disagreements: list[str] = []

    def best(self, job_id: str, figures: dict[str, int | None]) -> int:
        """The largest of a job's figures (source -> GPUs; None: the source names no GPU)."""
        known = [n for n in figures.values() if n is not None]
        best = max(known, default=0)
        if best and (len(set(known)) > 1 or len(known) < len(figures)):
            shown = ", ".join(f"{k} {'none' if n is None else n}" for k, n in figures.items())
            self.disagreements.append(f"job {job_id}: {shown}")
        return best

    def warn(self) -> None:
        """One warning for the listing's disagreements, if any."""
        if not self.disagreements:
            return
        more = len(self.disagreements) - SHOWN_DISAGREEMENTS
        log.warning(
            "%s: %d job(s) with GPU figures that disagree, kept the largest (%s%s); a TRES "
            "without GPUs means Slurm does not account gres/gpu: run `sing doctor head`",
            self.source,
            len(self.disagreements),
            "; ".join(self.disagreements[:SHOWN_DISAGREEMENTS]),
            f"; and {more} more" if more > 0 else "",
        )


def tres_values(text: str | None, where: str) -> list[tuple[str, str]]:
    """'cpu=1,mem=4000M,gres/gpu=2' -> [("cpu", "1"), ("mem", "4000M"), ("gres/gpu", "2")]."""
    entries = []
    for item in filter(None, (text or "").split(",")):
        name, sep, value = item.partition("=")
        if not sep:
            raise UserError(f"{where}: TRES entry {item!r} is not NAME=COUNT")
        entries.append((name, value))
    return entries


def parse_tres(text: str | None, where: str) -> list[tuple[str, int | None]]:
    """'cpu=1,gres/gpu=2,gres/gpu:a100=2' -> [("cpu", 1), ("gres/gpu", 2), ...]; a count that
    is not a plain number (`mem=4000M`) is None."""
    return [
        (name, int(value) if ascii_digits(value) else None)
        for name, value in tres_values(text, where)
    ]


def positive(value: Any) -> Any:
    """A figure, or None where Slurm gives none or 0 (its word for 'not gathered' or 'none')."""
    return value if value is not None and value > 0 else None


def text_mem_bytes(text: str | None, where: str) -> int | None:
    """The memory of a TRES text in bytes ('cpu=2,mem=1000M' -> 1048576000), None without one:
    the text prints it with Slurm's units, where the JSON's lists count MiB."""
    value = dict(tres_values(text, where)).get("mem")
    return positive(size_bytes(value, f"{where}: mem")) if value is not None else None


def _json_tres(job: _Job, path: str) -> list[tuple[str, int | None]]:
    items = job.get(path, required=False) or []
    if not isinstance(items, list):
        raise UserError(f"{job.where}: field {path!r} should be a list, got {items!r}")
    entries = []
    for item in items:
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("type"), str)
            or "count" not in item
        ):
            raise UserError(
                f"{job.where}: field {path!r} has an entry without type/count: {item!r}"
            )
        name = f"{item['type']}/{item['name']}" if item.get("name") else item["type"]
        count = item["count"]
        entries.append((name, count if isinstance(count, int) else None))
    return entries


def comment_fields(comment: object) -> tuple[bool | None, dict | None]:
    """(interactive, dependencies) that `sing submit` stored in the job comment."""
    if not isinstance(comment, str) or not comment.startswith(COMMENT_PREFIX):
        return None, None
    try:
        data = json.loads(comment[len(COMMENT_PREFIX) :])
    except json.JSONDecodeError:
        return None, None  # a user's own comment that happens to start with "sing:"
    if not isinstance(data, dict):
        return None, None  # the same, holding other JSON ("sing: 5")
    interactive, dependencies = data.get("interactive"), data.get("dependencies")
    return (
        interactive if isinstance(interactive, bool) else None,
        dependencies if isinstance(dependencies, dict) else None,
    )


def _gpu_indices(job: _Job, nodes: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    """Per-node GPU indices from gres_detail (one entry per node, in node-list order)."""
    detail = job.get("gres_detail", required=False) or []
    if not isinstance(detail, list) or not all(isinstance(d, str) for d in detail):
        raise UserError(f"{job.where}: field 'gres_detail' should be a list of text: {detail!r}")
    if not detail:
        return {}
    if len(detail) != len(nodes):
        raise UserError(
            f"{job.where}: field 'gres_detail' has {len(detail)} entries for {len(nodes)} nodes"
        )
    out = {}
    for node, entry in zip(nodes, detail, strict=True):
        indices = []
        for idx in GRES_IDX_RE.findall(entry):
            if idx and idx != "N/A":
                indices += [int(i) for i in hostlist.expand_hostlist(f"[{idx}]")]
        if indices:
            out[node] = tuple(sorted(indices))
    return out


def _labels(job: _Job) -> dict[str, str | None]:
    """The job's account, partition, name and QOS: the same fields in squeue's and sacct's JSON."""
    return {key: job.text(key, required=False) for key in ("account", "partition", "name", "qos")}


def parse_squeue(text: str, cluster: str) -> list[JobRecord]:
    """Jobs holding an allocation now, from `squeue --json` (which also lists ended jobs)."""
    records = []
    figures = GpuFigures("squeue --json")
    for job in _load(text, "squeue --json"):
        state = job.state("job_state")
        if not state.holding:
            continue
        job_id = str(job.number("job_id"))
        nodes = job.nodes("nodes")
        gpus = _gpu_indices(job, nodes)
        limit_min = job.number("time_limit")
        interactive, dependencies = comment_fields(job.text("comment", required=False))
        allocated = parse_tres(job.text("tres_alloc_str"), job.where)
        num_gpus = figures.best(
            job_id,
            {
                "tres_alloc_str": gpu_count(allocated),
                "gres_detail": sum(map(len, gpus.values())) or None,
            },
        )
        records.append(
            JobRecord(
                job_id=job_id,
                cluster=cluster,
                state=state.name,
                base_state=state.base_if_other,
                user=job.text("user_name"),
                **_labels(job),
                submit_time=job.time("submit_time"),
                start_time=job.time("start_time"),
                nodes=nodes,
                num_gpus=num_gpus,
                gpus=gpus,
                time_limit_s=limit_min * 60 if limit_min is not None else None,
                interactive=interactive,
                dependencies=dependencies,
                # The running run's SLUID sits in the job's step id (squeue has no top-level one).
                sluid=job.sluid("step_id.sluid"),
                alloc_cpus=positive(dict(allocated).get("cpu")),
                req_mem_bytes=text_mem_bytes(
                    job.text("tres_req_str", required=False), f"{job.where}: tres_req_str"
                ),
            )
        )
    figures.warn()
    return records


class SacctLine(NamedTuple):
    """What `sacct -P` text adds to the JSON: the user, the true exit code, the TRES's GPUs."""

    user: str
    exit_code: int
    gpus: int | None
    # AllocTRES set: the run was given resources (it started); a pending run's line has none.
    allocated: bool


def parse_sacct_text(text: str) -> dict[str, list[SacctLine]]:
    """`sacct -P -n -o JobIDRaw,User,ExitCode,AllocTRES` -> {job id: its lines}. With
    `--duplicates` a requeued job has a line per run, oldest first."""
    out: dict[str, list[SacctLine]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) != len(SACCT_TEXT_FIELDS):
            raise UserError(
                f"sacct -P line {number}: expected {len(SACCT_TEXT_FIELDS)} fields "
                f"({','.join(SACCT_TEXT_FIELDS)}), got {line!r}"
            )
        job_id, user, exit_code, tres = fields
        code, _, signal = exit_code.partition(":")
        if not (ascii_digits(code) and ascii_digits(signal)):
            raise UserError(f"sacct -P line {number}: ExitCode {exit_code!r} is not CODE:SIGNAL")
        gpus = gpu_count(parse_tres(tres, f"sacct -P line {number}"))
        line_of_run = SacctLine(user, exit_code_from(int(code), int(signal)), gpus, bool(tres))
        out.setdefault(job_id, []).append(line_of_run)
    return out


def runs_by_job(jobs: list[_Job]) -> dict[str, list[tuple[_Job, datetime | None]]]:
    """Each job's JSON entries (its runs) with their starts, ordered by start (a run that never
    started first, runs that started together as listed). `sacct --duplicates` lists every run
    of a requeued job; Slurm 24.11 lists without it only the newest record, a pending run, and
    the run that ended would be lost."""
    never = datetime.min.replace(tzinfo=UTC)
    out: dict[str, list[tuple[_Job, datetime | None]]] = {}
    for job in jobs:
        out.setdefault(str(job.number("job_id")), []).append((job, job.time("time.start")))
    return {job_id: sorted(runs, key=lambda run: run[1] or never) for job_id, runs in out.items()}


def lines_of_runs(
    runs: list[tuple[_Job, datetime | None]], lines: list[SacctLine]
) -> list[SacctLine | None]:
    """The text line of each of one job's runs (ordered by start): both outputs list runs
    oldest first, so the started runs take the allocated lines, newest with newest; a run that
    never started, or one left without an allocated line, takes the job's last line."""
    allocated = [line for line in lines if line.allocated]
    last = lines[-1] if lines else None
    matched: list[SacctLine | None] = [last] * len(runs)
    started = [i for i, (_, start) in enumerate(runs) if start]
    for i, line in zip(reversed(started), reversed(allocated), strict=False):
        matched[i] = line
    return matched


def parse_sacct(json_text: str, exit_text: str, cluster: str) -> list[JobRecord]:
    """Every ended run of the listed jobs from `sacct --json` (a requeued job has several),
    with user and exit code from `sacct -P` text. Runs still going are left to squeue."""
    by_job = runs_by_job(_load(json_text, "sacct --json"))
    exits = parse_sacct_text(exit_text)
    records = []
    figures = GpuFigures("sacct")
    for job_id, job_runs in by_job.items():
        for (job, _), line in zip(
            job_runs, lines_of_runs(job_runs, exits.get(job_id, [])), strict=True
        ):
            state = job.state("state.current")
            if state.holding or state.name == "PENDING":
                continue
            if line is None:
                raise UserError(f"sacct -P output has no line for job {job_id}; truncated?")
            records.append(_ended_run(job, job_id, state, line, figures, cluster))
    figures.warn()
    return records


def _ended_run(
    job: _Job, job_id: str, state: JobState, line: SacctLine, figures: GpuFigures, cluster: str
) -> JobRecord:
    """The record of one ended run of a job, its text line (`sacct -P`) beside it."""
    allocated = _json_tres(job, "tres.allocated")
    num_gpus = figures.best(
        job_id, {"tres.allocated": gpu_count(allocated), "AllocTRES": line.gpus}
    )
    requested_mib = dict(_json_tres(job, "tres.requested")).get("mem")  # the JSON's mem: MiB
    cpu_s, max_rss_bytes = _steps_usage(job)
    limit_min = job.number("time.limit", required=False)
    comment = job.get("comment", required=False)
    interactive, dependencies = comment_fields(
        comment.get("job") if isinstance(comment, dict) else comment
    )
    return JobRecord(
        job_id=job_id,
        cluster=cluster,
        state=state.name,
        # 22.05 JSON has user null for users without an association; text always has it.
        user=job.text("user", required=False) or line.user or None,
        **_labels(job),
        submit_time=job.time("time.submission"),
        start_time=job.time("time.start"),
        end_time=job.time("time.end"),
        exit_code=line.exit_code,
        nodes=job.nodes("nodes"),
        num_gpus=num_gpus,
        time_limit_s=limit_min * 60 if limit_min is not None else None,
        interactive=interactive,
        dependencies=dependencies,
        # v0.0.45 `sluid` is this run's (slurmdbd's db_index); `original_sluid`, the first
        # run's, is the same for every run of a requeued job, so it is not the run's id.
        sluid=job.sluid("sluid"),
        alloc_cpus=positive(dict(allocated).get("cpu")),
        req_mem_bytes=requested_mib * MIB if positive(requested_mib) else None,
        slurm_cpu_s=cpu_s,
        slurm_max_rss_bytes=max_rss_bytes,
    )


def _steps_usage(job: _Job) -> tuple[float | None, int | None]:
    """seff's figures of an ended run from its steps (contribs/seff/seff): the user + system CPU
    time of all steps, and the largest over steps of `TRESUsageInTot` mem (slurmstepd sums its
    tasks' RSS peaks there). None where the steps give nothing (no step ran, or a 0: what
    jobacct_gather/none leaves). 22.05's JSON leaves the job's own `time.total` 0, so the steps
    are summed on every release; their microseconds may pass 10^6 (user's plus system's)."""
    steps = job.get("steps", required=False) or []
    if not isinstance(steps, list):
        raise UserError(f"{job.where}: field 'steps' should be a list, got {steps!r}")
    cpu_s, mem = 0.0, 0
    for index, data in enumerate(steps):
        step = _Job(data, job.where, f"{job.where}: step {index}")
        cpu_s += (step.number("time.total.seconds") or 0) + (
            step.number("time.total.microseconds") or 0
        ) / 1e6
        step_mem = dict(_json_tres(step, "tres.requested.total")).get("mem")
        mem = max(mem, step_mem or 0)
    return positive(cpu_s), positive(mem)


def parse_sstat(text: str) -> JobUsage | None:
    """A running job's usage from `sstat -a -P -n -o JobID,TRESUsageInTot,TRESUsageInMax`, one
    line per running step; None when it lists none (sstat says "No steps running" on stderr
    and exits 0). CPU: the steps' `TRESUsageInTot` cpu (whole seconds). Memory: per step the
    larger of `TRESUsageInTot` mem (while running slurmstepd sums its tasks' current RSS there,
    not their peaks) and `TRESUsageInMax` mem (the largest task's peak), the largest over steps."""
    cpu_s, max_rss, steps = 0.0, 0, 0
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) != len(SSTAT_FIELDS):
            raise UserError(
                f"sstat -P line {number}: expected {len(SSTAT_FIELDS)} fields "
                f"({','.join(SSTAT_FIELDS)}), got {line!r}"
            )
        step, tot_text, max_text = fields
        where = f"sstat -P line {number} (step {step})"
        tot, peak = usage_tres(tot_text, where), usage_tres(max_text, where)
        cpu_s += tot.get("cpu") or 0
        max_rss = max(max_rss, tot.get("mem") or 0, peak.get("mem") or 0)
        steps += 1
    return JobUsage(positive(cpu_s), positive(max_rss)) if steps else None


def config_value(text: str, key: str) -> str | None:
    """One setting of `scontrol show config` ("AccountingStorageTRES   = cpu,mem,..."); None
    when it is not listed."""
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() == key:
            return value.strip()
    return None


def parse_sinfo(text: str) -> list[NodeRecord]:
    """`sinfo --Node -o '%N|%R|%G'` -> one record per node, its partitions joined.

    A node lists one line per partition; its GPUs are the sum of its `gpu` Gres entries, the
    model the GPU type when there is one type (`gpu:a100:8` -> "a100").
    """
    partitions: dict[str, set[str]] = {}
    gres: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.strip().split("|")
        if len(fields) != 3 or not fields[0]:
            raise UserError(f"sinfo line {number}: expected NODE|PARTITION|GRES, got {line!r}")
        node, partition, node_gres = fields
        partitions.setdefault(node, set()).add(partition)
        gres[node] = node_gres
    records = []
    for node in sorted(partitions):
        entries = GRES_GPU_RE.findall(gres[node])
        types = {kind for kind, _ in entries if kind}
        records.append(
            NodeRecord(
                node=node,
                gpus=sum(int(count) for _, count in entries),
                gpu_model=types.pop() if len(types) == 1 else None,
                partition=",".join(sorted(partitions[node])),
            )
        )
    return records
