"""Export from a real warehouse: round trip, anonymization policy, leak scan, atomic output."""

from __future__ import annotations

import io
import json
import zipfile
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sing.cli import main
from sing.traces.export import build_release, export_trace, export_zip
from sing.traces.settings import TraceSettings, load_key
from sing.traces.validate import validate
from sing.warehouse.store import Warehouse

T0 = datetime(2025, 3, 3, tzinfo=UTC)
UNTIL = T0 + timedelta(days=2)
KEY = bytes(range(32))
# sing 1.0's policy: exact times from T0, nodes in name order, one pseudonym per user; the
# protections of the default policy are tested in tests/test_traces_privacy.py.
PRECISE = TraceSettings.precise()
USERS = [
    "alice.liddell",
    "bob.marley",
    "carol.danvers",
    "dave.grohl",
    "erin.brockovich",
    "frank.ocean",
]
GROUPS = {
    "alice.liddell": "lab-quantumoptics",
    "bob.marley": "lab-quantumoptics",
    "carol.danvers": "lab-quantumoptics",
    "dave.grohl": "lab-quantumoptics",
    "erin.brockovich": "lab-quantumoptics",
    "frank.ocean": "lab-tinyrobotics",
}
HOSTS = ["gpu-rack7-node01", "gpu-rack7-node02", "gpu-rack7-node03"]
SECRETS = [
    *USERS,
    *set(GROUPS.values()),
    *HOSTS,
    "train_llama_secret",
    "/home/alice.liddell",
    "10.42.7.13",
    "finetune-covid-patients",
]


def job(
    i: int,
    user: str,
    submit_h: float,
    queue_min: float,
    run_h: float | None,
    nodes: list[str],
    gpus_per_node: int,
    state: str = "COMPLETED",
) -> dict:
    submit = T0 + timedelta(hours=submit_h)
    start = submit + timedelta(minutes=queue_min)
    return {
        "job_id": str(1000 + i),
        "cluster": "campus",
        "user": user,
        "account": GROUPS[user],
        "partition": "gpu",
        "name": "train_llama_secret" if i % 2 else "finetune-covid-patients",
        "submit_time": submit,
        "start_time": start,
        "end_time": start + timedelta(hours=run_h) if run_h is not None else None,
        "state": state,
        "exit_code": 0 if state == "COMPLETED" else None,
        "num_nodes": len(nodes),
        "gpus_per_node": gpus_per_node,
        "num_gpus": len(nodes) * gpus_per_node,
        "time_limit_s": 86_400,
        "nodes": nodes,
        "dependencies": json.dumps(
            {
                "torch": "2.3.1+cu121",
                "python": "3.11",
                "venv": "/home/alice.liddell/env",
                "note": "10.42.7.13",
            }
        ),
    }


def inventory(models: list[str] = ["A100"] * 3) -> pa.Table:  # noqa: B006 - never mutated
    """The three 4-GPU nodes of the campus cluster, known since before the window."""
    return pa.table(
        {
            "node": HOSTS,
            "gpus": [4] * 3,
            "gpu_model": models,
            "cluster": ["campus"] * 3,
            "valid_from": [T0 - timedelta(days=30)] * 3,
        }
    )


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory) -> Warehouse:
    """Six users in two groups; everyone runs 1x1 and 1x4 jobs, one user one 2x4 job."""
    wh = Warehouse(tmp_path_factory.mktemp("wh"))
    wh.append("nodes", inventory())
    jobs = []
    for u, user in enumerate(USERS):
        jobs.append(job(2 * u, user, u, 10 + u, 1 + u / 2, [HOSTS[u % 3]], 1))
        jobs.append(job(2 * u + 1, user, 6 + u, 5, 2, [HOSTS[(u + 1) % 3]], 4))
    # the only 2-node job: a rare shape (one user)
    jobs.append(job(20, "alice.liddell", 20, 30, 3, HOSTS[:2], 4))
    # still running at the window end: cut (censored) at UNTIL
    jobs.append(job(21, "bob.marley", 40, 60, None, [HOSTS[2]], 1, "RUNNING"))
    # outside the window
    jobs.append(job(22, "carol.danvers", 50, 0, 1, [HOSTS[0]], 1))
    wh.append("jobs", pa.Table.from_pylist(jobs))
    # job 1000 (alice, 1 GPU on node01): 4 samples a minute apart, 15 s cadence
    ts = [T0 + timedelta(minutes=10, seconds=15 * i) for i in range(8)]
    wh.append(
        "gpu_samples",
        pa.table(
            {
                "ts": ts,
                "node": [HOSTS[0]] * 8,
                "gpu_index": [0] * 8,
                "util": [0.2, 0.4, 0.6, 0.8, 1.0, 1.0, 1.0, 1.0],
                "sm_active": [0.5] * 8,
                "mem_used_bytes": [i * 10**9 for i in range(8)],
                "power_w": [100.0] * 4 + [300.0] * 4,
                "energy_j": [1000.0 + 50 * i for i in range(8)],
                "job_id": ["1000"] * 8,
            }
        ),
    )
    wh.append(
        "rdma_samples",
        pa.table(
            {
                "ts": ts,
                "node": [HOSTS[0]] * 8,
                "device": ["mlx5_0"] * 8,
                "port": [1] * 8,
                "tx_delta_bytes": [1000] * 8,
                "rx_delta_bytes": [10] * 8,
                "job_id": ["1000"] * 8,
            }
        ),
    )
    return wh


def warehouse_figures(wh: Warehouse) -> dict:
    """The warehouse's own answer, straight from its jobs view."""
    row = (
        wh.connect()
        .execute(
            """
        WITH w AS (
            SELECT num_gpus,
                   epoch(least(coalesce(end_time, $until), $until) - start_time) AS run_s,
                   epoch(start_time - submit_time) AS queue_s
            FROM jobs WHERE submit_time >= $since AND submit_time < $until)
        SELECT count(*), sum(run_s * num_gpus) / 3600, avg(run_s), avg(queue_s) FROM w
        """,
            {"since": T0, "until": UNTIL},
        )
        .fetchone()
    )
    return dict(zip(("jobs", "gpu_hours", "mean_run_s", "mean_queue_s"), row, strict=True))


def test_round_trip_reproduces_warehouse_aggregates(warehouse, tmp_path, capsys):
    settings = TraceSettings.precise(rare_shapes="keep")
    export_trace(warehouse, T0, UNTIL, tmp_path / "t", key=KEY, settings=settings)
    assert main(["trace", "validate", str(tmp_path / "t")]) == 0
    capsys.readouterr()
    assert main(["trace", "summary", str(tmp_path / "t")]) == 0
    summary = capsys.readouterr().out
    agg = json.loads((tmp_path / "t" / "aggregates.json").read_text())
    expected = warehouse_figures(warehouse)
    assert agg["jobs"] == expected["jobs"] == 14
    for key in ("gpu_hours", "mean_run_s", "mean_queue_s"):
        assert agg[key] == pytest.approx(expected[key], rel=1e-12)
        assert f"{key:<16} {agg[key]:,.1f}" in summary
    assert agg["censored_jobs"] == 1


def test_telemetry_summary_and_timeseries_by_hand(warehouse, tmp_path):
    export_trace(warehouse, T0, UNTIL, tmp_path / "t", key=KEY, settings=PRECISE, timeseries=True)
    jobs = pq.read_table(tmp_path / "t" / "jobs.parquet").to_pylist()
    first = next(j for j in jobs if j["submit_s"] == 0)
    assert first["gpu_util_mean"] == pytest.approx(0.75)  # (0.2+0.4+0.6+0.8+4) / 8
    assert first["gpu_util_max"] == 1.0
    assert first["gpu_mem_peak_bytes"] == 7 * 10**9
    assert first["energy_j"] == 350.0  # counter 1000 -> 1350
    assert (first["rdma_tx_bytes"], first["node_rdma_rx_bytes"]) == (8000, [80])
    assert first["nodes"] == ["n001"]
    assert json.loads(first["dependencies"]) == {"python": "3.11", "torch": "2.3.1+cu121"}
    series = pq.read_table(tmp_path / "t" / "job_timeseries.parquet").to_pylist()
    assert [
        (r["minute_s"], r["gpu_util"], r["gpu_power_w"], r["rdma_tx_bytes"]) for r in series
    ] == [
        (600, pytest.approx(0.5), 100.0, 4000),
        (660, 1.0, 300.0, 4000),
    ]
    assert series[0]["job_id"] == first["job_id"]
    assert validate(tmp_path / "t") == []


def test_k_anonymity_merges_small_groups_and_hides_a_rare_shape(warehouse, tmp_path):
    """The lone 2-node job (8 GPUs) is kept with its size hidden: its GPU count is known to
    4-127, among cover jobs of that class from enough other users that nobody holds more than
    half of them. Nothing is left out."""
    result = export_trace(warehouse, T0, UNTIL, tmp_path / "t", key=KEY, settings=PRECISE)
    jobs = pq.read_table(tmp_path / "t" / "jobs.parquet").to_pylist()
    assert result.suppressed_jobs == 0 and len(jobs) == 14
    hidden = [j for j in jobs if j["gpus_min"] is not None]
    assert {(j["gpus_min"], j["gpus_max"]) for j in hidden} == {(4, 127)}
    assert all(j["num_nodes"] is None and j["nodes"] is None for j in hidden)
    assert all(4 <= j["num_gpus"] <= 127 for j in hidden)
    owners = [j["user"] for j in hidden]  # PRECISE links a user's jobs
    assert len(set(owners)) >= 5 and 2 * max(map(owners.count, owners)) <= len(owners)
    assert {j["num_nodes"] for j in jobs if j["gpus_min"] is None} == {1}
    groups = {j["group"] for j in jobs}
    assert "other" in groups and len(groups) == 2  # frank's one-user lab merged
    readme = (tmp_path / "t" / "README.md").read_text()
    assert "0 jobs left out" in readme and "k=5" in readme


def test_no_real_name_anywhere_in_any_file(warehouse, tmp_path):
    out = tmp_path / "t"
    export_trace(
        warehouse,
        T0,
        UNTIL,
        out,
        key=KEY,
        settings=TraceSettings.precise(rare_shapes="keep"),
        timeseries=True,
    )
    archive = zipfile.ZipFile(io.BytesIO(export_zip(warehouse, T0, UNTIL, key=KEY)))
    blobs = {p.name: p.read_bytes() for p in out.iterdir()}
    blobs |= {name: archive.read(name) for name in archive.namelist()}
    for path in out.glob("*.parquet"):  # compressed pages hide text from a byte scan
        table = pq.read_table(path)
        values = [str(v) for column in table.columns for v in column.to_pylist()]
        blobs[f"{path.name} values"] = "\n".join(values).encode()
        blobs[f"{path.name} metadata"] = str(pq.read_metadata(path).metadata).encode()
    assert len(blobs) >= 14
    for name, data in blobs.items():
        for secret in SECRETS:
            for variant in {secret, secret.lower(), secret.upper()}:
                assert variant.encode() not in data, f"{variant!r} leaked into {name}"
    assert b"1000" not in blobs["jobs.parquet values"]  # real job ids are pseudonymized too


def test_pseudonyms_depend_on_the_key(warehouse, tmp_path):
    key_file = tmp_path / "release.key"
    key = load_key(key_file)  # created, 0600
    assert key_file.stat().st_mode & 0o777 == 0o600 and load_key(key_file) == key
    users = {}
    for name, k in (("a", key), ("b", key), ("c", load_key(None))):
        export_trace(warehouse, T0, UNTIL, tmp_path / name, key=k, settings=PRECISE)
        users[name] = pq.read_table(tmp_path / name / "jobs.parquet")["user"].to_pylist()
    assert users["a"] == users["b"]  # same key: linkable on purpose
    assert not set(users["a"]) & set(users["c"])  # fresh key: unlinkable


def test_csv_copy_passes_frictionless(warehouse, tmp_path):
    frictionless = pytest.importorskip("frictionless")
    export_trace(warehouse, T0, UNTIL, tmp_path / "t", key=KEY, timeseries=True)
    package = frictionless.Package(str(tmp_path / "t" / "datapackage.json"))
    for name in ("jobs-csv", "job_timeseries-csv"):
        report = package.get_resource(name).validate()
        assert report.valid, report.flatten(["rowNumber", "fieldName", "type", "note"])


def test_failed_export_leaves_nothing(warehouse, tmp_path, monkeypatch, capsys):
    from sing.traces import package as release_package

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(release_package, "_datasheet", boom)
    with pytest.raises(OSError):
        export_trace(warehouse, T0, UNTIL, tmp_path / "t", key=KEY)
    assert list(tmp_path.iterdir()) == []


def test_cli_export(warehouse, tmp_path, capsys):
    out, key_file = tmp_path / "t", tmp_path / "k"
    code = main(
        [
            "--warehouse",
            str(warehouse.root),
            "trace",
            "export",
            "--since",
            "2025-03-03",
            "--until",
            "2025-03-05",
            "--out",
            str(out),
            "--key-file",
            str(key_file),
        ]
    )
    assert code == 0, capsys.readouterr().err
    out_text = capsys.readouterr().out  # the default policy: cells of < 5 users coarsened
    assert "14 jobs" in out_text and "0 jobs left out" in out_text and key_file.exists()
    code = main(
        [
            "--warehouse",
            str(warehouse.root),
            "trace",
            "export",
            "--since",
            "2025-03-05",
            "--until",
            "2025-03-03",
            "--out",
            str(tmp_path / "x"),
        ]
    )
    assert code == 1 and "must be after" in capsys.readouterr().err


def test_dropped_fields_are_absent_and_trace_still_valid(warehouse, tmp_path):
    settings = TraceSettings.precise(drop=("dependencies", "partition"))
    export_trace(warehouse, T0, UNTIL, tmp_path / "t", key=KEY, settings=settings)
    names = pq.read_schema(tmp_path / "t" / "jobs.parquet").names
    assert "dependencies" not in names and "partition" not in names and "user" in names
    assert validate(tmp_path / "t") == []


def test_rare_shape_policies(tmp_path):
    """Three users on H100 and three on V100 are each rarer than k=5, together they are not."""
    wh = Warehouse(tmp_path / "wh")
    wh.append("nodes", inventory(["A100", "H100", "V100"]))
    jobs = [job(u, user, u, 1, 1, [HOSTS[0]], 1) for u, user in enumerate(USERS)]
    jobs += [job(10 + u, user, u, 1, 1, [HOSTS[1 + u // 3]], 1) for u, user in enumerate(USERS)]
    wh.append("jobs", pa.Table.from_pylist(jobs))
    models = {}
    for policy in ("generalize", "suppress", "keep"):
        release = build_release(wh, T0, UNTIL, KEY, TraceSettings.precise(rare_shapes=policy))
        models[policy] = (sorted(release.jobs["gpu_model"].to_pylist()), release.suppressed_jobs)
    assert models["generalize"] == (["A100"] * 6 + ["other"] * 6, 0)
    assert models["suppress"] == (["A100"] * 6, 6)
    assert models["keep"] == (["A100"] * 6 + ["H100"] * 3 + ["V100"] * 3, 0)


def test_nodes_resource_is_the_inventory_under_the_jobs_aliases_or_its_own(tmp_path):
    """Node-named aliases: the jobs' aliases, untouched nodes numbered on, a generalised
    model hidden; per-job aliases: aliases of its own by model and size. A node that left
    the cluster before the window is not listed."""
    wh = Warehouse(tmp_path / "wh")
    wh.append("nodes", inventory(["A100", "H100", "V100"]))
    wh.append(
        "nodes",
        pa.table(
            {
                "node": ["gpu-rack9-node09", "gpu-rack9-node10", "gpu-rack9-node10"],
                "gpus": [8, 4, 0],  # node10 left 10 days before the window
                "gpu_model": ["H100", "A100", "A100"],
                "cluster": ["campus"] * 3,
                "valid_from": [T0 - timedelta(days=d) for d in (30, 30, 10)],
            }
        ),
    )
    jobs = [job(u, user, u, 1, 1, [HOSTS[0]], 1) for u, user in enumerate(USERS)]
    jobs += [job(10 + u, user, u, 1, 1, [HOSTS[1 + u // 3]], 1) for u, user in enumerate(USERS)]
    wh.append("jobs", pa.Table.from_pylist(jobs))
    precise = build_release(wh, T0, UNTIL, KEY, PRECISE)
    assert sorted(precise.jobs["gpu_model"].to_pylist()) == ["A100"] * 6 + ["other"] * 6
    assert precise.jobs["gpu_request"].to_pylist() == [1.0] * 12  # = num_gpus
    assert precise.nodes.to_pylist() == [
        {"node": "n001", "gpus": 4, "gpu_model": "A100"},
        {"node": "n002", "gpus": 4, "gpu_model": "other"},  # H100, generalised in the jobs
        {"node": "n003", "gpus": 4, "gpu_model": "other"},  # V100, the same
        {"node": "n004", "gpus": 8, "gpu_model": "H100"},  # node09: no job ran on it
    ]
    per_job = build_release(wh, T0, UNTIL, KEY, TraceSettings(k=1))
    assert {tuple(n) for n in per_job.jobs["nodes"].to_pylist()} == {("n1",)}
    assert [(n["gpus"], n["gpu_model"]) for n in per_job.nodes.to_pylist()] == [
        (4, "A100"),
        (4, "H100"),
        (8, "H100"),
        (4, "V100"),
    ]
    assert per_job.nodes["node"].to_pylist() == ["n001", "n002", "n003", "n004"]
    result = export_trace(wh, T0, UNTIL, tmp_path / "t", KEY, PRECISE)
    assert pq.read_table(result.path / "nodes.parquet").num_rows == 4
    assert validate(result.path) == []
    assert "cluster: 4 nodes, 20 GPUs" in (result.path / "README.md").read_text()


def test_multi_node_job_lists_and_medians(tmp_path):
    """A job on node03 then node01: renamed nodes keep the job's order, RDMA bytes follow them,
    and the median runs over its three GPUs (a one-GPU job's median is its mean)."""
    wh = Warehouse(tmp_path / "wh")
    wh.append("nodes", inventory())
    wh.append(
        "jobs",
        pa.Table.from_pylist(
            [
                job(0, "alice.liddell", 0, 0, 2, [HOSTS[2], HOSTS[0]], 2),
                job(1, "bob.marley", 1, 0, 2, [HOSTS[1]], 1),
            ]
        ),
    )
    at = T0 + timedelta(minutes=5)
    gpus = [("1000", HOSTS[2], 0, 0.2), ("1000", HOSTS[2], 1, 0.4), ("1000", HOSTS[0], 0, 0.9)]
    gpus += [("1001", HOSTS[1], 0, 0.3)]
    wh.append(
        "gpu_samples",
        pa.Table.from_pylist(
            [
                {"ts": at, "node": n, "gpu_index": g, "util": u, "sm_active": u, "job_id": j}
                for j, n, g, u in gpus
            ]
        ),
    )
    wh.append(
        "rdma_samples",
        pa.table(
            {
                "ts": [at, at],
                "node": [HOSTS[0], HOSTS[2]],
                "device": ["mlx5_0"] * 2,
                "port": [1, 1],
                "tx_delta_bytes": [100, 300],
                "rx_delta_bytes": [1, 3],
                "job_id": ["1000", "1000"],
            }
        ),
    )
    settings = TraceSettings.precise(rare_shapes="keep")
    two_nodes, one_gpu = build_release(wh, T0, UNTIL, KEY, settings).jobs.to_pylist()
    assert two_nodes["nodes"] == ["n003", "n001"]  # node01 -> n001, node03 -> n003
    assert two_nodes["node_rdma_tx_bytes"] == [300, 100]
    assert two_nodes["node_rdma_rx_bytes"] == [3, 1]
    assert two_nodes["rdma_tx_bytes"] == 400
    assert two_nodes["gpu_util_p50"] == pytest.approx(0.4)
    assert two_nodes["gpu_util_mean"] == pytest.approx(0.5)
    assert two_nodes["sm_active_p50"] == pytest.approx(0.4)
    assert one_gpu["nodes"] == ["n002"] and one_gpu["node_rdma_tx_bytes"] == [None]
    assert one_gpu["gpu_util_p50"] == one_gpu["gpu_util_mean"] == pytest.approx(0.3)


def test_energy_across_a_counter_reset_unknown_rdma_and_clusters_kept_apart(tmp_path):
    """Job 1000's GPU counter resets mid-job (driver reload): its energy is the sum of the
    per-sample deltas after its first sample, not max - min. One of its RDMA samples had a
    saturated counter, so its traffic is unknown, not too small. Another cluster's job 1000
    on a node of the same name adds nothing to it."""
    wh = Warehouse(tmp_path / "wh")
    wh.append("nodes", inventory())
    other = job(0, "bob.marley", 0, 0, 2, [HOSTS[0]], 1) | {"cluster": "other"}
    wh.append(
        "jobs", pa.Table.from_pylist([job(0, "alice.liddell", 0, 0, 2, [HOSTS[0]], 1), other])
    )
    ts = [T0 + timedelta(minutes=5, seconds=15 * i) for i in range(4)]
    samples = {"ts": ts, "node": [HOSTS[0]] * 4, "gpu_index": [0] * 4, "util": [0.5] * 4}
    campus = samples | {
        "energy_j": [1000.0, 1100.0, 40.0, 140.0],
        "energy_delta_j": [70.0, 100.0, 40.0, 100.0],  # the first reaches back before the job
        "job_id": ["1000"] * 4,
        "cluster": ["campus"] * 4,
    }
    elsewhere = samples | {
        "energy_j": [5000.0, 9000.0, 13000.0, 17000.0],
        "energy_delta_j": [4000.0] * 4,
        "job_id": ["1000"] * 4,
        "cluster": ["other"] * 4,
    }
    wh.append("gpu_samples", pa.concat_tables([pa.table(campus), pa.table(elsewhere)]))
    rdma = {
        "ts": ts[:2],
        "node": [HOSTS[0]] * 2,
        "device": ["mlx5_0"] * 2,
        "port": [1, 1],
        "tx_bytes": [4_000_000_000, None],  # the second: a saturated 32-bit counter
        "tx_delta_bytes": [100, None],
        "rx_bytes": [10, 20],
        "rx_delta_bytes": [5, 10],
        "job_id": ["1000"] * 2,
        "cluster": ["campus"] * 2,
    }
    wh.append("rdma_samples", pa.table(rdma))
    jobs = build_release(
        wh, T0, UNTIL, KEY, TraceSettings.precise(rare_shapes="keep")
    ).jobs.to_pylist()
    mine = next(j for j in jobs if j["gpu_util_mean"] is not None and j["energy_j"] < 1000)
    assert mine["energy_j"] == pytest.approx(240.0)  # 100 + 40 + 100; max - min would be 1060
    assert mine["rdma_tx_bytes"] is None and mine["node_rdma_tx_bytes"] == [None]
    assert mine["rdma_rx_bytes"] == 15
    theirs = next(j for j in jobs if j is not mine and j["energy_j"] is not None)
    assert theirs["energy_j"] == pytest.approx(12000.0)


def test_default_policy_export_is_valid_and_says_how_it_was_made(warehouse, tmp_path):
    """The default release (secret origin, coarse times, per-job pseudonyms and node names)
    validates, states its threat model, and tells readers how to read its times."""
    export_trace(warehouse, T0, UNTIL, tmp_path / "t", key=KEY, timeseries=True)
    assert validate(tmp_path / "t") == []
    package = json.loads((tmp_path / "t" / "datapackage.json").read_text())
    assert package["release_start"].startswith("1970-01-01") and package["release_end"] is None
    assert package["anonymization"]["time_origin"] == "secret"
    assert package["anonymization"]["time_resolution_s"] == 86_400
    jobs = pq.read_table(tmp_path / "t" / "jobs.parquet")
    assert "partition" not in jobs.column_names and "start_s" not in jobs.column_names
    users, ids = jobs["user"].to_pylist(), jobs["job_id"].to_pylist()
    assert [u[2:] for u in users] == [j[2:] for j in ids]  # one pseudonym per job
    nodes = jobs["nodes"].to_pylist()
    assert all(n is None or n == [f"n{i + 1}" for i in range(len(n))] for n in nodes)
    readme = (tmp_path / "t" / "README.md").read_text()
    assert "## Threat model" in readme and "sacct -a" in readme


def test_a_node_whose_model_changed_gives_every_key_the_same_release(tmp_path) -> None:
    """A node with two inventory versions (the demo's seeded H100 history, then its H200 fake
    devices) gave each evaluation of the k rule another model per node, so about one export in
    three came out empty with exit status 0. Each job now takes its node's version at its
    start, and twelve keys give one release."""
    wh = Warehouse(tmp_path / "wh")
    wh.append("nodes", inventory())
    changed = T0 + timedelta(days=1)
    wh.append("nodes", inventory(["H100"] * 3).set_column(4, "valid_from", pa.array([changed] * 3)))
    jobs = [
        job(100 * u + i, user, 4 * i + u / 10, 5, 1, [HOSTS[0]], 1)
        for u, user in enumerate(USERS[:5])
        for i in range(12)
    ]
    wh.append("jobs", pa.Table.from_pylist(jobs))
    settings = TraceSettings(quasi_identifiers=("shape",))
    releases = [build_release(wh, T0, UNTIL, bytes([k]) * 32, settings) for k in range(12)]
    assert {r.jobs.num_rows for r in releases} == {len(jobs)}
    # six jobs per user before the change, six after: the version at each job's start
    models = releases[0].jobs["gpu_model"].to_pylist()
    assert {m: models.count(m) for m in set(models)} == {"A100": 30, "H100": 30}


def test_a_release_that_keeps_nothing_is_refused_and_nothing_written(
    tmp_path, warehouse, capsys
) -> None:
    """Six users, a k of 7: no cell can be kept. Exit status 0 with "0 jobs" passed for a
    release; it is refused with the reason now, and the directory is not created."""
    config = tmp_path / "sing.toml"
    config.write_text("[trace]\nk = 7\n")
    out = tmp_path / "release"
    args = ["--config", str(config), "--warehouse", str(warehouse.root), "trace", "export"]
    window = ["--since", T0.isoformat(), "--until", UNTIL.isoformat(), "--out", str(out)]
    assert main([*args, *window]) == 1
    assert not out.exists()
    err = capsys.readouterr().err
    assert "the release would keep 0 of the window's 14 jobs" in err and "k=7 rule" in err


def test_a_release_under_the_configured_share_is_refused(warehouse) -> None:
    """The fixture's release without coarsening keeps some jobs; asking for all of them
    refuses it, with the shares; asking for none writes it."""
    release = build_release(warehouse, T0, UNTIL, KEY, TraceSettings(rare_shapes="suppress"))
    kept = release.jobs.num_rows
    assert 0 < kept < release.window_jobs
    assert release.refusal(TraceSettings()) is None
    refusal = release.refusal(TraceSettings(min_kept_share=1.0))
    share = f"{kept / release.window_jobs:.0%}"
    assert (
        refusal.startswith(f"the release would keep {kept:,} of the window's") and share in refusal
    )
