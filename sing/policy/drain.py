"""Drain suggestions: nodes whose health readings cross the `[health]` drain limits, with the
evidence and the `scontrol` command that drains them; with the site's permission, the drain.

A limit is on a GPU's or port's newest reading (uncorrected ECC errors since the driver loaded,
the row-remap-failed and retired-pages-pending flags) or on a counter's increase over the last
`drain_window_hours` (XIDs of the listed codes, link downs); a counter that went down was reset
and counts from zero. `health_samples` holds a row per change, so the newest row of a series is
its value now.

sing drains only with `[health] drain = true` and `dry_run = false`, through the executor's
`drain(node, reason)`, and records each decision (dry run or not, done or failed) as an
`action`/`drain` row of `policy_events`, the audit trail the policies keep. Before it asks the
executor, an `action`/`drain_intent` row is written; the `drain` row after it names the same
intent. An intent left without an outcome (the process ended between the two) is settled at
the next run with the node's state as the scheduler shows it, before anything else is drained.
A node that sing drained after its newest evidence is not drained again: an admin who resumed it
decided so, until a reading changes.

A circuit breaker limits the drains: at most `[health] max_drained_share` of the cluster's
nodes (its `nodes` inventory; at least one, and one when the inventory is empty) are drained
within `drain_breaker_window_s`. The drain past that trips the policies' breaker
(sing/policy/breaker.py), which then blocks every drain and cancel (`action`/`drain_blocked`, with
why) until `sing policy resume`; the window counts from the resume on.
"""

from __future__ import annotations

import json
import re
import shlex
import uuid
from datetime import UTC, datetime, timedelta

import duckdb

from sing.config import Config
from sing.executors.base import Executor, executor_settings, make_executor
from sing.health.settings import HealthSettings
from sing.policy.breaker import DRAIN_BLOCKED, Breaker
from sing.policy.postman import make_postman
from sing.policy.settings import PolicySettings
from sing.warehouse.audit import ACTION, Event, actor, record
from sing.warehouse.store import Warehouse

DRAIN = "drain"  # the outcome of a drain in policy_events
DRAIN_INTENT = "drain_intent"  # written before the executor is asked to drain
UNSETTLED = "unknown"  # an intent whose node's state could not be read: it stays open
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

# The newest successful real drain per node, from the audit trail: done, or an unrecorded one
# that reconciliation found done (both are `drain` rows with ok).
DRAINED_SQL = f"""
SELECT cluster, detail ->> '$.node' AS node, max(ts) AS drained_at
FROM policy_events
WHERE event = '{ACTION}' AND outcome = '{DRAIN}' AND ok AND NOT dry_run
GROUP BY ALL
"""

# The cluster's drain intents that no `drain` row names: the process ended between the two.
OPEN_INTENTS_SQL = f"""
SELECT i.ts, i.detail
FROM policy_events i
WHERE i.event = '{ACTION}' AND i.outcome = '{DRAIN_INTENT}' AND i.cluster = $cluster
  AND NOT EXISTS (
      SELECT 1 FROM policy_events o
      WHERE o.event = '{ACTION}' AND o.outcome = '{DRAIN}'
        AND o.detail ->> '$.intent' = i.detail ->> '$.intent')
ORDER BY i.ts
"""


# The cluster's real drains begun since $since: each intent, unless its outcome says the drain
# failed (a drain whose outcome is unknown counts: it may have happened).
RECENT_DRAINS_SQL = f"""
SELECT count(*) FROM policy_events i
WHERE i.event = '{ACTION}' AND i.outcome = '{DRAIN_INTENT}' AND i.cluster = $cluster
  AND NOT i.dry_run AND i.ts > $since
  AND NOT EXISTS (
      SELECT 1 FROM policy_events o
      WHERE o.event = '{ACTION}' AND o.outcome = '{DRAIN}' AND NOT o.ok
        AND o.detail ->> '$.intent' = i.detail ->> '$.intent')
"""

# The cluster's nodes now: each node's newest inventory version, if it still has GPUs.
NODES_TOTAL_SQL = """
SELECT count(*) FROM (
    SELECT arg_max(gpus, valid_from) AS gpus FROM nodes WHERE cluster = $cluster GROUP BY node
) WHERE gpus > 0
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
    `force_dry_run`, nor a past `now`), settle open drain intents, then drain the candidates of
    this site's cluster through its executor. Returns `mode` (what was done, in words), `nodes`
    (each candidate with `done`, `ok`, `error`) and `reconciled` (each intent settled)."""
    settings = config.section("health", HealthSettings)
    force_dry_run = force_dry_run or now is not None  # judged as of then, never drained now
    now = now or datetime.now(UTC)
    cluster = config.site.cluster
    con = warehouse.connect({"health_samples": None, "policy_events": None})
    found = candidates(con, settings, now)
    allowed = settings.drain and not force_dry_run
    dry_run = not allowed or settings.dry_run
    intents = open_intents(con, cluster) if allowed and not dry_run else []
    executor = make_executor(config) if allowed and not dry_run and (found or intents) else None
    kind = executor_settings(config).kind
    who = actor("sing health drain")
    reconciled = [reconcile(warehouse, executor, i, who, kind) for i in intents]
    if reconciled:  # the views are a snapshot: read the drains just settled too
        con = warehouse.connect({"policy_events": None})
    drained = {(c, n): at for c, n, at in con.execute(DRAINED_SQL).fetchall()}
    unsettled = {(r["cluster"], r["node"]) for r in reconciled if r["done"] == UNSETTLED}
    if executor is not None:
        breaker = Breaker.load(warehouse, cluster, now, config.section("policy", PolicySettings))
        recent, nodes_total = _drain_counts(warehouse, cluster, now, settings, breaker)
    rows, events = [], []
    for node in found:
        row = {**node, "done": "no", "ok": True, "error": None}
        before = drained.get((node["cluster"], node["node"]))
        if before is not None and before >= node["newest_evidence"]:
            row["done"] = f"drained {before:%Y-%m-%d %H:%M} UTC, nothing newer"
        elif (node["cluster"], node["node"]) in unsettled:
            error = "an earlier drain's outcome is unknown (see reconciled); left alone"
            row = {**row, "done": "not drained", "ok": False, "error": error}
        elif allowed and executor is None:
            row["done"] = "dry run"
            events.append(_event(row, now, who, dry_run, kind))
        elif executor is not None and (
            blocked := breaker.drain_blocked(
                node["node"],
                recent,
                nodes_total,
                settings.max_drained_share,
                settings.drain_breaker_window_s,
            )
        ):
            row = {**row, "done": "blocked", "ok": False, "error": blocked}
            events.append(_event(row, now, who, False, kind, DRAIN_BLOCKED))
        elif allowed:
            row = drain_node(warehouse, executor, row, cluster, who, kind)
            recent += 1
        rows.append(row)
    if executor is not None and breaker.new_trip:
        events += breaker.events(who, make_postman(config))
    record(warehouse, events)
    return {"mode": _mode(settings, force_dry_run), "nodes": rows, "reconciled": reconciled}


def _drain_counts(
    warehouse: Warehouse,
    cluster: str,
    now: datetime,
    settings: HealthSettings,
    breaker: Breaker,
) -> tuple[int, int]:
    """The breaker's figures: real drains within the window (counted from a resume later than
    its start), and the cluster's nodes in the inventory (0: unknown)."""
    since = now - timedelta(seconds=settings.drain_breaker_window_s)
    if breaker.resumed_at is not None:
        since = max(since, breaker.resumed_at)
    con = warehouse.connect({"policy_events": None, "nodes": None})
    try:
        params = {"cluster": cluster, "since": since}
        (recent,) = con.execute(RECENT_DRAINS_SQL, params).fetchone()
        (nodes_total,) = con.execute(NODES_TOTAL_SQL, {"cluster": cluster}).fetchone()
    finally:
        con.close()
    return recent, nodes_total


def drain_node(
    warehouse: Warehouse, executor: Executor, row: dict, cluster: str, who: str, kind: str
) -> dict:
    """Drain one candidate for real: the intent is recorded before the executor is asked, the
    outcome after (each at the time it is written); any error of the executor is a failed
    drain, recorded, never the run's end. Returns the row with `done`, `ok` and `error`."""
    refused = _refusal(row, cluster)
    if refused:
        row = {**row, "done": "failed", "ok": False, "error": refused}
        record(warehouse, [_event(row, datetime.now(UTC), who, False, kind)])
        return row
    intent = uuid.uuid4().hex
    record(warehouse, [_event(row, datetime.now(UTC), who, False, kind, DRAIN_INTENT, intent)])
    try:
        executor.drain(row["node"], row["reason"])
    except Exception as err:  # noqa: BLE001 - any executor failure is a failed drain
        row = {**row, "done": "failed", "ok": False, "error": str(err) or type(err).__name__}
    else:
        row = {**row, "done": "drained"}
    record(warehouse, [_event(row, datetime.now(UTC), who, False, kind, DRAIN, intent)])
    return row


def _refusal(row: dict, cluster: str) -> str | None:
    """Why sing must not pass this candidate to the executor, or None."""
    if row["cluster"] != cluster:
        return f"node of cluster {row['cluster']!r}; this site drains {cluster!r}"
    if not NODE_NAME.match(row["node"]):
        return f"{row['node']!r} is not a node name sing passes to a command"
    return None


def open_intents(con: duckdb.DuckDBPyConnection, cluster: str) -> list[dict]:
    """The cluster's drain intents without an outcome: each intent row's detail, with `ts`."""
    rows = con.execute(OPEN_INTENTS_SQL, {"cluster": cluster}).fetchall()
    return [{**json.loads(detail), "cluster": cluster, "ts": ts} for ts, detail in rows]


def reconcile(warehouse: Warehouse, executor: Executor, intent: dict, who: str, kind: str) -> dict:
    """Settle an intent whose outcome went unrecorded with the node's state now: drained or
    draining with sing's reason is the drain done (counted by DRAINED_SQL, so not done twice);
    anything else is a drain not done. When the state cannot be read the intent stays open
    and the node is left alone (`done` = UNSETTLED). Returns what was found."""
    found = {"cluster": intent["cluster"], "node": intent["node"], "intent_at": intent["ts"]}
    try:
        state = executor.node_state(intent["node"])
    except Exception as err:  # noqa: BLE001 - unsure: record nothing, drain nothing, say so
        error = f"cannot read its state, the intent stays open: {str(err) or type(err).__name__}"
        return {**found, "done": UNSETTLED, "ok": False, "error": error}
    if state is not None and state.drained and state.reason == intent["reason"]:
        row = {**intent, "done": "drained", "ok": True, "error": None}
    else:
        shown = "not listed" if state is None else f"{state.state} ({state.reason or 'no reason'})"
        error = f"the process ended before the drain's outcome; the scheduler shows {shown}"
        row = {**intent, "done": "not drained", "ok": False, "error": error}
    record(warehouse, [_event(row, datetime.now(UTC), who, False, kind, DRAIN, intent["intent"])])
    return {**found, "done": row["done"], "ok": row["ok"], "error": row["error"]}


def _event(
    row: dict,
    now: datetime,
    who: str,
    dry_run: bool,
    kind: str,
    outcome: str = DRAIN,
    intent: str | None = None,
) -> Event:
    detail = {k: row[k] for k in ("node", "reason", "command", "evidence", "error")}
    if intent is not None:
        detail["intent"] = intent  # ties a drain to the intent before it
    return Event(
        ts=now,
        cluster=row["cluster"],
        event=ACTION,
        outcome=outcome,
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
