"""The real path of an automatic incident: a `sing exporter --fake` process whose fake NVML
raises XID 79 on one GPU, the `sing collector` daemon scraping it and running detection on its
schedule, and `sing incident list --json` showing the incident with the job that ran there."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sing.warehouse.store import Warehouse
from tests.policy_world import add_job
from tests.test_collector_scrape import file_sd_entry, running, sing, wait_for
from tests.test_health_readings import node  # noqa: F401 - the fixture


def test_an_xid_79_on_a_fake_gpu_becomes_one_incident(
    tmp_path: Path,
    node: tuple[int, Path],  # noqa: F811 - the fixture imported above
) -> None:
    port, state = node  # the exporter serving gpu01, and the state file scripting its faults
    (tmp_path / "targets.json").write_text(json.dumps([file_sd_entry("gpu01", port)]))
    config = tmp_path / "sing.toml"
    config.write_text(
        f'[site]\ncluster = "lab"\nwarehouse = "{tmp_path / "wh"}"\n'
        f'[collector]\nfile_sd = "{tmp_path / "targets.json"}"\ninterval_s = 0.3\n'
        "[health]\ninterval_s = 0.5\n"
    )
    wh = Warehouse(tmp_path / "wh")
    # The job the executor's sync would have recorded: running on gpu01 since an hour ago.
    add_job(wh, "4242", datetime.now(UTC) - timedelta(hours=1), cluster="lab", nodes=["gpu01"])
    collector = sing("--config", str(config), "collector")

    def incidents() -> list[dict]:
        listed = subprocess.run(
            sing("--config", str(config), "incident", "list", "--json"),
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(listed.stdout)["rows"]

    def detection_rounds_after(moment: datetime) -> bool:
        con = wh.connect({"health_rounds": None})
        try:
            (seen,) = con.execute("SELECT max(round_at) FROM health_rounds").fetchone()
        finally:
            con.close()
        return seen is not None and seen > moment

    with running(collector, tmp_path / "collector.log"):
        started = datetime.now(UTC)
        wait_for(lambda: detection_rounds_after(started), what="a detection round")
        assert incidents() == []  # healthy GPUs open nothing
        state.write_text(json.dumps({"gpus": {"1": {"xids": {"79": 1}}}}))
        (incident,) = wait_for(incidents, timeout_s=30, what="the XID 79 incident")
        later = datetime.now(UTC)
        wait_for(lambda: detection_rounds_after(later), what="later detection rounds")
    # A restarted collector writes the XID count again: the same count opens nothing.
    restarted = datetime.now(UTC)
    with running(collector, tmp_path / "collector.log"):
        wait_for(lambda: detection_rounds_after(restarted), what="a round after the restart")
        time_seen = datetime.now(UTC)
        wait_for(lambda: detection_rounds_after(time_seen), what="another round")
    assert incidents() == [incident]
    assert (incident["cluster"], incident["node"], incident["device"]) == ("lab", "gpu01", "1")
    assert (incident["class"], incident["signal"], incident["source"]) == ("xid", "xid_79", "auto")
    assert incident["jobs"] == ["4242"] and incident["closed_at"] is None
    assert incident["opened_by"].startswith("sing health@")
    evidence = json.loads(incident["evidence"])
    assert (evidence["value"], evidence["component"]) == (1.0, "gpu")
    assert evidence["gpu_uuid"].startswith("GPU-")
