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

DEFAULT_MIN_COVERAGE = 0.8


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
