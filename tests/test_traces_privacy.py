"""Privacy of trace releases, measured by the re-identification attack of `sing.traces.linkage`.

The warehouse holds a week of real Philly jobs (arrival times, run times, GPU counts and
virtual clusters from ../shared/traces) given to 150 users of 30 labs, as on a campus: a user
submits sessions of similar jobs to their lab's virtual cluster, with their usual time limit.
The attack sees what `sacct -a` shows of every job, and nothing of how the owners were drawn.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from sing.cli import main
from sing.traces.compare import evaluate
from sing.traces.export import build_release
from sing.traces.linkage import public_view
from sing.traces.privacy import ENERGY, EXACT, SACCT, SACCT_ORIGIN
from sing.traces.settings import TraceSettings
from sing.warehouse.store import Warehouse
from tests.shared_data import PHILLY, SHARED_TRACES

SINCE = datetime(2017, 11, 1, tzinfo=UTC)
UNTIL = SINCE + timedelta(days=7)
KEY = bytes(range(100, 132))
USERS, LABS = 150, 30
SESSION_GAP_S = 900
OUTCOMES = [("COMPLETED", 0), ("FAILED", 1), ("CANCELLED by 1042", 15), ("TIMEOUT", None)]
OUTCOME_SHARES = [0.85, 0.08, 0.05, 0.02]
LIMITS = [3_600, 4 * 3_600, 12 * 3_600, 86_400, 2 * 86_400, 7 * 86_400]  # sbatch --time
STACKS = [
    {"python": "3.10", "torch": "2.1.2", "numpy": "1.26.4"},
    {"python": "3.11", "torch": "2.3.1", "numpy": "1.26.4"},
    {"python": "3.11", "torch": "2.4.0", "transformers": "4.44.0"},
    {"python": "3.9", "tensorflow": "2.15.0"},
    {"python": "3.11", "jax": "0.4.30", "jaxlib": "0.4.30"},
]


def population(seed: int = 7) -> tuple[pa.Table, pa.Table]:
    """(jobs, nodes) of the campus: Philly's jobs of the week around the window, owned by
    sessions (jobs of one virtual cluster and GPU count less than SESSION_GAP_S apart)."""
    rng = np.random.default_rng(seed)
    vc_nodes = {}
    with open(SHARED_TRACES / "philly" / "philly_vc_nodes_helios.csv") as fh:
        for row in csv.DictReader(fh):
            vc_nodes[row["vc"]] = int(row["node num"])
    rows = []
    with open(PHILLY) as fh:
        for row in csv.DictReader(fh):
            if not row["timestamp"]:
                continue
            t = datetime.fromisoformat(row["timestamp"]).replace(tzinfo=UTC)
            if SINCE - timedelta(days=2) <= t < UNTIL + timedelta(days=2):
                rows.append((row["cluster"], t, float(row["duration"]), int(row["num_gpus"])))
    rows.sort()
    vcs = sorted({vc for vc, *_ in rows})
    lab_vc = {lab: vcs[lab % len(vcs)] for lab in range(LABS)}
    user_lab = rng.integers(0, LABS, USERS)
    weight = 1 / np.arange(1, USERS + 1) ** 0.8  # a few heavy users, a long tail
    env = {u: dict(STACKS[rng.integers(len(STACKS))]) for u in range(USERS)}
    habit = {u: LIMITS[rng.integers(len(LIMITS))] for u in range(USERS)}  # a user's usual limit
    for u in range(USERS):
        if rng.random() < 0.3:
            env[u][f"lab{user_lab[u]:02d}-tools"] = "0.1"  # a lab's private package
    jobs, last, owner = [], {}, 0
    for n, (vc, t, run, gpus) in enumerate(rows):
        session = last.get((vc, gpus))
        if session is None or (t - session[0]).total_seconds() > SESSION_GAP_S:
            users = [u for u in range(USERS) if lab_vc[user_lab[u]] == vc] or list(range(USERS))
            p = weight[users] / weight[users].sum()
            owner = int(rng.choice(users, p=p))
        else:
            owner = session[1]
        last[(vc, gpus)] = (t, owner)
        span = max(1, math.ceil(gpus / 8))
        per_node = min(gpus, 8)
        first = int(rng.integers(0, vc_nodes.get(vc, 8)))
        start = t + timedelta(seconds=float(rng.exponential(300)))
        state, code = OUTCOMES[rng.choice(len(OUTCOMES), p=OUTCOME_SHARES)]
        jobs.append(
            {
                "job_id": str(100_000 + n),
                "cluster": "campus",
                "user": f"user{owner:03d}",
                "account": f"lab{user_lab[owner]:02d}",
                "partition": f"vc-{vc}",
                "name": "job",
                "submit_time": t,
                "start_time": start,
                "end_time": start + timedelta(seconds=run),
                "state": state,
                "exit_code": code,
                "num_nodes": span,
                "gpus_per_node": per_node,
                "num_gpus": span * per_node,
                "time_limit_s": min(
                    (x for x in LIMITS if x >= max(habit[owner], run)), default=30 * 86_400
                ),
                "nodes": [f"{vc}-{(first + i) % vc_nodes.get(vc, 8):03d}" for i in range(span)],
                "dependencies": json.dumps(env[owner]),
            }
        )
    nodes = [f"{vc}-{i:03d}" for vc in vcs for i in range(vc_nodes.get(vc, 8))]
    inventory = pa.table(
        {
            "node": nodes,
            "gpus": [8] * len(nodes),
            "gpu_model": ["P100" if hash_of(n) % 3 else "P40" for n in nodes],
            "cluster": ["campus"] * len(nodes),
            "valid_from": [SINCE - timedelta(days=30)] * len(nodes),
        }
    )
    return pa.Table.from_pylist(jobs), inventory


def hash_of(text: str) -> int:
    return sum(ord(c) * (i + 1) for i, c in enumerate(text))


@pytest.fixture(scope="module")
def campus(tmp_path_factory) -> tuple[Warehouse, pa.Table]:
    wh = Warehouse(tmp_path_factory.mktemp("campus"))
    jobs, inventory = population()
    wh.append("nodes", inventory)
    wh.append("jobs", jobs)
    return wh, public_view(wh, SINCE, UNTIL)


def linkage(campus, settings: TraceSettings):
    wh, public = campus
    return evaluate(wh, SINCE, UNTIL, settings, KEY, public=public)


@pytest.fixture(scope="module")
def default(campus):
    """The attack against the default policy."""
    return linkage(campus, TraceSettings())


def sacct(result) -> object:
    """The sacct attack's figures against a policy's release (as a user would run it)."""
    return next(a for a in result.privacy.attacks if a.attack == SACCT)


def test_default_release_links_nobody(default):
    """The default policy against the full `sacct -a` view: the attack finds the secret origin
    (to within the bins) and still names no user and no job; handed the origin, neither."""
    for result in default.privacy.attacks[:2]:
        assert (result.attack, result.users_linked, result.jobs_linked) == (result.attack, 0, 0)


def test_default_release_keeps_the_large_and_failed_jobs(campus, default):
    """Issue 31: at least 90 % of the window's jobs and GPU-hours, large and failed jobs
    included, with user and job linkage at most 5 % under every attack of the privacy report
    (the sacct attack, the same with the secret origin known, run times from energy)."""
    wh, public = campus
    window = public.filter(
        pc.and_(
            pc.greater_equal(public["submit"], SINCE.timestamp()),
            pc.less(public["submit"], UNTIL.timestamp()),
        )
    )
    assert default.jobs >= 0.9 * window.num_rows and default.gpu_hours_pct >= 90
    release = build_release(wh, SINCE, UNTIL, KEY, TraceSettings())
    jobs = release.jobs
    ended_badly = ("failed", "cancelled", "timeout")
    failed_out = pc.sum(pc.is_in(window["state"], pa.array(ended_badly))).as_py()
    failed_in = pc.sum(pc.is_in(jobs["state"], pa.array([*ended_badly, "unknown"]))).as_py()
    assert failed_in >= 0.9 * failed_out  # (an outcome hidden on the last rungs is unknown)
    large = pc.sum(pc.greater_equal(window["num_gpus"], 8)).as_py()
    size = pc.coalesce(jobs["gpus_max"], jobs["num_gpus"])
    assert pc.sum(pc.greater_equal(size, 8)).as_py() >= 0.9 * large
    assert {a.attack for a in default.privacy.attacks} == {SACCT, SACCT_ORIGIN, ENERGY, EXACT}
    for result in default.privacy.attacks:
        assert result.users_pct <= 5 and result.jobs_pct <= 5, result


def test_every_released_pool_passes_the_k_rule(default):
    """Coarsened jobs and their cover: at every precision of the release, each pool holds at
    least k users and no user more than half its jobs, the pools the attacker can redo."""
    precisions = default.privacy.precisions
    assert sum(p.jobs for p in precisions) == default.jobs
    assert len(precisions) >= 3  # the release is not all at one precision
    for p in precisions:
        assert p.min_users >= 5 and p.max_top_share <= 0.5 and p.unique_jobs == 0, p


def test_attack_links_almost_everyone_without_protection(campus):
    """sing 1.0's release (exact times from --since, one pseudonym per user): the attack names
    nearly every user, so the zero above is the policy's doing, not a blind attack."""
    result = linkage(campus, TraceSettings.precise())
    assert result.users >= 100
    assert result.users_pct >= 80 and result.jobs_pct >= 80
    assert result.wrong_claims < result.jobs_linked / 4


def test_exact_times_let_the_attack_name_users(campus):
    """time_resolution_s = 0 and duration_ratio = 1 (still shifted, one pseudonym per job):
    the shift is found from run times alone, and single jobs are named."""
    exact = TraceSettings(time_resolution_s=0, duration_ratio=1.0, quasi_identifiers=("shape",))
    assert linkage(campus, exact).jobs_linked > 0


def test_absolute_times_are_published_only_when_asked(campus):
    wh, _ = campus
    shifted = build_release(wh, SINCE, UNTIL, KEY, TraceSettings())
    assert shifted.info.release_start.year == 1970 and shifted.info.release_end is None
    assert shifted.info.policy["time_origin"] == "secret"
    submit = shifted.jobs["submit_s"].to_pylist()
    assert min(submit) > 0  # counted from a secret origin up to a week before --since
    plain = build_release(wh, SINCE, UNTIL, KEY, TraceSettings(time_shift=False))
    assert plain.info.release_start == SINCE and plain.info.policy["time_origin"] == "release_start"


def test_node_aliases(campus):
    """per_job: n1, n2, ... inside each job; random: one alias per node, not in name order;
    name_order: the k-th name gets the k-th alias (reversible from `sinfo`)."""
    wh, _ = campus
    real = [
        nodes
        for (nodes,) in wh.connect()
        .execute(
            "SELECT nodes FROM jobs WHERE submit_time >= $s AND submit_time < $u "
            "ORDER BY submit_time, job_id",
            {"s": SINCE, "u": UNTIL},
        )
        .fetchall()
    ]

    def aliases(kind: str) -> dict[str, str]:
        """Real node -> alias, read off the release (exact times keep the warehouse's order)."""
        settings = TraceSettings.precise(node_aliases=kind, rare_shapes="keep")
        released = build_release(wh, SINCE, UNTIL, KEY, settings).jobs["nodes"].to_pylist()
        assert len(released) == len(real)
        pairs = {
            (n, a)
            for nodes, names in zip(real, released, strict=True)
            for n, a in zip(nodes, names, strict=True)
        }
        mapping = dict(pairs)
        if kind != "per_job":
            assert len(mapping) == len(pairs)  # one alias per node, the same in every job
        return mapping

    per_job = aliases("per_job")
    assert set(per_job.values()) <= {"n1", "n2", "n3", "n4"}
    ordered, random = aliases("name_order"), aliases("random")
    names = sorted(ordered)
    assert [ordered[n] for n in names] == sorted(ordered.values())  # name order: reversible
    assert sorted(random.values()) == sorted(ordered.values())
    assert [random[n] for n in names] != sorted(random.values())  # random: not in name order


def test_aliases_shared_across_jobs_are_reversed(campus):
    """One random alias per node: the attack reverses aliases by votes and names more users
    than with per-job aliases, where the cells leave it room (run time not in them)."""
    loose = TraceSettings(time_shift=False, quasi_identifiers=("shape", "submit", "outcome"))
    per_job = linkage(campus, loose)
    random = linkage(campus, replace(loose, node_aliases="random"))
    assert random.users_linked > per_job.users_linked and random.jobs_linked > per_job.jobs_linked


def test_job_outcome_is_in_the_cells(campus, default):
    """`sacct -a` shows each job's state: cells that ignore it let the attack single out a failed
    or cancelled job among completed ones."""
    settings = TraceSettings()
    without = tuple(q for q in settings.quasi_identifiers if q != "outcome")
    assert sacct(linkage(campus, replace(settings, quasi_identifiers=without))).users_linked > 0
    assert sacct(default).users_linked == 0


def test_partition_names_ship_only_from_the_allow_list(campus):
    wh, _ = campus
    allowed = "vc-6214e9"
    settings = TraceSettings(drop=(), partitions=(allowed,), quasi_identifiers=("shape",))
    parts = set(build_release(wh, SINCE, UNTIL, KEY, settings).jobs["partition"].to_pylist())
    assert allowed in parts
    assert all(p == allowed or p.startswith("p_") for p in parts)


def test_private_package_names_never_pass_by_default(campus):
    wh, _ = campus
    settings = TraceSettings(drop=(), quasi_identifiers=("shape",))
    deps = build_release(wh, SINCE, UNTIL, KEY, settings).jobs["dependencies"].to_pylist()
    assert deps and not any("-tools" in d for d in deps if d)
    anything = replace(settings, packages=("*",))
    deps = build_release(wh, SINCE, UNTIL, KEY, anything).jobs["dependencies"].to_pylist()
    assert any("-tools" in d for d in deps if d)


def test_software_stacks_pool_jobs_like_a_pseudonym(campus):
    """Shipping dependencies without the k rule over them: jobs that declare the same
    (private) stack are voted on together, and their owners are named."""
    shown = TraceSettings(drop=(), packages=("*",), quasi_identifiers=("shape", "submit", "run"))
    assert linkage(campus, shown).users_linked > 0


def test_one_pseudonym_per_user_links_a_users_jobs(campus):
    """linkage = user with the shape-only k rule: the intersection of a user's jobs names them."""
    linked = TraceSettings(linkage="user", quasi_identifiers=("shape",))
    assert linkage(campus, linked).users_pct >= 50


def test_k_over_every_quasi_identifier_beats_k_over_the_shape(campus, default):
    shape_only = linkage(campus, TraceSettings(quasi_identifiers=("shape",)))
    assert sacct(shape_only).users_linked > 0  # the default, with sing 1.0's k rule: named
    assert sacct(default).users_linked == 0
    # What the k rule costs is precision per job, not the distribution: a pool's values are
    # published exactly, shuffled among its jobs.
    assert default.run_ks < 0.01 and len(default.privacy.precisions) > 1


def test_cli_attack_prints_the_configured_policy(campus, tmp_path, capsys):
    wh, _ = campus
    config = tmp_path / "sing.toml"
    config.write_text('[trace]\nlinkage = "user"\nquasi_identifiers = ["shape"]\n')
    args = ["--config", str(config), "--warehouse", str(wh.root), "trace", "attack"]
    window = ["--since", "2017-11-01", "--until", "2017-11-08", "--only-configured"]
    assert main([*args, *window, "--json"]) == 0
    (result,) = json.loads(capsys.readouterr().out)["rows"]
    assert result["scenario"] == "as configured" and result["users_linked"] > 0
    assert main([*args, *window]) == 0
    header, row, legend, _, title, *report = capsys.readouterr().out.splitlines()
    assert "users linked" in header and row.startswith("as configured")
    assert f"{result['users_linked']:>5,} ({result['users_pct']:5.1f} %)" in row
    assert row.endswith("writes") and result["refused"] is None
    assert title.startswith("Privacy report of the configured policy")
    worst = next(a for a in result["privacy"]["attacks"] if a["attack"] == result["worst_attack"])
    assert worst["users_linked"] == result["users_linked"]
    assert any(
        line.startswith(f"| {worst['attack']} | {worst['users_linked']} of") for line in report
    )


def test_cli_attack_says_when_export_would_write_nothing(campus, tmp_path, capsys):
    """The attack reports what `sing trace export` writes: a policy whose release is under
    [trace] min_kept_share is marked refused, with the export's reason."""
    wh, _ = campus
    config = tmp_path / "sing.toml"
    config.write_text("[trace]\nmin_kept_share = 1.0\n")
    args = ["--config", str(config), "--warehouse", str(wh.root), "trace", "attack"]
    window = ["--since", "2017-11-01", "--until", "2017-11-08", "--only-configured"]
    assert main([*args, *window]) == 0
    header, row, legend, why, *report = capsys.readouterr().out.splitlines()
    assert row.endswith("refused")
    assert why.startswith("as configured: `sing trace export` would write nothing: the release")


def print_table() -> None:
    """The linkage table of docs/trace-format.md, for the test population."""
    import tempfile

    from sing.traces.compare import scenarios

    with tempfile.TemporaryDirectory() as tmp:
        wh = Warehouse(tmp)
        jobs, inventory = population()
        wh.append("nodes", inventory)
        wh.append("jobs", jobs)
        public = public_view(wh, SINCE, UNTIL)
        shown = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
        for name, settings in scenarios(TraceSettings()):
            r = evaluate(wh, SINCE, UNTIL, settings, KEY, name, public)
            print(
                f"| {name} | {r.jobs:,} | {r.left_out:,} | {r.gpu_hours_pct:.1f} % | {r.users} | "
                f"{r.users_linked} ({r.users_pct:.1f} %) | {r.jobs_linked:,} ({r.jobs_pct:.1f} %) "
                f"| {r.wrong_claims:,} | {r.worst_attack} | {shown(r.run_ks)} "
                f"| {shown(r.queue_ks)} |"
            )


if __name__ == "__main__":
    print_table()
