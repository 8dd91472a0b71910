"""The policies a data steward compares before publishing (`sing trace attack`): each one's
release of the site's own window, built in memory under a fresh key, attacked, and what it costs.

`scenarios` gives the configured policy, then each protection relaxed on its own, then none.
`evaluate` builds one policy's release with its privacy report (`sing.traces.privacy`) and
keeps the strongest attack's figures beside the fidelity the policy leaves.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sing.traces.export import build_release
from sing.traces.linkage import public_view
from sing.traces.privacy import LinkageRates, PrivacyReport
from sing.traces.settings import ANY, TraceSettings
from sing.warehouse.store import Warehouse


@dataclass(frozen=True)
class Linkage(LinkageRates):
    """How well the strongest attack did against one policy's release, scored with the
    steward's truth, and what the policy cost: jobs and GPU-hours left out, and how far the
    released run and queue times are from the window's true ones (Kolmogorov-Smirnov
    distance, 0 = same distribution, 1 = disjoint; None where the release does not show them)."""

    scenario: str
    jobs: int
    left_out: int
    users: int
    users_linked: int
    jobs_linked: int
    wrong_claims: int
    run_ks: float | None
    queue_ks: float | None
    gpu_hours_pct: float = 100.0  # share of the window's GPU-hours kept
    refused: str | None = None  # why `sing trace export` would write no such release
    worst_attack: str = ""  # the attack these linkage figures are from (the one naming most)
    privacy: PrivacyReport | None = None

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self) | {"users_pct": self.users_pct, "jobs_pct": self.jobs_pct}
        return out | {"privacy": self.privacy.as_dict() if self.privacy else None}


def evaluate(
    warehouse: Warehouse | str | Path,
    since: datetime,
    until: datetime,
    settings: TraceSettings,
    key: bytes,
    scenario: str = "as configured",
    public: pa.Table | None = None,
) -> Linkage:
    """Build the release `settings` give with its privacy report: its strongest attack's
    figures, the policy's cost, and the report (every attack's figures)."""
    wh = warehouse if isinstance(warehouse, Warehouse) else Warehouse(warehouse)
    since, until = since.astimezone(UTC), until.astimezone(UTC)
    view = public if public is not None else public_view(wh, since, until)
    release = build_release(wh, since, until, key, settings, public=view)
    assert release.privacy is not None  # built with the public view
    worst = release.privacy.worst()
    return Linkage(
        scenario=scenario,
        jobs=release.jobs.num_rows,
        left_out=release.suppressed_jobs,
        users=worst.users,
        users_linked=worst.users_linked,
        jobs_linked=worst.jobs_linked,
        wrong_claims=worst.wrong,
        run_ks=_ks(
            release.jobs, "run_s", view, pc.subtract(view["end"], view["start"]), since, until
        ),
        queue_ks=_ks(
            release.jobs, "queue_s", view, pc.subtract(view["start"], view["submit"]), since, until
        ),
        gpu_hours_pct=100 * release.privacy.kept_gpu_hours_share,
        refused=release.refusal(settings),
        worst_attack=worst.attack,
        privacy=release.privacy,
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
