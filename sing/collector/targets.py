"""Where to scrape: a Prometheus file_sd file, a plain list, or the Slurm node list.

Each target is a URL and the node name its rows are stored under. file_sd is what sites already
keep for Prometheus (a JSON or YAML list of `{targets: [host:port], labels: {...}}`); the
node name is the `node` label, else the host part, the cluster the `cluster` label, else the
site's, and the Prometheus labels `__scheme__` and `__metrics_path__` are honoured. The file is
re-read whenever it changes; a broken edit is logged and the previous targets are kept, so a
typo never stops collection.
"""

from __future__ import annotations

import logging
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sing.collector.client import PLAIN, ScrapeClient
from sing.errors import UserError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Target:
    url: str
    node: str
    cluster: str = ""  # "" = the site's cluster ([site] cluster)
    client: ScrapeClient = field(default=PLAIN, compare=False, repr=False)


def target_from(address: str, labels: dict[str, Any] | None = None, scheme: str = "http") -> Target:
    """A target from `host:port` (or a full URL) and optional file_sd labels."""
    labels = labels or {}
    if "://" in address:
        url = address
        host = address.split("://", 1)[1].split("/", 1)[0]
    else:
        scheme = labels.get("__scheme__", scheme)
        path = labels.get("__metrics_path__", "/metrics")
        url = f"{scheme}://{address}{path}"
        host = address
    node = str(labels.get("node") or host.rsplit(":", 1)[0].strip("[]"))
    return Target(url, node, str(labels.get("cluster") or ""))


class FileSD:
    """Targets from a file_sd file, re-read when its modification time or size changes."""

    def __init__(self, path: str | Path, scheme: str = "http") -> None:
        self.path = Path(path)
        self.scheme = scheme  # for groups without a `__scheme__` label
        self._stamp: tuple[int, int] | None = None
        self._targets: list[Target] = []
        self.targets()  # a broken file at start-up is the user's error, raised now
        if not self._targets:
            log.warning("%s lists no targets", self.path)

    def targets(self) -> list[Target]:
        try:
            stat = self.path.stat()
        except OSError as err:
            if self._stamp is None:
                raise UserError(f"file_sd file {self.path}: {err.strerror}") from err
            log.error("file_sd file %s: %s; keeping %d targets", self.path, err, len(self._targets))
            return self._targets
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp != self._stamp:
            try:
                self._targets = parse_file_sd(self.path, self.scheme)
                log.info("%s: %d targets", self.path, len(self._targets))
            except UserError as err:
                if self._stamp is None:
                    raise
                log.error("%s; keeping the previous %d targets", err, len(self._targets))
            self._stamp = stamp
        return self._targets


def parse_file_sd(path: Path, scheme: str = "http") -> list[Target]:
    """Parse a file_sd JSON/YAML file (YAML is a superset of JSON) into targets."""
    try:
        groups = yaml.safe_load(path.read_text()) or []
    except (OSError, yaml.YAMLError) as err:
        raise UserError(f"file_sd file {path}: cannot read it: {err}") from err
    if not isinstance(groups, list):
        raise UserError(f"file_sd file {path}: expected a list of target groups")
    targets = []
    for i, group in enumerate(groups, 1):
        if not isinstance(group, dict) or not isinstance(group.get("targets"), list):
            raise UserError(f"file_sd file {path}: group {i} needs a 'targets' list")
        labels = group.get("labels") or {}
        if not isinstance(labels, dict):
            raise UserError(f"file_sd file {path}: group {i}: 'labels' must be a mapping")
        targets.extend(target_from(str(a), labels, scheme) for a in group["targets"])
    return targets


def slurm_targets(port: int, path: str = "/metrics", scheme: str = "http") -> list[Target]:
    """One target per node Slurm knows (`sinfo -N`), on the exporter's port."""
    try:
        out = subprocess.run(
            ["sinfo", "--noheader", "--Node", "--format=%N"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as err:
        raise UserError(f"cannot list Slurm nodes with sinfo: {err}") from err
    nodes = sorted({line.strip() for line in out.splitlines() if line.strip()})
    return [Target(f"{scheme}://{node}:{port}{path}", node) for node in nodes]
