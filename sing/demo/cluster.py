"""The live simulated campus cluster: a workload, the SING scheduler, and simulated GPUs.

Users of the synthetic workload (sing.demo.synthetic) submit SING job profiles over time (YAML,
checked by the executors' own parser, so the cluster's rules apply); the scheduler's `sing`
policy places them; "running" a job means writing what its GPUs would show into the fake
exporters' state file (utilisation, memory, power, the job holding each GPU, RDMA rates per
port), and writing its job record where the simulated executor (sing.demo.executor) reads it.
Time is compressed: `speed` simulated seconds pass per real second, so a 6-hour training run
lasts 3 minutes at the default speed of 120, while all timestamps stay real wall-clock times.

One idle two-node job is placed first, started an hour ago, so an admin always has something to
find.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from sing.demo import synthetic
from sing.executors.profile import JobProfile, parse_profile
from sing.executors.records import JobRecord
from sing.executors.settings import ExecutorSettings
from sing.scheduler.cluster import Cluster
from sing.scheduler.core import Job, Scheduler
from sing.scheduler.settings import SchedulerSettings

# A finished job's record stays in the records file this long, for the job sync to pick it up.
KEEP_FINISHED_S = 900.0
# The injected idle job has run this long when the demo starts (past the idle report's hour)
# and runs this much longer, in real seconds.
IDLE_JOB_RAN_S = 65 * 60.0
IDLE_JOB_LEFT_S = 2 * 3600.0


@dataclass
class LiveJob:
    spec: synthetic.SyntheticJob
    profile: JobProfile
    submit: datetime
    real_duration_s: float
    start: datetime | None = None
    end: datetime | None = None
    gpus: dict[str, list[int]] = field(default_factory=dict)

    @property
    def state(self) -> str:
        if self.end is not None:
            return self.spec.state
        return "RUNNING" if self.start else "PENDING"


class LiveCluster:
    """Advance with `tick(now)`; it rewrites the state file each time, the records file when
    a job was submitted, started, ended or forgotten."""

    def __init__(
        self,
        state_file: Path,
        records_file: Path,
        *,
        nodes: int = 16,
        gpus_per_node: int = 8,
        speed: float = 120.0,
        seed: int = 0,
        first_job_id: int = 500_000,
        cluster: str = "campus",
    ) -> None:
        self.state_file = state_file
        self.records_file = records_file
        self.names = synthetic.node_names(nodes)
        self.gpus_per_node = gpus_per_node
        self.speed = speed
        self.cluster = cluster
        self.rng = np.random.default_rng(seed)
        self.noise = random.Random(seed)
        self.scheduler = Scheduler(
            Cluster(nodes, gpus_per_node, names=self.names), SchedulerSettings(policy="sing")
        )
        self.jobs: dict[str, LiveJob] = {}
        self.next_id = first_job_id
        self.last: datetime | None = None
        self._records_written: list[tuple[str, str]] | None = None  # (job id, state) last written
        self.gpu_rate = nodes * gpus_per_node / 128 * synthetic.LOAD_SCALE

    def inject_idle_multinode_job(
        self, now: datetime, ran_s: float = IDLE_JOB_RAN_S, left_s: float = IDLE_JOB_LEFT_S
    ) -> str:
        """A 2-node job that holds 16 GPUs and does nothing, for the idle-jobs report: placed at
        once, started `ran_s` ago (the report lists jobs of an hour or more, so a job started
        now would stay unlisted for the demo's first hour) and running `left_s` more, in real
        seconds. `history` gives the samples of the time it already ran."""
        user, account, _ = next(u for u in synthetic.USERS if u[2] == "multinode")
        habit = synthetic.HABITS["multinode"]
        spec = synthetic.draw_job(self.rng, user, account, "multinode", habit, 0.0)
        spec.num_gpus, spec.mean_util, spec.mem_share = 2 * self.gpus_per_node, 0.003, 0.03
        spec.duration, spec.state, spec.exit_code = (ran_s + left_s) * self.speed, "COMPLETED", 0
        spec.time_limit = max(spec.time_limit, 2 * spec.duration)
        job_id = self._submit(spec, now)
        job = self.jobs[job_id]
        (placement,) = self.scheduler.schedule(now.timestamp())
        job.start, job.gpus = now - timedelta(seconds=ran_s), placement.gpus
        job.submit, job.real_duration_s = job.start, ran_s + left_s
        return job_id

    def history(self, job_id: str, until: datetime, step_s: float) -> pl.DataFrame:
        """The gpu_samples rows a collector scraping every `step_s` would have written for a job
        from its start to `until` (the seeded past of the injected idle job)."""
        job = self.jobs[job_id]
        assert job.start is not None
        span = (until - job.start).total_seconds()
        ts = [job.start + timedelta(seconds=k * step_s) for k in range(int(span // step_s))]
        util = job.spec.mean_util
        power = synthetic.power_w(util)
        rows = [
            {
                "ts": t,
                "node": node,
                "gpu_index": i,
                "gpu_uuid": None,
                "util": util,
                "sm_active": util * job.spec.sm_factor,
                "mem_used_bytes": int(job.spec.mem_share * synthetic.GPU_MEMORY),
                "mem_total_bytes": synthetic.GPU_MEMORY,
                "power_w": power,
                "energy_j": power * step_s * (k + 1),
                "energy_delta_j": power * step_s if k else None,
                "temp_c": 30 + 45 * util,
                "job_id": job_id,
                "cluster": self.cluster,
            }
            for node, indices in job.gpus.items()
            for i in indices
            for k, t in enumerate(ts)
        ]
        return pl.DataFrame(rows)

    def tick(self, now: datetime) -> None:
        if self.last is not None:
            self._arrivals(now, (now - self.last).total_seconds())
        self.last = now
        for job_id, job in list(self.jobs.items()):
            due = job.start and (now - job.start).total_seconds() >= job.real_duration_s
            if due and job.end is None:
                job.end = now
                self.scheduler.finish(job_id, now.timestamp())
        for placement in self.scheduler.schedule(now.timestamp()):
            job = self.jobs[placement.job_id]
            job.start, job.gpus = now, placement.gpus
        self._forget_old(now)
        _write_json(self.state_file, self.device_state())
        # A record changes only with its job's state, so the file is rewritten only then.
        written = [(job_id, job.state) for job_id, job in self.jobs.items()]
        if written != self._records_written:
            records = [r.to_json() for r in self.records()]
            _write_json(self.records_file, {"cluster": self.cluster, "jobs": records})
            self._records_written = written

    def _arrivals(self, now: datetime, real_dt: float) -> None:
        sim_days = real_dt * self.speed / 86_400
        for user, account, habit_name in synthetic.USERS:
            habit = synthetic.HABITS[habit_name]
            for _ in range(self.rng.poisson(habit.jobs_per_day * self.gpu_rate * sim_days)):
                spec = synthetic.draw_job(self.rng, user, account, habit_name, habit, 0.0)
                self._submit(spec, now)

    def _submit(self, spec: synthetic.SyntheticJob, now: datetime) -> str:
        job_id = str(self.next_id)
        self.next_id += 1
        spec.job_id = job_id
        profile = parse_profile(
            profile_yaml(spec, self.gpus_per_node, self.speed), f"<{spec.user}'s profile>",
            ExecutorSettings(max_gpus_per_node=self.gpus_per_node),
        )  # fmt: skip
        self.jobs[job_id] = LiveJob(spec, profile, now, max(5.0, spec.duration / self.speed))
        self.scheduler.submit(
            Job(job_id, spec.num_gpus, user=spec.user, duration_s=spec.duration / self.speed),
            now.timestamp(),
        )
        return job_id

    def _forget_old(self, now: datetime) -> None:
        for job_id in [j for j, job in self.jobs.items() if job.end is not None]:
            if (now - self.jobs[job_id].end).total_seconds() > KEEP_FINISHED_S:  # type: ignore[operator]
                del self.jobs[job_id]

    def device_state(self) -> dict[str, Any]:
        """The fake exporters' state file: per node, per GPU values and per port RDMA rates."""
        nodes: dict[str, Any] = {
            name: {"gpus": {str(i): _idle_gpu() for i in range(self.gpus_per_node)}, "rdma": {}}
            for name in self.names
        }
        for job in self.jobs.values():
            if job.start is None or job.end is not None:
                continue
            spec = job.spec
            for node, indices in job.gpus.items():
                utils = []
                for i in indices:
                    util = spec.mean_util
                    if util > 0.01:
                        util = min(1.0, max(0.0, util + self.noise.gauss(0, synthetic.UTIL_NOISE)))
                    utils.append(util)
                    nodes[node]["gpus"][str(i)] = {
                        "util": round(util, 4),
                        "sm_active": round(util * spec.sm_factor, 4),
                        "memory_used": int(spec.mem_share * synthetic.GPU_MEMORY),
                        "power_w": round(synthetic.power_w(util), 1),
                        "temperature_c": round(30 + 45 * util, 1),
                        "job_id": job.spec.job_id,
                        "user": spec.user,
                    }
                mean_util = sum(utils) / len(utils)
                rate = 0.0
                if synthetic.talks(len(job.gpus), spec.mean_util):
                    rate = synthetic.rdma_bytes_per_s(mean_util)
                for port in range(synthetic.RDMA_PORTS):
                    nodes[node]["rdma"][f"mlx5_{port}/1"] = {
                        "tx_bytes_per_s": rate / synthetic.RDMA_PORTS,
                        "rx_bytes_per_s": rate / synthetic.RDMA_PORTS,
                    }
        return {"nodes": nodes}

    def records(self) -> list[JobRecord]:
        """What the simulated executor reports: every job it knows, as the executors' records."""
        out = []
        for job in self.jobs.values():
            spec, profile = job.spec, job.profile
            out.append(
                JobRecord(
                    job_id=spec.job_id,
                    cluster=self.cluster,
                    state=job.state,
                    user=spec.user,
                    account=spec.account,
                    partition=profile.partition,
                    name=profile.name,
                    submit_time=job.submit,
                    start_time=job.start,
                    end_time=job.end,
                    exit_code=spec.exit_code if job.end else None,
                    nodes=tuple(sorted(job.gpus)),
                    num_gpus=profile.num_gpus,
                    gpus={node: tuple(gpus) for node, gpus in job.gpus.items()},
                    time_limit_s=profile.time_limit_s,
                    interactive=profile.interactive,
                    dependencies=profile.dependencies(),
                )
            )
        return out


def profile_yaml(spec: synthetic.SyntheticJob, gpus_per_node: int, speed: float) -> str:
    """The SING job profile a user of this habit would write for this job."""
    nodes = max(1, -(-spec.num_gpus // gpus_per_node))
    software = dict(spec.dependencies)
    python, cuda = software.pop("python", None), software.pop("cuda", None)
    limit_s = max(60, int(spec.time_limit / speed))
    lines = [
        f"name: {spec.habit}-{spec.job_id}",
        f"partition: {'interactive' if spec.interactive else 'gpu'}",
        f"nodes: {nodes}",
        f"gpus_per_node: {spec.num_gpus // nodes}",
        f"time_limit: {limit_s // 3600:02d}:{limit_s % 3600 // 60:02d}:{limit_s % 60:02d}",
        f"interactive: {'true' if spec.interactive else 'false'}",
        "entry:",
        "  commands: [python train.py --config config.yaml]",
        "environment:",
        f"  python: '{python}'" if python else "",
        f"  cuda: '{cuda}'" if cuda else "",
        "  pip: [" + ", ".join(f"'{name}=={version}'" for name, version in software.items()) + "]",
    ]
    return "\n".join(line for line in lines if line) + "\n"


def _idle_gpu() -> dict[str, Any]:
    return {
        "util": 0.0,
        "sm_active": 0.0,
        "memory_used": 0,
        "power_w": synthetic.IDLE_POWER_W,
        "temperature_c": 30.0,
        "job_id": None,
        "user": None,
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Replace the file whole, so the exporter or the job sync never reads half of it."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def now_utc() -> datetime:
    return datetime.now(UTC)
