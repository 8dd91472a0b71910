"""Where the read-only public trace data lies: ../shared/traces beside the checkout (CI too)."""

from pathlib import Path

SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
PHILLY = SHARED_TRACES / "philly" / "philly_pollux_jobs.csv"
