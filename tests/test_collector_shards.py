"""Several collectors, one warehouse: three real `sing collector` processes, each scraping its
shard of one file_sd list of `sing exporter --fake` nodes, killed (SIGKILL) and restarted while
they run. Every row each one said it wrote is stored, none twice, and no node is scraped by two
shards; job sync and maintenance run in one collector at a time (the leader), and move to
another when the leader is killed.

The warehouse is a local directory, or a bucket on a real S3 server (SeaweedFS on loopback,
tests/s3_server.py) that the collectors reach over HTTP as they would reach object storage from
several hosts. The job source is this file's `record_sync`, installed as a site would install
one: it writes a job record and notes each sync (pid, start, end) in the test's `syncs.log`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest
from deltalake.exceptions import DeltaError

from sing.collector.leader import Leadership
from sing.collector.selfmetrics import SelfMetrics
from sing.collector.service import Collector
from sing.collector.settings import CollectorSettings
from sing.collector.shard import Shard, bucket
from sing.config import Config
from sing.executors.records import NodeRecord
from sing.warehouse import delta, lease
from sing.warehouse.maintenance import CHECKPOINT_EVERY
from sing.warehouse.store import Warehouse
from tests import daemons, s3_server
from tests.ports import free_port
from tests.test_collector_scrape import (
    REPO,
    fake_exporter,
    file_sd_entry,
    http_get,
    sing,
    wait_for,
    write_config,
)

SHARDS = 3
NODES_PER_SHARD = 2
GPUS = 4  # NODE_YAML's
SYNC_S = 2.0
MAINTENANCE_S = 4.0
TTL_S = 6.0
# Where `record_sync`, in the collectors' processes, notes each sync (a test-only variable).
SYNCS_LOG = "SHARDS_TEST_SYNCS_LOG"


def record_sync(config: Config, warehouse: Warehouse) -> None:
    """The collectors' job source: one running job, and a line `pid start end` in syncs.log."""
    start = time.time()
    job = {"job_id": "77", "cluster": config.site.cluster, "user": "ann", "state": "RUNNING"}
    warehouse.append("jobs", pa.Table.from_pylist([job | {"start_time": datetime.now(UTC)}]))
    time.sleep(0.3)  # as long as a real sacct, so that two syncs at once would overlap
    with open(os.environ[SYNCS_LOG], "a") as fh:
        fh.write(f"{os.getpid()} {start} {time.time()}\n")


def node_names() -> dict[int, list[str]]:
    """NODES_PER_SHARD node names for each shard 1..SHARDS."""
    shards: dict[int, list[str]] = {k: [] for k in range(1, SHARDS + 1)}
    i = 0
    while any(len(names) < NODES_PER_SHARD for names in shards.values()):
        name = f"gpu{i:03d}"
        names = shards[bucket(name, SHARDS) + 1]
        if len(names) < NODES_PER_SHARD:
            names.append(name)
        i += 1
    return shards


@dataclass
class Run:
    """One collector process, from its start to its kill or stop."""

    shard: int
    proc: subprocess.Popen
    port: int
    log: Path
    started: datetime
    ended: datetime | None = None
    # Its self-metrics read just before it was killed or stopped.
    rounds: float = 0.0
    gpu_rows: float = 0.0

    def metric(self, name: str) -> float:
        text = http_get(f"http://127.0.0.1:{self.port}/metrics")
        return sum(
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name)
        )

    def answers(self) -> bool:
        return bool(http_get(f"http://127.0.0.1:{self.port}/metrics"))

    def leads(self) -> bool:
        return self.metric("sing_collector_leader ") == 1

    def count(self) -> None:
        self.rounds = self.metric("sing_collector_rounds_total")
        self.gpu_rows = self.metric('sing_collector_rows_written_total{table="gpu_samples"}')


@dataclass
class Fleet:
    """The collectors of the test, started and stopped as an operator would."""

    tmp_path: Path
    config: Path
    wh: Warehouse
    env: dict[str, str]
    stack: ExitStack
    runs: list[Run] = field(default_factory=list)

    def start(self, *shards: int) -> list[Run]:
        """Collectors of `shards`, started together, each once its /metrics answers; one whose
        free port was taken meanwhile (by tests running beside this one) starts again on
        another."""
        pending, started = list(shards), []
        for _ in range(3):
            runs = [self._spawn(shard) for shard in pending]
            for run in runs:
                wait_for(lambda r=run: r.proc.poll() is not None or r.answers(), 60, "/metrics")
                if run.proc.poll() is None:
                    started.append(run)
                else:
                    assert "Address already in use" in run.log.read_text(), run.log.read_text()
            self.runs += [r for r in runs if r in started]
            pending = [r.shard for r in runs if r not in started]
            if not pending:
                return started
        raise AssertionError(f"shards {pending} found no free port")

    def _spawn(self, shard: int) -> Run:
        port = free_port()
        log = self.tmp_path / f"collector-{shard}-{port}.log"
        argv = sing("--config", str(self.config), "--warehouse", str(self.wh.root), "collector")
        argv += ["--shard", f"{shard}/{SHARDS}", "--metrics-port", str(port)]
        started = datetime.now(UTC)
        proc = daemons.spawn(argv, log, self.env, daemons.owner_mark("shards"), cwd=REPO)
        self.stack.callback(daemons.stop, proc, 5)
        return Run(shard, proc, port, log, started)

    def live(self) -> list[Run]:
        return [r for r in self.runs if r.ended is None]

    def stored_rounds(self, run: Run) -> int:
        return len(self.rounds_of(run))

    def rounds_of(self, run: Run) -> list[datetime]:
        """The stored rounds of the run's shard while it ran."""
        until = run.ended or datetime.now(UTC)
        nodes = node_names()[run.shard]
        query = "SELECT DISTINCT ts FROM scrapes WHERE node IN ? AND ts >= ? AND ts <= ?"
        con = self.wh.connect()
        return [t for (t,) in con.execute(query, [nodes, run.started, until]).fetchall()]

    def wait_rounds(self, run: Run, rounds: int = 3) -> None:
        wait_for(lambda: self.stored_rounds(run) >= rounds, 60, f"shard {run.shard}'s rounds")

    def leader(self) -> Run:
        """The one live collector that says it leads (the others, that they do not)."""

        def one() -> Run | None:
            leading = [r for r in self.live() if r.leads()]
            return leading[0] if len(leading) == 1 else None

        return wait_for(one, 60, "exactly one leader")

    def end(self, run: Run, sig: int) -> None:
        run.count()
        if sig == signal.SIGKILL:
            run.proc.send_signal(sig)
            run.proc.wait(30)
        else:
            assert daemons.stop(run.proc, 15) == 0
        run.ended = datetime.now(UTC)


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[s3_server.S3Server]:
    with s3_server.seaweedfs(tmp_path_factory.mktemp("weed")) as running:
        yield running


@pytest.fixture(params=["disk", pytest.param("s3", marks=s3_server.NEEDS_WEED)])
def warehouse(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Warehouse, dict[str, str]]]:
    """The shared warehouse, a directory or a fresh bucket on the S3 server, and the variables
    that point a process at it (this one's set too, for the test's reads)."""
    if request.param == "disk":
        yield Warehouse(tmp_path / "wh"), {}
        return
    server: s3_server.S3Server = request.getfixturevalue("s3")
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    yield Warehouse(f"s3://{server.new_bucket()}/warehouse"), server.env()


@pytest.fixture
def fleet(
    tmp_path: Path, install_source, warehouse: tuple[Warehouse, dict[str, str]]
) -> Iterator[Fleet]:
    install_source(f"{__name__}:record_sync")
    names = node_names()
    with ExitStack() as stack:
        ports = stack.enter_context(
            fake_exporter(tmp_path, [n for shard in names.values() for n in shard])
        )
        targets = tmp_path / "targets.json"
        targets.write_text(json.dumps([file_sd_entry(n, p) for n, p in ports.items()]))
        config = write_config(
            tmp_path / "sing.toml",
            targets,
            interval_s=1.0,
            job_sync=f"{__name__}:record_sync",
            job_sync_interval_s=SYNC_S,
            node_inventory="",
            maintenance_interval_s=MAINTENANCE_S,
            leader_lease_ttl_s=TTL_S,
        )
        with open(config, "a") as fh:
            fh.write("[health]\ninterval_s = 0\n")
        site = str(tmp_path / "site-packages")
        wh, wh_env = warehouse
        env = os.environ | wh_env | {"PYTHONPATH": os.pathsep.join([site, str(REPO)])}
        env[SYNCS_LOG] = str(tmp_path / "syncs.log")
        yield Fleet(tmp_path, config, wh, env, stack)


@pytest.mark.timeout(150)
def test_three_sharded_collectors_killed_and_restarted_store_every_row_once(
    fleet: Fleet, record_property: Callable[[str, object], None]
) -> None:
    began = time.time()
    first = fleet.start(*range(1, SHARDS + 1))
    for run in first:
        fleet.wait_rounds(run)
    leader = fleet.leader()
    wait_for(lambda: (fleet.tmp_path / "syncs.log").exists(), 30, "the leader's first job sync")
    fleet.end(leader, signal.SIGKILL)
    killed_leader_at = time.time()
    successor = fleet.leader()  # after the killed leader's lease lapsed
    assert successor is not leader
    record_property("failover_s", round(time.time() - killed_leader_at, 1))  # for --junitxml
    fleet.wait_rounds(*fleet.start(leader.shard))
    follower = next(r for r in fleet.live() if r is not successor)
    fleet.end(follower, signal.SIGKILL)
    fleet.wait_rounds(*fleet.start(follower.shard))
    wait_for(lambda: synced_by(fleet, successor, after=killed_leader_at), 30, "a sync by the next")
    last_leader = fleet.leader()
    for run in fleet.live():
        fleet.end(run, signal.SIGTERM)
    seconds = time.time() - began
    record_property("collectors_s", round(seconds, 1))

    con = fleet.wh.connect()
    doubled = con.execute(
        "SELECT node, gpu_index, ts, count(*) FROM gpu_samples GROUP BY ALL HAVING count(*) > 1"
    ).fetchall()
    assert doubled == []
    # Each round holds its shard's nodes, all GPUs of each: no node scraped by two shards.
    names = node_names()
    expected = {frozenset(names[k]) for k in names}
    rounds = con.execute(
        "SELECT s.ts, list(DISTINCT s.node), count(g.node) FROM scrapes s "
        "LEFT JOIN gpu_samples g USING (ts, node) GROUP BY s.ts"
    ).fetchall()
    assert {frozenset(nodes) for _, nodes, _ in rounds} == expected
    assert all(gpus == GPUS * NODES_PER_SHARD for _, _, gpus in rounds), rounds
    # One inventory version per node: no shard wrote another's, no restart wrote one again.
    versions = con.execute("SELECT node, count(*) FROM nodes GROUP BY node").fetchall()
    assert sorted(versions) == sorted((n, 1) for shard in names.values() for n in shard)
    # Every round and row a collector counted as written is stored; a killed one's round in
    # flight may have some tables stored (each whole), the rest not.
    for run in fleet.runs:
        stored = fleet.rounds_of(run)
        assert len(stored) >= run.rounds >= 2, (run.shard, run.rounds, len(stored))
        window = [node_names()[run.shard], run.started, run.ended]
        per_round = con.execute(
            "SELECT ts, count(*) FROM gpu_samples WHERE node IN ? AND ts BETWEEN ? AND ? "
            "GROUP BY ts",
            window,
        ).fetchall()
        assert {n for _, n in per_round} == {GPUS * NODES_PER_SHARD}
        in_flight = {ts for ts, _ in per_round} - set(stored)
        assert len(in_flight) <= (run.proc.returncode == -signal.SIGKILL), in_flight
        assert GPUS * NODES_PER_SHARD * len(per_round) >= run.gpu_rows

    syncs = sorted(
        (float(start), float(end), int(pid))
        for pid, start, end in (
            line.split() for line in (fleet.tmp_path / "syncs.log").read_text().splitlines()
        )
    )
    for (_, end, pid), (start, _, next_pid) in zip(syncs, syncs[1:], strict=False):
        assert pid == next_pid or start >= end, "two collectors synced jobs at once"
    assert {pid for *_, pid in syncs} >= {leader.proc.pid, successor.proc.pid}
    # One collector's syncs, not three's: at most one per interval (coalesced when late).
    assert len(syncs) <= seconds / SYNC_S + 3, (len(syncs), seconds)
    compactions = sum(r.log.read_text().count(" compaction: ") for r in fleet.runs)
    assert 1 <= compactions <= seconds / MAINTENANCE_S + 3, (compactions, seconds)
    followers = [r for r in fleet.runs if "follower: leader-only jobs skipped" in r.log.read_text()]
    assert len(followers) >= SHARDS - 1
    assert "released the leader lease" in last_leader.log.read_text()
    # Checkpoints kept up through the kills: a maintainer killed mid-checkpoint kept the
    # others out for its lease at most (on S3 the leader's; a lock on disk).
    for name in ("gpu_samples", "scrapes"):
        table = delta.open_table(fleet.wh.table_dir(name))
        assert table is not None
        assert delta.versions_since_checkpoint(table) <= 2 * CHECKPOINT_EVERY, name


def hold_leader_and_maintenance(root: str) -> None:
    """A leader in the middle of maintenance until it is killed (run in a subprocess)."""
    wh = Warehouse(root)
    assert Leadership(wh, TTL_S, SelfMetrics()).leading()
    with wh.maintenance_lock() as held:
        assert held
        print("held", flush=True)
        time.sleep(3600)


def maintains(wh: Warehouse) -> bool:
    with wh.maintenance_lock() as held:
        return held


@pytest.mark.parametrize("warehouse", ["s3"], indirect=True)
@pytest.mark.timeout(120)
def test_a_leader_killed_mid_maintenance_leaves_it_to_the_next_within_its_lease(
    warehouse: tuple[Warehouse, dict[str, str]],
) -> None:
    """On object storage the maintenance lease of a collector lasts as long as its leader
    lease: a leader SIGKILLed while it compacts keeps the next leader from maintenance (and
    every collector from checkpoints) that long at most, not the 10 minutes of a by-hand run."""
    wh, env = warehouse
    code = f"from {__name__} import hold_leader_and_maintenance as h; h({str(wh.root)!r})"
    holder = subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO, env=os.environ | env, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        follower = Leadership(wh, TTL_S, SelfMetrics())
        assert not follower.leading() and not maintains(wh)
    finally:
        holder.kill()
        holder.wait()
    killed = time.monotonic()
    try:
        wait_for(follower.leading, 2 * TTL_S, "the next leader")
        wait_for(lambda: maintains(wh), 2 * TTL_S, "maintenance by the next leader")
        assert time.monotonic() - killed < 2 * TTL_S
    finally:
        follower.release()


def synced_by(fleet: Fleet, run: Run, after: float) -> bool:
    lines = (fleet.tmp_path / "syncs.log").read_text().splitlines()
    return any(int(pid) == run.proc.pid and float(s) > after for pid, s, _ in map(str.split, lines))


def test_shards_split_any_node_list_evenly_and_stably() -> None:
    """Every node in exactly one shard, the same in every process (no salted `hash`), and a
    thousand nodes split into three near-equal parts."""
    nodes = [f"node{i:04d}" for i in range(1000)]
    shards = [Shard.parse(f"{k}/3") for k in (1, 2, 3)]
    owners = [[s for s in shards if s.owns(n)] for n in nodes]
    assert all(len(o) == 1 for o in owners)
    sizes = [sum(o[0] is s for o in owners) for s in shards]
    assert min(sizes) > 280, sizes
    code = "from sing.collector.shard import bucket; print(bucket('node0001', 3))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert int(other.stdout) == bucket("node0001", 3)
    assert Shard.parse("").owns("anything")


def test_a_shard_lists_and_inventories_its_own_nodes_only(tmp_path: Path) -> None:
    """The executor lists every node; each shard's collector keeps its own, and never reads
    another shard's nodes as gone (a version with 0 GPUs)."""
    names = node_names()
    everyone = [NodeRecord(n, 8, "a100", "gpu") for shard in names.values() for n in shard]
    wh = Warehouse(tmp_path / "wh")

    def run_collector(shard: str) -> set[str]:
        settings = CollectorSettings(shard=shard)
        collector = Collector(Config({}), settings, wh, lambda: [], node_source=lambda _: everyone)
        collector.sync_jobs()
        collector.scrape_round()
        collector.close()
        return {node for _, node in collector.listed or {}}

    assert run_collector("") == {n.node for n in everyone}  # one collector: all nodes
    for k in range(1, SHARDS + 1):
        assert run_collector(f"{k}/{SHARDS}") == set(names[k])
    versions = wh.connect().execute("SELECT node, gpus FROM nodes ORDER BY node").fetchall()
    assert versions == sorted((n.node, 8) for n in everyone)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--shard", "4/3"], 'shard = "4/3": write "k/n" with 1 <= k <= n'),
        (["--shard", "two"], 'shard = "two": write "k/n"'),
        (["--shard", "1/2", "--pull", "http://127.0.0.1:1"], "run one pulling collector"),
    ],
)
def test_a_bad_shard_is_a_clear_error(tmp_path: Path, options: list[str], message: str) -> None:
    result = subprocess.run(
        sing("--warehouse", str(tmp_path / "wh"), "collector", "--once", *options),
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert message in result.stderr


def leadership_moves(root: str | Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two collectors' claims to one warehouse's leader lease (60 s, on a clock the test moves):
    one leads, the other follows; a clean stop hands it over at once; a leader whose renewals
    fail (the store unreachable for its commits) stops leading while a third of its lease is
    left, and the other takes over once it lapsed."""
    offset = [0.0]
    clock = SimpleNamespace(
        time=lambda: time.time() + offset[0], strftime=time.strftime, gmtime=time.gmtime
    )
    monkeypatch.setattr(lease, "time", clock)
    wh = Warehouse(root)
    a, b = (Leadership(wh, 60.0, SelfMetrics()) for _ in range(2))
    try:
        assert a.leading() and not b.leading()
        gauges = [c.metrics.registry.get_sample_value("sing_collector_leader") for c in (a, b)]
        assert gauges == [1, 0]
        a.release()
        assert b.leading() and not a.leading()
        commit = lease._commit

        def unreachable(*_args: object) -> None:
            raise DeltaError("the store does not answer")

        monkeypatch.setattr(lease, "_commit", unreachable)  # no renewal (nor release) goes through
        offset[0] += 41  # 19 s of b's lease left: less than a third
        assert not b.leading()  # fails closed
        assert not a.leading()  # the lease has not lapsed yet
        monkeypatch.setattr(lease, "_commit", commit)
        offset[0] += 20
        assert a.leading() and not b.leading()
    finally:  # no renewer thread left running into the interpreter's exit
        a.release()
        b.release()


def test_the_leader_lease_moves_on_a_clean_stop_and_on_lapsed_renewals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leadership_moves(tmp_path / "wh", monkeypatch)
