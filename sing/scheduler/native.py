"""Build the compiled (mypyc) version of the replay's hot modules: `make native`.

    python -m sing.scheduler.native build [--out DIR]    # default build/native in the checkout

The modules named in `sing.scheduler.COMPILED` are compiled together into DIR/sing/scheduler, and
their fingerprint is written last to DIR/FINGERPRINT; the package uses the build only while that
matches (sing/scheduler/__init__.py). A build needs a C compiler, the Python headers and the dev
extras (mypy, setuptools). mypy type-checks the modules on the way, so a type error fails the build,
not a replay.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from sing.scheduler import CHECKOUT, COMPILED, DEFAULT_BUILD, fingerprint


def build(out: Path) -> None:
    """Compile the modules into `out`, replacing what was there. The new build is staged beside it
    and renamed into place, so a process starting meanwhile finds the old build, none (pure
    Python), or the new one: never a half-written one."""
    from mypyc.build import mypycify  # dev extras: needed only here
    from setuptools import Distribution

    with tempfile.TemporaryDirectory(prefix="sing-native-") as scratch:
        here = os.getcwd()
        os.chdir(CHECKOUT)  # mypyc names modules after their paths: sing/scheduler/core.py
        try:
            extensions = mypycify(
                # the modules they import are taken as untyped (Any), not checked or compiled
                ["--follow-imports=skip", *(f"sing/scheduler/{name}.py" for name in COMPILED)],
                opt_level="3",
                group_name="sing.scheduler.native_lib",  # the shared runtime, inside the package
                target_dir=str(Path(scratch) / "c"),
            )
            dist = Distribution({"ext_modules": extensions, "script_name": "sing.scheduler.native"})
            dist.verbose = 0  # the compiler's command lines only on failure
            command = dist.get_command_obj("build_ext")
            command.build_lib = str(Path(scratch) / "lib")
            command.build_temp = str(Path(scratch) / "temp")
            dist.run_command("build_ext")
        finally:
            os.chdir(here)
        staged, retired = out.with_name(out.name + ".new"), out.with_name(out.name + ".old")
        for leftover in (staged, retired):
            shutil.rmtree(leftover, ignore_errors=True)
        shutil.copytree(Path(scratch) / "lib", staged)
    (staged / "FINGERPRINT").write_text(fingerprint() + "\n")
    if out.exists():
        out.rename(retired)
    staged.rename(out)
    shutil.rmtree(retired, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sing.scheduler.native",
        description="Compile the replay's hot modules (mypyc).",
    )
    parser.add_argument("command", choices=["build"])
    parser.add_argument("--out", type=Path, default=DEFAULT_BUILD, help="default: %(default)s")
    args = parser.parse_args(argv)
    build(args.out)
    print(f"compiled {', '.join(COMPILED)} into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
