"""A known-answer test of the real path, with nothing written by the synthetic generator.

    real Slurm 22.05 on loopback (tests/slurm_harness.py: gpu-1, gpu-2, Gres=gpu:a100:8)
      -> the project's own prolog/epilog (sing/exporters/deploy/) writing the GPU-to-job mapping
      -> one `python -m sing.exporters` per node: fake NVML scripted to known per-GPU utilisation,
         SM activity, memory and power; an InfiniBand sysfs tree (real layout) the test drives
      -> `sing collector` (file_sd targets, job sync through squeue/sacct, 2 s rounds)
      -> `sing job`, `sing report cluster|by-nodes|idle|fairness` and the dashboard pages.

Three jobs, submitted with `sing submit PROFILE` for two ordinary users (sbatch runs as the
user; see `_submit_one_by_one`), one after another so Slurm's first fit places them as `JOBS`
says (checked against `scontrol show job -d` and the prolog's files before anything else): a
1-node job using its 4 GPUs hard, a 2-node job using its 4 GPUs lightly, and a 2-node job
holding 4 GPUs it never uses. gpu-1's driver reloads mid-run (energy counters restart), and
gpu-2's adapter has a saturated 32-bit receive counter (its traffic is unknown, not zero).
Slurm's FirstJobId is 8, so the ids are 8, 9, 10 and anything comparing them as strings
("10" < "9") shows.

Every expected figure is computed here from the script (the per-GPU values, the burst's bytes)
and from what Slurm says (allocations, start and end times), never from sing's output. Sample
timestamps are read back only where a figure is defined by them (energy = power x the time the
job was sampled; the dashboard's capacity runs from when a node was first seen).

Tolerances, and why:
- utilisation, SM activity: 1e-4. Every GPU holds one value throughout, so a mean carries only
  float32 storage rounding (0.8 is stored as 0.800000012).
- RDMA bytes: exact. Counters move only in a burst that starts after the jobs' first samples
  and ends before their last ones, and the last write sets the exact final value.
- energy: per GPU, power x (SCRAPE_TIMEOUT_S + 0.1 s) either way. Samples are stamped with the
  round's start, the exporter reads the counter when the scrape arrives (up to the scrape
  timeout later), and the fake re-evaluates its state every 0.1 s. On gpu-1, whose driver is
  reloaded mid-run (its energy counters restart from 0), up to one more round of energy may be
  missing below: what was used between the last sample before the reload and the reload.
- capacity, assignment rate, Jain's index, GPU-hours: 1e-6 relative. The window lies where all
  three jobs run, on whole seconds as Slurm accounts them, so these are exact ratios.
- dashboard percentages: half a point, since the pages print whole percent.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from sing.warehouse.store import Warehouse
from tests.dashboard_app import metrics, open_app
from tests.ports import free_ports
from tests.real_path.infiniband import SATURATED_32, BurstThread, IbTree, Port
from tests.real_path.processes import Service, run, wait_for
from tests.real_path.site import (
    GPU_MEMORY,
    IDLE,
    MODEL,
    SING,
    Submitter,
    Use,
    mapping_files,
    script_state,
    scripted_use,
    slurm_site,
    start_collector,
    start_exporters,
    up_scrapes,
    write_targets,
)
from tests.real_path.slurm import Allocation, JobTimes, gpu_allocation, job_states, run_times
from tests.slurm_harness import GPUS_PER_NODE, NODES, TEST_USER, TEST_USER2, SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(400)]

REPO = Path(__file__).resolve().parents[1]

SITE_CLUSTER = "campus"
EXPORTER_PORTS = dict(zip(NODES, free_ports(len(NODES)), strict=True))
INTERVAL_S = 2.0
SCRAPE_TIMEOUT_S = 1.5
JOB_SYNC_S = 10.0  # long enough that a round always falls between a job's end and the next sync
BURST_S = 12.0
RELOADED_NODE = "gpu-1"  # its driver reloads during the burst: energy counters restart
ADMIN = "ghopper"
UTIL_TOL = 1e-4
# Utilisation over all GPUs, busy or not, is a mean over samples: a node missing one scrape of
# the ~15 in a window moves it by about 0.007.
ALL_GPUS_TOL = 0.015
REL_TOL = 1e-6
SHOWN_TOL = 0.005

CONFIG = f"""\
[site]
cluster = "{SITE_CLUSTER}"
warehouse = "warehouse"
[executor]
kind = "slurm"
[collector]
file_sd = "targets.json"
interval_s = {INTERVAL_S}
scrape_timeout_s = {SCRAPE_TIMEOUT_S}
job_sync_interval_s = {JOB_SYNC_S}
maintenance_interval_s = 3600
metrics_port = 0
[thresholds]
idle_job_min_hours = 0  # the jobs here last about a minute
[roles]
admins = ["{ADMIN}"]
[dashboard]
auth = "oidc"
allowed_domains = ["campus.edu"]
"""


@dataclass(frozen=True)
class JobSpec:
    key: str
    user: str
    nodes: int
    gpus_per_node: int
    use: Use  # of each of its GPUs
    placement: Allocation  # where Slurm's first fit puts it (checked, then relied on)


JOBS = (
    JobSpec("train", TEST_USER, 1, 4, Use(0.8, 0.6, 300.0, 40 * 10**9), {"gpu-1": [0, 1, 2, 3]}),
    JobSpec("multi", TEST_USER2, 2, 2, Use(0.3, 0.2, 200.0, 20 * 10**9),
            {"gpu-1": [4, 5], "gpu-2": [0, 1]}),
    JobSpec("holder", TEST_USER2, 2, 2, IDLE, {"gpu-1": [6, 7], "gpu-2": [2, 3]}),
)  # fmt: skip
BY_KEY = {spec.key: spec for spec in JOBS}
CAPACITY_GPUS = len(NODES) * GPUS_PER_NODE
ALLOCATED_GPUS = sum(spec.nodes * spec.gpus_per_node for spec in JOBS)

# gpu-1: a 64-bit mlx5 port whose counters are already past 2^32 words; gpu-2: an old adapter
# with 32-bit counters whose port_rcv_data has saturated (its receive traffic is unknown).
PORTS = {
    "gpu-1": Port("mlx5_0", 1, "200 Gb/sec (4X HDR)", tx_words=6_000_000_000,
                  rx_words=5_500_000_000, tx_bytes_per_s=1.0e9, rx_bytes_per_s=0.5e9),
    "gpu-2": Port("mlx4_0", 1, "56 Gb/sec (4X FDR)", tx_words=1_000_000_000,
                  rx_words=SATURATED_32, tx_bytes_per_s=0.25e9, rx_bytes_per_s=0.1e9,
                  rx_saturated=True),
}  # fmt: skip


def use_of(node: str, gpu: int) -> Use:
    return scripted_use(JOBS, node, gpu)


def all_gpus_util() -> float:
    """The cluster's utilisation over all its GPUs, as scripted."""
    return sum(use_of(n, g).util for n in NODES for g in range(GPUS_PER_NODE)) / CAPACITY_GPUS


def gpus_of(key: str) -> int:
    return BY_KEY[key].nodes * BY_KEY[key].gpus_per_node


def profile(spec: JobSpec) -> str:
    """A job profile (docs/executors.md); the job sleeps until the test cancels it."""
    return (
        f"name: {spec.key}\nnodes: {spec.nodes}\ngpus_per_node: {spec.gpus_per_node}\n"
        "entry: {commands: 'sleep 3600'}\n"
    )


@dataclass
class RealRun:
    """What the scenario did, and the ground truth it collected from Slurm and its clock."""

    base: Path
    config: Path
    env: dict[str, str]
    trees: list[IbTree] = field(default_factory=list)
    ids: dict[str, str] = field(default_factory=dict)  # job key -> Slurm job id
    allocation: dict[str, Allocation] = field(default_factory=dict)  # scontrol show job -d
    prolog: dict[str, Allocation] = field(default_factory=dict)  # the prolog's mapping files
    times: dict[str, JobTimes] = field(default_factory=dict)  # sacct
    collector_started: datetime | None = None
    since: datetime | None = None  # all three jobs run throughout [since, until)
    until: datetime | None = None
    burst_end: datetime | None = None
    jobs_cleared: datetime | None = None  # the test saw the epilog's work done by then
    collector_stopped: datetime | None = None

    @property
    def warehouse(self) -> Warehouse:
        return Warehouse(self.base / "warehouse")

    def sql(self, query: str, params: list | dict | None = None) -> list[tuple]:
        con = self.warehouse.connect()
        try:
            return con.execute(query, params or []).fetchall()
        finally:
            con.close()

    def sing(self, *args: str) -> Any:
        """A `sing ... --json` command's output, parsed."""
        return json.loads(run([SING, "--config", str(self.config), *args, "--json"], self.env))

    def run_s(self, key: str) -> float:
        times = self.times[self.ids[key]]
        return (times.end - times.start).total_seconds()

    def gpu_hours(self, key: str) -> float:
        return gpus_of(key) * self.run_s(key) / 3600


def now() -> datetime:
    return datetime.now(UTC)


@pytest.fixture(scope="module")
def real(request: pytest.FixtureRequest) -> Iterator[RealRun]:
    """The whole scenario, once for the module; every process it starts is stopped after it.

    The scratch directory (logs of every process, the warehouse) is kept when a test of the
    module failed, its path given in a warning; MariaDB's files are removed either way.
    """
    with slurm_site(request, "sing-realpath-", "real path", first_job_id=8) as site:
        yield _play(*site)


def _play(cluster: SlurmCluster, base: Path, stack: contextlib.ExitStack) -> RealRun:
    """Nodes, collector, jobs, traffic, the jobs' end; each step waits for its evidence."""
    config = base / "sing.toml"
    config.write_text(CONFIG)
    real = RealRun(base, config, {**cluster.env, "TZ": "UTC"})
    services = _start_nodes(cluster, real, stack)

    write_targets(base, EXPORTER_PORTS)
    real.collector_started = now()
    collector = start_collector(config, base, real.env)
    stack.callback(collector.stop)
    services.append(collector)
    started, warehouse = real.collector_started, base / "warehouse"
    wait_for(lambda: up_scrapes(warehouse, started) >= 1, "both nodes scraped", 90, services)

    _submit_one_by_one(cluster, real, services)

    # Samples of the running jobs before any traffic, the burst, samples after it.
    wait_for(lambda: up_scrapes(warehouse, real.since) >= 2, "2 rounds of the jobs", 60, services)
    burst = BurstThread(real.trees, BURST_S)
    burst.start()
    reload_driver(real, RELOADED_NODE)
    burst.join(BURST_S + 60)
    assert not burst.is_alive(), "the InfiniBand burst did not finish"
    real.burst_end = now()
    after = real.burst_end
    wait_for(lambda: up_scrapes(warehouse, after) >= 2, "2 rounds after the burst", 60, services)

    real.until = now().replace(microsecond=0)
    run(["scancel", *real.ids.values()], real.env)
    ids = set(real.ids.values())
    wait_for(
        lambda: not ids & job_states(real.env).keys() and not mapping_files(cluster),
        "the jobs to end and the epilog to clear their GPUs",
        60,
        services,
    )
    real.jobs_cleared = ended = now()
    wait_for(
        lambda: real.sql(
            "SELECT count(*) FROM jobs WHERE job_id IN (SELECT unnest(?)) AND end_time IS NOT NULL",
            [sorted(ids)],
        )[0][0] == len(ids),
        "the collector's job sync to record the jobs' ends",
        90,
        services,
    )  # fmt: skip
    wait_for(
        lambda: up_scrapes(warehouse, ended) >= 1, "a round after the jobs ended", 60, services
    )
    assert collector.stop() == 0, collector.tail()
    real.collector_stopped = now()
    real.times = run_times(sorted(ids), real.env)
    return real


def _start_nodes(
    cluster: SlurmCluster, real: RealRun, stack: contextlib.ExitStack
) -> list[Service]:
    """One exporter per node over its InfiniBand tree and its scripted GPUs."""
    real.trees += [IbTree(real.base / "sys" / node, [PORTS[node]]) for node in EXPORTER_PORTS]
    return start_exporters(cluster, real.base, real.env, EXPORTER_PORTS, use_of, stack)


def reload_driver(real: RealRun, node: str) -> None:
    """Script an NVIDIA driver reload on `node` now: its GPUs' energy counters restart from 0
    (the fake's `driver_loaded_at`, docs/exporter.md), while its jobs are being sampled."""
    loaded_at = time.time()
    gpus = {str(i): {"driver_loaded_at": loaded_at} for i in range(GPUS_PER_NODE)}
    script_state(real.base / "fake-state.json", {node: gpus})


def _submit_one_by_one(cluster: SlurmCluster, real: RealRun, services: list[Service]) -> None:
    """`sing submit PROFILE` for each job's user; each job runs (prolog done) before the next."""
    submitter = Submitter(cluster, real.config, real.base, real.env)
    for spec in JOBS:
        real.ids[spec.key] = submitter.submit(
            spec.user, spec.key, profile(spec), spec.nodes, services
        )
    real.prolog = {key: mapping_files(cluster)[job_id] for key, job_id in real.ids.items()}
    real.allocation = {key: gpu_allocation(job_id, real.env) for key, job_id in real.ids.items()}
    real.since = now().replace(microsecond=0) + timedelta(seconds=1)
    assert real.allocation == {s.key: s.placement for s in JOBS}, (
        "Slurm placed the jobs other than the script assumes (a premise of this test, not a "
        f"product failure): {real.allocation}"
    )


# ---- expected figures, from the script and Slurm ------------------------------------------


def held(real: RealRun, key: str) -> set[tuple[str, int]]:
    return {(node, gpu) for node, gpus in real.allocation[key].items() for gpu in gpus}


def rdma_owner(real: RealRun, node: str) -> str:
    """The job a node's RDMA traffic belongs to (docs/collector.md): the one holding most of
    its GPUs during the burst, ties to the lowest job id compared as a number."""
    return max(real.ids, key=lambda k: (len(real.allocation[k].get(node, [])), -int(real.ids[k])))


def expected_rdma(real: RealRun, key: str) -> dict[str, tuple[int, int | None]]:
    """Node -> (tx, rx) bytes of the job; rx None where the counter was saturated (unknown)."""
    return {n: PORTS[n].burst_bytes(BURST_S) for n in NODES if rdma_owner(real, n) == key}


def sampled_spans(real: RealRun, job_id: str) -> dict[tuple[str, int], float]:
    """(node, GPU) -> seconds from the job's first to its last sample of that GPU."""
    rows = real.sql(
        "SELECT node, gpu_index, epoch(max(ts) - min(ts)) FROM gpu_samples WHERE job_id = ? "
        "GROUP BY ALL",
        [job_id],
    )
    return {(node, gpu): seconds for node, gpu, seconds in rows}


def energy_bounds(power_w: float, span_s: float, reloaded: bool) -> tuple[float, float]:
    """The energy a GPU used while sampled in a job: power x span, give or take the scrape
    latency at either end; across a driver reload the counter restarts from 0, so what it
    used between the sample before the reload and the reload (at most one round) is lost."""
    jitter = power_w * (SCRAPE_TIMEOUT_S + 0.1)
    lost = power_w * (INTERVAL_S + SCRAPE_TIMEOUT_S) if reloaded else 0.0
    return power_w * span_s - jitter - lost, power_w * span_s + jitter


def jain(values: list[float]) -> float:
    """Jain's fairness index: (sum x)^2 / (n sum x^2)."""
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def window_args(real: RealRun) -> list[str]:
    """--since/--until where all three jobs run, --now after everything ended."""
    assert real.since and real.until and real.collector_stopped
    return [
        "--since", real.since.isoformat(), "--until", real.until.isoformat(),
        "--now", real.collector_stopped.isoformat(),
    ]  # fmt: skip


def window_hours(real: RealRun) -> float:
    assert real.since and real.until
    return (real.until - real.since).total_seconds() / 3600


# ---- Slurm -> prolog -> exporter -> collector -> warehouse --------------------------------


def test_prolog_maps_exactly_the_gpus_slurm_allocated(real: RealRun) -> None:
    assert real.prolog == real.allocation


def test_job_records_hold_the_gpus_slurm_allocated(real: RealRun) -> None:
    for key, job_id in real.ids.items():
        spec = BY_KEY[key]
        rows = real.sql(
            "SELECT node, list(gpu_index ORDER BY gpu_index) FROM job_gpus WHERE job_id = ? "
            "GROUP BY node",
            [job_id],
        )
        assert dict(rows) == real.allocation[key], key
        ((user, state, nodes, gpus, cluster),) = real.sql(
            'SELECT "user", state, num_nodes, num_gpus, cluster FROM jobs WHERE job_id = ?',
            [job_id],
        )
        assert (user, state, cluster) == (spec.user, "CANCELLED", SITE_CLUSTER)
        assert (nodes, gpus) == (spec.nodes, spec.nodes * spec.gpus_per_node)


def test_samples_are_stamped_with_the_job_holding_the_gpu_while_it_runs(real: RealRun) -> None:
    # A sample's ts is its round's start: a round can begin up to one interval before the
    # prolog ran, and Slurm's times are whole seconds. At the end the epilog clears the GPUs,
    # and no round that starts later may stamp them with the job.
    slack = timedelta(seconds=INTERVAL_S + 1)
    for key, job_id in real.ids.items():
        stamped = real.sql(
            "SELECT DISTINCT node, gpu_index FROM gpu_samples WHERE job_id = ?", [job_id]
        )
        assert set(stamped) == held(real, key), key
        ((first, last),) = real.sql(
            "SELECT min(ts), max(ts) FROM gpu_samples WHERE job_id = ?", [job_id]
        )
        _, start, end = real.times[job_id]
        assert start - slack <= first, (key, first, start)
        assert last < real.jobs_cleared, (key, last, end, real.jobs_cleared)
    free = {(n, g) for n in NODES for g in range(GPUS_PER_NODE)} - set().union(
        *(held(real, k) for k in real.ids)
    )
    stamped_free = real.sql(
        "SELECT DISTINCT node, gpu_index FROM gpu_samples WHERE job_id IS NOT NULL"
    )
    assert not free & set(stamped_free)


def test_every_sample_carries_the_site_cluster(real: RealRun) -> None:
    for table in ("gpu_samples", "rdma_samples"):
        assert real.sql(f"SELECT DISTINCT cluster FROM {table}") == [(SITE_CLUSTER,)], table


def test_node_inventory_comes_from_the_exporters_and_sinfo(real: RealRun) -> None:
    latest = real.sql(
        """
        SELECT node, gpus, gpu_model, gpu_memory_bytes, partition, cluster, source FROM nodes
        QUALIFY row_number() OVER (PARTITION BY cluster, node ORDER BY valid_from DESC) = 1
        ORDER BY node
        """
    )
    assert latest == [
        (node, GPUS_PER_NODE, MODEL, GPU_MEMORY, "debug", SITE_CLUSTER, "exporter+sinfo")
        for node in NODES
    ]
    ((first_seen,),) = real.sql("SELECT max(valid_from) FROM nodes WHERE gpus > 0")
    assert real.collector_started <= first_seen <= real.since  # seen before the jobs ran


# ---- sing job ------------------------------------------------------------------------------


@pytest.mark.parametrize("key", [spec.key for spec in JOBS])
def test_sing_job_shows_the_scripted_use(real: RealRun, key: str) -> None:
    spec, job_id = BY_KEY[key], real.ids[key]
    gpus = spec.nodes * spec.gpus_per_node
    (job,) = real.sing("job", job_id)["rows"]
    assert (job["job_id"], job["user"], job["num_nodes"], job["num_gpus"]) == (
        job_id, spec.user, spec.nodes, gpus,
    )  # fmt: skip
    assert job["run_s"] == pytest.approx(real.run_s(key), abs=1e-6)
    assert job["gpus_sampled"] == gpus
    assert job["gpus_never_used"] == (gpus if spec.use.util == 0 else 0)
    assert job["mean_util"] == pytest.approx(spec.use.util, abs=UTIL_TOL)
    assert job["mean_sm_active"] == pytest.approx(spec.use.sm_active, abs=UTIL_TOL)
    assert job["peak_mem_bytes"] == spec.use.memory_used
    assert job["gpu_mem_bytes"] == GPU_MEMORY

    # Energy: the scripted power over the time each GPU was sampled in the job.
    spans = sampled_spans(real, job_id)
    per_gpu = {(row["node"], row["gpu_index"]): row for row in job["per_gpu"]}
    assert set(per_gpu) == held(real, key)
    assert min(spans.values()) >= BURST_S  # sampled before and after the burst
    low_total = high_total = 0.0
    for gpu, row in per_gpu.items():
        assert row["mean_util"] == pytest.approx(spec.use.util, abs=UTIL_TOL), gpu
        low, high = energy_bounds(spec.use.power_w, spans[gpu], reloaded=gpu[0] == RELOADED_NODE)
        assert low <= row["energy_j"] <= high, (gpu, row["energy_j"], low, high)
        low_total, high_total = low_total + low, high_total + high
    assert low_total <= job["energy_j"] <= high_total

    # RDMA: each node's burst belongs to the job holding most of its GPUs.
    expected = expected_rdma(real, key)
    shown = {row["node"]: (row["tx_bytes"], row["rx_bytes"]) for row in job["per_node_rdma"]}
    assert shown == expected
    if expected:
        tx = sum(t for t, _ in expected.values())
        rxs = [r for _, r in expected.values()]
        rx = None if None in rxs else sum(rxs)
        assert (job["rdma_tx_bytes"], job["rdma_rx_bytes"]) == (tx, rx)
        if rx is None:  # part of the traffic is unknown: so is the rate
            assert job["rdma_bytes_per_node_hour"] is None
        else:
            per_node_hour = (tx + rx) / (spec.nodes * real.run_s(key) / 3600)
            assert job["rdma_bytes_per_node_hour"] == pytest.approx(per_node_hour, rel=REL_TOL)
    else:  # the node's traffic went to another job: none of it is this job's
        assert job["rdma_tx_bytes"] in (None, 0) and job["rdma_rx_bytes"] in (None, 0)


# ---- sing report ---------------------------------------------------------------------------


def test_report_cluster_knows_the_capacity_and_the_assignment_rate(real: RealRun) -> None:
    rows = real.sing("report", "cluster", "--bucket", "hour", *window_args(real))["rows"]
    assert rows and all(r["capacity_gpu_hours"] is not None for r in rows), rows
    hours = window_hours(real)
    capacity = sum(r["capacity_gpu_hours"] for r in rows)
    allocated = sum(r["allocated_gpu_hours"] for r in rows)
    assert capacity == pytest.approx(CAPACITY_GPUS * hours, rel=REL_TOL)
    assert allocated == pytest.approx(ALLOCATED_GPUS * hours, rel=REL_TOL)
    for row in rows:
        rate = ALLOCATED_GPUS / CAPACITY_GPUS
        assert row["assignment_rate"] == pytest.approx(rate, rel=REL_TOL), row
        assert row["util"] is not None, row  # samples cover the window
        assert row["util"] == pytest.approx(all_gpus_util(), abs=ALL_GPUS_TOL), row


def test_report_by_nodes_weighs_utilisation_by_gpu_hours(real: RealRun) -> None:
    rows = {r["nodes"]: r for r in real.sing("report", "by-nodes")["rows"]}
    assert set(rows) == {1, 2}
    train, multi, holder = (real.gpu_hours(k) for k in ("train", "multi", "holder"))
    assert rows[1]["jobs"] == 1 and rows[2]["jobs"] == 2
    assert rows[1]["gpu_hours"] == pytest.approx(train, rel=REL_TOL)
    assert rows[2]["gpu_hours"] == pytest.approx(multi + holder, rel=REL_TOL)
    util = {key: spec.use.util for key, spec in BY_KEY.items()}
    assert rows[1]["weighted_util"] == pytest.approx(util["train"], abs=UTIL_TOL)
    weighted = (util["multi"] * multi + util["holder"] * holder) / (multi + holder)
    assert rows[2]["weighted_util"] == pytest.approx(weighted, abs=UTIL_TOL)
    # Every sample of the holder's GPUs is idle, none of the others'.
    assert rows[1]["idle_gpu_hours"] == pytest.approx(0.0, abs=1e-9)
    assert rows[2]["idle_gpu_hours"] == pytest.approx(holder, rel=REL_TOL)


def test_report_idle_lists_the_job_holding_gpus_it_never_uses(real: RealRun) -> None:
    rows = real.sing("report", "idle")["rows"]
    assert [r["job_id"] for r in rows] == [real.ids["holder"]]
    (row,) = rows
    holder = BY_KEY["holder"]
    assert (row["num_nodes"], row["num_gpus"], row["user"]) == (
        holder.nodes, gpus_of("holder"), holder.user,
    )  # fmt: skip
    assert row["mean_util"] == pytest.approx(0.0, abs=UTIL_TOL)
    assert row["wasted_gpu_hours"] == pytest.approx(real.gpu_hours("holder"), rel=REL_TOL)
    assert row["low_rdma"] is True


def test_report_fairness_shares_gpu_hours_by_user(real: RealRun) -> None:
    out = real.sing("report", "fairness", *window_args(real))
    users = {r["user"]: r for r in out["rows"]}
    hours = window_hours(real)
    assert set(users) == {TEST_USER, TEST_USER2}
    gpus = {user: sum(gpus_of(s.key) for s in JOBS if s.user == user) for user in users}
    for user, row in users.items():
        assert row["gpu_hours"] == pytest.approx(gpus[user] * hours, rel=REL_TOL), user
        assert row["share"] == pytest.approx(gpus[user] / ALLOCATED_GPUS, rel=REL_TOL), user
    assert out["jain_index"] == pytest.approx(jain(list(gpus.values())), rel=REL_TOL)


# ---- dashboards ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dashboard(real: RealRun) -> Iterator[RealRun]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SING_WAREHOUSE", str(real.base / "warehouse"))
        mp.setenv("SING_CONFIG", str(real.config))
        mp.delenv("SING_DASHBOARD_DEMO", raising=False)
        yield real


def open_page(page: str, query: dict | None = None) -> AppTest:
    """A page as the admin, signed in through OIDC."""
    return open_app(ADMIN, page, query)


def pct(text: str) -> float:
    return float(text.rstrip("%")) / 100


def test_cluster_page_shows_capacity_assignment_and_use(dashboard: RealRun) -> None:
    real = dashboard
    at = open_page("cluster")
    inventory = f"{len(NODES)} nodes, {CAPACITY_GPUS} GPUs"
    assert any(inventory in c.value for c in at.caption), [c.value for c in at.caption]
    # The page's window is the data's span: from the first job's submission (Slurm's time) to
    # the newest sample; both nodes were seen before it opened. Slurm keeps whole seconds, so
    # a job submitted 0.8 s after the nodes were seen carries a submit time 0.2 s before it.
    first = min(t.submit for t in real.times.values())
    ((last,),) = real.sql("SELECT max(ts) FROM gpu_samples")
    ((seen,),) = real.sql("SELECT max(first) FROM (SELECT min(valid_from) AS first FROM nodes "
                          "WHERE gpus > 0 GROUP BY node)")  # fmt: skip
    assert seen.replace(microsecond=0) <= first and real.burst_end <= last <= real.collector_stopped
    # A node counts from when the inventory first knew it (the page's capacity), which can be
    # up to a second after that truncated submit time: enough to tip a rate near x.5% over.
    known = real.sql("SELECT min(valid_from), max(gpus) FROM nodes WHERE gpus > 0 GROUP BY node")
    assert sum(gpus for _, gpus in known) == CAPACITY_GPUS
    capacity_s = sum(gpus * (last - max(first, since)).total_seconds() for since, gpus in known)
    allocated_s = sum(gpus_of(key) * real.run_s(key) for key in real.ids)
    figures = metrics(at)
    rate = pct(figures["GPU assignment rate"])
    assert rate == pytest.approx(allocated_s / capacity_s, abs=SHOWN_TOL + 1e-9)
    used = pct(figures["GPU utilization (all GPUs)"])
    assert used == pytest.approx(all_gpus_util(), abs=SHOWN_TOL + ALL_GPUS_TOL)


@pytest.mark.parametrize("key", [spec.key for spec in JOBS])
def test_job_page_shows_the_scripted_utilisation(dashboard: RealRun, key: str) -> None:
    at = open_page("job", query={"job": dashboard.ids[key]})
    util = pct(metrics(at)["Mean GPU utilization"])
    assert util == pytest.approx(BY_KEY[key].use.util, abs=SHOWN_TOL + 1e-9)


def test_idle_jobs_page_lists_the_holder(dashboard: RealRun) -> None:
    at = open_page("idle_jobs")
    assert metrics(at)["Idle jobs"] == "1"
    assert list(at.dataframe[0].value["job"]) == [f"job?job={dashboard.ids['holder']}"]


def test_by_node_count_page_shows_the_weighted_utilisation(dashboard: RealRun) -> None:
    at = open_page("by_node_count")
    multi, holder = dashboard.gpu_hours("multi"), dashboard.gpu_hours("holder")
    util = {key: spec.use.util for key, spec in BY_KEY.items()}
    assert pct(metrics(at)["1 node"]) == pytest.approx(util["train"], abs=SHOWN_TOL + 1e-9)
    two = (util["multi"] * multi + util["holder"] * holder) / (multi + holder)
    assert pct(metrics(at)["2 nodes"]) == pytest.approx(two, abs=SHOWN_TOL + 1e-9)


def test_fairness_page_shows_jains_index_over_whole_jobs(dashboard: RealRun) -> None:
    at = open_page("fairness")
    users = {spec.user for spec in JOBS}
    hours = [sum(dashboard.gpu_hours(s.key) for s in JOBS if s.user == u) for u in users]
    shown_jain = float(metrics(at)["Jain's index (GPU-hours per user)"])
    assert shown_jain == pytest.approx(jain(hours), abs=0.005 + 1e-9)  # printed with 2 decimals
