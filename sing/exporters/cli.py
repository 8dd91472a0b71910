"""`sing exporter`: serve one node's `/metrics` (or several fake nodes' on several ports)."""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import logging
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pynvml

from sing.config import Config
from sing.digits import ascii_digits
from sing.errors import UserError
from sing.exporters.backends import Backend, BackendNode, load_backend
from sing.exporters.node import NodeCollector, node_registry
from sing.exporters.recording import Recorder
from sing.exporters.settings import ExporterSettings
from sing.exporters.web import serve
from sing.exporters.webconfig import WebConfig, load_web_config

log = logging.getLogger(__name__)

DESCRIPTION = (
    "Serve /metrics for Prometheus: NVML GPU metrics, RDMA port traffic and which Slurm job "
    "holds each GPU. Values are read at scrape time."
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("exporter", description=DESCRIPTION)
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, help="port to serve on (default: [exporter] port, 9410)")
    p.add_argument("--listen-address", help="address to bind (default: 127.0.0.1)")
    p.add_argument(
        "--web.listen-address",
        dest="web_listen_address",
        metavar="[HOST]:PORT",
        help="address and port in one, as node_exporter takes them (instead of the two above)",
    )
    p.add_argument(
        "--web.config.file",
        dest="web_config_file",
        metavar="FILE",
        help="TLS and basic auth, in Prometheus exporter-toolkit's web config format",
    )
    p.add_argument("--sysfs-root", help="where sysfs is mounted (default: /sys)")
    p.add_argument("--proc-root", help="where procfs is mounted (default: /proc)")
    p.add_argument("--job-mapping-dir", help="GPU-to-job files from the Slurm prolog")
    p.add_argument("--cache-seconds", type=float, help="scrapes this close share one reading")
    p.add_argument(
        "--health-refresh-s",
        type=float,
        help="seconds between reads of the GPU's InfoROM health counts (default: 60; 0: each read)",
    )
    p.add_argument(
        "--fake",
        nargs="?",
        const="default",
        metavar="FILE",
        help="use a fake NVML: a device description (YAML) or a recording (.jsonl); "
        "without FILE the built-in 8-GPU H200 node",
    )
    p.add_argument(
        "--fake-state", metavar="FILE", help="runtime overrides, re-read when the file changes"
    )
    p.add_argument(
        "--node",
        action="append",
        metavar="NAME:PORT",
        help="serve fake node NAME on PORT (repeat for several nodes in one process)",
    )
    p.add_argument(
        "--fake-root", metavar="DIR", help="where fake nodes keep their /sys, /proc, job files"
    )
    p.add_argument("--record", metavar="FILE", help="also write the device state to FILE (JSONL)")
    p.add_argument("--record-interval", type=float, help="seconds between recorded frames")
    p.add_argument("--duration", type=float, help="stop after this many seconds")


def _settings(args: argparse.Namespace, config: Config) -> ExporterSettings:
    settings = config.section("exporter", ExporterSettings)
    if settings.web_config_file:  # relative to the config file; on the command line, to the CWD
        web_file = str(config.resolve_path(settings.web_config_file))
        settings = dataclasses.replace(settings, web_config_file=web_file)
    given = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(ExporterSettings)
        if getattr(args, f.name, None) is not None
    }
    if args.web_listen_address:
        if args.port is not None or args.listen_address is not None:
            raise UserError("--web.listen-address replaces --port and --listen-address; give one")
        host, colon, port = args.web_listen_address.rpartition(":")
        if not colon or not ascii_digits(port):
            raise UserError(f"--web.listen-address {args.web_listen_address!r}: expected HOST:PORT")
        # ":PORT" is every address, as in node_exporter; "[::1]:PORT" an IPv6 one
        given.update(listen_address=host.strip("[]") or "0.0.0.0", port=int(port))
    return dataclasses.replace(settings, **given)


def _nodes(args: argparse.Namespace, port: int) -> list[tuple[str | None, int]]:
    if not args.node:
        return [(None, port)]
    if args.fake is None:
        raise UserError("--node serves fake nodes; add --fake (several real nodes need one each)")
    nodes = []
    for spec in args.node:
        name, _, number = spec.rpartition(":")
        if not name or not ascii_digits(number):
            raise UserError(f"--node {spec!r}: expected NAME:PORT, e.g. gpu01:9501")
        nodes.append((name, int(number)))
    return nodes


def run(args: argparse.Namespace, config: Config) -> int:
    settings = _settings(args, config)
    web = load_web_config(settings.web_config_file) if settings.web_config_file else WebConfig()
    if warning := exposure_warning(settings.listen_address, web):
        log.warning("%s", warning)
    nodes = _nodes(args, settings.port)
    if args.record and len(nodes) > 1:
        raise UserError("--record writes one node's state; use it without several --node")
    fakes = load_backend("fake", args.fake, args.fake_state) if args.fake is not None else None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    recorder = Recorder(args.record) if args.record else None
    with tempfile.TemporaryDirectory(prefix="sing-fake-") as scratch:
        fake_root = Path(args.fake_root or scratch)
        servers: list[Any] = []
        try:
            collectors = [
                _start_node(name, port, settings, web, args, fakes, fake_root, recorder, servers)
                for name, port in nodes
            ]  # fmt: skip
            sampler = threading.Thread(
                target=_sample_activity, args=(collectors, stop), name="gpm-sampler", daemon=True
            )
            sampler.start()
            interval = settings.record_interval if recorder else None
            _wait(args.duration, interval, stop, collectors[-1])
        except KeyboardInterrupt:
            pass
        finally:
            stop.set()  # ends the sampling thread
            for server in servers:
                server.shutdown()
            if recorder:
                recorder.close()
    return 0


def _start_node(
    name: str | None,
    port: int,
    settings: ExporterSettings,
    web: WebConfig,
    args: argparse.Namespace,
    fakes: Backend | None,
    fake_root: Path,
    recorder: Recorder | None,
    servers: list[Any],
) -> NodeCollector:
    """Build one node's collector and serve its registry on its port."""
    node = BackendNode(pynvml)
    if fakes is not None:  # the fake node's own files, unless the command line names others
        explicit_roots = any((args.sysfs_root, args.proc_root, args.job_mapping_dir))
        node = fakes.node(name, None if explicit_roots else fake_root / (name or "node"))
    roots = node.roots or (settings.sysfs_root, settings.proc_root, settings.job_mapping_dir)
    collector = NodeCollector(
        node.nvml,
        *roots,
        cache_seconds=settings.cache_seconds,
        before_read=node.before_read,
        on_reading=recorder.write if recorder else None,
        health=settings.health,
        health_refresh_s=settings.health_refresh_s,
        cgroups=settings.cgroups,
    )
    try:
        server = serve(node_registry(collector), settings.listen_address, port, web)
    except OSError as err:
        raise UserError(
            f"cannot listen on {settings.listen_address}:{port}: {err.strerror or err}"
        ) from err
    servers.append(server)
    scheme = "https" if web.tls else "http"
    where = f"{scheme}://{settings.listen_address}:{port}/metrics"
    log.info("serving %s on %s (%s)", name or "this node", where, web.describe())
    return collector


def exposure_warning(address: str, web: WebConfig) -> str | None:
    """Why the network can read the page in clear when served on `address` with `web`, or
    None; the page names users and their jobs (also checked by `sing doctor node`)."""
    try:
        loopback = ipaddress.ip_address(address).is_loopback
    except ValueError:  # a host name
        loopback = address == "localhost"
    if loopback or web.tls:
        return None
    if web.users:
        return f"basic auth without TLS on {address}: passwords cross the network in clear"
    return (
        f"serving user names and job ids on {address} with neither TLS nor authentication; "
        "see --web.config.file (docs/exporter.md)"
    )


def _sample_activity(collectors: list[NodeCollector], stop: threading.Event) -> None:
    """Take GPM samples on the exporter's clock, so SM activity covers a window of its own."""
    while True:
        if stop.wait(min(c.gpus.sample_activity() for c in collectors)):
            return


def _wait(
    duration: float | None,
    record_interval: float | None,
    stop: threading.Event,
    recorded: NodeCollector | None,
) -> None:
    """Serve until stopped or `duration` passes; when recording, read on a clock meanwhile."""
    deadline = None if duration is None else time.monotonic() + duration
    while not stop.is_set():
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return
        wait = record_interval if record_interval is not None else left
        if stop.wait(wait if left is None or wait is None else min(wait, left)):
            return
        if record_interval is not None and recorded is not None:
            recorded.collect()  # record on a clock, not only when scraped
