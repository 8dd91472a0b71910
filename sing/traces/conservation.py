"""GPU-time conservation: a release must hold the GPU-time of its source, to a rounding error.

An importer that drops or shortens jobs (a pod alive at the end given no run time) changes every
utilisation figure computed from the release; the import records the source's own GPU-seconds in
datapackage.json (`source_gpu_seconds`), and `sing trace validate` compares the release with it.
"""

from __future__ import annotations

import math

# Seconds are floats converted through microsecond times: a release may differ from its source
# by a rounding error, no more.
REL_TOL = 1e-6
ABS_TOL_S = 1.0
PACKAGE_KEY = "source_gpu_seconds"


def gpu_time_problem(source_gpu_seconds: float, release_gpu_seconds: float) -> str | None:
    """Why the release's GPU-time is not its source's (None when it is, to a rounding error)."""
    if math.isclose(release_gpu_seconds, source_gpu_seconds, rel_tol=REL_TOL, abs_tol=ABS_TOL_S):
        return None
    kept = release_gpu_seconds / source_gpu_seconds if source_gpu_seconds else math.inf
    return (
        f"GPU-time not conserved: the release holds {release_gpu_seconds / 3600:,.1f} GPU-hours "
        f"of the source's {source_gpu_seconds / 3600:,.1f} ({kept:.1%})"
    )
