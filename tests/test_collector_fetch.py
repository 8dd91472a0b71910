"""One GET of a page (`sing.collector.client.fetch`) under each Python's http.client.

Python 3.13's `HTTPResponse.read1` closes the connection as soon as it has read the last byte of
a body of known length (3.11 waits for the next, empty read). fetch set each read's timeout
after the read, so on 3.13 every scrape of a whole page failed with EBADF ("0/1 targets up" on
a Debian 13 head node). The test gives this interpreter 3.13's read1, so it checks the 3.13
behaviour on any Python.
"""

from __future__ import annotations

import http.client

import pytest

from sing.collector.client import fetch
from tests.http_stub import serving

PAGE = b"".join(b'sing_gpu_utilization_ratio{gpu="%d"} 0.5\n' % i for i in range(20_000))
READ_1 = http.client.HTTPResponse.read1


def read1_as_python_3_13(self: http.client.HTTPResponse, n: int = -1) -> bytes:
    """3.13's read1: the read that completes a body of known length closes the connection."""
    result = READ_1(self, n)
    if result and self.length == 0:
        self._close_conn()
    return result


@pytest.mark.parametrize("read1", [READ_1, read1_as_python_3_13], ids=["this python", "3.13"])
def test_a_whole_page_is_read_in_chunks_within_the_deadline(
    read1, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http.client.HTTPResponse, "read1", read1)
    with serving(lambda path: PAGE) as address:
        body = fetch(f"http://{address}/metrics", timeout_s=10, max_bytes=1 << 24)
    assert body.encode() == PAGE  # more than one chunk (CHUNK is 256 KiB)
    assert len(PAGE) > 3 * 256 * 1024
