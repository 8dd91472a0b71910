"""The privacy report that goes with every release: how the release was protected, and how the
attacks of `sing.traces.linkage` did against that very release.

It says which quasi-identifiers the k rule considered; per precision the release uses (a rung of
`sing.traces.settings.ladder`): how many jobs, in how many pools, the fewest distinct users of a
pool (its k), the largest share of a pool's jobs that one user holds, and how many released jobs
are unique on what the release shows of them; then each attack's linkage rates. The steward
holds the truth (every job's owner, the secret key and origin), so the rates are measured, not
estimated. No other trace tool ships one.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from sing.traces import sql
from sing.traces.linkage import attack, energy_attack, exact_attack, owners

# The attacks run on every release: the sacct attack as a user would run it; the same handed
# the secret time origin; run times read back from energy, origin known; a row's exact times
# matched to the public job that had them, origin known.
SACCT = "sacct -a"
SACCT_ORIGIN = "sacct -a, origin known"
ENERGY = "run time from energy, origin known"
EXACT = "exact times matched, origin known"


class LinkageRates:
    """The shares of users and of released jobs an attack linked (of a dataclass with the
    fields users, users_linked, jobs, jobs_linked)."""

    users: int
    users_linked: int
    jobs: int
    jobs_linked: int

    @property
    def users_pct(self) -> float:
        return 100 * self.users_linked / self.users if self.users else 0.0

    @property
    def jobs_pct(self) -> float:
        return 100 * self.jobs_linked / self.jobs if self.jobs else 0.0


@dataclass(frozen=True)
class AttackResult(LinkageRates):
    """One attack against one release, scored with the steward's truth."""

    attack: str
    users: int  # distinct owners of the released jobs
    # Users what the attack says of can be relied on: its claims naming them, with PRIOR_CLAIMS
    # more right at its overall precision, are right more often than wrong. (A user named
    # correctly once among an attack's many wrong guesses is not linked: an attacker guessing
    # at random would "name" most users so, and could not tell which.)
    users_linked: int
    jobs: int
    jobs_linked: int  # released jobs correctly given to a linked user
    wrong: int  # released jobs named wrongly (the attacker cannot tell these apart)
    users_named: int  # users named correctly at least once, lucky guesses included
    jobs_named: int  # released jobs whose owner was named correctly, lucky guesses included

    @property
    def precision(self) -> float | None:
        """The share of the attack's claims that were right (None: it claimed nothing)."""
        claims = self.jobs_named + self.wrong
        return self.jobs_named / claims if claims else None


@dataclass(frozen=True)
class Precision:
    """The released jobs of one precision (rung) and the pools the k rule released them in."""

    submit_bin_s: float
    run_bin_ratio: float
    model_hidden: bool
    outcome_hidden: bool
    shape_hidden: bool  # nodes hidden, the GPU count known to its class
    jobs: int
    pools: int
    min_users: int  # the smallest pool's distinct users: the k this precision achieved
    max_top_share: float  # the largest share of a pool's jobs held by one user
    unique_jobs: int  # released jobs alone on what the release shows of them


@dataclass(frozen=True)
class PrivacyReport:
    quasi_identifiers: tuple[str, ...]
    k: int
    window_jobs: int
    kept_jobs: int
    kept_gpu_hours_share: float
    precisions: tuple[Precision, ...]
    attacks: tuple[AttackResult, ...]
    assessed_jobs: int  # the released jobs the attacks ran on (all, or a sample)

    def worst(self) -> AttackResult:
        """The attack that named the most users (then jobs)."""
        return max(self.attacks, key=lambda a: (a.users_linked, a.jobs_linked))

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        for row, result in zip(out["attacks"], self.attacks, strict=True):
            row |= {
                "users_pct": result.users_pct,
                "jobs_pct": result.jobs_pct,
                "precision": result.precision,
            }
        return out

    def lines(self) -> list[str]:
        """The report as Markdown, for the datasheet."""
        kept = self.kept_jobs / self.window_jobs if self.window_jobs else 1.0
        out = [
            "How the attacks of `sing trace attack` did against this very release, scored by "
            "the publisher, who knows every job's owner, the release key and its time origin "
            "(docs/trace-format.md in the sing repository).",
            "",
            f"Quasi-identifiers considered: {', '.join(self.quasi_identifiers) or 'none'}; "
            f"k = {self.k}. Kept {self.kept_jobs:,} of the window's {self.window_jobs:,} jobs "
            f"({kept:.1%}) and {self.kept_gpu_hours_share:.1%} of their GPU-hours.",
            "",
            "| submit bin | run bucket | GPU model | outcome | GPUs | jobs | pools "
            "| k (fewest users) | top user's share | unique jobs |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        out += [
            f"| {_seconds(p.submit_bin_s)} | {_factor(p.run_bin_ratio)} "
            f"| {'hidden' if p.model_hidden else 'shown'} "
            f"| {'hidden' if p.outcome_hidden else 'shown'} "
            f"| {'class' if p.shape_hidden else 'exact'} "
            f"| {p.jobs:,} | {p.pools:,} "
            f"| {p.min_users} | {p.max_top_share:.0%} | {p.unique_jobs:,} |"
            for p in self.precisions
        ]
        if self.assessed_jobs < self.kept_jobs:
            out += [
                "",
                f"The attacks ran on a keyed random sample of the release: {self.assessed_jobs:,} "
                f"of its {self.kept_jobs:,} jobs (whole pseudonyms); the rates are estimates.",
            ]
        out += [
            "",
            "| attack | users linked | jobs linked | named wrongly | precision "
            "| named correctly at all (users, jobs) |",
            "|---|---|---|---|---|---|",
        ]
        out += [
            f"| {a.attack} | {a.users_linked} of {a.users} ({a.users_pct:.1f} %) "
            f"| {a.jobs_linked:,} of {a.jobs:,} ({a.jobs_pct:.1f} %) | {a.wrong:,} "
            f"| {'-' if a.precision is None else f'{a.precision:.0%}'} "
            f"| {a.users_named}, {a.jobs_named:,} |"
            for a in self.attacks
        ]
        out += [
            "",
            "Users linked: those what the attack says of can be relied on (its claims naming "
            f"them, with {PRIOR_CLAIMS} more at its overall precision, right more often than "
            "wrong); jobs linked: theirs named correctly; precision: the share of the attack's "
            "claims that were right. Lucky guesses of an unreliable attack are counted apart.",
        ]
        return out


def assess(
    jobs: pa.Table,
    package: dict,
    public: pa.Table,
    key: bytes,
    origin: float,
    pools: pa.Table,
    shares: tuple[int, int, float],
    quasi_identifiers: tuple[str, ...],
    k: int,
) -> PrivacyReport:
    """Attack the released `jobs` (with `package`'s public anonymization block) from the
    public view, score each attack with the owners found through the key, and summarise the
    k rule's pools (`pools`: rung, precision, users, jobs, top per pool). `origin` is the
    secret time origin (Unix seconds); `shares`: the window's jobs, the jobs kept and the
    share of GPU-hours kept. A release of more than ASSESSED_JOBS jobs is attacked on a keyed
    random sample of its pseudonyms' jobs (the attacks' cost grows with the jobs; the rates are
    then estimates, and the report says so)."""
    jobs = _sample(jobs, key)
    truth = owners(public, key, jobs["job_id"])
    claims = {
        SACCT: attack(jobs, package, public).claims,
        SACCT_ORIGIN: attack(jobs, package, public, origin=origin).claims,
        ENERGY: energy_attack(jobs, public, origin),
        EXACT: exact_attack(jobs, public, origin),
    }
    window_jobs, kept_jobs, hours = shares
    return PrivacyReport(
        quasi_identifiers=quasi_identifiers,
        k=k,
        window_jobs=window_jobs,
        kept_jobs=kept_jobs,
        kept_gpu_hours_share=hours,
        precisions=_precisions(pools),
        attacks=tuple(_score(name, c, truth) for name, c in claims.items()),
        assessed_jobs=jobs.num_rows,
    )


ASSESSED_JOBS = 10_000  # about 10 s of attacks on 2 cores


def _sample(jobs: pa.Table, key: bytes) -> pa.Table:
    """The released jobs the attacks run on: all of them, or, past ASSESSED_JOBS, the jobs of a
    keyed random share of the user pseudonyms (whole pseudonyms, so that a linked release is
    attacked as it is: all of a pseudonym's jobs vote together)."""
    if jobs.num_rows <= ASSESSED_JOBS:
        return jobs
    share = ASSESSED_JOBS / jobs.num_rows
    users = jobs["user"].combine_chunks().dictionary_encode()
    drawn = [
        int.from_bytes(hashlib.blake2b(u.encode(), key=key[:64], digest_size=8).digest())
        < share * 2**64
        for u in users.dictionary.to_pylist()
    ]
    return jobs.filter(pc.take(pa.array(drawn), users.indices))


def _score(name: str, claims: list[str | None], truth: pa.Array) -> AttackResult:
    con = sql.connect()
    con.register("c", pa.table({"claim": pa.array(claims, pa.string()), "owner": truth}))
    ((users, linked, jobs_linked, wrong, named, jobs_named),) = con.execute(SCORE_SQL).fetchall()
    return AttackResult(name, users, linked, len(truth), jobs_linked, wrong, named, jobs_named)


# Per attack: distinct owners; users whose claims are reliable (see AttackResult), and their
# jobs named correctly; wrong claims; users and jobs named correctly at all. Reads `c` (claim,
# owner per job).
PRIOR_CLAIMS = 2
SCORE_SQL = f"""
WITH per_user AS (
    SELECT claim AS "user", count(*) FILTER (WHERE claim = owner) AS hits,
           count(*) FILTER (WHERE claim != owner) AS misses
    FROM c WHERE claim IS NOT NULL GROUP BY claim
),
precision AS (SELECT coalesce(sum(hits) / nullif(sum(hits + misses), 0), 0) AS p FROM per_user),
reliable AS (
    SELECT u.* FROM per_user u, precision
    WHERE (hits + {PRIOR_CLAIMS} * p) / (hits + misses + {PRIOR_CLAIMS}) > 0.5
)
SELECT (SELECT count(DISTINCT owner) FROM c),
       (SELECT count(*) FROM reliable),
       (SELECT coalesce(sum(hits), 0) FROM reliable),
       (SELECT count(*) FROM c WHERE claim != owner),
       (SELECT count(*) FROM per_user WHERE hits > 0),
       (SELECT count(*) FROM c WHERE claim = owner)
"""


# Per precision, from the k rule's pools (rung, its precision, and per pool its distinct users,
# jobs and the top user's jobs): a job alone in its pool is unique on everything the release
# shows of it that an attacker can also see.
PRECISIONS_SQL = """
SELECT any_value(resolution_s), any_value(ratio), any_value(model_hidden),
       any_value(outcome_hidden), any_value(shape_hidden), sum(jobs)::BIGINT, count(*),
       min(users), max(top / jobs),
       coalesce(sum(jobs) FILTER (WHERE jobs = 1), 0)::BIGINT
FROM pools GROUP BY rung ORDER BY rung
"""


def _precisions(pools: pa.Table) -> tuple[Precision, ...]:
    con = sql.connect()
    con.register("pools", pools)
    return tuple(Precision(*row) for row in con.execute(PRECISIONS_SQL).fetchall())


def _seconds(value: float) -> str:
    if not value:
        return "exact"
    days = value / 86_400
    return f"{days:g} d" if days >= 1 else f"{value:g} s"


def _factor(value: float) -> str:
    return "exact" if value <= 1 else f"x{value:g}"
