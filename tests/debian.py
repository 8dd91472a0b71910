"""Install the Debian packages a real-component test needs, or say why it cannot run.

Rule for every real-component test (markers slurm, prometheus, browser, e2e): with CI=true the
component must run, so a missing package is installed with apt as root and a failure fails the
test; outside CI the test is skipped with the reason when the package cannot be installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# What a Playwright test needs beyond a minimal Debian: Debian's Chromium (its package pulls in
# the libraries and a font), and libatomic1 for Playwright's bundled node driver, which is the
# one library of `ldd .venv/lib/python3.11/site-packages/playwright/driver/node` that a minimal
# Debian 12 lacks (libstdc++6 and libgcc-s1 come with apt).
BROWSER_PACKAGES = ("chromium", "libatomic1")


def _installed(package: str) -> bool:
    result = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True
    )
    return result.returncode == 0 and "install ok installed" in result.stdout


def ensure_packages(*packages: str) -> None:
    """Make sure the Debian packages are installed; install them if possible.

    Concurrent test sessions wait for apt's lock instead of failing on it.
    """
    missing = [p for p in packages if not _installed(p)]
    if not missing:
        return
    problem = None
    if shutil.which("apt-get") is None:
        problem = "apt-get is not available"
    elif os.geteuid() != 0:
        problem = "installing Debian packages needs root"
    if problem is None:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        lock = ["-o", "DPkg::Lock::Timeout=600"]
        update = subprocess.run(["apt-get", *lock, "update", "-q"], capture_output=True, env=env)
        install = subprocess.run(
            ["apt-get", *lock, "install", "-y", "-q", "--no-install-recommends", *missing],
            capture_output=True,
            text=True,
            env=env,
        )
        if install.returncode == 0:
            return
        problem = f"apt-get install {' '.join(missing)} failed: {install.stderr[-2000:]}"
        problem += f" (apt-get update exit {update.returncode})"
    if IN_CI:
        pytest.fail(f"CI=true needs {' '.join(missing)}: {problem}")
    pytest.skip(f"needs Debian packages {' '.join(missing)}: {problem}")
