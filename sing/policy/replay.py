"""`sing policy replay`: the configured rules applied to the history as if they had been live.

An admin turns real mode on only after seeing what it would have done: which jobs would have
been notified, warned and cancelled, the GPU-hours a cancel would have freed, the messages that
would have gone, and the evidence and coverage behind each hit.

How: the window is stepped at `[policy] interval_s`, as the collector's rounds would run. Per
rule ONE query judges every (running job, step): the samples are summed per GPU and bucket,
the buckets add up to each step's window (sliding: a range join; since start: running sums
read with an ASOF join), and the rows go through the live engine's own `figures_sql` and
`verdict_sql` with the step as the evaluation time, so the replay says what the live engine
would have said. The verdicts then walk, in time order, through the real `Ladder`, with an
in-memory episode per (job, rule), as if every message had been delivered and every cancel
done (a cancelled job ends at that step). `dry_run` settings are ignored: every rule is judged
as if real. Nothing is written and nothing is sent: the replay runs on a read-only warehouse.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from fnmatch import fnmatchcase
from typing import Any

import duckdb

from sing.policy.evaluate import (
    EVIDENCE,
    EXEMPT,
    GPU_SUMS,
    HOST_WINDOW_FIGURES,
    INCOMPLETE,
    OK,
    STALE,
    VIOLATING,
    DataNeeds,
    Verdict,
    figures_sql,
    host_sql,
    rule_params,
    verdict_sql,
)
from sing.policy.ladder import CANCEL, HELD, LEFT_ALONE, Decision, Episode, Ladder, QuietHours
from sing.policy.messages import CANCELLED, NOTIFY, WARN
from sing.policy.rules import HOST_KINDS, SINCE_START, UNTOUCHED_GPUS, Rule
from sing.policy.settings import PolicySettings
from sing.warehouse.analytics import HOME_CLUSTER
from sing.warehouse.store import Warehouse

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # before any sample: since-start sums read all
NODE_KEYS = ["cluster", "job_id", "node"]

# The jobs holding resources at each step, by their recorded start and end (not "no end yet").
STEP_RUNNING_SQL = """
SELECT s.step, s.k, j.job_id, j.cluster, j."user", j.account, j.partition, j.name, j.qos,
       j.start_time, j.end_time, j.num_nodes, j.num_gpus, j.time_limit_s, j.interactive
FROM steps s JOIN jobs j
  ON j.start_time IS NOT NULL AND j.start_time <= s.step
 AND (j.end_time IS NULL OR j.end_time > s.step)
"""


def _buckets_sql(source: str, keys: str, figures: str) -> str:
    """Per job, `keys` and bucket (`$width` seconds from `$origin`; bucket k * `$ratio` ends at
    step k): `figures` over the samples of `source` in ($lo, $hi]."""
    return f"""
SELECT coalesce(cluster, {HOME_CLUSTER}) AS cluster, job_id, {keys},
       ceil(epoch(ts - $origin) / $width)::BIGINT AS b, {figures}
FROM {source} WHERE ts > $lo AND ts <= $hi AND job_id IS NOT NULL GROUP BY ALL"""


GPU_BUCKETS_SQL = _buckets_sql("gpu_samples", "node, gpu_index", GPU_SUMS)
GPU_SUMMED = {
    "util_sum": "sum",
    "util_max": "max",
    "samples": "sum",
    "idle_samples": "sum",
    "newest": "max",
}
# Per node: RDMA bytes and how many counters were known.
RDMA_BUCKETS_SQL = _buckets_sql(
    "rdma_samples",
    "node",
    "sum(tx_delta_bytes) AS tx, sum(rx_delta_bytes) AS rx, count(*) AS n, "
    "count(tx_delta_bytes) AS n_tx, count(rx_delta_bytes) AS n_rx",
)
RDMA_SUMMED = {"tx": "sum", "rx": "sum", "n": "sum", "n_tx": "sum", "n_rx": "sum"}
# Per node: the cgroup's CPU seconds (deltas), samples and memory, as the live sliding window
# reads them (sing/policy/evaluate.py `_host_nodes_sql`). Since the start, the replay sums the
# deltas too; the live rule counts the job report's way (the first sample's counter value, then
# deltas), which differs by at most the CPU time before the first sample.
HOST_BUCKETS_SQL = _buckets_sql("job_host_samples", "node", HOST_WINDOW_FIGURES)
HOST_SUMMED = {
    "samples": "sum",
    "newest": "max",
    "cpu_s": "sum",
    "cpuset_cpus": "max",
    "mem_peak_bytes": "max",
    "mem_limit_bytes": "max",
}


@dataclass
class Hit:
    """One ladder episode that would have sent something: a (job, rule) and its steps."""

    job: dict[str, Any]
    rule: str
    evidence: dict[str, Any]  # at the first message
    notify_at: datetime | None = None
    warn_at: datetime | None = None
    cancel_at: datetime | None = None
    gpu_hours_freed: float = 0.0
    ended: str | None = None  # recovered, exempt: how the episode ended before a cancel


@dataclass
class Replay:
    """What the rules would have done from `since` to `until`."""

    since: datetime
    until: datetime
    steps: int
    hits: list[Hit] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    # (job, step) verdicts nothing could act on: per (cluster, job, rule, outcome) the steps
    unjudged: list[dict[str, Any]] = field(default_factory=list)


def replay(
    warehouse: Warehouse,
    settings: PolicySettings,
    rules: list[Rule],
    since: datetime,
    until: datetime,
    sample_interval_s: float,
) -> Replay:
    """The rules' verdicts at every step from `since` to `until`, walked through the ladder."""
    interval = int(settings.interval_s) or 300
    steps = int((until - since).total_seconds() // interval)
    result = Replay(since, until, steps)
    rules = [replace(rule, dry_run=False) for rule in rules]
    if steps <= 0 or not rules:
        return result
    needs = DataNeeds(settings.max_data_age_s, settings.min_coverage, sample_interval_s)
    con = open_replay(warehouse, rules, since, steps, interval)
    try:
        rows: list[tuple[Rule, dict[str, Any]]] = []
        for rule in rules:
            judge(con, rule, needs, since, interval)
            rows += [(rule, row) for row in _ladder_rows(con)]
            result.unjudged += _unjudged(con, rule)
    finally:
        con.close()
    _walk(result, replace(settings, dry_run=False), rows, until)
    return result


def open_replay(
    warehouse: Warehouse, rules: list[Rule], since: datetime, steps: int, interval: int
) -> duckdb.DuckDBPyConnection:
    """A connection with `jobs`, the sample days from the earliest start of a job running in
    the window (since-start figures look back to it) or the earliest sliding window on, the
    `steps` (k = 1.., `interval` s apart from `since`) and the jobs `running` at each."""
    until = since + timedelta(seconds=steps * interval)
    con = warehouse.connect({"jobs": None})
    try:
        ((first_start,),) = con.execute(
            "SELECT min(start_time) FROM jobs WHERE start_time <= $until "
            "AND (end_time IS NULL OR end_time > $since)",
            {"since": since, "until": until},
        ).fetchall()
        longest = max(timedelta(minutes=rule.minutes) for rule in rules)
        first = min(first_start or since, since - longest).date()
        views = {"gpu_samples": first, "rdma_samples": first}
        if any(rule.kind in HOST_KINDS for rule in rules):  # a listing only where read
            views["job_host_samples"] = first
        warehouse.add_views(con, views, rollups=())
        con.execute(
            "CREATE TEMP TABLE steps AS SELECT k, $since + k * to_seconds($interval) AS step "
            "FROM range(1, $steps + 1) t(k)",
            {"since": since, "interval": interval, "steps": steps},
        )
        con.execute(f"CREATE TEMP TABLE running AS {STEP_RUNNING_SQL}")
        # verdict_sql reads the trail's (job, rule) pairs; the replay's ladders start empty
        con.execute("CREATE TEMP TABLE remembered (cluster VARCHAR, job_id VARCHAR, rule VARCHAR)")
    except BaseException:
        con.close()
        raise
    return con


def _since_start(rule: Rule) -> bool:
    return rule.window == SINCE_START or rule.kind == UNTOUCHED_GPUS


def judge(
    con: duckdb.DuckDBPyConnection, rule: Rule, needs: DataNeeds, since: datetime, interval: int
) -> None:
    """The temp table `verdicts`: the rule's `verdict_sql` row for every (running job, step)
    of `open_replay`'s connection. The buckets, the per-step sums and the figures are made
    once per connection and shared by the rules that read the same ones."""
    since_start = _since_start(rule)
    window_s = round(rule.minutes * 60)
    # buckets small enough that a sliding window and a step are whole numbers of them
    width = interval if since_start else math.gcd(interval, window_s) or interval
    span = None if since_start else window_s // width
    (until,) = con.execute("SELECT max(step) FROM steps").fetchone()
    params = {"origin": since, "width": width, "lo": EPOCH, "hi": until}
    ratio = interval // width
    for name, buckets, summed in (
        ("gpu", GPU_BUCKETS_SQL, GPU_SUMMED),
        ("rdma", RDMA_BUCKETS_SQL, RDMA_SUMMED),
    ):
        _once(con, f"{name}_buckets_{width}", buckets, params)
        keys = NODE_KEYS + (["gpu_index"] if name == "gpu" else [])
        stepped = _stepped_sql(f"{name}_buckets_{width}", keys, summed, span, ratio)
        _once(con, f"{name}_stepped_{width}_{span or 0}", stepped)
    span_key = f"{width}_{span or 0}"
    _once(
        con,
        f"gpu_step_{span_key}",
        f"""SELECT step, cluster, job_id, node, gpu_index,
               util_sum / nullif(samples, 0) AS mean_util, util_max AS max_util, samples,
               idle_samples, newest
        FROM gpu_stepped_{span_key} WHERE samples > 0""",
    )
    _once(
        con,
        f"rdma_step_{span_key}",
        f"""SELECT step, cluster, job_id,
               CASE WHEN sum(n) = sum(n_tx) AND sum(n) = sum(n_rx)
                    THEN coalesce(sum(tx), 0) + coalesce(sum(rx), 0) END::DOUBLE AS bytes,
               count(*) AS nodes
        FROM rdma_stepped_{span_key} WHERE n > 0 GROUP BY ALL""",
    )
    host = None
    if rule.kind in HOST_KINDS:
        host = f"host_step_{span_key}"
        _once(con, f"host_buckets_{width}", HOST_BUCKETS_SQL, params)
        stepped = _stepped_sql(f"host_buckets_{width}", NODE_KEYS, HOST_SUMMED, span, ratio)
        _once(
            con,
            f"host_nodes_{span_key}",
            f"""SELECT *, NULL::BIGINT AS io_read_bytes, NULL::BIGINT AS io_write_bytes
            FROM ({stepped}) WHERE samples > 0""",
        )
        _once(con, host, host_sql(f"host_nodes_{span_key}", step="step"))
    figures = f"figures_{span_key}_{round(rule.threshold * 1e6)}{'_host' if host else ''}"
    _once(
        con,
        figures,
        figures_sql(f"gpu_step_{span_key}", f"rdma_step_{span_key}", step="step", host=host),
        {"threshold": rule.threshold},
    )
    names = [
        n for (n,) in con.execute("SELECT DISTINCT coalesce(name, '') FROM running").fetchall()
    ]
    exempt_names = [n for n in names if any(fnmatchcase(n, p) for p in rule.exempt_names)]
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE verdicts AS {verdict_sql(f'FROM {figures}', now='step')}",
        rule_params(rule, needs, exempt_names, remembered_only=False),
    )


def _once(
    con: duckdb.DuckDBPyConnection, name: str, sql: str, params: dict[str, Any] | None = None
) -> None:
    """Temp table `name` from `sql`, unless this connection made it already."""
    made = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE temporary AND table_name = $name",
        {"name": name},
    ).fetchone()
    if not made[0]:
        con.execute(f"CREATE TEMP TABLE {name} AS {sql}", params)


def _ladder_rows(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """The `verdicts` a ladder needs: of each job that violated at some step, its violating,
    fine and exempt rows from its first violation on (a fine row ends an open ladder; before
    the first violation none is open)."""
    return (
        con.sql(
            f"""WITH first_hit AS (
                SELECT cluster, job_id, min(step) AS first_step FROM verdicts
                WHERE outcome = '{VIOLATING}' GROUP BY ALL
            )
            SELECT v.* FROM verdicts v JOIN first_hit f
              ON f.cluster = v.cluster AND f.job_id = v.job_id AND v.step >= f.first_step
            WHERE v.outcome IN ('{VIOLATING}', '{OK}', '{EXEMPT}')
            ORDER BY v.step"""
        )
        .to_arrow_table()
        .to_pylist()
    )


def _stepped_sql(
    buckets: str, keys: list[str], summed: dict[str, str], span: int | None, ratio: int
) -> str:
    """Each bucketed key's sums at every step its job runs: over the `span` buckets up to the
    step (sliding), or over all buckets up to it (span None: since the job started)."""
    on = " AND ".join(f"b.{k} = r.{k}" for k in ("cluster", "job_id"))
    r = "(SELECT DISTINCT step, k, cluster, job_id FROM running) r"
    cols = ", ".join(keys)
    if span is not None:
        aggs = ", ".join(f"{agg}(b.{col}) AS {col}" for col, agg in summed.items())
        return f"""SELECT r.step, {", ".join(f"b.{k}" for k in keys)}, {aggs}
            FROM {r} JOIN {buckets} b ON {on}
             AND b.b > r.k * {ratio} - {span} AND b.b <= r.k * {ratio}
            GROUP BY ALL"""
    running = ", ".join(f"{agg}({col}) OVER w AS {col}" for col, agg in summed.items())
    match = " AND ".join(f"c.{k} = g.{k}" for k in keys)
    return f"""
        WITH cum AS (
            SELECT {cols}, b, {running} FROM {buckets}
            WINDOW w AS (PARTITION BY {cols} ORDER BY b ROWS UNBOUNDED PRECEDING)
        ),
        grid AS (
            SELECT r.step, r.k * {ratio} AS k, {", ".join(f"b.{k}" for k in keys)}
            FROM {r} JOIN (SELECT DISTINCT {cols} FROM {buckets}) b ON {on}
        )
        SELECT g.step, {", ".join(f"g.{k}" for k in keys)}, {", ".join(f"c.{c}" for c in summed)}
        FROM grid g ASOF JOIN cum c ON {match} AND g.k >= c.b"""


def _unjudged(con: duckdb.DuckDBPyConnection, rule: Rule) -> list[dict[str, Any]]:
    """Per job: the steps the rule could not judge (stale or incomplete data), with why."""
    return (
        con.sql(
            f"""SELECT cluster, job_id, "user", $rule AS rule, outcome, count(*) AS steps,
                   min(step) AS first_step, max(step) AS last_step,
                   min(coverage) AS min_coverage
            FROM verdicts WHERE outcome IN ('{STALE}', '{INCOMPLETE}') GROUP BY ALL
            ORDER BY cluster, job_id, outcome""",
            params={"rule": rule.name},
        )
        .to_arrow_table()
        .to_pylist()
    )


def _walk(
    result: Replay,
    settings: PolicySettings,
    rows: list[tuple[Rule, dict[str, Any]]],
    until: datetime,
) -> None:
    """The verdict rows, in time order, through the real ladder: each Decision updates the
    (job, rule)'s in-memory episode as if every message went and every cancel was done."""
    rows.sort(key=lambda item: item[1]["step"])
    quiet = QuietHours(settings.quiet_hours, settings.zone)
    episodes: dict[tuple[tuple[str, str, str], bool], Episode] = {}
    last_sent: dict[tuple[str, str, bool], tuple[datetime, str]] = {}
    open_hits: dict[tuple[str, str, str], Hit] = {}
    cancelled: set[tuple[str, str]] = set()
    ladder: Ladder | None = None
    for rule, job in rows:
        step = job["step"]
        if (job["cluster"], job["job_id"]) in cancelled:
            continue  # the replayed cancel ended it
        if ladder is None or ladder.now != step:
            ladder = Ladder(
                settings, quiet, episodes, ladder.last_sent if ladder else last_sent, step
            )
        evidence = {k: job[k] for k in EVIDENCE}
        verdict = Verdict(rule, job, job["outcome"], evidence)
        decision = ladder.decide(verdict)
        _follow(result, episodes, open_hits, cancelled, decision, step, until)
    result.hits.extend(open_hits.values())
    result.hits.sort(key=lambda h: h.notify_at or h.warn_at or h.cancel_at, reverse=True)


def _follow(
    result: Replay,
    episodes: dict[tuple[tuple[str, str, str], bool], Episode],
    open_hits: dict[tuple[str, str, str], Hit],
    cancelled: set[tuple[str, str]],
    d: Decision,
    step: datetime,
    until: datetime,
) -> None:
    """Update the episode (and the hit it makes) from one Decision, as the engine's trail would."""
    key = d.key
    ep = episodes.setdefault((key, False), Episode())
    ep.start_time = ep.start_time or d.start_time
    if d.evaluation:
        ep.last_evaluation = d.evaluation
    if d.action == LEFT_ALONE:
        episodes[(key, False)] = Episode(last_evaluation=ep.last_evaluation)
        if key in open_hits:
            hit = open_hits.pop(key)
            hit.ended = d.evaluation or d.verdict
            result.hits.append(hit)
        return
    if d.action == HELD or d.hold:
        ep.held = d.hold
        return
    if d.action not in (NOTIFY, WARN, CANCEL):
        return
    hit = open_hits.setdefault(key, Hit(d.job, d.rule.name, d.evidence))
    if d.action == CANCEL:
        ep.cancelled = True
        ep.sent[CANCELLED] = step  # the notice goes with the cancel
        end = d.job["end_time"] or until
        hit.cancel_at = step
        hit.gpu_hours_freed = d.job["num_gpus"] * max(0.0, (end - step).total_seconds()) / 3600
        cancelled.add((key[0], key[1]))
        _message(result, d, CANCELLED, step)
        return
    ep.sent[d.action] = step
    ep.held = None
    if d.action == WARN:
        ep.deadline = d.deadline
        hit.warn_at = step
    else:
        hit.notify_at = step
    _message(result, d, d.action, step)


def _message(result: Replay, d: Decision, kind: str, step: datetime) -> None:
    result.messages.append(
        {
            "ts": step,
            "cluster": d.job["cluster"],
            "job_id": d.job["job_id"],
            "user": d.job["user"],
            "rule": d.rule.name,
            "kind": kind,
        }
    )


def totals(result: Replay) -> dict[str, Any]:
    """The replay's sums: jobs per ladder step, messages, GPU-hours freed, unjudged verdicts."""

    def jobs(attr: str) -> int:
        return len({(h.job["cluster"], h.job["job_id"]) for h in result.hits if getattr(h, attr)})

    unjudged = Counter()
    for row in result.unjudged:
        unjudged[row["outcome"]] += row["steps"]
    return {
        "since": result.since,
        "until": result.until,
        "steps": result.steps,
        "jobs_notified": jobs("notify_at"),
        "jobs_warned": jobs("warn_at"),
        "jobs_cancelled": jobs("cancel_at"),
        "messages": len(result.messages),
        "gpu_hours_freed": sum(h.gpu_hours_freed for h in result.hits),
        "stale_verdicts": unjudged[STALE],
        "incomplete_verdicts": unjudged[INCOMPLETE],
    }


def hit_rows(result: Replay) -> list[dict[str, Any]]:
    """One row per hit, newest first: the job, the ladder's times, the evidence."""
    return [
        {
            "cluster": h.job["cluster"],
            "job_id": h.job["job_id"],
            "user": h.job["user"],
            "rule": h.rule,
            "notify_at": h.notify_at,
            "warn_at": h.warn_at,
            "cancel_at": h.cancel_at,
            "gpu_hours_freed": h.gpu_hours_freed,
            "mean_util": h.evidence.get("mean_util"),
            "coverage": h.evidence.get("coverage"),
            "ended": h.ended,
            "evidence": h.evidence,
        }
        for h in result.hits
    ]
