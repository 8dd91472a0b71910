"""The re-identification attack a data steward runs before publishing a trace.

It plays a cluster user who can run `sacct -a` (most Slurm users can): for every job in and
around the window they see its owner, account, partition, submit, start and end time, node count,
GPUs per node and node names, and `sinfo` gives each node's GPU model. With the release in hand
(jobs table and datapackage.json, whose anonymization block is public), they try to name the
owner of each pseudonym, and so read the GPU efficiency of all that person's jobs:

1. Partition pseudonyms are reversed first, by votes of public jobs with the same size, run
   and queue time, which a time shift does not change.
2. Time origin: `release_start` when times are absolute. Otherwise the same look-alike pairs
   each allow an interval of origins (the submit bin's width); around the origin most pairs
   allow, the one under which the public jobs, binned like the release, explain the most
   released jobs from the fewest public ones wins.
3. Candidates: each released job matches the public jobs with the same coarsened submit, run and
   queue time, nodes, GPUs per node, GPU model (unless generalised) and partition. Group
   pseudonyms and node aliases are reversed by votes over the candidates (node aliases also by
   the hypothesis that they follow node-name order); candidates that contradict a reversed
   value drop out, unless none would be left.
4. A pseudonym's jobs vote: a user's posterior is the product over the jobs of the share of the
   job's candidates that are theirs (Bayes with a uniform prior, a small floor for a miss).
   Released jobs that declare the same dependencies are voted on together as well (a private
   package name is a fingerprint). The attacker names a user only above a posterior of 1/2.

`evaluate` builds a release with a known key, attacks it, and scores the claims against the
truth the steward holds: the share of users with at least one correctly named pseudonym, and the
share of released jobs whose owner the attacker names correctly.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sing.times import parse_time
from sing.traces import sql
from sing.traces.anonymize import OTHER, pseudonymize
from sing.traces.export import MAX_SHIFT_S, build_release
from sing.traces.format import JOBS, conform, exit_class_sql, state_sql
from sing.traces.settings import ANY, TraceSettings
from sing.warehouse.analytics import first_node_version_join
from sing.warehouse.store import Warehouse

CLAIM_POSTERIOR = 0.5  # the attacker names a user only when more likely than not
MISS = 0.01  # a user's share floor in a job that does not list them (a stray mismatch)
OFFSET_JOBS = 2000  # released jobs that vote on the time origin
OFFSET_FANOUT = 200  # a job with more candidates than this says nothing about the origin
EPS = 1e-9  # a released value sits strictly inside its bin; this absorbs rounding
REFINE_STEPS = 48  # origins tried per time bin
REFINE_BINS = 4  # bins either side of the pairs' answer that are tried

# What `sacct -a` shows of every job submitted in [$from, $to), as of $seen; the GPU model of
# each job's first node is what `sinfo` says of it.
PUBLIC_SQL = f"""
SELECT j.job_id AS pub, j."user", j.account, j.partition, j.num_nodes, j.gpus_per_node,
       j.num_gpus, j.nodes, j.time_limit_s, m.gpu_model,
       CASE WHEN j.end_time <= $seen THEN {state_sql("j.state")} END AS state,
       CASE WHEN j.end_time <= $seen THEN {exit_class_sql("j.exit_code")} END AS exit_class,
       epoch(j.submit_time) AS submit,
       CASE WHEN j.start_time < $seen THEN epoch(j.start_time) END AS start,
       CASE WHEN j.end_time <= $seen THEN epoch(j.end_time) END AS "end"
FROM jobs j
{first_node_version_join("j")}
WHERE j.submit_time >= $from AND j.submit_time < $to
"""


@dataclass(frozen=True)
class Attack:
    """What the attacker concluded: a claimed owner (or None) per released job, in row order."""

    claims: list[str | None]
    origin: float  # the estimated time origin, Unix seconds
    reversed: dict[str, int]  # pseudonymous values reversed, per kind


@dataclass(frozen=True)
class Linkage:
    """How well the attack did against one release, scored with the steward's truth, and what
    the policy cost: jobs left out, and how far the released run and queue times are from the
    window's true ones (Kolmogorov-Smirnov distance, 0 = same distribution, 1 = disjoint;
    None where the release does not show them)."""

    scenario: str
    jobs: int
    left_out: int
    users: int
    users_linked: int
    jobs_linked: int
    wrong_claims: int
    run_ks: float | None
    queue_ks: float | None
    refused: str | None = None  # why `sing trace export` would write no such release

    @property
    def users_pct(self) -> float:
        return 100 * self.users_linked / self.users if self.users else 0.0

    @property
    def jobs_pct(self) -> float:
        return 100 * self.jobs_linked / self.jobs if self.jobs else 0.0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self) | {"users_pct": self.users_pct, "jobs_pct": self.jobs_pct}


def public_view(
    warehouse: Warehouse, since: datetime, until: datetime, margin_s: int = MAX_SHIFT_S
) -> pa.Table:
    """The attacker's view: every job submitted within `margin_s` of the window, as at `until`."""
    margin = timedelta(seconds=margin_s + 86_400)
    params = {"from": since - margin, "to": until + margin, "seen": until}
    return warehouse.connect().sql(PUBLIC_SQL, params=params).to_arrow_table()


def attack(release: pa.Table, package: dict, public: pa.Table) -> Attack:
    """Name the owners of a release's jobs from the public view (see the module docstring)."""
    policy = package.get("anonymization") or {}
    res = float(policy.get("time_resolution_s", 0))
    ratio = float(policy.get("duration_ratio", 1.0))
    con = sql.connect()
    con.register("rel_in", conform(JOBS, release))
    con.register("pub_in", public)
    con.execute(_released_sql(res, ratio))
    con.execute(_public_sql(ratio))
    partitions = _reverse_partitions(con)
    if policy.get("time_origin", "release_start") == "release_start":
        origin = parse_time(package["release_start"], "release_start").timestamp()
    else:
        origin = _estimate_origin(con, res)
    con.execute(
        f"CREATE TEMP TABLE pub AS "
        f"SELECT *, {_bin('submit - $origin', res)} AS sbin FROM pub_durations",
        {"origin": origin},
    )
    con.execute(CANDIDATES_SQL)
    reversed_values = {
        "partition": partitions,
        "group": _reverse(
            con, '"group"', "account", "(SELECT account FROM pub WHERE account IS NOT NULL)"
        ),
        "node": _reverse_nodes(con),
    }
    return Attack(_claims(con), origin, reversed_values)


def _bin(x: str, res: float) -> str:
    return f"floor(({x}) / {res} + {EPS})" if res > 0 else f"round({x})"


def _duration_bin(x: str, ratio: float, released: bool) -> str:
    """The bucket of a duration: released values sit inside theirs (hence EPS); public ones
    are binned exactly as the export bins true durations."""
    if ratio <= 1:
        return f"round({x})"
    eps = f" + {EPS}" if released else ""
    return f"CASE WHEN {x} >= 1 THEN floor(ln({x}) / ln({ratio}){eps}) ELSE round({x}) END"


def _released_sql(res: float, ratio: float) -> str:
    return f"""
CREATE TEMP TABLE rel AS
SELECT row_number() OVER () - 1 AS i, coalesce("user", 'row' || i) AS pseudonym, "group",
       partition, num_nodes, gpus_per_node, num_gpus, gpu_model, nodes, submit_s, time_limit_s,
       CASE WHEN NOT censored THEN state END AS state, exit_class,
       nullif(dependencies, '{{}}') AS fingerprint,
       {_bin("submit_s", res)} AS sbin,
       CASE WHEN NOT censored THEN {_duration_bin("run_s", ratio, True)} END AS rbin,
       {_duration_bin("queue_s", ratio, True)} AS qbin
FROM rel_in
"""


def _public_sql(ratio: float) -> str:
    """The public jobs with their duration buckets (which a time shift does not change)."""
    return f"""
CREATE TEMP TABLE pub_durations AS
SELECT *, partition AS real_partition, {_duration_bin('"end" - start', ratio, False)} AS rbin,
       {_duration_bin("start - submit", ratio, False)} AS qbin
FROM pub_in
"""


# A released job `r` and a public one `p` of the same size, durations, time limit and outcome;
# a value the release does not show (dropped, or cut by the window) matches any.
SAME_SIZE = """r.num_nodes IS NOT DISTINCT FROM p.num_nodes
    AND r.gpus_per_node IS NOT DISTINCT FROM p.gpus_per_node
    AND r.num_gpus IS NOT DISTINCT FROM p.num_gpus
    AND (r.rbin IS NULL OR r.rbin = p.rbin) AND (r.qbin IS NULL OR r.qbin = p.qbin)
    AND (r.time_limit_s IS NULL OR r.time_limit_s = p.time_limit_s)
    AND (r.state IS NULL OR r.state = p.state)
    AND (r.exit_class IS NULL OR r.exit_class = p.exit_class)"""

# Public jobs a released job can be: same bins and size, same model unless generalised, same
# partition where the release shows its real name or it was reversed.
CANDIDATES_SQL = f"""
CREATE TEMP TABLE cand AS
SELECT r.i, p.pub, p."user", p.account, p.partition, p.nodes
FROM rel r JOIN pub p ON r.sbin = p.sbin AND {SAME_SIZE}
    AND (r.gpu_model IS NULL OR r.gpu_model = '{OTHER}' OR r.gpu_model = p.gpu_model)
    AND (r.real_partition IS NULL OR r.real_partition = p.partition)
"""


def _reverse_partitions(con: duckdb.DuckDBPyConnection) -> int:
    """Each released job's real partition (`rel.real_partition`): its name where public, or
    the pseudonym's reversal by votes of public jobs of the same size and durations, which a
    time shift does not change. Returns how many pseudonyms were reversed."""
    mapping = con.execute(
        f"""
        WITH pairs AS (
            SELECT r.partition AS v, p.partition AS real,
                   1.0 / count(*) OVER (PARTITION BY r.i) AS w,
                   count(*) OVER (PARTITION BY r.i) AS n
            FROM rel r JOIN pub_durations p ON {SAME_SIZE}
            WHERE r.partition IS NOT NULL AND r.rbin IS NOT NULL
              AND r.partition NOT IN (SELECT partition FROM pub_in WHERE partition IS NOT NULL)
        ),
        {BEST_VOTE_SQL.format(pairs="(SELECT * FROM pairs WHERE n <= " + str(OFFSET_FANOUT) + ")")}
        """
    ).fetchall()
    _register_mapping(con, dict(mapping))
    con.execute(
        """
        CREATE OR REPLACE TEMP TABLE rel AS
        SELECT rel.*, CASE WHEN rel.partition IN (SELECT partition FROM pub_in) THEN rel.partition
                           ELSE m.real END AS real_partition
        FROM rel LEFT JOIN mapping m ON m.v = rel.partition
        """
    )
    con.unregister("mapping")
    return len(mapping)


# Over `pairs` (v: a released value, real: a public one, w: the pair's weight), the real
# value with the most votes for each released value, where it has twice the votes of the next
# and at least two in all.
BEST_VOTE_SQL = """
votes AS (SELECT v, real, sum(w) AS votes FROM {pairs} GROUP BY ALL),
ranked AS (
    SELECT v, real, votes,
           row_number() OVER (PARTITION BY v ORDER BY votes DESC, real) AS rank,
           lead(votes) OVER (PARTITION BY v ORDER BY votes DESC, real) AS second
    FROM votes
)
SELECT v, real FROM ranked WHERE rank = 1 AND votes >= 2 * coalesce(second, 0) AND votes >= 2
"""


def _estimate_origin(con: duckdb.DuckDBPyConnection, res: float) -> float:
    """The origin most (released, public) pairs of equal size and durations allow."""
    width = max(res, 1.0)
    pairs = con.execute(
        f"""
        WITH sample AS (
            SELECT * FROM rel WHERE rbin IS NOT NULL ORDER BY hash(i) LIMIT {OFFSET_JOBS}
        ),
        pairs AS (
            SELECT r.i, p.submit - r.sbin * {width} AS hi, count(*) OVER (PARTITION BY r.i) AS n
            FROM sample r JOIN pub_durations p ON {SAME_SIZE}
        )
        SELECT hi FROM pairs WHERE n <= {OFFSET_FANOUT}
        """
    ).fetchnumpy()["hi"]
    if len(pairs) == 0:
        return 0.0
    # A pair allows origins in (hi - width, hi] (exact times: a second around hi).
    his = np.asarray(pairs, dtype=float) + (0.5 if res <= 0 else 0.0)
    events = np.concatenate([his - width, his])
    step = np.concatenate([np.ones(len(his)), -np.ones(len(his))])
    order = np.lexsort((-step, events))  # at equal times, an interval opens before one closes
    coverage = np.cumsum(step[order])
    best = int(np.argmax(coverage))
    start, end = events[order][best], events[order][min(best + 1, len(events) - 1)]
    middle = float((start + end) / 2)
    if res <= 0:  # exact times: the origin is --since, a whole second
        return float(round(middle))
    # Pairs of look-alike jobs blur the answer by a bin or more; the right origin also bins
    # the public jobs into the cells the release has (a released group counts as its bin).
    grid = np.arange(middle - REFINE_BINS * res, middle + REFINE_BINS * res, res / REFINE_STEPS)
    return _most_whole_cells(con, res, grid)


def _most_whole_cells(con: duckdb.DuckDBPyConnection, res: float, origins: np.ndarray) -> float:
    """The origin under which the public jobs, binned alike, explain the most released jobs
    per group (submit bin, run and queue bin, size), then the one that draws them from the
    fewest public jobs: under the true origin every released group is a subset of its public
    group (the whole of it where the k rule kept whole cells), while a wrong one merges
    unrelated jobs."""
    ((queue, partition),) = con.execute(
        "SELECT count(qbin) > 0, count(real_partition) > 0 FROM rel"
    ).fetchall()
    key = "sbin, rbin, num_nodes, gpus_per_node, num_gpus"
    key += (", qbin" if queue else "") + (", real_partition" if partition else "")
    rows = con.execute(
        f"""
        WITH g AS (SELECT unnest($origins::DOUBLE[]) AS origin),
        r AS (SELECT {key}, count(*) AS n FROM rel WHERE rbin IS NOT NULL GROUP BY ALL),
        p AS (
            SELECT g.origin, {_bin("submit - g.origin", res)} AS sbin,
                   {key.removeprefix("sbin, ")}, count(*) AS n
            FROM pub_durations, g WHERE rbin IS NOT NULL GROUP BY ALL
        )
        SELECT p.origin, sum(least(r.n, p.n)) AS explained, sum(p.n) AS drawn_from
        FROM r JOIN p USING ({key})
        GROUP BY p.origin ORDER BY explained DESC, drawn_from, p.origin LIMIT 1
        """,
        {"origins": origins.tolist()},
    ).fetchall()
    return float(rows[0][0]) if rows else float(origins[len(origins) // 2])


def _reverse(con: duckdb.DuckDBPyConnection, released: str, public: str, known: str) -> int:
    """Reverse the pseudonymous values of one released column by votes of its jobs'
    candidates, and drop candidates that contradict them. Returns how many were reversed."""
    mapping = con.execute(
        f"""
        WITH w AS (
            SELECT r.{released} AS v, c.{public} AS real,
                   1.0 / count(*) OVER (PARTITION BY c.i) AS w
            FROM cand c JOIN rel r USING (i)
            WHERE r.{released} IS NOT NULL AND r.{released} NOT IN {known}
        ),
        {BEST_VOTE_SQL.format(pairs="w")}
        """
    ).fetchall()
    if mapping:
        _register_mapping(con, dict(mapping))
        _keep_consistent(
            con,
            f"""SELECT c.* FROM cand c JOIN rel r USING (i)
                LEFT JOIN mapping m ON m.v = r.{released}
                WHERE m.real IS NULL OR m.real = c.{public}""",
        )
        con.unregister("mapping")
    return len(mapping)


def _reverse_nodes(con: duckdb.DuckDBPyConnection) -> int:
    """Node aliases: the name-order hypothesis (the k-th alias is the k-th node name of the
    window) against a vote per alias and list position; the one that explains more jobs."""
    aliases = [
        a
        for (a,) in con.execute("SELECT DISTINCT unnest(nodes) AS a FROM rel ORDER BY a").fetchall()
    ]
    if not aliases:
        return 0
    names = [
        n
        for (n,) in con.execute(
            "SELECT DISTINCT unnest(nodes) AS n FROM pub WHERE sbin BETWEEN "
            "(SELECT min(sbin) FROM rel) AND (SELECT max(sbin) FROM rel) ORDER BY n"
        ).fetchall()
    ]
    votes = con.execute(
        f"""
        WITH pairs AS (
            SELECT unnest(r.nodes) AS a, unnest(c.nodes) AS n,
                   1.0 / count(*) OVER (PARTITION BY c.i) AS w
            FROM cand c JOIN rel r USING (i) WHERE len(r.nodes) = len(c.nodes)
        ),
        {BEST_VOTE_SQL.format(pairs="(SELECT a AS v, n AS real, w FROM pairs)")}
        """
    ).fetchall()
    hypotheses = [dict(votes)]
    if len(names) == len(aliases):
        hypotheses.append(dict(zip(aliases, names, strict=True)))
    best, explained = {}, -1
    for mapping in hypotheses:
        if not mapping:
            continue
        count = _explained(con, mapping)
        if count > explained:
            best, explained = mapping, count
    if best:
        _register_mapping(con, best)
        _keep_consistent(con, NODE_CONSISTENT_SQL)
        con.unregister("mapping")
    return len(best)


# Candidates whose node list agrees with the released one wherever an alias is reversed.
NODE_CONSISTENT_SQL = """
SELECT c.* FROM cand c JOIN rel r USING (i), (SELECT map(list(v), list(real)) AS m FROM mapping)
WHERE len(r.nodes) = len(c.nodes)
  AND list_transform(range(1, len(r.nodes) + 1),
                     lambda k: coalesce(map_extract(m, r.nodes[k])[1], c.nodes[k])) = c.nodes
"""


def _register_mapping(con: duckdb.DuckDBPyConnection, mapping: dict) -> None:
    con.register("mapping", pa.table({"v": list(mapping), "real": list(mapping.values())}))


def _explained(con: duckdb.DuckDBPyConnection, mapping: dict) -> int:
    """Released jobs with at least one candidate consistent with a node mapping."""
    _register_mapping(con, mapping)
    ((count,),) = con.execute(f"SELECT count(DISTINCT i) FROM ({NODE_CONSISTENT_SQL})").fetchall()
    con.unregister("mapping")
    return count


def _keep_consistent(con: duckdb.DuckDBPyConnection, consistent: str) -> None:
    """Keep the candidates `consistent` selects; a job none of whose candidates are kept keeps
    them all (the reversal may be wrong for it)."""
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE cand AS
        WITH ok AS ({consistent})
        SELECT * FROM ok
        UNION ALL
        SELECT * FROM cand WHERE i NOT IN (SELECT i FROM ok)
        """
    )


# Per voting unit (a pseudonym; or released jobs declaring the same dependencies), each user's
# posterior; the best per unit with its posterior.
CLAIMS_SQL = f"""
WITH share AS (
    SELECT i, "user", count(*) / sum(count(*)) OVER (PARTITION BY i) AS share
    FROM cand GROUP BY i, "user"
),
units AS (
    SELECT i, 1 AS strength, 'p:' || pseudonym AS unit FROM rel
    UNION ALL
    SELECT i, 2, 'f:' || fingerprint FROM rel WHERE fingerprint IS NOT NULL
),
informed AS (
    SELECT unit, count(*) AS n FROM units WHERE i IN (SELECT i FROM share) GROUP BY unit
),
score AS (
    SELECT u.unit, s."user",
           sum(ln(s.share + {MISS})) + (any_value(f.n) - count(*)) * ln({MISS}) AS s
    FROM units u JOIN share s USING (i) JOIN informed f USING (unit)
    GROUP BY u.unit, s."user"
),
relative AS (SELECT unit, "user", exp(s - max(s) OVER (PARTITION BY unit)) AS e FROM score),
posterior AS (SELECT unit, "user", e / sum(e) OVER (PARTITION BY unit) AS p FROM relative),
best AS (
    SELECT unit, arg_max("user", p) AS "user", max(p) AS p FROM posterior GROUP BY unit
)
-- a pseudonym says "same person"; a shared software stack only hints it: the pseudonym first
SELECT u.i, arg_min(b."user", u.strength) AS "user"
FROM units u JOIN best b USING (unit)
WHERE b.p > {CLAIM_POSTERIOR}
GROUP BY u.i
"""


def _claims(con: duckdb.DuckDBPyConnection) -> list[str | None]:
    ((rows,),) = con.execute("SELECT count(*) FROM rel").fetchall()
    claims: list[str | None] = [None] * rows
    for i, user in con.execute(CLAIMS_SQL).fetchall():
        claims[i] = user
    return claims


def evaluate(
    warehouse: Warehouse | str | Path,
    since: datetime,
    until: datetime,
    settings: TraceSettings,
    key: bytes,
    scenario: str = "as configured",
    public: pa.Table | None = None,
) -> Linkage:
    """Build the release `settings` give, attack it with the public view, score the claims."""
    wh = warehouse if isinstance(warehouse, Warehouse) else Warehouse(warehouse)
    since, until = since.astimezone(UTC), until.astimezone(UTC)
    release = build_release(wh, since, until, key, settings)
    package = {
        "release_start": release.info.release_start.isoformat(),
        "anonymization": release.info.policy,
    }
    view = public if public is not None else public_view(wh, since, until)
    result = attack(release.jobs, package, view)
    truth = _owners(view, key, release.jobs["job_id"])
    claims = pa.array(result.claims, pa.string())
    right = pc.fill_null(pc.equal(claims, truth), False)
    wrong = pc.and_(pc.is_valid(claims), pc.invert(right))
    return Linkage(
        scenario=scenario,
        jobs=release.jobs.num_rows,
        left_out=release.suppressed_jobs,
        users=len(pc.unique(truth)),
        users_linked=len(pc.unique(pc.filter(truth, right))),
        jobs_linked=pc.sum(right).as_py() or 0,
        wrong_claims=pc.sum(wrong).as_py() or 0,
        run_ks=_ks(
            release.jobs, "run_s", view, pc.subtract(view["end"], view["start"]), since, until
        ),
        queue_ks=_ks(
            release.jobs, "queue_s", view, pc.subtract(view["start"], view["submit"]), since, until
        ),
        refused=release.refusal(settings),
    )


def _ks(
    released: pa.Table,
    column: str,
    public: pa.Table,
    truth: pa.ChunkedArray,
    since: datetime,
    until: datetime,
) -> float | None:
    """Kolmogorov-Smirnov distance between the released values of `column` and the true ones
    of the window's jobs that finished (censored jobs left out on both sides)."""
    if column not in released.column_names:
        return None
    shown = pc.filter(released[column], pc.invert(released["censored"])).drop_null()
    window = pc.and_(
        pc.greater_equal(public["submit"], since.timestamp()),
        pc.less(public["submit"], until.timestamp()),
    )
    true = pc.filter(truth, window).drop_null()
    if len(shown) == 0 or len(true) == 0:
        return None
    a = np.sort(shown.to_numpy())
    b = np.sort(true.to_numpy())
    points = np.concatenate([a, b])
    gap = np.searchsorted(a, points, side="right") / len(a) - np.searchsorted(
        b, points, side="right"
    ) / len(b)
    return float(np.abs(gap).max())


def _owners(public: pa.Table, key: bytes, released_ids: pa.ChunkedArray) -> pa.Array:
    """The real owner of each released job, found through the job-id pseudonym (steward only)."""
    ids = pseudonymize(public["pub"], key, "j", distinct=True)
    index = pc.index_in(released_ids, ids)
    return pc.take(public["user"], index)


def scenarios(settings: TraceSettings) -> list[tuple[str, TraceSettings]]:
    """The configured policy, then each protection relaxed on its own, then none at all."""
    replace = dataclasses.replace

    def shown(*fields: str, **changes) -> TraceSettings:
        return replace(settings, drop=tuple(d for d in settings.drop if d not in fields), **changes)

    without_outcome = tuple(q for q in settings.quasi_identifiers if q != "outcome")
    relaxed = [
        ("as configured", settings),
        ("exact times", replace(settings, time_resolution_s=0, duration_ratio=1.0)),
        ("times from --since", replace(settings, time_shift=False)),
        ("random node aliases", replace(settings, node_aliases="random")),
        ("node aliases in name order", replace(settings, node_aliases="name_order")),
        ("start, end, queue shown", shown("start_s", "end_s", "queue_s")),
        ("time limit shown", shown("time_limit_s")),
        ("partition shown", shown("partition")),
        ("partition shown, raw names", shown("partition", partitions=(ANY,))),
        ("dependencies shown", shown("dependencies")),
        ("dependencies, any package", shown("dependencies", packages=(ANY,))),
        ("one pseudonym per group", replace(settings, linkage="group")),
        ("one pseudonym per user", replace(settings, linkage="user")),
        ("outcome not in the cells", replace(settings, quasi_identifiers=without_outcome)),
        ("k over the shape only", replace(settings, quasi_identifiers=("shape",))),
        ("no protection (sing 1.0)", TraceSettings.precise(k=settings.k)),
    ]
    seen, out = [], []
    for name, option in relaxed:
        if option not in seen:
            seen.append(option)
            out.append((name, option))
    return out
