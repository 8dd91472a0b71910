"""Anonymization of an export: keyed pseudonyms, small-group merging, rare-shape handling.

Pseudonyms are HMAC-SHA256 under the release's secret key, never a bare hash: a bare hash of a
user name is reversed by hashing the department's user list. Each kind of identifier gets its
own domain prefix, so a user and a group with the same name get unrelated pseudonyms. The HMAC
runs once per distinct value (a few thousand users, one per job id) and the result is joined
back, which keeps a million-job export fast.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from sing.traces.settings import GPUS_CLASS_EDGES, Rung

OTHER = "other"
PSEUDONYM_HEX = 16  # 64 bits: no collisions expected below ~10^9 distinct values
SHA256_BLOCK = 64


def pseudonymize(
    column: pa.ChunkedArray | pa.Array, key: bytes, kind: str, distinct: bool = False
) -> pa.Array:
    """Replace each value by `kind` + '_' + HMAC-SHA256(key, kind:value), nulls kept.

    The HMAC runs once per distinct value, found first; `distinct=True` says that (nearly) all
    values differ already, as job ids do, so looking for repeats would be wasted work.
    """
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if distinct:
        return _pseudonyms(array, key, kind)
    encoded = pc.dictionary_encode(array)
    return pc.take(_pseudonyms(encoded.dictionary, key, kind), encoded.indices)


def _pseudonyms(values: pa.Array, key: bytes, kind: str) -> pa.Array:
    mac = hmac_sha256_hex(key, f"{kind}:".encode())
    names = [
        None if value is None else f"{kind}_{mac(value)[:PSEUDONYM_HEX]}"
        for value in values.cast(pa.binary()).to_pylist()
    ]
    return pa.array(names, pa.string())


def hmac_sha256_hex(key: bytes, prefix: bytes) -> Callable[[bytes], str]:
    """A function giving HMAC-SHA256(key, prefix + message) in hex: exactly `hmac.new`'s digest.

    HMAC = H((K ^ opad) || H((K ^ ipad) || m)) (RFC 2104). The padded key halves (and the
    prefix) are hashed once; each message then costs two copies of those hash states and no
    Python-level `hmac.HMAC` wrapper calls: about 40 % less time than copying a keyed `hmac`
    object for each of a million job ids. A test checks the result against `hmac.new`.
    """
    if len(key) > SHA256_BLOCK:
        key = hashlib.sha256(key).digest()
    key = key.ljust(SHA256_BLOCK, b"\0")
    inner = hashlib.sha256(bytes(b ^ 0x36 for b in key))
    inner.update(prefix)
    outer = hashlib.sha256(bytes(b ^ 0x5C for b in key))

    def mac(message: bytes, inner_copy=inner.copy, outer_copy=outer.copy) -> str:
        digest = inner_copy()
        digest.update(message)
        result = outer_copy()
        result.update(digest.digest())
        return result.hexdigest()

    return mac


SHAPE = ("num_nodes", "gpus_per_node", "gpu_model")
# The columns of `people` behind each quasi-identifier of [trace] quasi_identifiers. The times
# are raw (seconds from the origin) and binned per rung (`_cell_columns`).
QI_COLUMNS = {
    "shape": SHAPE,
    "submit": ("submit",),
    "run": ("run",),
    "queue": ("queue",),
    "time_limit": ("time_limit_s",),
    "outcome": ("state", "exit_class", "failure_class"),
    "partition": ("partition",),
    "group": ("group",),
    "dependencies": ("dependencies",),
}


def _same(a: str, b: str, columns: tuple[str, ...]) -> str:
    """Join condition on `columns`, where an unknown (null) value matches itself."""
    return " AND ".join([f"{a}.{c} IS NOT DISTINCT FROM {b}.{c}" for c in columns] or ["TRUE"])


def duration_bucket(x: str, ratio: str) -> str:
    """SQL: the bucket of duration `x`, a whole power of `ratio` (a number or a column; exact
    below 1 s or at 1). The k rule's pools and the release's shuffle both bin with it, so they
    cannot disagree on a bucket."""
    return f"CASE WHEN {ratio} > 1 AND {x} >= 1 THEN floor(ln({x}) / ln({ratio})) ELSE {x} END"


def submit_bin(x: str, resolution_s: int) -> str:
    """SQL: the bin of submit time `x` (seconds from the origin); exact at resolution 0."""
    return f"floor({x} / {resolution_s})" if resolution_s > 0 else x


def gpus_class(x: str) -> str:
    """SQL: the number (1, 2, ...) of the class of GPU count `x` (GPUS_CLASS_EDGES)."""
    return f"len(list_filter({list(GPUS_CLASS_EDGES)}, lambda e: e <= {x}))"


def _cell_columns(rung: Rung) -> dict[str, str]:
    """Each column of `people` as the k rule sees it at `rung`: times binned, model hidden."""
    return {
        "submit": submit_bin("submit", rung.resolution_s),
        "run": duration_bucket("run", repr(rung.ratio)),
        "queue": duration_bucket("queue", repr(rung.ratio)),
        "gpu_model": f"'{OTHER}'" if rung.model_hidden else "gpu_model",
        **dict.fromkeys(QI_COLUMNS["outcome"] if rung.outcome_hidden else (), "NULL"),
        **(
            {"num_nodes": "NULL", "gpus_per_node": gpus_class("num_nodes * gpus_per_node")}
            if rung.shape_hidden
            else {}
        ),
    }


# `people` (r, user, group, shape, raw times, partition, ...) with groups of fewer than $k
# users merged into OTHER, and the model of a shape used by fewer than $k users hidden when
# $generalize: every job as the rule sees it.
BASE_SQL = f"""
CREATE TEMP TABLE base AS
WITH group_users AS (
    SELECT "group", count(DISTINCT "user") AS n FROM people GROUP BY ALL
),
shape_users AS (
    SELECT {", ".join(SHAPE)}, count(DISTINCT "user") AS n FROM people GROUP BY ALL
)
SELECT p.* EXCLUDE ("group", gpu_model),
       CASE WHEN g.n < $k THEN '{OTHER}' ELSE p."group" END AS "group",
       CASE WHEN $generalize AND s.n < $k THEN '{OTHER}' ELSE p.gpu_model END AS gpu_model
FROM people p
LEFT JOIN group_users g ON p."group" = g."group"
JOIN shape_users s ON {_same("p", "s", SHAPE)}
"""


def pool_sql(quasi_identifiers: tuple[str, ...], rung: Rung) -> str:
    """Over `base`: each job's pool at `rung` (r, user, group, gpu_model as released there,
    pool: a hash of its quasi-identifiers at the rung's precision)."""
    binned = _cell_columns(rung)
    cell = tuple(dict.fromkeys(c for q in quasi_identifiers for c in QI_COLUMNS[q]))
    quoted = {"group": '"group"'}
    key = ", ".join(binned.get(c, quoted.get(c, c)) for c in cell) or "0"
    return f"""SELECT r, "user", "group", {binned["gpu_model"]} AS gpu_model,
       hash({key}) AS pool FROM base"""


# The pools of the pending jobs at one rung, the jobs of those that pass the rule (at least $k
# users, none with more than half the jobs) or of all ($keep_all). Reads `rung_pools`.
RELEASE_SQL = """
WITH pending AS (SELECT * FROM rung_pools ANTI JOIN kept USING (r)),
pool_users AS (SELECT pool, "user", count(*) AS n FROM pending GROUP BY ALL),
pools AS (
    SELECT pool, count(*) AS users, sum(n) AS jobs, max(n) AS top FROM pool_users GROUP BY pool
)
SELECT p.r, p."group", p.gpu_model, $rung AS rung, p.pool
FROM pending p JOIN pools USING (pool)
WHERE $keep_all OR (users >= $k AND ($k < 2 OR 2 * top <= jobs))
"""


# Per released pool: its rung and precision, distinct users, jobs, and the top user's jobs (the
# privacy report's figures). Reads `kept`, `base` and `rung_list`.
POOL_STATS_SQL = """
CREATE TEMP TABLE pool_stats AS
WITH u AS (
    SELECT k.rung, k.pool, b."user", count(*) AS n FROM kept k JOIN base b USING (r) GROUP BY ALL
)
SELECT rung, pool, l.resolution_s, l.ratio, l.model_hidden, l.outcome_hidden, l.shape_hidden,
       count(*) AS users, sum(n) AS jobs, max(n) AS top
FROM u JOIN rung_list l USING (rung)
GROUP BY ALL
"""


def apply_k_anonymity(
    con: duckdb.DuckDBPyConnection,
    k: int,
    rare_shapes: str,
    quasi_identifiers: tuple[str, ...],
    rungs: list[Rung],
    seed: bytes = b"",
) -> int:
    """Create the temporary tables `kept` (r, group, gpu_model, rung, pool, resolution_s, ratio,
    outcome_hidden, shape_hidden) from the relation `people`, each job with the pool and
    precision it is released at, and `pool_stats` (POOL_STATS_SQL).

    Groups of fewer than k distinct users are merged into OTHER. A shape is (num_nodes,
    gpus_per_node, gpu_model); one used by fewer than k distinct users singles out whoever ran
    it: `generalize` turns its model into OTHER before the pools are formed. Then each rung in
    turn releases the pending jobs whose pool (equal quasi-identifiers at its precision)
    passes the rule, and a failing pool may take cover jobs (`_take_cover`). A job
    that passes no rung is left out. `rare_shapes` = keep applies no rule. Only these narrow
    columns take part, so the wide job rows are never copied for the policy. Returns how many
    jobs were left out.
    """
    con.execute(BASE_SQL, {"k": k, "generalize": rare_shapes == "generalize"})
    con.execute(
        'CREATE TEMP TABLE kept (r BIGINT, "group" VARCHAR, gpu_model VARCHAR, rung INTEGER, '
        "pool UBIGINT)"
    )
    params = {"k": k, "keep_all": rare_shapes == "keep"}
    for index, rung in enumerate(rungs):
        pools = pool_sql(quasi_identifiers, rung)
        con.execute(f"CREATE OR REPLACE TEMP TABLE rung_pools AS {pools}")
        con.execute(f"INSERT INTO kept {RELEASE_SQL}", params | {"rung": index})
        if index > 0 and rare_shapes != "keep":
            _take_cover(con, k, index, seed)
    con.register(
        "rung_list",
        pa.table(
            {
                "rung": range(len(rungs)),
                "resolution_s": [r.resolution_s for r in rungs],
                "ratio": [r.ratio for r in rungs],
                "model_hidden": [r.model_hidden for r in rungs],
                "outcome_hidden": [r.outcome_hidden for r in rungs],
                "shape_hidden": [r.shape_hidden for r in rungs],
            }
        ),
    )
    con.execute(POOL_STATS_SQL)
    con.execute(
        "CREATE OR REPLACE TEMP TABLE kept AS "
        'SELECT k.r, k."group", k.gpu_model, k.rung, k.pool, l.resolution_s, l.ratio, '
        "l.outcome_hidden, l.shape_hidden FROM kept k JOIN rung_list l USING (rung)"
    )
    con.unregister("rung_list")
    ((left_out,),) = con.execute("SELECT count(*) FROM base ANTI JOIN kept USING (r)").fetchall()
    return left_out


def _take_cover(con: duckdb.DuckDBPyConnection, k: int, last: int, seed: bytes) -> None:
    """Release the pools still failing at rung `last` among cover jobs: jobs of other users
    with the same quasi-identifiers at that precision, already released more precisely, that
    are published at this rung's precision instead (a keyed random choice, so nobody can
    tell cover from the pool's own jobs). A pool is released once it holds k users and no
    user more than half its jobs; a cover job leaves its own pool alone if that pool still
    passes without it, else with the whole pool, so that no pool left behind fails the rule.
    A pool with too little cover stays out, and its cover where it was.

    Without cover, a heavy user whose jobs dominate every pool they fall in (many similar jobs
    in one week) would be left out whatever the precision: cover keeps them, and the attacker
    who can redo every step of the rule (`sacct -a` shows all owners) still cannot name them.
    """
    rows = con.execute(
        """
        SELECT b.r, b."user", b.pool AS last_pool, k.pool AS own_pool, k.rung
        FROM rung_pools b LEFT JOIN kept k USING (r)
        """
    ).fetchall()
    failing: dict[int, list[tuple[int, str]]] = {}
    kept_in: dict[int, list[tuple[int, str, tuple]]] = {}  # last pool -> released jobs
    members: dict[tuple, dict[int, str]] = {}  # a released job's (rung, pool) -> r: user
    for r, user, last_pool, own_pool, rung in rows:
        if own_pool is None:
            failing.setdefault(last_pool, []).append((r, user))
            continue
        members.setdefault((rung, own_pool), {})[r] = user
        if rung < last:
            kept_in.setdefault(last_pool, []).append((r, user, (rung, own_pool)))

    def deficit(users: Counter[str]) -> int:
        """How far a pool is from passing: users missing, and jobs the top user has too many."""
        jobs = sum(users.values())
        top = max(users.values(), default=0)
        return max(0, k - len(users)) + (max(0, 2 * top - jobs) if k >= 2 else 0)

    def order(r: int) -> bytes:
        return hashlib.blake2b(r.to_bytes(8, "little"), key=seed[:64], digest_size=8).digest()

    released: list[tuple[int, int]] = []  # (r, last pool): deferred jobs and their cover
    for pool, jobs in failing.items():
        users = Counter(user for _, user in jobs)
        taken: dict[tuple, dict[int, str]] = {}  # own pool -> its jobs taken as cover
        for r, user, own_pool in sorted(kept_in.get(pool, ()), key=lambda job: order(job[0])):
            if not deficit(users):
                break
            left = {j: u for j, u in members[own_pool].items() if j not in taken.get(own_pool, {})}
            if r not in left:
                continue  # taken with its whole pool
            rest = Counter(u for j, u in left.items() if j != r)
            # One job where its pool still passes without it, else the whole pool with it.
            move = {r: user} if not rest or not deficit(rest) else left
            grown = users + Counter(move.values())
            if deficit(grown) < deficit(users):
                users = grown
                taken.setdefault(own_pool, {}).update(move)
        if deficit(users):
            continue  # too little cover: the pool stays out, and its cover where it was
        for own_pool, jobs_taken in taken.items():
            for j in jobs_taken:
                del members[own_pool][j]
        cover = [j for jobs_taken in taken.values() for j in jobs_taken]
        released += [(r, pool) for r, _ in jobs] + [(r, pool) for r in cover]
    if not released:
        return
    r, pool = zip(*released, strict=True)
    con.register(
        "covered", pa.table({"r": pa.array(r, pa.int64()), "pool": pa.array(pool, pa.uint64())})
    )
    con.execute(
        f"""
        DELETE FROM kept WHERE r IN (SELECT r FROM covered);
        INSERT INTO kept
        SELECT c.r, b."group", b.gpu_model, {last}, c.pool
        FROM covered c JOIN rung_pools b USING (r);
        """
    )
    con.unregister("covered")
