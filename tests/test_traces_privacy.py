"""Privacy of trace releases, measured by the re-identification attack of `traces.linkage`.

The warehouse holds a week of real Philly jobs (arrival times, run times, GPU counts and
virtual clusters from ../shared/traces) given to 150 users of 30 labs, as on a campus: a user
submits sessions of similar jobs to their lab's virtual cluster. The attack sees what `sacct -a`
shows of every job, and nothing of how the owners were drawn.
"""

from __future__ import annotations

import csv
import json
import math
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pytest

from tests.shared_data import PHILLY, SHARED_TRACES
from traces.linkage import evaluate, public_view
from traces.settings import TraceSettings
from warehouse.store import Warehouse

SINCE = datetime(2017, 11, 1, tzinfo=UTC)
UNTIL = SINCE + timedelta(days=7)
KEY = bytes(range(100, 132))
USERS, LABS = 150, 30
SESSION_GAP_S = 900
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
                "state": "COMPLETED",
                "exit_code": 0,
                "num_nodes": span,
                "gpus_per_node": per_node,
                "num_gpus": span * per_node,
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
