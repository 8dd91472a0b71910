"""Usage, charges, allocations, energy and carbon on tiny hand-made warehouses.

Jobs, GPUs held, node inventory and GPU samples are written through `Warehouse.append` as the
collector writes them (tests.test_analytics has the helpers: samples every 15 minutes, constant
power, each sample's energy delta the step before it). Every expected number is worked out by
hand in the test's docstring or comments.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from sing.accounting.periods import period_window
from sing.accounting.settings import AccountingSettings
from sing.accounting.usage import snapshot, usage
from sing.collector.counters import CounterDeltas
from sing.demo import synthetic
from sing.errors import UserError
from sing.warehouse.rollups import IDLE_SAMPLE_UTIL
from sing.warehouse.store import Warehouse
from tests.test_analytics import (
    GIB,
    STEP,
    T0,
    add_gpu_samples,
    add_job,
    at,
    run_sing,
    sample_times,
)

DAY = timedelta(days=1)
STEP_J_100W = 100.0 * STEP.total_seconds()  # one step's energy at 100 W: 90 kJ
KWH = 3.6e6


def add_node(
    wh: Warehouse, node: str, model: str, gpus: int = 4, valid_from: datetime = T0 - 30 * DAY
) -> None:
    """One inventory version of a node: `model` GPUs from `valid_from` on."""
    wh.append(
        "nodes",
        pl.DataFrame(
            {
                "node": [node],
                "gpus": [gpus],
                "gpu_model": [model],
                "gpu_memory_bytes": [80 * GIB],
                "partition": ["gpu"],
                "cluster": ["test"],
                "valid_from": [valid_from],
                "source": ["exporter"],
            }
        ),
    )


def by_group(frame: pl.DataFrame, column: str) -> dict:
    return {r[column]: r for r in frame.to_dicts()}


def run(wh: Warehouse, by: str, since: datetime, until: datetime, **settings) -> dict:
    frame = usage(wh.connect(), by, since, until, AccountingSettings(**settings), now=at(48))
    return by_group(frame, by)


@pytest.fixture
def midnight(tmp_path: Path) -> Warehouse:
    """Job X: 2 GPUs of n1 from 22:00 to 01:00 (across the UTC day), 100 W each; GPU 0 at util
    0.5, GPU 1 idle (util 0). Job Y: 1 GPU, on the next afternoon, outside the first day."""
    wh = Warehouse(tmp_path / "wh")
    add_node(wh, "n1", "H100")
    add_job(wh, "X", ["n1"], 2, at(12), at(15), submit=at(11))
    add_gpu_samples(wh, "X", "n1", [0], at(12), at(15), 0.5)
    add_gpu_samples(wh, "X", "n1", [1], at(12), at(15), 0.0)
    add_job(wh, "Y", ["n1"], 1, at(30), at(31), user="bob")
    add_gpu_samples(wh, "Y", "n1", [2], at(30), at(31), 1.0)
    return wh


def test_a_window_counts_only_the_hours_inside_it(midnight: Warehouse) -> None:
    """The first UTC day holds 2 of X's 3 hours (22:00-24:00): 4 GPU-hours, half used (mean
    util 0.25 -> 1 used), half idle (GPU 1's samples); energy: 8 samples per GPU there, less
    each GPU's first (its delta reaches back before the job): 14 x 90 kJ = 0.35 kWh."""
    day = T0.replace(hour=0)
    first = run(midnight, "user", day, day + DAY)
    assert set(first) == {"alice"}
    alice = first["alice"]
    assert alice["jobs"] == 1
    assert alice["allocated_gpu_hours"] == pytest.approx(4.0)
    assert alice["used_gpu_hours"] == pytest.approx(1.0)
    assert alice["idle_gpu_hours"] == pytest.approx(2.0)
    assert alice["unmeasured_gpu_hours"] == 0
    assert alice["energy_kwh"] == pytest.approx(14 * STEP_J_100W / KWH)
    assert alice["mean_wait_s"] == pytest.approx(3600)
    assert alice["carbon_kg"] is None  # no intensity configured

    # The next day: X's last hour (8 samples, none a first) and all of Y.
    second = run(midnight, "user", day + DAY, day + 2 * DAY)
    assert second["alice"]["allocated_gpu_hours"] == pytest.approx(2.0)
    assert second["alice"]["used_gpu_hours"] == pytest.approx(0.5)
    assert second["alice"]["energy_kwh"] == pytest.approx(8 * STEP_J_100W / KWH)
    assert second["bob"]["allocated_gpu_hours"] == pytest.approx(1.0)
    assert second["bob"]["used_gpu_hours"] == pytest.approx(1.0)

    # Both days give the whole job: the parts add up.
    both = run(midnight, "user", day, day + 2 * DAY)
    assert both["alice"]["allocated_gpu_hours"] == pytest.approx(6.0)
    assert both["alice"]["energy_kwh"] == pytest.approx(22 * STEP_J_100W / KWH)


def test_a_window_that_cuts_days_prorates_them(midnight: Warehouse) -> None:
    """23:00-00:30 holds half of X's time on each day: 2 GPUs x 1.5 h; energy half of each
    day's (0.5 x 14 + 0.5 x 8 steps)."""
    alice = run(midnight, "user", at(13), at(14.5))["alice"]
    assert alice["allocated_gpu_hours"] == pytest.approx(3.0)
    assert alice["used_gpu_hours"] == pytest.approx(0.75)
    assert alice["energy_kwh"] == pytest.approx(11 * STEP_J_100W / KWH)


def test_a_window_that_cuts_a_later_day_leaves_out_first_samples_on_the_whole_one(
    midnight: Warehouse,
) -> None:
    """Midnight to 00:30: X's first day whole (2 GPUs x 2 h, 14 steps: the GPUs' first samples
    left out there) and half of its second (2 x 0.5 h, half of 8 steps): 5 GPU-hours, at mean
    util 0.25 on both days, and 18 steps of energy."""
    alice = run(midnight, "user", T0.replace(hour=0), at(14.5))["alice"]
    assert alice["allocated_gpu_hours"] == pytest.approx(5.0)
    assert alice["used_gpu_hours"] == pytest.approx(1.25)
    assert alice["energy_kwh"] == pytest.approx(18 * STEP_J_100W / KWH)


def test_charge_units_by_model_weight_and_inventory_version(tmp_path: Path) -> None:
    """a1 has A100s (weight 2), h1 H100s (default 1) until 15:00, H200s (weight 3) after.

    M: 2 GPUs on each of a1 and h1, 1 h -> 2 A100-hours + 2 H100-hours, 6 units.
    N: 1 GPU of h1, 2 h from 10:00 -> 2 H100-hours, 2 units.
    P: 1 GPU of h1 from 16:00, 1 h -> 1 H200-hour, 3 units.
    Q: on a node missing from the inventory, 1 GPU, 1 h -> model unknown, default weight."""
    wh = Warehouse(tmp_path / "wh")
    add_node(wh, "a1", "A100")
    add_node(wh, "h1", "H100")
    add_node(wh, "h1", "H200", valid_from=at(5))
    add_job(wh, "M", ["a1", "h1"], 2, at(0), at(1))
    add_job(wh, "N", ["h1"], 1, at(0), at(2), user="bob")
    add_job(wh, "P", ["h1"], 1, at(6), at(7), user="bob")
    add_job(wh, "Q", ["x9"], 1, at(0), at(1), user="carol")
    weights = {"A100": 2.0, "H200": 3.0}
    models = run(wh, "model", at(-1), at(24), gpu_weights=weights)
    assert {
        m: (r["jobs"], r["allocated_gpu_hours"], r["charge_units"]) for m, r in models.items()
    } == {
        "A100": (1, pytest.approx(2.0), pytest.approx(4.0)),
        "H100": (2, pytest.approx(4.0), pytest.approx(4.0)),
        "H200": (1, pytest.approx(1.0), pytest.approx(3.0)),
        None: (1, pytest.approx(1.0), pytest.approx(1.0)),
    }
    users = run(wh, "user", at(-1), at(24), gpu_weights=weights, default_weight=0.5)
    assert users["alice"]["charge_units"] == pytest.approx(2 * 2.0 + 2 * 0.5)
    assert users["bob"]["charge_units"] == pytest.approx(2 * 0.5 + 1 * 3.0)
    assert users["carol"]["charge_units"] == pytest.approx(0.5)
    # no samples at all: every GPU-hour is unmeasured, used and idle stay unknown-as-zero
    assert users["bob"]["unmeasured_gpu_hours"] == pytest.approx(3.0)


def test_allocations_per_account_and_period(tmp_path: Path) -> None:
    """alice-lab holds 100 units for January and 50 for February, idle-lab 10 for January;
    alice's 2-GPU, 3-hour job in January is charged 6 units (weight 1)."""
    wh = Warehouse(tmp_path / "wh")
    add_node(wh, "n1", "H100")
    add_job(wh, "A", ["n1"], 2, at(0), at(3))
    allocations = {"alice-lab": {"2026-01": 100.0, "2026-02": 50.0}, "idle-lab": {"2026-01": 10.0}}
    january = run(wh, "account", *period_window("2026-01"), allocations=allocations)
    assert january["alice-lab"]["charge_units"] == pytest.approx(6.0)
    assert january["alice-lab"]["allocation_units"] == 100.0
    assert january["alice-lab"]["remaining_units"] == pytest.approx(94.0)
    idle = january["idle-lab"]
    assert (idle["jobs"], idle["charge_units"], idle["allocation_units"]) == (0, 0.0, 10.0)
    assert idle["remaining_units"] == 10.0 and idle["mean_wait_s"] is None
    quarter = run(wh, "account", *period_window("2026-Q1"), allocations=allocations)
    assert quarter["alice-lab"]["allocation_units"] == 150.0
    # a window inside a period holds no whole period: no allocation to compare with
    one_day = run(
        wh, "account", T0.replace(hour=0), T0.replace(hour=0) + DAY, allocations=allocations
    )
    assert one_day["alice-lab"]["allocation_units"] is None
    assert "idle-lab" not in one_day


def test_energy_across_a_counter_reset(tmp_path: Path) -> None:
    """GPU 0's counter resets to 5 kJ at the job's 5th sample (a driver reload). The collector's
    deltas read that as 5 kJ accrued; the job's first sample follows an unassigned one, so its
    delta (before the job) is left out: 6 x 90 kJ + 5 kJ."""
    wh = Warehouse(tmp_path / "wh")
    add_node(wh, "n1", "H100")
    add_job(wh, "R", ["n1"], 1, at(0), at(2))
    deltas = CounterDeltas()
    counter = 1e6
    rows = []
    for k, ts in enumerate([at(0) - STEP, *sample_times(at(0), at(2))]):
        counter = 5000.0 if k == 5 else counter + STEP_J_100W
        rows.append(
            {
                "ts": ts,
                "cluster": "test",
                "node": "n1",
                "gpu_index": 0,
                "util": 1.0,
                "power_w": 100.0,
                "energy_j": counter,
                "energy_delta_j": deltas.delta(("n1", 0), counter),
                "job_id": None if k == 0 else "R",
            }
        )
    wh.append("gpu_samples", pl.DataFrame(rows))
    alice = run(wh, "user", at(-1), at(3))["alice"]
    assert alice["energy_kwh"] == pytest.approx((6 * STEP_J_100W + 5000.0) / KWH)


def test_node_share_and_pue(tmp_path: Path) -> None:
    """A 1-GPU job of 2 h on a 4-GPU node of 800 W host power carries 1/4 of it: 1.44 MJ, plus
    its GPU's 7 x 90 kJ; x PUE 1.5. The A100 node's own host power (1200 W) overrides."""
    wh = Warehouse(tmp_path / "wh")
    add_node(wh, "n1", "H100")
    add_node(wh, "a1", "A100", gpus=8)
    add_job(wh, "S", ["n1"], 1, at(0), at(2))
    add_gpu_samples(wh, "S", "n1", [0], at(0), at(2), 1.0)
    add_job(wh, "T", ["a1"], 2, at(0), at(1), user="bob")  # no samples: host share only
    settings = {"node_power_w": 800.0, "node_power_w_by_model": {"A100": 1200.0}, "pue": 1.5}
    users = run(wh, "user", at(-1), at(3), **settings)
    gpu_j, host_j = 7 * STEP_J_100W, 800.0 / 4 * 7200
    assert users["alice"]["energy_kwh"] == pytest.approx((gpu_j + host_j) * 1.5 / KWH)
    assert users["bob"]["energy_kwh"] == pytest.approx(1200.0 * 2 / 8 * 3600 * 1.5 / KWH)


@pytest.fixture
def two_powers(tmp_path: Path) -> Warehouse:
    """Job C, 1 GPU 10:00-12:00: 100 W in the first hour, 300 W in the second. Energy: 3 x 90 kJ
    (the first sample left out) + 4 x 270 kJ = 1.35 MJ = 0.375 kWh."""
    wh = Warehouse(tmp_path / "wh")
    add_node(wh, "n1", "H100")
    add_job(wh, "C", ["n1"], 1, at(0), at(2))
    add_gpu_samples(wh, "C", "n1", [0], at(0), at(1), 1.0, power_w=100.0)
    add_gpu_samples(wh, "C", "n1", [0], at(1), at(2), 1.0, power_w=300.0)
    return wh


def test_carbon_from_a_constant_intensity(two_powers: Warehouse) -> None:
    alice = run(two_powers, "user", at(-1), at(3), carbon_intensity=250.0)["alice"]
    assert alice["energy_kwh"] == pytest.approx(0.375)
    assert alice["carbon_kg"] == pytest.approx(0.375 * 250 / 1000)


def test_carbon_by_hour_of_use_from_a_series(two_powers: Warehouse, tmp_path: Path) -> None:
    """10:00 at 100 g/kWh, 11:00 at 300: weighted by the GPU's power in each hour (4 x 100 W vs
    4 x 300 W of samples) the job's intensity is (400 x 100 + 1200 x 300) / 1600 = 250 g/kWh.
    A series that stops at 10:00 covers only that hour: the carbon is unknown, not a guess."""
    series = tmp_path / "intensity.csv"
    series.write_text(
        "time,g_per_kwh\n2026-01-05T10:00:00Z,100\n2026-01-05T11:00:00Z,300\n"
        "2026-01-05T12:00:00Z,900\n"
    )
    alice = run(two_powers, "user", at(-1), at(3), carbon_intensity_file=str(series))["alice"]
    assert alice["carbon_kg"] == pytest.approx(0.375 * 250 / 1000)

    short = tmp_path / "short.csv"
    short.write_text("time,g_per_kwh\n2026-01-05T10:00:00Z,100\n")
    alice = run(two_powers, "user", at(-1), at(3), carbon_intensity_file=str(short))["alice"]
    assert alice["carbon_kg"] is None
    assert alice["energy_kwh"] == pytest.approx(0.375)


def test_carbon_series_weighs_by_time_without_power_samples(tmp_path: Path) -> None:
    """A job without samples (host power only) is weighted by its time in each hour: 45 min at
    100 g/kWh and 60 min at 300 -> (0.75 x 100 + 1 x 300) / 1.75."""
    wh = Warehouse(tmp_path / "wh")
    add_node(wh, "n1", "H100")
    add_job(wh, "D", ["n1"], 4, at(0.25), at(2))
    series = tmp_path / "intensity.csv"
    series.write_text("time,g_per_kwh\n2026-01-05T10:00:00Z,100\n2026-01-05T11:00:00Z,300\n")
    alice = run(wh, "user", at(-1), at(3), node_power_w=1000.0, carbon_intensity_file=str(series))[
        "alice"
    ]
    energy_kwh = 1000.0 * 1.75 * 3600 / KWH
    assert alice["energy_kwh"] == pytest.approx(energy_kwh)
    assert alice["carbon_kg"] == pytest.approx(energy_kwh * (75 + 300) / 1.75 / 1000)


@pytest.mark.parametrize(
    ("period", "since", "until"),
    [
        ("2026-11", "2026-11-01", "2026-12-01"),
        ("2026-12", "2026-12-01", "2027-01-01"),
        ("2026-Q4", "2026-10-01", "2027-01-01"),
        ("2026", "2026-01-01", "2027-01-01"),
        ("2026-W01", "2025-12-29", "2026-01-05"),
        ("2026-11-30", "2026-11-30", "2026-12-01"),
    ],
)
def test_period_windows(period: str, since: str, until: str) -> None:
    start, end = period_window(period)
    assert (start.isoformat(), end.isoformat()) == (
        f"{since}T00:00:00+00:00",
        f"{until}T00:00:00+00:00",
    )


@pytest.mark.parametrize("period", ["2026-13", "2026-Q5", "26-11", "2026-W60", "november"])
def test_bad_periods_are_user_errors(period: str) -> None:
    with pytest.raises(UserError, match="period"):
        period_window(period)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"pue": 0.9}, "pue"),
        ({"gpu_weights": {"A100": -1.0}}, "A100"),
        ({"node_power_w": -5.0}, "node_power_w"),
        ({"allocations": {"chem": {"2026-13": 5.0}}}, "allocations.chem"),
        ({"allocations": {"chem": {"2026-11": -5.0}}}, "negative"),
    ],
)
def test_bad_settings_are_refused(settings: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        AccountingSettings(**settings)


def test_bad_input_is_a_user_error(two_powers: Warehouse, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="choose one of"):
        run(two_powers, "lab", at(-1), at(3))
    bad = tmp_path / "bad.csv"
    for text, message in (
        ("time,g_per_kwh\nyesterday,100\n", "ISO 8601"),
        ("time,g_per_kwh\n2026-01-05T10:00:00Z,-3\n", ">= 0"),
        ("when,g\n2026-01-05T10:00:00Z,3\n", "carbon_intensity_file"),
        ("time,g_per_kwh\n2026-01-05T10:00:00Z,3\n2026-01-05T10:20:00Z,4\n", "twice"),
    ):
        bad.write_text(text)
        with pytest.raises(UserError, match=message):
            run(two_powers, "user", at(-1), at(3), carbon_intensity_file=str(bad))
    with pytest.raises(UserError, match="carbon_intensity_file"):
        run(two_powers, "user", at(-1), at(3), carbon_intensity_file=str(tmp_path / "none.csv"))


def test_sing_report_usage(two_powers: Warehouse, tmp_path: Path) -> None:
    """The command line: a period, the site's weights and a series next to the config file
    (relative path), as JSON with the method, as a table with units and footnotes, as CSV."""
    (tmp_path / "intensity.csv").write_text(
        "time,g_per_kwh\n2026-01-05T10:00:00Z,100\n2026-01-05T11:00:00Z,300\n"
    )
    config = tmp_path / "sing.toml"
    config.write_text(
        f'[site]\nwarehouse = "{two_powers.root}"\n'
        '[accounting]\ngpu_weights = {H100 = 2.5}\ncarbon_intensity_file = "intensity.csv"\n'
        'allocations = {alice-lab = {"2026-01" = 20.0}}\n'
    )
    base = (
        "--config",
        str(config),
        "report",
        "usage",
        "--period",
        "2026-01",
        "--now",
        "2026-02-01",
    )
    done = run_sing(*base, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    (row,) = out["rows"]
    assert row["account"] == "alice-lab"
    assert row["charge_units"] == pytest.approx(2 * 2.5)
    assert row["remaining_units"] == pytest.approx(15.0)
    assert row["carbon_kg"] == pytest.approx(0.375 * 250 / 1000)
    assert "H100 2.5" in out["method"]["charge"]
    assert "hourly grid intensity" in out["method"]["carbon"]

    table = run_sing(*base, "--by", "model")
    assert table.returncode == 0, table.stderr
    heading, line, *notes = table.stdout.splitlines()
    assert heading.split()[:4] == ["model", "jobs", "allocated", "GPU-h"]
    assert "kWh" in heading and "kg CO2e" in heading
    assert line.split()[:3] == ["H100", "1", "2.0"]
    assert [n.split(":")[0] for n in notes] == ["charge", "energy", "carbon"]

    csv = run_sing(*base, "--csv", "--by", "user")
    assert csv.stdout.splitlines()[0].startswith("user,jobs,allocated_gpu_hours")

    both = run_sing(*base, "--since", "2026-01-01")
    assert both.returncode != 0 and "either --period or --since" in both.stderr


def test_one_accounts_statement(tmp_path: Path) -> None:
    """`account=` keeps that account's jobs (and its allocation) only; a zero grant is a grant."""
    wh = Warehouse(tmp_path / "wh")
    add_node(wh, "n1", "H100")
    add_job(wh, "A", ["n1"], 2, at(0), at(3))
    add_job(wh, "B", ["n1"], 1, at(0), at(1), user="bob")
    allocations = {"alice-lab": {"2026-01": 100.0}, "bob-lab": {"2026-01": 0.0}}
    settings = AccountingSettings(allocations=allocations)
    since, until = period_window("2026-01")
    con = wh.connect()
    alice = usage(con, "account", since, until, settings, now=at(48), account="alice-lab")
    assert alice["account"].to_list() == ["alice-lab"]
    assert alice["remaining_units"].to_list() == [pytest.approx(94.0)]
    users = usage(con, "user", since, until, settings, now=at(48), account="bob-lab")
    assert users["user"].to_list() == ["bob"]
    bob = usage(con, "account", since, until, settings, now=at(48), account="bob-lab")
    assert bob["remaining_units"].to_list() == [pytest.approx(-1.0)]


GENERATED_END = datetime(2026, 3, 5, tzinfo=UTC)


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    """Four days of a 2 x 4 GPU cluster from the synthetic generator (the bench's history in
    small), its closed days rolled up and compacted."""
    wh = Warehouse(tmp_path_factory.mktemp("generated") / "wh")
    synthetic.generate(wh, nodes=2, gpus_per_node=4, days=4, seed=3, end=GENERATED_END)
    return wh


def from_samples(wh: Warehouse, by: str, since: datetime, until: datetime) -> pl.DataFrame:
    """The figures of whole UTC days straight from the raw samples, the method in plain polars:
    per job, its samples in the window (less each GPU's first sample in the job, for energy)
    and its allocated hours there, summed per group."""
    con = wh.connect()
    samples = con.sql(
        "SELECT cluster, job_id, node, gpu_index, ts, util, energy_delta_j FROM gpu_samples "
        "WHERE job_id IS NOT NULL"
    ).pl()
    jobs = con.sql("SELECT * FROM jobs WHERE start_time IS NOT NULL").pl()
    gpu = ["cluster", "job_id", "node", "gpu_index"]
    measured = (
        samples.with_columns(first=pl.col("ts") == pl.col("ts").min().over(gpu))
        .filter(pl.col("ts").is_between(since, until, closed="left"))
        .group_by("cluster", "job_id")
        .agg(
            mean_util=pl.col("util").cast(pl.Float64).mean(),
            idle_share=(pl.col("util") < IDLE_SAMPLE_UTIL).mean(),
            energy_j=pl.col("energy_delta_j").filter(~pl.col("first")).sum(),
        )
    )
    w_start = pl.max_horizontal("start_time", pl.lit(since))
    w_end = pl.min_horizontal(pl.col("end_time").fill_null(GENERATED_END), pl.lit(until))
    hours = pl.col("num_gpus") * (w_end - w_start).dt.total_seconds() / 3600
    return (
        jobs.with_columns(allocated=hours, model=pl.lit(synthetic.GPU_MODEL))
        .filter(pl.col("allocated") > 0)
        .join(measured, on=["cluster", "job_id"], how="left")
        .group_by(by)
        .agg(
            jobs=pl.len(),
            allocated_gpu_hours=pl.col("allocated").sum(),
            used_gpu_hours=(pl.col("allocated") * pl.col("mean_util")).sum(),
            idle_gpu_hours=(pl.col("allocated") * pl.col("idle_share")).sum(),
            energy_kwh=pl.col("energy_j").sum() / KWH,
        )
    )


@pytest.mark.parametrize("by", ["account", "user", "partition", "model"])
def test_usage_of_whole_days_equals_the_raw_samples(generated: Warehouse, by: str) -> None:
    """Over the whole history and over one day of it, every group's figures equal the ones
    worked out from the raw samples: the per-day rollups and each GPU's first sample
    (left out on its first day in the job, whatever the window) add up exactly."""
    start = GENERATED_END - 4 * DAY
    for since, until in ((start, GENERATED_END), (start + DAY, start + 2 * DAY)):
        got = usage(
            snapshot(generated, since, until, GENERATED_END),
            by,
            since,
            until,
            AccountingSettings(),
            now=GENERATED_END,
        )
        want = from_samples(generated, by, since, until)
        assert set(got[by]) == set(want[by])
        columns = list(want.columns)
        assert_frame_equal(
            got.select(columns).sort(by),
            want.sort(by),
            check_dtypes=False,
            rel_tol=1e-9,
            abs_tol=1e-9,
        )
