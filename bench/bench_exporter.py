"""Exporter cost per scrape and memory, measured side by side with a bare prometheus_client.

Scrape cost: an 8-GPU (18 NVLinks each), 4-port node on the fake NVML, with the real
sysfs/procfs readers on a static fake tree, against a bare CollectorRegistry of plain Gauges
holding the same series (the least any Python exporter built on prometheus_client can cost),
best of alternating rounds. Target: under 2x.
Health readings (issue 18): the same node with `[exporter] health` on and off, in paired rounds
that alternate which runs first, medians: the page alone (read and render), and served over plain
HTTP (the exporter's CPU per scrape, as a node pays it: the target's measure). Target: the health
readings add at most 20% to the CPU per scrape. The fake
NVML answers each call in Python, as the real pynvml binding does around its driver call; the
driver's own time per call (an ioctl) is not in these figures and needs a GPU node
(tests/test_exporter_gpu.py records a real node).
Job cgroups (issue 32): the same node with 32 Slurm jobs' cgroups (each its CPU, memory, cpuset
and I/O files) in the v2 and v1 layouts, and with 8 (one per GPU), read and not read
(`[exporter] cgroups`), measured as the health readings are. Target: reading the 32 jobs'
cgroups adds at most 20% to the CPU per scrape served (a ratio of at most 1.2).
Transport: the same registry served over HTTP, over TLS, over TLS with basic auth, and with a
client certificate required too; the server's CPU per scrape (this process; the scraping
client runs in a child process, a new connection per scrape as Prometheus' short-lived
exporters see it). No target: the TLS handshake is the price of not publishing who runs what.
Memory: resident set of a real `python -m sing.exporters --fake` and `sing exporter --fake` process
after some scrapes. Target: under 60 MB (dcgm-exporter users report 70-150 MB).

Run: .venv/bin/python bench/bench_exporter.py   (--health, --cgroups: only that comparison)
"""

from __future__ import annotations

import base64
import gc
import json
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import bcrypt
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sing.exporters.basicauth import BasicAuth  # noqa: E402
from sing.exporters.node import NodeCollector, node_registry  # noqa: E402
from sing.exporters.web import serve  # noqa: E402
from sing.exporters.webconfig import load_web_config  # noqa: E402
from sing.testing.fake_nvml import FakeNvml, load_description  # noqa: E402
from sing.testing.fake_world import FakeWorld  # noqa: E402
from tests.pki import Pki, make_pki  # noqa: E402

HTTP_SCRAPES = 200
PASSWORD = "bench password"

SCRAPES = 300
ROUNDS = 5  # alternating rounds, best of each kept: the dev box is shared and noisy
HEALTH_ROUNDS = 11  # paired rounds of the health and cgroup comparisons (medians)
HEALTH_SERVED_ROUNDS = 5
CGROUP_CASES = (("v2", 8), ("v2", 32), ("v1", 32))  # (layout, jobs): one per GPU, the target's


def node_collector(
    root: Path, health: bool = True, cgroups: bool = True, description: dict | None = None
) -> NodeCollector:
    nvml = FakeNvml(description or load_description(None), node="bench")
    world = FakeWorld(root, nvml)
    world.sync()  # a static tree: the bench times the exporter's reads, not the fake's writes
    return NodeCollector(nvml, *world.roots, 0.0, health=health, cgroups=cgroups)


def exporter_registry(
    root: Path, health: bool = True, cgroups: bool = True, description: dict | None = None
) -> CollectorRegistry:
    collector = node_collector(root, health, cgroups, description)
    return node_registry(collector, process_metrics=False)


def with_jobs(layout: str, count: int) -> dict:
    """The built-in node with `count` jobs' cgroups in `layout`, every file present."""
    jobs = {
        str(1000 + n): {
            "cpus": 4,
            "cpu_user_s": 3600.0 * n,
            "cpu_system_s": 60.0 * n,
            "memory_used": 4e9 + n,
            "memory_limit": 3.2e10,
            "io_read_bytes": 1e9 * n,
            "io_write_bytes": 1e8 * n,
        }
        for n in range(count)
    }
    return {**load_description(None), "cgroup": {"layout": layout, "jobs": jobs}}


def bare_registry(page: str) -> CollectorRegistry:
    """Plain Gauges holding every series of `page`, as a hand-written exporter would."""
    registry = CollectorRegistry()
    for family in text_string_to_metric_families(page):
        labels = sorted({k for s in family.samples for k in s.labels})
        gauge = Gauge(family.name + "_bare", family.documentation, labels, registry=registry)
        for s in family.samples:
            (gauge.labels(**s.labels) if labels else gauge).set(s.value)
    return registry


def per_scrape(registry: CollectorRegistry) -> tuple[float, float]:
    """Mean (CPU seconds, wall seconds) of one generate_latest over SCRAPES runs."""
    for _ in range(20):
        generate_latest(registry)
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(SCRAPES):
        generate_latest(registry)
    return (time.process_time() - cpu) / SCRAPES, (time.perf_counter() - wall) / SCRAPES


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(command: list[str]) -> float:
    """Resident memory of an exporter process after 20 scrapes, from /proc."""
    port = free_port()
    proc = subprocess.Popen([*command, "--port", str(port), "--listen-address", "127.0.0.1"],
                            cwd=ROOT, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        scraped = 0
        while scraped < 20:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
                scraped += 1
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        status = Path(f"/proc/{proc.pid}/status").read_text()
        kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
        return kb / 1024
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def web_configs(pki: Pki) -> dict[str, dict]:
    """The transports compared, as web config files would give them."""
    tls = {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}
    users = {"prometheus": bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()}
    mtls = {**tls, "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(pki.ca)}
    return {
        "plain HTTP": {},
        "TLS": {"tls_server_config": tls},
        "TLS + basic auth": {"tls_server_config": tls, "basic_auth_users": users},
        "TLS + client cert + auth": {"tls_server_config": mtls, "basic_auth_users": users},
    }


def served_cpu(registry: CollectorRegistry, pki: Pki, name: str, config: dict) -> float:
    """This process's CPU seconds per scrape while a child process scrapes it."""
    web_file = pki.dir / "web.yml"
    web_file.write_text(json.dumps(config))
    port = free_port()
    server = serve(registry, "127.0.0.1", port, load_web_config(web_file))
    scheme = "https" if config.get("tls_server_config") else "http"
    client = [sys.executable, __file__, "--client", f"{scheme}://127.0.0.1:{port}/metrics",
              str(pki.dir), "1" if "client_auth_type" in str(config) else "0"]  # fmt: skip
    try:
        subprocess.run([*client, "20"], check=True)  # warm up (and the first, uncached bcrypt)
        cpu = time.process_time()
        subprocess.run([*client, str(HTTP_SCRAPES)], check=True)
        return (time.process_time() - cpu) / HTTP_SCRAPES
    finally:
        server.shutdown()
        server.server_close()


def client(url: str, pki_dir: str, with_cert: str, scrapes: str) -> None:
    """The scraping side: a new connection per scrape, checking each answer is the page."""
    base = Path(pki_dir)
    context = ssl.create_default_context(cafile=base / "ca.pem")
    if with_cert == "1":
        context.load_cert_chain(base / "client.pem", base / "client.key")
    auth = "Basic " + base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()
    request = urllib.request.Request(url, headers={"Authorization": auth})
    for _ in range(int(scrapes)):
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            assert b"sing_gpu_info" in response.read()


def auth_check_us() -> tuple[float, float]:
    """CPU microseconds of the first (bcrypt, cost 10) and of a cached credentials check."""
    auth = BasicAuth({"prometheus": bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10))})
    header = "Basic " + base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()
    started = time.process_time()
    auth.allows(header)
    first = time.process_time() - started
    started = time.process_time()
    for _ in range(10_000):
        auth.allows(header)
    return first * 1e6, (time.process_time() - started) / 10_000 * 1e6


def series_of(registry: CollectorRegistry) -> int:
    page = generate_latest(registry).decode()
    return sum(len(f.samples) for f in text_string_to_metric_families(page))


def paired(measure_on: Callable[[], float], measure_off: Callable[[], float], rounds: int) -> tuple:
    """Medians of (on, off, on/off - 1) over rounds that alternate which side runs first, so
    neither side always meets a warmer cache or a later garbage collection."""
    on, off, added = [], [], []
    for k in range(rounds):
        gc.collect()
        if k % 2:
            b, a = measure_off(), measure_on()
        else:
            a, b = measure_on(), measure_off()
        on.append(a)
        off.append(b)
        added.append(a / b - 1)
    return statistics.median(on), statistics.median(off), statistics.median(added)


def side_by_side(on: CollectorRegistry, off: CollectorRegistry, pki: Pki) -> tuple:
    """`paired` medians (on, off, on/off - 1) of the page alone and of the page served over
    plain HTTP, for two registries of one node."""
    page = paired(lambda: per_scrape(on)[0], lambda: per_scrape(off)[0], HEALTH_ROUNDS)
    served = paired(
        lambda: served_cpu(on, pki, "on", {}),
        lambda: served_cpu(off, pki, "off", {}),
        HEALTH_SERVED_ROUNDS,
    )
    return page, served


def print_rounds(what: str) -> None:
    print(f"\n{what}; medians of {HEALTH_ROUNDS} alternating rounds of {SCRAPES} scrapes (page "
          f"alone) and {HEALTH_SERVED_ROUNDS} of {HTTP_SCRAPES} scrapes over plain HTTP (served: "
          "the exporter's CPU per scrape)")  # fmt: skip
    print(f"{'':24}{'series':>8}{'page CPU ms':>13}{'served CPU ms':>15}")


def health_cost() -> None:
    """CPU per scrape with and without the health readings, side by side."""
    with tempfile.TemporaryDirectory() as tmp:
        on = exporter_registry(Path(tmp) / "on", health=True)
        off = exporter_registry(Path(tmp) / "off", health=False)
        page, served = side_by_side(on, off, make_pki(Path(tmp) / "pki"))
        print_rounds("health readings, 8 GPUs (fake NVML)")
        for name, registry, k in (("health = false", off, 1), ("health = true", on, 0)):
            print(f"{name:24}{series_of(registry):>8}{page[k] * 1e3:>13.3f}"
                  f"{served[k] * 1e3:>15.3f}")  # fmt: skip
    print(f"{'added (target <= 20%)':24}{'':>8}{page[2]:>13.1%}{served[2]:>15.1%}")


def cgroup_cost() -> None:
    """CPU per scrape with and without reading the jobs' cgroups, side by side."""
    print_rounds("job cgroups on the 8-GPU node")
    with tempfile.TemporaryDirectory() as tmp:
        pki = make_pki(Path(tmp) / "pki")
        for layout, jobs in CGROUP_CASES:
            node = with_jobs(layout, jobs)
            on = exporter_registry(Path(tmp) / f"{layout}-{jobs}-on", description=node)
            off = exporter_registry(Path(tmp) / f"{layout}-{jobs}-off", cgroups=False,
                                    description=node)  # fmt: skip
            page, served = side_by_side(on, off, pki)
            for name, registry, k in (("cgroups = false", off, 1),
                                      (f"{jobs} jobs' cgroups ({layout})", on, 0)):  # fmt: skip
                print(f"{name:24}{series_of(registry):>8}{page[k] * 1e3:>13.3f}"
                      f"{served[k] * 1e3:>15.3f}")  # fmt: skip
            target = " (target <= 1.2)" if jobs == 32 else ""
            print(f"{'ratio' + target:24}{'':>8}{1 + page[2]:>13.2f}{1 + served[2]:>15.2f}")
            read, render = cgroup_split(
                node_collector(Path(tmp) / f"{layout}-{jobs}", description=node)
            )
            print(f"{'  of which read':24}{'':>8}{read * 1e3:>13.3f}   (the files, the families)")
            print(f"{'  of which rendered':24}{'':>8}{render * 1e3:>13.3f}   (prometheus_client's "
                  f"text of them alone: {render / page[1]:.0%} of the page without)")  # fmt: skip


def cgroup_split(collector: NodeCollector) -> tuple[float, float]:
    """CPU seconds per scrape of the jobs' cgroup series: reading their files and building
    the families, and prometheus_client rendering them alone (a registry of just those)."""
    source = collector.cgroups
    assert source is not None
    families = source.metrics()
    alone = CollectorRegistry()
    alone.register(type("Rendered", (), {"collect": lambda self: families})())
    cpu = time.process_time()
    for _ in range(SCRAPES):
        source.metrics()
    read = (time.process_time() - cpu) / SCRAPES
    return read, per_scrape(alone)[0]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ours = exporter_registry(Path(tmp))
        page = generate_latest(ours).decode()
        series = sum(len(f.samples) for f in text_string_to_metric_families(page))
        bare = bare_registry(page)
        rounds = [(per_scrape(ours), per_scrape(bare)) for _ in range(ROUNDS)]
        ours_cpu, ours_wall = (min(r[0][i] for r in rounds) for i in (0, 1))
        bare_cpu, bare_wall = (min(r[1][i] for r in rounds) for i in (0, 1))
        pki = make_pki(Path(tmp) / "pki")
        transports = {
            name: min(served_cpu(ours, pki, name, config) for _ in range(3))
            for name, config in web_configs(pki).items()
        }
    print(f"node: 8 GPUs (fake NVML), 4 RDMA ports (sysfs tree), {series} series")
    print(f"{'':24}{'CPU ms/scrape':>15}{'wall ms/scrape':>16}")
    print(f"{'sing exporter':24}{ours_cpu * 1e3:>15.3f}{ours_wall * 1e3:>16.3f}")
    print(f"{'bare prometheus_client':24}{bare_cpu * 1e3:>15.3f}{bare_wall * 1e3:>16.3f}")
    print(f"{'ratio (target < 2)':24}{ours_cpu / bare_cpu:>15.2f}{ours_wall / bare_wall:>16.2f}")
    plain = transports["plain HTTP"]
    print(f"\nserved, new connection per scrape ({HTTP_SCRAPES} scrapes, best of 3)")
    print(f"{'transport':26}{'server CPU ms/scrape':>22}{'vs plain HTTP':>15}")
    for name, cpu in transports.items():
        print(f"{name:26}{cpu * 1e3:>22.3f}{cpu / plain:>14.2f}x")
    first, cached = auth_check_us()
    print(f"basic auth check: {first / 1e3:.0f} ms CPU the first time (bcrypt, cost 10), "
          f"{cached:.1f} us cached")  # fmt: skip
    python = [sys.executable, "-m"]
    for name, cmd in [
        ("python -m sing.exporters --fake", [*python, "sing.exporters", "--fake"]),
        ("sing exporter --fake", [*python, "sing.cli", "exporter", "--fake"]),
    ]:
        print(f"RSS {name}: {rss_mb(cmd):.1f} MB (target < 60)")
    health_cost()
    cgroup_cost()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--client"]:
        client(*sys.argv[2:])
    elif sys.argv[1:2] == ["--health"]:
        health_cost()
    elif sys.argv[1:2] == ["--cgroups"]:
        cgroup_cost()
    else:
        main()
