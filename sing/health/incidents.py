"""Incidents: a node (or one of its devices) that failed, from opening to how it ended.

Each change is a new `incidents` record (the newest wins: open -> closed) plus an
`incident_notes` row, so the table says where each incident stands and the notes say who did
what and when. An incident keeps the jobs that ran on its node when it opened; the jobs that
failed there while it was open are linked by `jobs_in_incidents`.
"""

from __future__ import annotations

import difflib
import getpass
import json
import secrets
from datetime import UTC, datetime
from typing import Any

import duckdb
import pyarrow as pa

from sing.errors import UserError
from sing.schema import table
from sing.warehouse.store import Warehouse

CLASSES = ("xid", "ecc", "row_remap", "link", "node_down", "service_request", "other")
AUTO, MANUAL = "auto", "manual"
FAILED_STATES = ("FAILED", "NODE_FAIL")

# A failed job is put down to an incident still open for at most this long after it opened: an
# incident nobody closes must not turn weeks of users' failures into hardware ones. Closing one
# declares its period, and every failure on the node within it is linked.
LINK_HOURS = 24
# SQL: whether job `j` ended while incident `i` was open: up to its closing, or for one still
# open up to `now` and at most LINK_HOURS after its opening.
ENDED_DURING_SQL = (
    "{j}.end_time >= {i}.opened_at AND {j}.end_time <= coalesce({i}.closed_at, least({now}, "
    "{i}.opened_at + INTERVAL " + str(LINK_HOURS) + " HOUR))"
)
# SQL: whether job `j` may have used GPU `{device}` of `{node}`: any job when the incident is
# on the whole node (or a port), and a job whose GPUs there are not recorded (`job_gpus`): an
# unknown mapping does not clear a job. Otherwise only the jobs that held that GPU.
ON_DEVICE_SQL = """(
    try_cast({device} AS SMALLINT) IS NULL
    OR NOT EXISTS (SELECT 1 FROM job_gpus g WHERE g.cluster = {j}.cluster
                   AND g.job_id = {j}.job_id AND g.node = {node})
    OR EXISTS (SELECT 1 FROM job_gpus g WHERE g.cluster = {j}.cluster AND g.job_id = {j}.job_id
               AND g.node = {node} AND g.gpu_index = try_cast({device} AS SMALLINT))
)"""

# A job failed "in" an incident when it ended on the incident's node while the incident was open.
LINKED_JOBS_SQL = f"""
SELECT i.incident_id, i.cluster, i.node, i.class, j.job_id, j."user", j.account, j.state,
       j.end_time
FROM incidents i
JOIN jobs j ON j.cluster = i.cluster AND list_contains(j.nodes, i.node)
WHERE j.state IN ('FAILED', 'NODE_FAIL')
  AND {{on_device}}
  AND {ENDED_DURING_SQL.format(j="j", i="i", now="j.end_time")}
""".format(on_device=ON_DEVICE_SQL.format(j="j", node="i.node", device="i.device"))


def user_actor() -> str:
    """Who acts from a shell: the unix user running the command."""
    return getpass.getuser()


def open_incident(
    warehouse: Warehouse,
    *,
    cluster: str,
    node: str,
    klass: str,
    note: str,
    actor: str,
    source: str = MANUAL,
    device: str | None = None,
    signal: str | None = None,
    evidence: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> str:
    """Open an incident on `node` (or one of its devices) and return its id."""
    if klass not in CLASSES:
        raise UserError(f"incident class {klass!r} is not one of {', '.join(CLASSES)}")
    if not node.strip():
        raise UserError("an incident needs the node it happened on")
    now = now or datetime.now(UTC)
    con = warehouse.connect({"incidents": None, "jobs": None, "job_gpus": None})
    try:
        incident_id = _new_id(con)
        jobs = running_jobs(con, cluster, node, now, device)
    finally:
        con.close()
    record = {
        "incident_id": incident_id,
        "cluster": cluster,
        "node": node,
        "device": device,
        "class": klass,
        "source": source,
        "signal": signal,
        "opened_at": now,
        "opened_by": actor,
        "jobs": jobs,
        "evidence": json.dumps(evidence, sort_keys=True) if evidence is not None else None,
    }
    _write(warehouse, record, "opened", actor, note, now)
    return incident_id


def note_incident(
    warehouse: Warehouse, incident_id: str, text: str, *, actor: str, now: datetime | None = None
) -> None:
    """Add a note to an incident (open or closed: what was found later belongs there too)."""
    incident = get_incident(warehouse, incident_id)
    _append_note(warehouse, incident["cluster"], incident_id, "note", actor, text, now)


def close_incident(
    warehouse: Warehouse, incident_id: str, note: str, *, actor: str, now: datetime | None = None
) -> None:
    """Close an open incident; `note` says how it ended (its resolution)."""
    incident = get_incident(warehouse, incident_id)
    if incident["closed_at"] is not None:
        raise UserError(
            f"incident {incident_id} was already closed at {incident['closed_at']:%Y-%m-%d %H:%M} "
            f"UTC by {incident['closed_by']}; add a note instead"
        )
    now = now or datetime.now(UTC)
    if now < incident["opened_at"]:
        raise UserError(f"incident {incident_id} cannot close before it opened")
    incident.update(closed_at=now, closed_by=actor, resolution=note, recorded_at=None)
    _write(warehouse, incident, "closed", actor, note, now)


def get_incident(warehouse: Warehouse, incident_id: str) -> dict[str, Any]:
    """The incident's newest record; a UserError naming the id when there is none."""
    con = warehouse.connect({"incidents": None})
    try:
        rows = dicts(
            con,
            "SELECT * FROM incidents WHERE incident_id = ? ORDER BY recorded_at DESC LIMIT 1",
            [incident_id],
        )
    finally:
        con.close()
    if not rows:
        raise UserError(f"no incident {incident_id!r}; `sing incident list` shows their ids")
    return rows[0]


def list_incidents(
    warehouse: Warehouse, *, open_only: bool = False, since: datetime | None = None
) -> list[dict[str, Any]]:
    """Incidents, newest first, each with `failed_jobs` (the jobs linked to it) and `notes`
    (how many). `since`: those open at any time from then on."""
    con = warehouse.connect(
        {"incidents": None, "incident_notes": None, "jobs": None, "job_gpus": None}
    )
    try:
        jobs_in_incidents(con)
        return dicts(
            con,
            """
            SELECT i.incident_id, i.cluster, i.node, i.device, i.class, i.source, i.signal,
                   i.opened_at, i.opened_by, i.closed_at, i.closed_by, i.resolution, i.jobs,
                   coalesce((SELECT list(l.job_id ORDER BY l.end_time) FROM incident_jobs l
                             WHERE l.incident_id = i.incident_id AND l.cluster = i.cluster),
                            []) AS failed_jobs,
                   (SELECT count(*) FROM incident_notes n
                    WHERE n.incident_id = i.incident_id AND n.cluster = i.cluster) AS notes,
                   i.evidence
            FROM incidents i
            WHERE (NOT $open_only OR i.closed_at IS NULL)
              AND ($since IS NULL OR i.closed_at IS NULL OR i.closed_at >= $since)
            ORDER BY i.opened_at DESC, i.incident_id
            """,
            {"open_only": open_only, "since": since},
        )
    finally:
        con.close()


def jobs_in_incidents(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyRelation:
    """The view `incident_jobs` on `con` (which has `incidents` and `jobs`): each job that
    FAILED or NODE_FAIL on an incident's node while the incident was open, one row per pair."""
    con.execute(f"CREATE OR REPLACE TEMP VIEW incident_jobs AS {LINKED_JOBS_SQL}")
    return con.table("incident_jobs")


def dicts(con: duckdb.DuckDBPyConnection, sql: str, params: Any) -> list[dict[str, Any]]:
    """A query's rows as dicts (times as aware UTC datetimes)."""
    return con.sql(sql, params=params).to_arrow_table().to_pylist()


def running_jobs(
    con: duckdb.DuckDBPyConnection, cluster: str, node: str, at: datetime, device: str | None = None
) -> list:
    """Ids of the jobs running on `node` at `at`, from the `jobs` records; with a GPU index
    as `device`, only those that held that GPU (or whose GPUs there are not recorded)."""
    on_device = ON_DEVICE_SQL.format(j="jobs", node="$node", device="$device")
    rows = con.execute(
        f"""
        SELECT job_id FROM jobs
        WHERE cluster = $cluster AND list_contains(nodes, $node) AND start_time <= $at
          AND (end_time IS NULL OR end_time > $at) AND {on_device}
        ORDER BY start_time, job_id
        """,
        {"cluster": cluster, "node": node, "at": at, "device": device},
    ).fetchall()
    return [job_id for (job_id,) in rows]


def check_known_node(warehouse: Warehouse, cluster: str, node: str) -> None:
    """Refuse a node the warehouse has never seen (inventory, jobs, scrapes) for `cluster`: a
    typo would open an incident no report ever matches. A warehouse that knows no node at all
    (nothing collected yet) has nothing to check against."""
    con = warehouse.connect({"nodes": None, "jobs": None})
    try:
        known = {
            name
            for (name,) in con.execute(
                "SELECT node FROM nodes WHERE cluster = $c UNION "
                "SELECT unnest(nodes) FROM jobs WHERE cluster = $c",
                {"c": cluster},
            ).fetchall()
            if name
        }
    finally:
        con.close()
    if known and node not in known:
        like = difflib.get_close_matches(node, sorted(known), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(like)}?" if like else ""
        raise UserError(
            f"node {node!r} is not in the inventory or job records of cluster {cluster}{hint}"
        )


def _new_id(con: duckdb.DuckDBPyConnection) -> str:
    """A short random id ("INC-" and 8 hex digits) no incident has yet."""
    while True:
        candidate = f"INC-{secrets.token_hex(4)}"
        taken = con.execute(
            "SELECT count(*) FROM incidents WHERE incident_id = ?", [candidate]
        ).fetchone()
        if not taken[0]:
            return candidate


def _write(
    warehouse: Warehouse,
    record: dict[str, Any],
    event: str,
    actor: str,
    text: str,
    now: datetime,
) -> None:
    """The incident's new record, then the note that says who changed it (a failure between
    the two leaves the record without its note, never a note about a change that was lost)."""
    warehouse.append("incidents", pa.Table.from_pylist([record], table("incidents").schema))
    _append_note(warehouse, record["cluster"], record["incident_id"], event, actor, text, now)


def _append_note(
    warehouse: Warehouse,
    cluster: str,
    incident_id: str,
    event: str,
    author: str,
    text: str,
    now: datetime | None,
) -> None:
    row = {
        "ts": now or datetime.now(UTC),
        "cluster": cluster,
        "incident_id": incident_id,
        "event": event,
        "author": author,
        "text": text,
    }
    warehouse.append("incident_notes", pa.Table.from_pylist([row], table("incident_notes").schema))
