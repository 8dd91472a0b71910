"""Pull mode against a real Prometheus (Debian package) on loopback, scraping real
`sing exporter --fake` processes."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlencode

import pytest

from sing.warehouse.store import Warehouse
from tests.debian import ensure_packages
from tests.ports import free_port
from tests.test_collector_scrape import (  # noqa: F401 - the fixtures `exporter`, `secure_exporter`
    REPO,
    SecureExporter,
    exporter,
    http_get,
    running,
    secure_exporter,
    sing,
    wait_for,
)

pytestmark = pytest.mark.prometheus


@contextmanager
def prometheus(tmp_path: Path, scrape_configs: list[dict]) -> Iterator[str]:
    """A real Prometheus on loopback scraping every second; yields its URL once ready."""
    ensure_packages("prometheus")
    port = free_port()
    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": scrape_configs}
    (tmp_path / "prom.yml").write_text(json.dumps(config))  # JSON is YAML
    url = f"http://127.0.0.1:{port}"
    argv = [
        shutil.which("prometheus") or "/usr/bin/prometheus",
        f"--config.file={tmp_path / 'prom.yml'}",
        f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with running(argv, tmp_path / "prometheus.log"):
        wait_for(lambda: "Ready" in http_get(f"{url}/-/ready"), what="prometheus ready")
        yield url


def query(url: str, promql: str) -> list[dict]:
    return json.loads(http_get(f"{url}/api/v1/query?{urlencode({'query': promql})}"))["data"][
        "result"
    ]


def prometheus_has_data(url: str) -> bool:
    targets = json.loads(http_get(f"{url}/api/v1/targets"))["data"]["activeTargets"]
    if not targets or any(t["health"] != "up" for t in targets):
        return False
    result = json.loads(http_get(f"{url}/api/v1/query?query=sing_rdma_transmit_bytes_total"))
    return len(result["data"]["result"]) == len(targets)


def test_pull_mode_reads_the_same_rows_from_prometheus(
    tmp_path: Path,
    exporter: dict[str, int],  # noqa: F811 - the imported fixture
) -> None:
    job = {
        "job_name": "sing",
        "static_configs": [
            {"targets": [f"127.0.0.1:{p}"], "labels": {"node": node}}
            for node, p in exporter.items()
        ],
    }
    with prometheus(tmp_path, [job]) as url:
        wait_for(lambda: prometheus_has_data(url), timeout_s=30, what="prometheus scraping")
        (tmp_path / "sing.toml").write_text(
            f'[collector]\nprometheus_url = "{url}"\ninterval_s = 1.0\npull_lookback_s = 8.0\n'
        )
        cmd = sing(
            "--config", str(tmp_path / "sing.toml"), "--warehouse", str(tmp_path / "wh"),
            "collector", "--once",
        )  # fmt: skip
        time.sleep(4)  # several one-second steps of history
        first = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=60)
        assert first.returncode == 0, first.stderr
        time.sleep(2)
        second = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=60)
        assert second.returncode == 0, second.stderr

    con = Warehouse(tmp_path / "wh").connect()
    # Each step has both nodes' 4 GPUs, once: the second pull went on from the first.
    per_step = con.execute(
        "SELECT ts, count(*), count(DISTINCT node || gpu_index) FROM gpu_samples "
        "GROUP BY ts ORDER BY ts"
    ).fetchall()
    assert all(n == d for _, n, d in per_step), "no GPU twice in one step"
    # The lookback may reach steps before Prometheus had scraped both nodes; from the first
    # step with both, every step has both.
    full = [n for _, n, _ in per_step][[n for _, n, _ in per_step].index(8) :]
    assert len(full) >= 4 and set(full) == {8}
    assert all(ts.microsecond == 0 for ts, _, _ in per_step)  # steps on whole seconds
    gpus = con.execute(
        "SELECT DISTINCT node, gpu_index, round(util, 3), job_id, mem_used_bytes, power_w "
        "FROM gpu_samples ORDER BY ALL"
    ).fetchall()
    assert gpus == [
        (node, i, util, job, 1_000_000_000, 300.0)
        for node in "ab"
        for i, util, job in [(0, 0.25, "101"), (1, 0.5, "101"), (2, 0.5, "102"), (3, 0.5, None)]
    ]
    scrapes = con.execute("SELECT DISTINCT node, target, up FROM scrapes ORDER BY node").fetchall()
    assert scrapes == [(n, f"127.0.0.1:{p}", True) for n, p in sorted(exporter.items())]
    # RDMA deltas from Prometheus' counter values: 1 GB/s out, job of most GPUs.
    tx, jobs = con.execute(
        "SELECT sum(tx_delta_bytes) / (count(tx_delta_bytes) * 1.0), list(DISTINCT job_id) "
        "FROM rdma_samples WHERE node = 'a'"
    ).fetchone()
    assert tx == pytest.approx(1e9, rel=0.3)
    assert jobs == ["101"]
    # Energy deltas chain across both pulls (300 W, one-second steps), every row stamped with
    # the site's cluster, and one inventory version per node from the exporter's series.
    energy = con.execute(
        "SELECT count(*) - count(energy_delta_j), avg(energy_delta_j), list(DISTINCT cluster) "
        "FROM gpu_samples"
    ).fetchone()
    assert energy[0] == 8  # only each GPU's first step has no delta
    assert energy[1] == pytest.approx(300.0, rel=0.3)
    assert energy[2] == ["campus"]
    nodes = con.execute(
        "SELECT node, gpus, gpu_model, gpu_memory_bytes, source FROM nodes ORDER BY node"
    ).fetchall()
    assert nodes == [(n, 4, "NVIDIA H200", 150754820096, "exporter") for n in "ab"]


def test_prometheus_scrapes_the_exporter_over_tls_with_basic_auth(
    tmp_path: Path,
    secure_exporter: SecureExporter,  # noqa: F811 - the imported fixture
) -> None:
    pki = secure_exporter.pki
    tls = {
        "ca_file": str(pki.ca),
        "cert_file": str(pki.client_cert),
        "key_file": str(pki.client_key),
    }
    target = {"targets": [f"127.0.0.1:{secure_exporter.port}"], "labels": {"node": "s"}}
    secure = {
        "job_name": "secure",
        "scheme": "https",
        "tls_config": tls,
        "basic_auth": {
            "username": "prometheus",
            "password_file": str(secure_exporter.password_file),
        },
        "static_configs": [target],
    }
    anonymous = {
        "job_name": "anonymous",
        "scheme": "https",
        "tls_config": tls,
        "static_configs": [target],
    }
    plain = {"job_name": "plain", "static_configs": [target]}
    with prometheus(tmp_path, [secure, anonymous, plain]) as url:

        def scraped() -> dict[str, dict]:
            active = json.loads(http_get(f"{url}/api/v1/targets"))["data"]["activeTargets"]
            jobs = {t["labels"]["job"]: t for t in active if t["health"] != "unknown"}
            return jobs if len(jobs) == 3 else {}

        targets = wait_for(scraped, timeout_s=30, what="three scrapes")
        util = wait_for(
            lambda: query(url, 'sing_gpu_utilization_ratio{job="secure",gpu="0"}'),
            what="the secure job's samples",
        )
        up = {r["metric"]["job"]: r["value"][1] for r in query(url, "up")}
        leaked = query(url, '{job=~"anonymous|plain",__name__=~"sing_.*"}')
    assert up == {"secure": "1", "anonymous": "0", "plain": "0"}
    assert float(util[0]["value"][1]) == 0.25  # NODE_YAML's GPU 0
    assert util[0]["metric"]["node"] == "s"
    assert "401 Unauthorized" in targets["anonymous"]["lastError"]
    assert targets["plain"]["lastError"]  # plain HTTP to a TLS port gets no metrics
    assert leaked == []  # neither refused job stored a sample of the exporter's
