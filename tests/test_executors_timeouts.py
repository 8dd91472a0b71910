"""Slurm commands that hang or cannot run: one clear error, counted, recorded and shown.

Fake Slurm clients (shell scripts on PATH) stand in for a stopped slurmctld (`squeue` that
never answers), a broken client (`sinfo` that exits 1) and a client sing may not run. The
collector's job sync runs the real executor path against them; `sing doctor head` reads what
it recorded.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sing.collector.inventory import executor_inventory
from sing.collector.jobsync import executor_sync
from sing.collector.service import Collector
from sing.collector.settings import CollectorSettings
from sing.config import Config, ConfigError
from sing.executors.base import FAILED, TIMEOUT, CommandError
from sing.executors.settings import ExecutorSettings
from sing.executors.slurm import SlurmExecutor, run_command
from sing.warehouse.store import Warehouse
from tests.test_doctor import doctor

HANGS = "#!/bin/bash\nexec /bin/sleep 5\n"  # a client stuck on a stopped (SIGSTOP) slurmctld
BROKEN = "#!/bin/bash\necho 'slurm_load_partitions: Unable to contact slurm controller' >&2\n"
BROKEN += "exit 1\n"
# sacct that finds no job: JSON with an empty list, text with no line
NO_JOBS = '#!/bin/bash\n[[ " $* " == *" --json "* ]] && echo \'{"jobs": []}\'\nexit 0\n'


def fake_clients(directory: Path, **scripts: str) -> Path:
    """`directory` with an executable script per client name."""
    directory.mkdir(exist_ok=True)
    for name, text in scripts.items():
        path = directory / name
        path.write_text(text)
        path.chmod(0o755)
    return directory


@pytest.fixture
def on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Make PATH the fake clients alone: a real Slurm client installed here is never run."""

    def put(**scripts: str) -> Path:
        directory = fake_clients(tmp_path / "bin", **scripts)
        monkeypatch.setenv("PATH", str(directory))
        return directory

    return put


def test_a_hung_squeue_times_out_and_says_which_and_after_how_long(on_path) -> None:
    on_path(squeue=HANGS)
    executor = SlurmExecutor("campus", ExecutorSettings(command_timeout_s=1))
    started = time.monotonic()
    with pytest.raises(CommandError, match=r"^squeue --json timed out after 1 s") as caught:
        executor.running()
    assert time.monotonic() - started < 2.5
    assert (caught.value.command, caught.value.reason) == ("squeue", TIMEOUT)


def test_every_failure_to_run_a_command_is_a_command_error(tmp_path: Path, on_path) -> None:
    on_path(sinfo=BROKEN)
    with pytest.raises(CommandError, match=r"sinfo --all failed \(exit 1\): .*Unable to contact"):
        SlurmExecutor("campus", ExecutorSettings()).inventory()
    not_executable = tmp_path / "scontrol"
    not_executable.write_text("#!/bin/bash\n")  # no x bit: PermissionError, not an OSError out
    with pytest.raises(CommandError, match="scontrol could not run: .*Permission denied") as caught:
        run_command([str(not_executable), "update"])
    assert (caught.value.command, caught.value.reason) == ("scontrol", FAILED)
    with pytest.raises(CommandError, match="squeue not found: install the Slurm client"):
        run_command([str(tmp_path / "nowhere" / "squeue")])


def test_the_timeout_is_a_site_setting(tmp_path: Path) -> None:
    file = tmp_path / "sing.toml"
    file.write_text("[executor]\ncommand_timeout_s = 5\n")
    assert Config.load(file).section("executor", ExecutorSettings).command_timeout_s == 5.0
    file.write_text("[executor]\ncommand_timeout_s = 0\n")
    with pytest.raises(ConfigError, match="command_timeout_s = 0.0 must be more than 0"):
        Config.load(file).section("executor", ExecutorSettings)


def test_the_collector_counts_and_records_failures_and_doctor_shows_them(
    tmp_path: Path, on_path
) -> None:
    """Job sync through the real executor against a hung squeue and a broken sinfo: each is
    counted by command and reason, recorded in `command_failures`, and `sing doctor head`
    says which command failed, how often and when."""
    on_path(sacct=NO_JOBS, squeue=HANGS, sinfo=BROKEN)
    config = Config({"executor": {"kind": "slurm", "command_timeout_s": 1}})
    wh = Warehouse(tmp_path / "wh")
    settings = config.section("collector", CollectorSettings)
    collector = Collector(
        config, settings, wh, list, job_sync=executor_sync, node_source=executor_inventory
    )
    collector.sync_jobs()
    collector.sync_jobs()
    collector.close()

    def failures(command: str, reason: str) -> float | None:
        labels = {"command": command, "reason": reason}
        return collector.metrics.registry.get_sample_value(
            "sing_executor_command_failures_total", labels
        )

    assert failures("squeue", "timeout") == 2 and failures("sinfo", "failed") == 2
    assert (
        collector.metrics.registry.get_sample_value(
            "sing_collector_job_syncs_total", {"result": "error"}
        )
        == 2
    )
    rows = wh.connect().sql("SELECT command, reason, error FROM command_failures").fetchall()
    assert (
        sorted((c, r) for c, r, _ in rows)
        == [("sinfo", "failed")] * 2 + [("squeue", "timeout")] * 2
    )
    assert any("squeue --json timed out after 1 s" in error for _, _, error in rows)

    file = tmp_path / "sing.toml"
    file.write_text('[site]\nwarehouse = "wh"\n')
    _, found = doctor(file, "head")
    shown = found["slurm commands"]
    assert shown.startswith("WARN "), shown
    assert "squeue timed out 2 times in the last hour, last at " in shown
    assert "sinfo failed 2 times in the last hour" in shown


def test_doctor_says_ok_when_no_command_failed(tmp_path: Path) -> None:
    Warehouse(tmp_path / "wh")
    file = tmp_path / "sing.toml"
    file.write_text('[site]\nwarehouse = "wh"\n')
    _, found = doctor(file, "head")
    assert found["slurm commands"] == "OK none timed out or failed in the last hour"
