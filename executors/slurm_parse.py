"""Turn `squeue --json`, `sacct --json` and `sacct -P` output into job records.

Slurm's JSON changes shape between releases. 22.05 (openapi v0.0.38, the one CI runs) has plain
numbers, `null` for unset and a state string; 23.02+ (data_parser v0.0.39+) wraps numbers as
`{"set", "infinite", "number"}` and states as lists. Both are read here; anything else is an
error that names the command, the job and the field, never a silent zero.

Known 22.05 bug: `sacct --json` reports exit code 0 for failed jobs, so exit codes always come
from `sacct -P` text (stable across versions).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

import hostlist

from executors.records import JobRecord, NodeRecord, exit_code_from, utc
from sing.digits import ascii_digits
from sing.errors import UserError

# The prefix of the job comment in which `sing submit` stores what Slurm has no field for.
COMMENT_PREFIX = "sing:"
# Squeue states in which a job holds its allocation.
HOLDING_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED"})
# One GPU entry of gres_detail: "gpu:a100:4(IDX:2-5)", "gpu:2(IDX:0-1)", "gpu(IDX:3)".
GRES_IDX_RE = re.compile(r"gpu(?::[^:(,]+)?(?::\d+)?\(IDX:([^)]*)\)")
# The columns read from `sacct -P`, in order.
SACCT_TEXT_FIELDS = ("JobIDRaw", "User", "ExitCode")
# `sinfo --Node` columns: node, partition (%R: without the default's "*"), generic resources.
SINFO_FORMAT = "%N|%R|%G"
# One GPU entry of a node's Gres: "gpu:a100:8", "gpu:8", "gpu:a100:8(S:0-1)".
GRES_GPU_RE = re.compile(r"(?:^|,)gpu(?::([^:(,]+))?:(\d+)")


class _Job:
    """One job object of a JSON dump, with field access that names what is wrong."""

    def __init__(self, data: Any, source: str) -> None:
        if not isinstance(data, dict):
            raise UserError(f"{source}: a job entry is {type(data).__name__}, not an object")
        self.data = data
        self.where = f"{source}: job {data.get('job_id', '?')}"

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

    def state(self, path: str) -> str:
        value = self.get(path)
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            value = value[0]  # v0.0.39+: ["FAILED"], the base state first
        if isinstance(value, str) and value:
            return value.split()[0].upper()
        raise UserError(f"{self.where}: field {path!r} should be a job state, got {value!r}")

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


def gpu_count(entries: Iterable[tuple[str, int | None]]) -> int:
    """GPUs in a TRES list of (name, count), e.g. [("gres/gpu", 2), ("gres/gpu:a100", 2)].

    With typed GPUs Slurm lists both the total `gres/gpu` and each type `gres/gpu:TYPE`; adding
    them all would double count. The total wins; the types are summed only when it is absent.
    """
    total, typed = None, 0
    for name, count in entries:
        if name == "gres/gpu":
            total = (total or 0) + (count or 0)
        elif name.startswith("gres/gpu:"):
            typed += count or 0
    return total if total is not None else typed


def parse_tres(text: str | None, where: str) -> list[tuple[str, int | None]]:
    """'cpu=1,gres/gpu=2,gres/gpu:a100=2' -> [("cpu", 1), ("gres/gpu", 2), ...]."""
    entries = []
    for item in filter(None, (text or "").split(",")):
        name, sep, count = item.partition("=")
        if not sep:
            raise UserError(f"{where}: TRES entry {item!r} is not NAME=COUNT")
        entries.append((name, int(count) if ascii_digits(count) else None))
    return entries


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


def parse_squeue(text: str, cluster: str) -> list[JobRecord]:
    """Jobs holding an allocation now, from `squeue --json` (which also lists ended jobs)."""
    records = []
    for job in _load(text, "squeue --json"):
        state = job.state("job_state")
        if state not in HOLDING_STATES:
            continue
        nodes = job.nodes("nodes")
        limit_min = job.number("time_limit")
        interactive, dependencies = comment_fields(job.text("comment", required=False))
        records.append(
            JobRecord(
                job_id=str(job.number("job_id")),
                cluster=cluster,
                state=state,
                user=job.text("user_name"),
                account=job.text("account", required=False),
                partition=job.text("partition", required=False),
                name=job.text("name", required=False),
                qos=job.text("qos", required=False),
                submit_time=job.time("submit_time"),
                start_time=job.time("start_time"),
                nodes=nodes,
                num_gpus=gpu_count(parse_tres(job.text("tres_alloc_str"), job.where)),
                gpus=_gpu_indices(job, nodes),
                time_limit_s=limit_min * 60 if limit_min is not None else None,
                interactive=interactive,
                dependencies=dependencies,
            )
        )
    return records


def parse_sacct_text(text: str) -> dict[str, tuple[str, int]]:
    """`sacct -P -n -o JobIDRaw,User,ExitCode` -> {job id: (user, exit code)}."""
    out = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) != len(SACCT_TEXT_FIELDS):
            raise UserError(
                f"sacct -P line {number}: expected {len(SACCT_TEXT_FIELDS)} fields "
                f"({','.join(SACCT_TEXT_FIELDS)}), got {line!r}"
            )
        job_id, user, exit_code = fields
        code, _, signal = exit_code.partition(":")
        if not (ascii_digits(code) and ascii_digits(signal)):
            raise UserError(f"sacct -P line {number}: ExitCode {exit_code!r} is not CODE:SIGNAL")
        out[job_id] = (user, exit_code_from(int(code), int(signal)))
    return out


def parse_sacct(json_text: str, exit_text: str, cluster: str) -> list[JobRecord]:
    """Ended jobs from `sacct --json`, with user and exit code from `sacct -P` text."""
    jobs = _load(json_text, "sacct --json")
    exits = parse_sacct_text(exit_text)
    records = []
    for job in jobs:
        job_id = str(job.number("job_id"))
        state = job.state("state.current")
        if state in HOLDING_STATES or state == "PENDING":
            continue
        if job_id not in exits:
            raise UserError(f"sacct -P output has no line for job {job_id}; truncated?")
        text_user, exit_code = exits[job_id]
        limit_min = job.number("time.limit", required=False)
        comment = job.get("comment", required=False)
        interactive, dependencies = comment_fields(
            comment.get("job") if isinstance(comment, dict) else comment
        )
        records.append(
            JobRecord(
                job_id=job_id,
                cluster=cluster,
                state=state,
                # 22.05 JSON has user null for users without an association; text always has it.
                user=job.text("user", required=False) or text_user or None,
                account=job.text("account", required=False),
                partition=job.text("partition", required=False),
                name=job.text("name", required=False),
                qos=job.text("qos", required=False),
                submit_time=job.time("time.submission"),
                start_time=job.time("time.start"),
                end_time=job.time("time.end"),
                exit_code=exit_code,
                nodes=job.nodes("nodes"),
                num_gpus=gpu_count(_json_tres(job, "tres.allocated")),
                time_limit_s=limit_min * 60 if limit_min is not None else None,
                interactive=interactive,
                dependencies=dependencies,
            )
        )
    return records


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
