"""Drain suggestions: nodes whose health readings cross the `[health]` drain limits, with the
evidence and the `scontrol` command that drains them; with the site's permission, the drain.

A limit is on a GPU's or port's newest reading (uncorrected ECC errors since the driver loaded,
the row-remap-failed and retired-pages-pending flags) or on a counter's increase over the last
`drain_window_hours` (XIDs of the listed codes, link downs); a counter that went down was reset
and counts from zero. `health_samples` holds a row per change, so the newest row of a series is
its value now.

sing drains only with `[health] drain = true` and `dry_run = false`, through the executor's
`drain(node, reason)`, and records each decision (dry run or not, done or failed) as an
`action`/`drain` row of `policy_events`, the audit trail the policies keep. A node that sing
drained after its newest evidence is not drained again: an admin who resumed it decided so,
until a reading changes.
"""

from __future__ import annotations

import re
import shlex
from datetime import UTC, datetime, timedelta

import duckdb

from executors.base import executor_settings, make_executor
from health.settings import HealthSettings
from policy.audit import ACTION, Event, actor, record
from sing.config import Config
from sing.errors import UserError
from warehouse.store import Warehouse

DRAIN = "drain"  # the outcome of a drain in policy_events
FLAGS = ("row_remap_failed", "retired_pages_pending")
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
REASON_CHARS = re.compile(r"[^A-Za-z0-9_./:+=(), -]")
MAX_REASON = 200

# Per series of the signals drain looks at: its newest value, when it last changed, and its
# increase since $from (a drop is a reset: the new value is the increase). A series' first row
# is a baseline (a port's link downs over months of uptime are not new), except an XID's: the
# exporter's XID counts start at zero, so a first row is that many new XIDs.
READINGS_SQL = """
WITH s AS (
    SELECT cluster, node, component, device, signal, ts, value,
           lag(value) OVER (PARTITION BY cluster, node, component, device, signal
                            ORDER BY ts) AS prev
    FROM health_samples
    WHERE ts <= $now AND (list_contains($signals, signal) OR signal LIKE 'xid\\_%' ESCAPE '\\')
)
SELECT cluster, node, component, device, signal,
       arg_max(value, ts) AS value,
       -- when the value last changed: a collector restart rewrites an unchanged value
       max(ts) FILTER (WHERE prev IS NULL OR value <> prev) AS ts,
       coalesce(sum(CASE WHEN prev IS NULL AND signal NOT LIKE 'xid\\_%' ESCAPE '\\' THEN 0
                         WHEN prev IS NULL OR value < prev THEN value
                         ELSE value - prev END)
                FILTER (WHERE ts > $from), 0) AS increase
FROM s GROUP BY ALL
ORDER BY cluster, node, component, device, signal
"""

# The newest successful real drain per node, from the audit trail.
DRAINED_SQL = f"""
SELECT cluster, detail ->> '$.node' AS node, max(ts) AS drained_at
FROM policy_events
WHERE event = '{ACTION}' AND outcome = '{DRAIN}' AND ok AND NOT dry_run
GROUP BY ALL
"""


def candidates(
    con: duckdb.DuckDBPyConnection, settings: HealthSettings, now: datetime
) -> list[dict]:
    """The nodes over a limit: cluster, node, evidence (one dict per reading over its limit),
    the reason text, the `scontrol` command, and the time of the newest evidence."""
    params = {
        "now": now,
        "from": now - timedelta(hours=settings.drain_window_hours),
        "signals": ["ecc_uncorrected_volatile", *FLAGS, "link_downed"],
    }
    nodes: dict[tuple[str, str], list[dict]] = {}
    result = con.execute(READINGS_SQL, params)
    names = [d[0] for d in result.description]
    for row in (dict(zip(names, r, strict=True)) for r in result.fetchall()):
        found = _over_limit(row, settings)
        if found:
            nodes.setdefault((row["cluster"], row["node"]), []).append(found)
    out = []
    for (cluster, node), evidence in nodes.items():
        reason = reason_text(evidence)
        out.append(
            {
                "cluster": cluster,
                "node": node,
                "evidence": evidence,
                "reason": reason,
                "command": command(node, reason),
                "newest_evidence": max(e["ts"] for e in evidence),
            }
        )
    return out


def _over_limit(row: dict, settings: HealthSettings) -> dict | None:
    """The reading as evidence when it reaches its limit, else None."""
    signal = row["signal"]
    if signal == "ecc_uncorrected_volatile":
        limit, figure, seen = settings.drain_ecc_uncorrected, "now", row["value"]
    elif signal in FLAGS:
        limit = 1 if getattr(settings, f"drain_{signal}") else 0
        figure, seen = "now", row["value"]
    elif signal == "link_downed":
        limit, figure, seen = settings.drain_link_downed, "increase", row["increase"]
    else:  # xid_<code>
        limit = settings.drain_xid.get(signal.removeprefix("xid_"), 0)
        figure, seen = "increase", row["increase"]
    if not limit or seen is None or seen < limit:
        return None
    return {
        "component": row["component"],
        "device": row["device"],
        "signal": signal,
        "figure": figure,
        "value": seen,
        "limit": limit,
        "ts": row["ts"],
    }


def reason_text(evidence: list[dict]) -> str:
    """The drain reason Slurm shows: each reading and its limit, in safe characters only (it is
    quoted in a shell command, and the device names come from the nodes)."""
    parts = []
    for e in evidence:
        where = f"{e['component']} {e['device']}".strip()
        change = "+" if e["figure"] == "increase" else ""
        parts.append(f"{e['signal']}={change}{e['value']:g} on {where} (limit {e['limit']:g})")
    text = REASON_CHARS.sub("_", "sing health: " + ", ".join(parts))
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def command(node: str, reason: str) -> str:
    """The command an admin runs to drain `node`: the reason holds no quote or `$`, and the node
    name, which a scrape target's labels set, is quoted for the shell."""
    return f'scontrol update nodename={shlex.quote(node)} state=drain reason="{reason}"'


def run(
    warehouse: Warehouse,
    config: Config,
    force_dry_run: bool = False,
    now: datetime | None = None,
) -> dict:
    """List the candidates and, with `[health] drain = true` and `dry_run = false` (and not
    `force_dry_run`, nor a past `now`), drain those of this site's cluster through its executor.
    Returns `mode`
    (what was done, in words) and `nodes` (each candidate with `done`, `ok`, `error`)."""
    settings = config.section("health", HealthSettings)
    force_dry_run = force_dry_run or now is not None  # judged as of then, never drained now
    now = now or datetime.now(UTC)
    con = warehouse.connect({"health_samples": None, "policy_events": None})
    found = candidates(con, settings, now)
    drained = {(c, n): at for c, n, at in con.execute(DRAINED_SQL).fetchall()}
    allowed = settings.drain and not force_dry_run
    dry_run = not allowed or settings.dry_run
    executor = make_executor(config) if allowed and not dry_run and found else None
    kind = executor_settings(config).kind
    who = actor("sing health drain")
    rows, events = [], []
    for node in found:
        row = {**node, "done": "no", "ok": True, "error": None}
        before = drained.get((node["cluster"], node["node"]))
        if before is not None and before >= node["newest_evidence"]:
            row["done"] = f"drained {before:%Y-%m-%d %H:%M} UTC, nothing newer"
        elif allowed:
            row = _drain(row, executor, config.site.cluster)
            events.append(_event(row, now, who, dry_run, kind))
        rows.append(row)
    record(warehouse, events)
    return {"mode": _mode(settings, force_dry_run), "nodes": rows}


def _drain(row: dict, executor, cluster: str) -> dict:
    """Drain the candidate through `executor` (None: dry run) and say how it went."""
    if executor is None:
        return {**row, "done": "dry run"}
    try:
        if row["cluster"] != cluster:
            raise UserError(f"node of cluster {row['cluster']!r}; this site drains {cluster!r}")
        if not NODE_NAME.match(row["node"]):
            raise UserError(f"{row['node']!r} is not a node name sing passes to a command")
        executor.drain(row["node"], row["reason"])
    except UserError as err:
        return {**row, "done": "failed", "ok": False, "error": str(err)}
    return {**row, "done": "drained"}


def _event(row: dict, now: datetime, who: str, dry_run: bool, kind: str) -> Event:
    detail = {k: row[k] for k in ("node", "reason", "command", "evidence", "error")}
    return Event(
        ts=now,
        cluster=row["cluster"],
        event=ACTION,
        outcome=DRAIN,
        actor=who,
        dry_run=dry_run,
        channel=kind,
        ok=row["ok"],
        detail=detail,
    )


def _mode(settings: HealthSettings, force_dry_run: bool) -> str:
    if force_dry_run:
        return "Listed only (--dry-run): nothing drained, nothing recorded."
    if not settings.drain:
        return (
            "Suggestions only: sing drains nothing without [health] drain = true "
            "(and dry_run = false)."
        )
    if settings.dry_run:
        return "Dry run ([health] dry_run = true): decisions recorded, nothing drained."
    return "Drained through the executor; every decision recorded in policy_events."
