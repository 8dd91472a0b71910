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
    prefix = f"{kind}:".encode()
    names = [
        f"{kind}_" + hmac.digest(key, prefix + value.encode(), hashlib.sha256).hex()[:PSEUDONYM_HEX]
        for value in encoded.dictionary.to_pylist()
    ]
    return pc.take(pa.array(names, pa.string()), encoded.indices)


def apply_k_anonymity(jobs: pa.Table, k: int, rare_shapes: str) -> tuple[pa.Table, int]:
    """Merge groups of fewer than k users into OTHER and handle rare resource shapes.

    A shape is (num_nodes, gpus_per_node, gpu_model); one used by fewer than k distinct users
    singles out whoever ran it. Returns the table (real user names still in it, so distinct users
    can be counted) and how many jobs were left out.
    """
    con = sql.connect()
    con.register("jobs", jobs)
    others = ", ".join(f'"{c}"' for c in jobs.column_names if c not in ("group", "gpu_model"))
    shape_users = 'count(DISTINCT "user") OVER (PARTITION BY num_nodes, gpus_per_node, gpu_model)'
    generalize = "TRUE" if rare_shapes == "generalize" else "FALSE"
    keep_rare = "TRUE" if rare_shapes == "keep" else "FALSE"
    out = con.sql(
        f"""
        WITH merged AS (
            SELECT {others},
                   CASE WHEN "group" IS NULL THEN NULL
                        WHEN count(DISTINCT "user") OVER (PARTITION BY "group") < $k
                        THEN '{OTHER}' ELSE "group" END AS "group",
                   CASE WHEN {generalize} AND {shape_users} < $k
                        THEN '{OTHER}' ELSE gpu_model END AS gpu_model
            FROM jobs
        )
        SELECT {", ".join(f'"{c}"' for c in jobs.column_names)} FROM merged
        QUALIFY {keep_rare} OR {shape_users} >= $k
        """,
        params={"k": k},
    ).to_arrow_table()
    return out, jobs.num_rows - out.num_rows
