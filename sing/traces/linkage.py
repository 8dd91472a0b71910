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

`energy_attack` tries what the sacct attack does not: a published quantity that grows with the
run time (energy) read back as a run time. `sing.traces.privacy` runs both on every release and
scores the claims against the truth the steward holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sing.times import parse_time
from sing.traces import sql
from sing.traces.anonymize import OTHER, pseudonymize
from sing.traces.format import JOBS, conform, exit_class_sql, state_sql
from sing.traces.settings import MAX_SHIFT_S
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


def public_view(
    warehouse: Warehouse, since: datetime, until: datetime, margin_s: int = MAX_SHIFT_S
) -> pa.Table:
    """The attacker's view: every job submitted within `margin_s` of the window, as at `until`."""
    margin = timedelta(seconds=margin_s + 86_400)
    params = {"from": since - margin, "to": until + margin, "seen": until}
    return warehouse.connect().sql(PUBLIC_SQL, params=params).to_arrow_table()


def attack(
    release: pa.Table, package: dict, public: pa.Table, origin: float | None = None
) -> Attack:
    """Name the owners of a release's jobs from the public view (see the module docstring).
    `origin` (Unix seconds) hands the attacker the secret time origin instead of estimating it:
    the strongest version, as if the origin had leaked."""
    policy = package.get("anonymization") or {}
    res = float(policy.get("time_resolution_s", 0))
    ratio = float(policy.get("duration_ratio", 1.0))
    con = sql.connect()
    con.register("rel_in", conform(JOBS, release))
    con.register("pub_in", public)
    con.execute(RELEASED_SQL, {"res": res, "ratio": ratio})
    con.execute(PUBLIC_DURATIONS_SQL)
    partitions = _reverse_partitions(con)
    if origin is None and policy.get("time_origin", "release_start") == "release_start":
        origin = parse_time(package["release_start"], "release_start").timestamp()
    elif origin is None:
        origin = _estimate_origin(con)
    con.execute(PUBLIC_BINS_SQL, {"origin": origin})
    con.execute(CANDIDATES_SQL)
    reversed_values = {
        "partition": partitions,
        "group": _reverse(
            con, '"group"', "account", "(SELECT account FROM pub WHERE account IS NOT NULL)"
        ),
        "node": _reverse_nodes(con),
    }
    return Attack(_claims(con), origin, reversed_values)


def _bin(x: str, res: str) -> str:
    """SQL: the bin of time `x` at resolution `res` (a column or number; 0 = exact)."""
    return f"CASE WHEN {res} > 0 THEN floor(({x}) / {res} + {EPS}) ELSE round({x}) END"


def _duration_bin(x: str, ratio: str, released: bool) -> str:
    """SQL: the bucket of a duration at factor `ratio` (a column): released values sit inside
    theirs (hence EPS); public ones are binned exactly as the export bins true durations."""
    eps = f" + {EPS}" if released else ""
    return (
        f"CASE WHEN {ratio} > 1 AND {x} >= 1 THEN floor(ln({x}) / ln({ratio}){eps}) "
        f"ELSE round({x}) END"
    )


# The released jobs with the bins of their own precision (a release before format 1.3 has one
# precision, the policy's $res and $ratio); an outcome the release hides matches any.
RELEASED_SQL = f"""
CREATE TEMP TABLE rel AS
WITH r AS (
    SELECT *, coalesce(submit_bin_s, $res) AS sres, coalesce(run_bin_ratio, $ratio) AS rratio
    FROM rel_in
)
SELECT row_number() OVER () - 1 AS i, coalesce("user", 'row' || i) AS pseudonym, "group",
       partition, num_nodes, gpus_per_node, num_gpus, gpu_model, nodes, submit_s, time_limit_s,
       CASE WHEN NOT censored AND state != 'unknown' THEN state END AS state, exit_class,
       nullif(dependencies, '{{}}') AS fingerprint, sres, rratio, gpus_min, gpus_max,
       {_bin("submit_s", "sres")} AS sbin,
       CASE WHEN NOT censored THEN {_duration_bin("run_s", "rratio", True)} END AS rbin,
       {_duration_bin("queue_s", "rratio", True)} AS qbin
FROM r
"""

# The public jobs with their duration and size buckets at each precision the release uses
# (which a time shift does not change).
PUBLIC_DURATIONS_SQL = f"""
CREATE TEMP TABLE pub_durations AS
SELECT p.*, p.partition AS real_partition, x.rratio,
       {_duration_bin('p."end" - p.start', "x.rratio", False)} AS rbin,
       {_duration_bin("p.start - p.submit", "x.rratio", False)} AS qbin
FROM pub_in p, (SELECT DISTINCT rratio FROM rel) x
"""

# And their submit bins under an origin, at each precision of the release. Parameter: $origin.
PUBLIC_BINS_SQL = f"""
CREATE TEMP TABLE pub AS
SELECT p.*, x.sres, {_bin("p.submit - $origin", "x.sres")} AS sbin
FROM pub_durations p JOIN (SELECT DISTINCT sres, rratio FROM rel) x USING (rratio)
"""


# A released job `r` and a public one `p` of the same size (or size class), durations, time
# limit and outcome; a value the release does not show (dropped, or cut by the window) matches
# any.
SAME_SIZE = """r.rratio = p.rratio
    AND CASE WHEN r.gpus_min IS NULL
             THEN r.num_nodes IS NOT DISTINCT FROM p.num_nodes
                  AND r.gpus_per_node IS NOT DISTINCT FROM p.gpus_per_node
                  AND r.num_gpus IS NOT DISTINCT FROM p.num_gpus
             ELSE p.num_gpus BETWEEN r.gpus_min AND r.gpus_max END
    AND (r.rbin IS NULL OR r.rbin = p.rbin) AND (r.qbin IS NULL OR r.qbin = p.qbin)
    AND (r.time_limit_s IS NULL OR r.time_limit_s = p.time_limit_s)
    AND (r.state IS NULL OR r.state = p.state)
    AND (r.exit_class IS NULL OR r.exit_class = p.exit_class)"""

# Public jobs a released job can be: same bins and size, same model unless generalised, same
# partition where the release shows its real name or it was reversed.
CANDIDATES_SQL = f"""
CREATE TEMP TABLE cand AS
SELECT r.i, p.pub, p."user", p.account, p.partition, p.nodes
FROM rel r JOIN pub p ON r.sres = p.sres AND r.sbin = p.sbin AND {SAME_SIZE}
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


def _estimate_origin(con: duckdb.DuckDBPyConnection) -> float:
    """The origin most (released, public) pairs of equal size and durations allow, from the
    released jobs of the finest submit precision (the most telling)."""
    ((res,),) = con.execute("SELECT coalesce(min(sres), 0) FROM rel").fetchall()
    width = max(res, 1.0)
    pairs = con.execute(
        f"""
        WITH sample AS (
            SELECT * FROM rel WHERE rbin IS NOT NULL AND sres = {res}
            ORDER BY hash(i) LIMIT {OFFSET_JOBS}
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
    unrelated jobs. Only the released jobs of submit precision `res` take part."""
    ((queue, partition),) = con.execute(
        "SELECT count(qbin) > 0, count(real_partition) > 0 FROM rel"
    ).fetchall()
    key = "sbin, rratio, rbin, num_nodes, gpus_per_node, num_gpus"
    key += (", qbin" if queue else "") + (", real_partition" if partition else "")
    rows = con.execute(
        f"""
        WITH g AS (SELECT unnest($origins::DOUBLE[]) AS origin),
        r AS (
            SELECT {key}, count(*) AS n FROM rel
            WHERE rbin IS NOT NULL AND sres = {res} GROUP BY ALL
        ),
        p AS (
            SELECT g.origin, {_bin("submit - g.origin", str(res))} AS sbin,
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
            "WITH f AS (SELECT min(sres) AS sres FROM rel), "
            "b AS (SELECT min(sbin) AS lo, max(sbin) AS hi FROM rel SEMI JOIN f USING (sres)) "
            "SELECT DISTINCT unnest(nodes) AS n FROM pub SEMI JOIN f USING (sres), b "
            "WHERE sbin BETWEEN lo AND hi ORDER BY n"
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


def energy_attack(release: pa.Table, public: pa.Table, origin: float) -> list[str | None]:
    """Run times read back from a quantity that grows with them. Per GPU model, the apparent
    power (energy_j / (run_s x GPUs)) is fitted as a line in gpu_util_mean (a GPU's power
    follows its load), each job's run time estimated as its energy over its GPUs' fitted power,
    and the estimates scaled so that their median ratio to run_s is 1 (the fit's bias). The
    candidates are the public jobs of the same size, model, outcome and submit bin (`origin`
    known) whose run time is within RUN_TOLERANCE of the estimate, and the attacker names a
    user holding more than half of them. Against energy published as measured, this recovers
    the run time far inside its bucket; against sing's (scaled with the released run time, so
    energy / run_s is the true mean power) it only picks a random slice of the bucket."""
    con = sql.connect()
    con.register("rel_in", conform(JOBS, release))
    con.register("pub_in", public)
    rows = con.execute(ENERGY_SQL, {"origin": origin, "tolerance": RUN_TOLERANCE}).fetchall()
    claims: list[str | None] = [None] * release.num_rows
    for i, user in rows:
        claims[i] = user
    return claims


RUN_TOLERANCE = 1.05  # the energy attack's run-time match: within x1.05 of its estimate
ENERGY_SQL = f"""
WITH r AS (
    SELECT row_number() OVER () - 1 AS i, *, coalesce(submit_bin_s, 0) AS sres,
           energy_j / (run_s * num_gpus) AS apparent_w
    FROM rel_in
),
measured AS (
    SELECT * FROM r
    WHERE energy_j > 0 AND run_s > 0 AND num_gpus > 0 AND NOT censored
      AND gpu_util_mean IS NOT NULL
),
fit AS (
    SELECT gpu_model, regr_intercept(apparent_w, gpu_util_mean) AS a,
           coalesce(regr_slope(apparent_w, gpu_util_mean), 0) AS b
    FROM measured GROUP BY ALL
),
raw AS (
    SELECT m.*, m.energy_j / (m.num_gpus * coalesce(f.a + f.b * m.gpu_util_mean, m.apparent_w))
           AS run_raw
    FROM measured m JOIN fit f USING (gpu_model)
),
est AS (
    SELECT *, run_raw / median(run_raw / run_s) OVER (PARTITION BY gpu_model) AS run_est
    FROM raw WHERE run_raw > 0
),
cand AS (
    SELECT e.i, p."user"
    FROM est e JOIN pub_in p
      ON e.num_nodes = p.num_nodes AND e.gpus_per_node = p.gpus_per_node
     AND (e.gpu_model = '{OTHER}' OR e.gpu_model = p.gpu_model)
     AND (e.state = 'unknown' OR e.state = p.state)
     AND p."end" > p.start
     AND CASE WHEN e.sres > 0
              THEN floor(e.submit_s / e.sres + {EPS}) = floor((p.submit - $origin) / e.sres)
              ELSE abs(e.submit_s - (p.submit - $origin)) < 1 END
     AND abs(ln((p."end" - p.start) / e.run_est)) <= ln($tolerance)
),
shares AS (SELECT i, "user", count(*) AS n FROM cand GROUP BY i, "user")
SELECT i, arg_max("user", n) FROM shares GROUP BY i HAVING max(n) > {CLAIM_POSTERIOR} * sum(n)
"""


def exact_attack(release: pa.Table, public: pa.Table, origin: float) -> list[str | None]:
    """The public job whose submit and run time a released row shows to the second (`origin`
    known), of the same size or size class: its owner. A release that published each job's own
    exact times would be named in full; one whose pools shuffle their times is right only as
    often as the shuffle left a row its own values, or gave it another of its owner's."""
    con = sql.connect()
    con.register("rel_in", conform(JOBS, release))
    con.register("pub_in", public)
    rows = con.execute(EXACT_SQL, {"origin": origin}).fetchall()
    claims: list[str | None] = [None] * release.num_rows
    for i, user in rows:
        claims[i] = user
    return claims


EXACT_SQL = """
WITH r AS (SELECT row_number() OVER () - 1 AS i, * FROM rel_in WHERE run_s IS NOT NULL),
cand AS (
    SELECT r.i, p."user"
    FROM r JOIN pub_in p
      ON abs(r.submit_s - (p.submit - $origin)) < 0.5
     AND abs(r.run_s - (least(coalesce(p."end", p.start + r.run_s), p.start + r.run_s)
                        - p.start)) < 0.5
     AND CASE WHEN r.gpus_min IS NULL THEN r.num_gpus = p.num_gpus
              ELSE p.num_gpus BETWEEN r.gpus_min AND r.gpus_max END
)
SELECT i, any_value("user") FROM cand GROUP BY i HAVING count(DISTINCT "user") = 1
"""


def owners(public: pa.Table, key: bytes, released_ids: pa.ChunkedArray) -> pa.Array:
    """The real owner of each released job, found through the job-id pseudonym (steward only)."""
    ids = pseudonymize(public["pub"], key, "j", distinct=True)
    index = pc.index_in(released_ids, ids)
    return pc.take(public["user"], index)
