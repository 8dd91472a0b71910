"""Anonymization of an export: keyed pseudonyms, small-group merging, rare-shape handling.

Pseudonyms are HMAC-SHA256 under the release's secret key, never a bare hash: a bare hash of a
user name is reversed by hashing the department's user list. Each kind of identifier gets its
own domain prefix, so a user and a group with the same name get unrelated pseudonyms. The HMAC
runs once per distinct value (a few thousand users, one per job id) and the result is joined
back, which keeps a million-job export fast.
"""

from __future__ import annotations

import hashlib
import hmac

import pyarrow as pa
import pyarrow.compute as pc

from traces import sql

OTHER = "other"
PSEUDONYM_HEX = 16  # 64 bits: no collisions expected below ~10^9 distinct values


def pseudonymize(column: pa.ChunkedArray | pa.Array, key: bytes, kind: str) -> pa.Array:
    """Replace each value by `kind` + '_' + HMAC-SHA256(key, kind:value), nulls kept."""
    column = pa.chunked_array([column]) if isinstance(column, pa.Array) else column
    encoded = pc.dictionary_encode(column.combine_chunks())
    keyed = hmac.new(key, f"{kind}:".encode(), hashlib.sha256)

    def name(value: str, copy=keyed.copy) -> str:  # copying the keyed state skips re-keying
        mac = copy()
        mac.update(value.encode())
        return f"{kind}_{mac.hexdigest()[:PSEUDONYM_HEX]}"

    names = list(map(name, encoded.dictionary.to_pylist()))
    return pc.take(pa.array(names, pa.string()), encoded.indices)


def apply_k_anonymity(jobs: pa.Table, k: int, rare_shapes: str) -> tuple[pa.Table, int]:
    """Merge groups of fewer than k users into OTHER and handle rare resource shapes.

    A shape is (num_nodes, gpus_per_node, gpu_model); one used by fewer than k distinct users
    singles out whoever ran it. Returns the table (real user names still in it, so distinct users
    can be counted) and how many jobs were left out.
    """
    con = sql.connect()
    con.register("jobs", jobs)
    generalize = "TRUE" if rare_shapes == "generalize" else "FALSE"
    keep_rare = "TRUE" if rare_shapes == "keep" else "FALSE"
    out = con.sql(
        f"""
        WITH group_users AS (
            SELECT "group", count(DISTINCT "user") AS n FROM jobs GROUP BY ALL
        ),
        shape_users AS (
            SELECT {SHAPE}, count(DISTINCT "user") AS n FROM jobs GROUP BY ALL
        ),
        merged AS (
            SELECT j.* EXCLUDE ("group", gpu_model),
                   CASE WHEN g.n < $k THEN '{OTHER}' ELSE j."group" END AS "group",
                   CASE WHEN {generalize} AND s.n < $k THEN '{OTHER}' ELSE j.gpu_model END
                       AS gpu_model
            FROM jobs j
            LEFT JOIN group_users g ON j."group" = g."group"
            JOIN shape_users s ON {_same_shape("j", "s")}
        ),
        merged_shapes AS (
            SELECT {SHAPE}, count(DISTINCT "user") AS n FROM merged GROUP BY ALL
        )
        SELECT {", ".join(f'm."{c}"' for c in jobs.column_names)}
        FROM merged m JOIN merged_shapes s ON {_same_shape("m", "s")}
        WHERE {keep_rare} OR s.n >= $k
        """,
        params={"k": k},
    ).to_arrow_table()
    return out, jobs.num_rows - out.num_rows


SHAPE = "num_nodes, gpus_per_node, gpu_model"


def _same_shape(a: str, b: str) -> str:
    """Join condition on the shape columns, where an unknown (null) value matches itself."""
    return " AND ".join(f"{a}.{c} IS NOT DISTINCT FROM {b}.{c}" for c in SHAPE.split(", "))
