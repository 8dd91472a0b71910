"""A longer fuzzing run of the parsers than CI's: every tests/test_fuzz_*.py test, with fresh
random inputs and SCALE times CI's number of them, printing inputs/s and any failure.

CI runs the same tests derandomized at scale 1 (well under two minutes); this searches wider.
Run: .venv/bin/python bench/bench_fuzz.py [SCALE [MATCH]]   (SCALE default 10; MATCH picks the
tests whose name holds it, e.g. "importers"; exits 1 if any test fails)
"""

from __future__ import annotations

import importlib
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SCALE = sys.argv[1] if len(sys.argv) > 1 else "10"
MATCH = sys.argv[2] if len(sys.argv) > 2 else ""
# Read when the tests are imported: fresh inputs each run, SCALE times as many.
os.environ["SING_FUZZ_SCALE"] = SCALE
os.environ["SING_HYPOTHESIS_PROFILE"] = "dev"
importlib.import_module("tests.conftest")  # registers and loads the profile


def fuzz_tests() -> list[tuple[str, object]]:
    found = []
    for path in sorted((ROOT / "tests").glob("test_fuzz_*.py")):
        module = importlib.import_module(f"tests.{path.stem}")
        for name in dir(module):
            test = getattr(module, name)
            if name.startswith("test_") and hasattr(test, "hypothesis"):
                found.append((f"{path.stem.removeprefix('test_fuzz_')}::{name[5:]}", test))
    return found


def run(test) -> tuple[int, float, str]:
    """(inputs tried, seconds, "ok" or the failure's last line)."""
    calls = 0
    inner = test.hypothesis.inner_test

    def counted(*args, **kwargs):
        nonlocal calls
        calls += 1
        return inner(*args, **kwargs)

    test.hypothesis.inner_test = counted
    start = time.perf_counter()
    try:
        test()
        outcome = "ok"
    except Exception as err:  # a failure is reported, and the other tests still run
        traceback.print_exception(err, file=sys.stderr)
        outcome = f"FAILED: {type(err).__name__}: {str(err).splitlines()[0][:60]}"
    finally:
        test.hypothesis.inner_test = inner
    return calls, time.perf_counter() - start, outcome


def main() -> int:
    print(f"scale {SCALE} x CI's inputs, random seed")
    print(f"{'test':<58} {'inputs':>7} {'s':>7} {'inputs/s':>9}  result")
    failed = 0
    for label, test in fuzz_tests():
        if MATCH not in label:
            continue
        calls, seconds, outcome = run(test)
        failed += outcome != "ok"
        print(f"{label:<58} {calls:>7,} {seconds:>7.1f} {calls / seconds:>9,.0f}  {outcome}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
