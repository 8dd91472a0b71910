"""How many inputs each fuzz test (tests/test_fuzz_*.py) tries.

The counts are sized for CI (all fuzz tests together well under two minutes on two cores);
`SING_FUZZ_SCALE` multiplies them for a longer search (bench/bench_fuzz.py). Determinism and
deadlines come from the Hypothesis profile (tests/conftest.py).
"""

from __future__ import annotations

import os

from hypothesis import settings


def fuzz(examples: int) -> settings:
    """Settings trying `examples` inputs (times SING_FUZZ_SCALE)."""
    scale = float(os.environ.get("SING_FUZZ_SCALE", "1"))
    return settings(max_examples=max(1, int(examples * scale)), deadline=None)
