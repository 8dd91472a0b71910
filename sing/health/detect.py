"""Incident detection: one round reads the health readings and scrapes that arrived since the
last round and opens an incident for each signal that crossed a limit (docs/health.md).

Signals are edges, not states: a serious XID counter that rose, a row remap that failed (0 ->
1), uncorrected ECC errors that rose by `ecc_uncorrected_limit`, a port whose link went down
`flapping_downs` times within `flapping_minutes`, a node none of whose scrapes answered for
`node_down_minutes`. Where the round stopped reading (the newest reading time of each source) is
stored in `health_rounds`, so a restarted collector neither opens an incident twice nor misses
a reading. While an incident of the same node, device and class is open, a new finding becomes
a note on it instead of a second incident.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import duckdb
import pyarrow as pa

from sing.config import Config
from sing.health.incidents import AUTO, dicts, note_incident, open_incident
from sing.health.settings import HealthSettings
from sing.schema import table
from sing.warehouse.sql import source_sql
from sing.warehouse.store import Warehouse

log = logging.getLogger(__name__)

# With no round before (a new warehouse, or detection just turned on), the readings of the last
# hour are looked at, not the whole history.
FIRST_LOOKBACK = timedelta(hours=1)
# The log's file stats may round a time down (to the millisecond): files are picked with room.
STATS_MARGIN = timedelta(seconds=1)
# What names a series of health_samples.
SERIES = ("cluster", "node", "component", "device", "signal")
# Scrapes read before a node's streak could have crossed, to find where its streak began.
STREAK_MARGIN = timedelta(minutes=30)
ECC_SIGNALS = ("ecc_uncorrected_volatile", "ecc_uncorrected_aggregate")
# Counters whose first reading is history from before sing looked (a lifetime count, a port's
# downs since it came up): the baseline, not an event. Every other signal starts from 0.
BASELINE_SIGNALS = ("ecc_uncorrected_aggregate", "link_downed")


def actor() -> str:
    """Who opens automatic incidents: 'sing health@HOST'."""
    return f"sing health@{socket.gethostname()}"


@dataclass(frozen=True)
class Finding:
    """A signal that crossed its limit: what an automatic incident opens with."""

    cluster: str
    node: str
    device: str | None  # None: the whole node
    klass: str
    signal: str
    ts: datetime  # the reading that showed it (the incident's opening time)
    text: str
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, str | None, str]:
        return (self.cluster, self.node, self.device, self.klass)


@dataclass
class DetectionRound:
    findings: list[Finding]
    opened: list[str]  # ids of the incidents opened
    noted: list[str]  # ids of the open incidents that got a note
    samples_until: datetime | None
    scrapes_until: datetime | None
    seconds: float


def detect_round(
    warehouse: Warehouse,
    settings: HealthSettings,
    cluster: str,
    now: datetime | None = None,
    site_cluster: str | None = None,
) -> DetectionRound:
    """Read what arrived for `cluster` since its last round, open or note incidents, record
    its progress. Only that cluster's readings are read and only its watermark moves, so the
    readings of another cluster sharing the warehouse (newer or older) neither open incidents
    here nor make this round skip its own late readings. Scrapes carry no cluster: a node is
    of the cluster the inventory (`nodes`) puts it in, else of `site_cluster` (the site's,
    default `cluster`)."""
    started = time.monotonic()
    now = now or datetime.now(UTC)
    site_cluster = site_cluster or cluster
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        warehouse.add_views(con, {"health_rounds": None, "incidents": None, "nodes": None})
        samples_from, scrapes_from = _last_round(con, cluster, now)
        readings_from = samples_from - timedelta(minutes=settings.flapping_minutes)
        streaks_from = scrapes_from - timedelta(minutes=settings.node_down_minutes) - STREAK_MARGIN
        _recent_view(con, warehouse, "health_samples", readings_from)
        _recent_view(con, warehouse, "scrapes", streaks_from)
        readings = _readings(con, settings, readings_from, cluster)
        # scrapes carry no cluster: a node the inventory knows in one cluster only is of that one
        node_clusters = dict(
            con.execute(
                "SELECT node, min(cluster) FROM nodes GROUP BY node "
                "HAVING count(DISTINCT cluster) = 1"
            ).fetchall()
        )
        scrapes = [
            answer
            for answer in _node_answers(con, streaks_from)
            if node_clusters.get(answer[0], site_cluster) == cluster
        ]
        # The newest reading of any of this cluster's signals: its next round starts after it.
        ((samples_until,),) = con.execute(
            "SELECT max(ts) FROM health_samples WHERE cluster = ?", [cluster]
        ).fetchall()
        open_now = {
            (c, n, d, k): i
            for i, c, n, d, k in con.execute(
                "SELECT incident_id, cluster, node, device, class FROM incidents "
                "WHERE closed_at IS NULL AND cluster = ?",
                [cluster],
            ).fetchall()
        }
    finally:
        con.close()
    _previous_values(warehouse, readings)
    findings = sorted(
        [
            *signal_findings(readings, settings, samples_from),
            *node_down_findings(scrapes, settings, site_cluster, scrapes_from, node_clusters),
        ],
        key=lambda f: f.ts,
    )
    opened, noted = [], []
    for finding in findings:
        if finding.key in open_now:
            incident_id = open_now[finding.key]
            note_incident(warehouse, incident_id, finding.text, actor=actor(), now=finding.ts)
            noted.append(incident_id)
        else:
            incident_id = _open(warehouse, finding)
            open_now[finding.key] = incident_id
            opened.append(incident_id)
    scrapes_until = max((ts for _, ts, _, _ in scrapes), default=None)
    result = DetectionRound(
        findings,
        opened,
        noted,
        max(samples_until, samples_from) if samples_until else samples_from,
        max(scrapes_until, scrapes_from) if scrapes_until else scrapes_from,
        time.monotonic() - started,
    )
    _record(warehouse, cluster, result, now)
    return result


def detection_job(
    config: Config, warehouse: Warehouse, pull: bool = False
) -> tuple[Callable[[], list[DetectionRound]], float] | None:
    """The collector's scheduled detection rounds and their interval; None when `[health]
    interval_s = 0`. On by default: a round reads only what arrived since the last one.

    A collector detects the clusters it writes: the site's; in pull mode (`pull`: a Prometheus
    server may hold several clusters) also every cluster of the inventory, one round each."""
    settings = config.section("health", HealthSettings)
    if settings.interval_s <= 0:
        return None
    site = config.site.cluster

    def job() -> list[DetectionRound]:
        rounds = []
        for cluster in watched_clusters(warehouse, site) if pull else [site]:
            result = detect_round(warehouse, settings, cluster, site_cluster=site)
            for finding in result.findings:
                log.warning("health: %s", finding.text)
            rounds.append(result)
        return rounds

    return job, settings.interval_s


def watched_clusters(warehouse: Warehouse, site: str) -> list[str]:
    """The site's cluster first, then the other clusters the node inventory names."""
    con = warehouse.connect({"nodes": None})
    try:
        rows = con.execute("SELECT DISTINCT cluster FROM nodes WHERE cluster IS NOT NULL")
        others = sorted({c for (c,) in rows.fetchall()} - {site})
    finally:
        con.close()
    return [site, *others]


def signal_findings(
    readings: list[dict[str, Any]], settings: HealthSettings, after: datetime
) -> Iterator[Finding]:
    """Findings in the health readings newer than `after` (each row has its series' previous
    value as `prev`, NULL for the series' first reading; rows are in time order)."""
    serious = {f"xid_{code}" for code in settings.serious_xids}
    window = timedelta(minutes=settings.flapping_minutes)
    downs: dict[tuple, list[tuple[datetime, float]]] = {}  # port -> recent (time, increase)
    for r in readings:
        signal, value, prev = r["signal"], r["value"], r["prev"]
        rise = _increase(value, prev, signal in BASELINE_SIGNALS)
        where = _device_words(r)
        if signal == "link_downed":
            port = (r["cluster"], r["node"], r["device"])
            recent = [(t, n) for t, n in downs.get(port, []) if t > r["ts"] - window] + [
                (r["ts"], rise)
            ]
            downs[port] = recent
            total = sum(n for _, n in recent)
            if r["ts"] > after and rise > 0 and total >= settings.flapping_downs:
                yield _finding(
                    r,
                    "link",
                    f"link of {where} went down {total:g} times in "
                    f"{settings.flapping_minutes:g} min (flapping)",
                    downs_in_window=total,
                    window_minutes=settings.flapping_minutes,
                )
            continue
        if r["ts"] <= after:
            continue
        if signal in serious and rise > 0:
            yield _finding(r, "xid", f"new {signal.replace('_', ' ').upper()} on {where}")
        elif signal == "row_remap_failed" and value >= 1 and not (prev or 0) >= 1:
            yield _finding(r, "row_remap", f"row remapping failed on {where}")
        elif signal in ECC_SIGNALS and rise >= settings.ecc_uncorrected_limit:
            yield _finding(r, "ecc", f"{rise:g} new uncorrected ECC errors on {where} ({signal})")


def node_down_findings(
    answers: list[tuple[str, datetime, bool, str | None]],
    settings: HealthSettings,
    cluster: str,
    after: datetime,
    node_clusters: dict[str, str] | None = None,
) -> Iterator[Finding]:
    """Nodes whose streak of unanswered scrapes reached `node_down_minutes` after `after`.
    `answers`: (node, scrape time, any target answered, an error), by node then time; each
    node's cluster from `node_clusters` (the inventory), else `cluster` (the site's)."""
    limit = timedelta(minutes=settings.node_down_minutes)
    down_since: dict[str, datetime] = {}
    crossed: set[str] = set()
    for node, ts, up, error in answers:
        if up:
            down_since.pop(node, None)
            crossed.discard(node)
            continue
        since = down_since.setdefault(node, ts)
        if node in crossed or ts - since < limit:
            continue
        crossed.add(node)
        if ts > after:
            minutes = (ts - since).total_seconds() / 60
            yield Finding(
                (node_clusters or {}).get(node, cluster),
                node,
                None,
                "node_down",
                "up",
                since,
                f"{node} has not answered a scrape for {minutes:.0f} min (last error: {error})",
                {"down_since": since.isoformat(), "seen_down_at": ts.isoformat(), "error": error},
            )


def _recent_view(
    con: duckdb.DuckDBPyConnection, warehouse: Warehouse, name: str, since: datetime
) -> None:
    """The view `name` over only the files that hold rows newer than `since` (by the log's
    stats, which may round a time down to the millisecond: hence the margin): a round reads
    the last minutes, not the day."""
    since = since - STATS_MARGIN
    paths = [f.path for f in warehouse.live_files(name) if f.max_time is None or f.max_time > since]
    con.execute(f"CREATE VIEW {name} AS SELECT * FROM {source_sql(con, table(name), paths)}")


def _readings(
    con: duckdb.DuckDBPyConnection, settings: HealthSettings, since: datetime, cluster: str
) -> list[dict[str, Any]]:
    """The readings of `cluster`'s signals detection watches, newer than `since`, in time order,
    each with its series' previous value among them (`prev`; `_previous_values` fills it for
    each series' first one)."""
    signals = [f"xid_{code}" for code in settings.serious_xids]
    signals += [*ECC_SIGNALS, "row_remap_failed", "link_downed"]
    return dicts(
        con,
        """
        SELECT cluster, node, component, device, gpu_uuid, signal, ts, value,
               lag(value) OVER (PARTITION BY cluster, node, component, device, signal
                                ORDER BY ts) AS prev
        FROM health_samples
        WHERE list_contains($signals, signal) AND ts > $since AND cluster = $cluster
        ORDER BY ts, node, device, signal
        """,
        {"signals": signals, "since": since, "cluster": cluster},
    )


def _previous_values(warehouse: Warehouse, readings: list[dict[str, Any]]) -> None:
    """Set `prev` of each series' first reading to the series' reading before it, which may be
    days old (a series is written only when it changes); left NULL for a series' first ever.
    Only rounds that saw a watched signal move pay for the look into the history."""
    firsts: dict[tuple, dict[str, Any]] = {}
    for r in readings:
        firsts.setdefault(_series(r), r)
    if not firsts:
        return
    wanted = pa.Table.from_pylist(
        [dict(zip(SERIES, key, strict=True)) | {"first_ts": r["ts"]} for key, r in firsts.items()]
    )
    con = warehouse.connect({"health_samples": None})
    try:
        con.register("wanted", wanted)
        before = con.execute(
            f"""
            SELECT {", ".join(f"h.{c}" for c in SERIES)}, arg_max(h.value, h.ts)
            FROM health_samples h JOIN wanted w USING ({", ".join(SERIES)})
            WHERE h.ts < w.first_ts GROUP BY ALL
            """
        ).fetchall()
    finally:
        con.close()
    for *key, value in before:
        firsts[tuple(key)]["prev"] = value


def _series(r: dict[str, Any]) -> tuple:
    return tuple(r[c] for c in SERIES)


def _node_answers(
    con: duckdb.DuckDBPyConnection, since: datetime
) -> list[tuple[str, datetime, bool, str | None]]:
    """Per node and scrape round after `since`: whether any of its targets answered."""
    return con.execute(
        """
        SELECT node, ts, bool_or(up), max(error) FROM scrapes
        WHERE ts > ? AND node IS NOT NULL GROUP BY node, ts ORDER BY node, ts
        """,
        [since],
    ).fetchall()


def _increase(value: float, prev: float | None, baseline: bool) -> float:
    """A counter's rise since its previous reading (a drop is a reset: it counts from 0)."""
    if prev is None:
        return 0.0 if baseline else value
    return value - prev if value >= prev else value


def _device_words(r: dict[str, Any]) -> str:
    if r["component"] == "gpu":
        return f"{r['node']} GPU {r['device']}"
    return f"{r['node']} {r['device']}" if r["device"] else r["node"]


def _finding(r: dict[str, Any], klass: str, text: str, **extra: Any) -> Finding:
    evidence = {
        "component": r["component"],
        "gpu_uuid": r["gpu_uuid"],
        "signal": r["signal"],
        "value": r["value"],
        "previous": r["prev"],
        "ts": r["ts"].isoformat(),
        **extra,
    }
    device = r["device"] or None
    return Finding(r["cluster"], r["node"], device, klass, r["signal"], r["ts"], text, evidence)


def _open(warehouse: Warehouse, finding: Finding) -> str:
    return open_incident(
        warehouse,
        cluster=finding.cluster,
        node=finding.node,
        klass=finding.klass,
        note=finding.text,
        source=AUTO,
        device=finding.device,
        signal=finding.signal,
        evidence={k: v for k, v in finding.evidence.items() if v is not None},
        actor=actor(),
        now=finding.ts,
    )


def _last_round(
    con: duckdb.DuckDBPyConnection, cluster: str, now: datetime
) -> tuple[datetime, datetime]:
    """Where the last round stopped reading (samples, scrapes); the first round looks back
    `FIRST_LOOKBACK` from `now`."""
    first = now - FIRST_LOOKBACK
    rows = con.execute(
        "SELECT samples_until, scrapes_until FROM health_rounds WHERE cluster = ?", [cluster]
    ).fetchall()
    if not rows:
        return first, first
    samples_until, scrapes_until = rows[0]
    return samples_until or first, scrapes_until or first


def _record(warehouse: Warehouse, cluster: str, result: DetectionRound, now: datetime) -> None:
    row = {
        "cluster": cluster,
        "samples_until": result.samples_until,
        "scrapes_until": result.scrapes_until,
        "round_at": now,
        "seconds": result.seconds,
        "opened": len(result.opened),
        "noted": len(result.noted),
    }
    warehouse.append("health_rounds", pa.Table.from_pylist([row], table("health_rounds").schema))
