"""Coverage: the share of the samples a job's allocated GPUs should have given over a span that
the warehouse holds.

A figure over part of a job's GPUs reads like a figure over all of them: a 16-GPU job whose busy
node was never scraped looks idle on the other 8. Every verdict and efficiency figure therefore
carries its coverage, and below the site's `[policy] min_coverage` a rule's verdict is
`incomplete`: never fine, never violating, and nothing acts on it.

Expected samples: one per allocated GPU per collector interval (`[collector] interval_s`) of the
span, at least one per GPU; present samples above that (a GPU scraped twice) count as full.
"""

from __future__ import annotations

from dataclasses import dataclass

# The built-in [collector] interval_s and [policy] min_coverage: those settings take their
# defaults from here, so a figure read without a config file is measured as the site's would be.
DEFAULT_INTERVAL_S = 15.0
DEFAULT_MIN_COVERAGE = 0.8


@dataclass(frozen=True)
class CoverageNeeds:
    """What the reports and pages measure a job's coverage against (the site's are
    sing.policy.settings.site_coverage)."""

    interval_s: float = DEFAULT_INTERVAL_S  # [collector] interval_s
    min_coverage: float = DEFAULT_MIN_COVERAGE  # [policy] min_coverage


# A site without a config file.
DEFAULT_NEEDS = CoverageNeeds()


def coverage_sql(samples: str, gpus: str, seconds: str, interval_s: str) -> str:
    """SQL for the coverage (0..1) of `samples` present from `gpus` allocated GPUs over a span
    of `seconds`, sampled every `interval_s`; NULL when the job holds no GPU."""
    expected = f"({gpus}) * greatest(1.0, floor(({seconds}) / ({interval_s})))"
    return f"least(1.0, coalesce({samples}, 0)::DOUBLE / nullif({expected}, 0))"


def coverage_words(coverage: float | None) -> str:
    """'from 47% of the expected samples', the words beside a figure (empty when complete)."""
    if coverage is None:
        return "from no samples"
    if coverage >= 0.995:
        return ""
    return f"from {coverage:.0%} of the expected samples"


def partial_data_note(coverage: float | None, needs: CoverageNeeds) -> str | None:
    """The plain note for a job whose figures rest on part of its data (under
    `[policy] min_coverage`); None when enough of it is there, and when there is none at all
    or the job holds no GPU (its GPU figures are unknown then, and show as such)."""
    if not coverage or coverage >= needs.min_coverage:
        return None
    return (
        f"These figures rest on part of the job's data: {coverage:.0%} of the samples expected "
        f"from its GPUs (one per GPU every {needs.interval_s:g} s) are in the warehouse, under "
        f"the site's {needs.min_coverage:.0%}. Read them as a partial picture, not as the job's."
    )
