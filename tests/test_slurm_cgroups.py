"""A job's CPU and host memory from the cgroups a real Slurm made for it, through the exporter and
the collector to `sing job` and the Job page, against what Slurm's own accounting says.

Real Slurm on loopback, 22.05 and (from a Debian 13 root) 24.11, with proctrack/cgroup,
task/cgroup and jobacct_gather/cgroup, cgroup.conf ConstrainCores and ConstrainRAMSpace
(tests/slurm_harness.py, `cgroups=True`). One job, `-c 2 --mem=400M`: two processes each touch
100 MiB and burn 3 s of CPU (`time.process_time()`, so a loaded machine only makes it slower),
then hold their memory until the test lets them go. `sing exporter` reads this machine's real
/sys/fs/cgroup (a fake NVML beside it: no GPU here), `sing collector --once` scrapes it while
the job runs (before and after the burn) and syncs the job from squeue, then sacct once it
ended. While it runs, `sing job` and the Job and My jobs pages (Streamlit's AppTest, signed in as
the job's user) show sstat's figures so far under the label "Slurm (sstat)": the pages' lie
between what `sing job --json` said just before and just after them.

Checked on cgroup v1 (this machine kind's: controllers one per tree, Slurm's directories
`<controller>/slurm_<node>/uid_<uid>/job_<id>/`): the cpuacct CPU seconds, the cpuset (2 CPUs),
the memory cgroup's limit (400 MiB) and high-water mark, and that they agree with sacct's
TotalCPU and seff's memory within `sing job`'s tolerances (no cross-check sentence). The v2
layout (`system.slice/slurmstepd.scope/job_<id>/` and 26.05's SLUID directories) is checked
through the same exporter and collector on a copy of the real layout
(tests/fixtures/exporter/sys/fs/cgroup, tests/test_exporter_cgroups.py and
tests/test_job_host.py's end-to-end test): this machine kind mounts cgroup2 only beside v1
(/sys/fs/cgroup/unified), and Slurm's cgroup/v2 wants the whole unified hierarchy.

Tolerances, measured here (`pytest -s` prints the figures; 22.05 and 24.11 alike):
- CPU: 6 s burnt; measured 6.01 s from the cgroup (its last reading before the job's end) and
  6.03-6.05 s from sacct's TotalCPU (the interpreters' start and exit, bash): 6.0 to 7.5 s
  (+25 %), and the two within 10 % of each other (sing/warehouse/job_report.py, CPU_TOLERANCE).
- memory: 200 MiB touched; measured 207-209 MiB from the cgroup's high-water mark (the
  interpreters and page cache too) and 206-208 MiB from Slurm (the tasks' RSS, sampled every
  second): 200 to 260 MiB (+30 %), and within 25 % of each other (MEMORY_TOLERANCE).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import streamlit as st

from sing.config import Config
from sing.dashboards.data import job_details
from sing.warehouse.job_report import CPU_TOLERANCE, MEMORY_TOLERANCE, apart
from tests.dashboard_app import open_app, serving
from tests.ports import free_port
from tests.real_path.processes import Service, run, wait_for
from tests.slurm_harness import NODES, TEST_USER, SlurmCluster, running, scratch
from tests.slurm_release import RELEASES
from tests.test_collector_scrape import http_get, sing

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(420)]

MIB = 1 << 20
CGROUP_LOCK = Path("/var/tmp/sing-test-slurm-cgroups.lock")
CPUS, MEM = 2, 400 * MIB
RUNNING_FIGURES = ("cpu_core_s", "slurm_cpu_s", "host_mem_peak_bytes", "slurm_max_rss_bytes")
# argv: MiB to touch, CPU seconds to burn; then hold the memory until `release` exists.
BURN = """\
import os, sys, time
held = b"\\1" * (int(sys.argv[1]) << 20)
while time.process_time() < float(sys.argv[2]):
    pass
deadline = time.monotonic() + 240
while not os.path.exists("release") and time.monotonic() < deadline:
    time.sleep(0.2)
"""
JOB = f"""\
#!/bin/bash
#SBATCH --job-name=cgburn -c {CPUS} --mem={MEM // MIB}M --acctg-freq=task=1
python3 burn.py 100 3 & python3 burn.py 100 3 & wait
"""
NODE_YAML = "model: NVIDIA H200\ncount: 1\ndefaults: {util: 0.0, power_w: 100, energy_j: 0}\n"
CONFIG = """\
[site]
cluster = "testcluster"
warehouse = "wh"
[executor]
kind = "slurm"
[collector]
file_sd = "targets.json"
metrics_port = 0
[dashboard]
auth = "oidc"
allowed_domains = ["campus.edu"]
"""


def cgroup_errors(cluster: SlurmCluster) -> list[str]:
    """slurmd's log lines about cgroups that went wrong (why this machine cannot run them)."""
    lines = []
    for log in sorted((cluster.base / "log").glob("slurmd*")):
        for line in log.read_text(errors="replace").splitlines():
            if "cgroup" in line.lower() and re.search(r"error|fatal", line, re.I):
                lines.append(line.strip())
    return lines[:5]


class NoCgroups(RuntimeError):
    """Slurm could not make its cgroups here; says slurmd's own words."""


class CgroupCluster(SlurmCluster):
    """The loopback cluster with cgroups; a start that fails on them says why (its logs are
    removed with its directory afterwards)."""

    def up(self) -> None:
        try:
            super().up()
        except RuntimeError as err:
            if errors := cgroup_errors(self):
                raise NoCgroups(" | ".join(errors)) from err
            raise


@pytest.fixture(scope="module", params=RELEASES)
def cluster(request):
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        pytest.skip(
            "this machine has only cgroup v2; the harness sets Slurm's cgroup/v1 (its cgroup/v2 "
            "wants systemd to make slurmstepd's scope, not set up here); the v2 layout is "
            "tested on copies (tests/test_exporter_cgroups.py, tests/test_job_host.py)"
        )
    cluster = CgroupCluster(scratch("sing-cgroups-"), slurm=request.param, cgroups=True)
    try:
        with machine_cgroups(), running(cluster) as up:
            yield up
    except NoCgroups as err:
        pytest.skip(f"Slurm cannot make cgroups on this machine: {err}")


@contextlib.contextmanager
def machine_cgroups() -> Iterator[None]:
    """Slurm names its v1 directories after the node (`slurm_gpu-1`), whatever the cluster, and
    every cluster's job ids start at 1: one cgroup cluster per machine at a time (a lock two
    copies of the suite share), its directories removed before (a killed run's) and after."""
    with open(CGROUP_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        remove_slurm_cgroups()
        try:
            yield
        finally:
            remove_slurm_cgroups()


def remove_slurm_cgroups() -> None:
    """rmdir the test nodes' cgroup directories, deepest first: only a cgroup without processes
    goes; one still holding a job's processes stays (and its job id is no test's to reuse)."""
    for prepend in Path("/sys/fs/cgroup").glob("*/slurm_gpu-[0-9]"):
        if prepend.name.removeprefix("slurm_") not in NODES:
            continue
        for directory, _, _ in sorted(os.walk(prepend), key=lambda w: -len(w[0])):
            with contextlib.suppress(OSError):
                os.rmdir(directory)


def page(port: int) -> str:
    """The exporter's page; "" while it does not answer."""
    try:
        return http_get(f"http://127.0.0.1:{port}/metrics")
    except OSError:
        return ""


def cgroup_cpu_s(port: int, job_id: str) -> float | None:
    """The job's cgroup CPU seconds on the exporter's page, None before its cgroup is read."""
    found = re.search(rf'^cgroup_cpu_total_seconds{{jobid="{job_id}"}} (\S+)$', page(port), re.M)
    return float(found.group(1)) if found else None


def test_a_jobs_cgroups_through_exporter_and_collector_agree_with_slurm(cluster, tmp_path):
    env = {**cluster.env, "TZ": "UTC"}
    (cluster.jobs_dir / "burn.py").write_text(BURN)
    (tmp_path / "sing.toml").write_text(CONFIG)
    (tmp_path / "node.yaml").write_text(NODE_YAML)
    port = free_port()
    targets = [{"targets": [f"127.0.0.1:{port}"], "labels": {"node": "gpu-1"}}]
    (tmp_path / "targets.json").write_text(json.dumps(targets))
    exporter = Service(
        sing(
            "exporter", "--fake", str(tmp_path / "node.yaml"), "--listen-address", "127.0.0.1",
            "--port", str(port), "--cache-seconds", "0", "--sysfs-root", "/sys",
            "--job-mapping-dir", str(tmp_path / "gpu-jobs"),
        ),
        tmp_path / "exporter.log",
        env,
    )  # fmt: skip
    config = str(tmp_path / "sing.toml")

    def collect() -> None:
        run(sing("--config", config, "collector", "--once"), env, cwd=tmp_path)

    try:
        wait_for(lambda: page(port), "the exporter", 60, [exporter])
        job_id = submit(cluster)
        try:
            wait_for(lambda: cgroup_cpu_s(port, job_id) is not None, "the job's cgroup", 60,
                     [exporter])  # fmt: skip
        except AssertionError:
            if errors := cgroup_errors(cluster):
                pytest.skip(f"Slurm cannot make cgroups on this machine: {' | '.join(errors)}")
            raise
        collect()  # while it burns
        wait_for(lambda: (cgroup_cpu_s(port, job_id) or 0) >= 6, "6 s of CPU", 120, [exporter])
        collect()  # burnt, holding its memory
        collect()
        # The cgroups' figures and sstat's so far. sstat answers from the step's last
        # accounting poll (JobAcctGatherFrequency, 30 s here), so it may still lag the burn.
        running_job: dict = {}

        def sstat_caught_up() -> bool:
            running_job.update(sing_job(config, job_id, env))
            return (running_job["slurm_cpu_s"] or 0) >= 6

        wait_for(sstat_caught_up, "sstat to count the 6 s of CPU", 90, [exporter])
        print("running:", {k: running_job[k] for k in RUNNING_FIGURES})
        assert running_job["state"] == "RUNNING" and running_job["cpu_core_s"] >= 6
        assert running_job["slurm_source"] == "sstat" and running_job["slurm_error"] is None
        assert running_job["slurm_cpu_s"] <= 7.5
        assert apart(running_job["cpu_core_s"], running_job["slurm_cpu_s"]) <= CPU_TOLERANCE
        assert running_job["accounting_check"] == []
        assert "Slurm (sstat)" in run(sing("--config", config, "job", job_id), env)
        # The Job and My jobs pages ask sstat the same way: their figures lie between the ones
        # `sing job` showed just before and just after (CPU only grows; held memory stays).
        shown = pages_slurm_lines(tmp_path, job_id)
        after = sing_job(config, job_id, env)
        print("pages:", shown, "sing job after:", {k: after[k] for k in RUNNING_FIGURES})
        for cpu_s, rss in (slurm_line(line) for line in shown):
            assert running_job["slurm_cpu_s"] <= cpu_s <= after["slurm_cpu_s"]
            figures = (running_job["slurm_max_rss_bytes"], after["slurm_max_rss_bytes"])
            assert min(figures) - MIB / 20 <= rss <= max(figures) + MIB / 20  # shown to 0.1 MiB
        (cluster.jobs_dir / "release").touch()
        wait_for(lambda: ended(job_id, env), "sacct to show the job ended", 60)
        collect()  # the job's end and Slurm's accounting
    finally:
        (cluster.jobs_dir / "release").touch()
        exporter.stop()

    report = sing_job(config, job_id, env)
    assert report["slurm_source"] == "sacct"
    figures = {k: report[k] for k in ("state", "cpu_core_s", "alloc_cores", "host_mem_peak_bytes",
               "host_mem_req_bytes", "slurm_cpu_s", "slurm_max_rss_bytes")}  # fmt: skip
    (node,) = report["per_node_host"]
    print(f"Slurm {cluster.release.name}: {figures} {node}")  # `pytest -s`: the measured figures
    assert report["state"] == "COMPLETED"
    assert 6.0 <= report["cpu_core_s"] <= 7.5
    assert report["alloc_cores"] == CPUS and node["cpuset_cpus"] == CPUS  # ConstrainCores
    assert report["host_mem_req_bytes"] == MEM and node["mem_limit_bytes"] == MEM  # ConstrainRAM
    assert 200 * MIB <= report["host_mem_peak_bytes"] <= 260 * MIB
    assert apart(report["cpu_core_s"], report["slurm_cpu_s"]) <= CPU_TOLERANCE
    assert 200 * MIB <= report["slurm_max_rss_bytes"] <= 260 * MIB
    assert apart(report["host_mem_peak_bytes"], report["slurm_max_rss_bytes"]) <= MEMORY_TOLERANCE
    assert report["accounting_check"] == []

    shown = job_details(str(tmp_path / "wh"), job_id, TEST_USER, datetime.now(UTC),
                        Config.load(config))  # fmt: skip
    assert shown is not None and shown["cpu_core_s"] == report["cpu_core_s"]  # the Job page's
    assert shown["host_mem_peak_bytes"] == report["host_mem_peak_bytes"]


def pages_slurm_lines(site: Path, job_id: str) -> list[str]:
    """The "Slurm (...)" line of the Job page and of My jobs' job in detail, as the job's user
    sees them (the app in this process: its sstat finds this cluster through $SLURM_CONF)."""
    st.cache_data.clear()  # a report cached by an earlier look would not ask sstat again
    with serving(site / "wh", site / "sing.toml"):
        pages = [open_app(TEST_USER, "job", query={"job": job_id}), open_app(TEST_USER, "my_jobs")]
    lines = [[c.value for c in at.caption if c.value.startswith("Slurm (")] for at in pages]
    assert all(len(found) == 1 for found in lines), lines
    return [found[0] for found in lines]


def slurm_line(line: str) -> tuple[float, float]:
    """(CPU seconds, memory bytes) of a page's sstat line."""
    found = re.match(r"Slurm \(sstat\): CPU ([\d.]+) core-seconds, memory ([\d.]+) MiB;", line)
    assert found, line
    return float(found.group(1)), float(found.group(2)) * MIB


def sing_job(config: str, job_id: str, env: dict[str, str]) -> dict:
    return json.loads(run(sing("--config", config, "job", job_id, "--json"), env))["rows"][0]


def submit(cluster: SlurmCluster) -> str:
    """sbatch as the test user, from the jobs directory (its output goes there)."""
    result = subprocess.run(
        ["runuser", "-u", TEST_USER, "--", "env", f"SLURM_CONF={cluster.conf}",
         f"PATH={cluster.path}", "sbatch", "--parsable", f"--chdir={cluster.jobs_dir}",
         f"--output={cluster.jobs_dir}/cgburn-%j.out"],
        input=JOB, capture_output=True, text=True, cwd=cluster.jobs_dir, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


def ended(job_id: str, env: dict[str, str]) -> bool:
    out = run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State", "-S", "now-1hour"], env)
    return out.strip() not in ("", "RUNNING", "PENDING", "COMPLETING")
