"""Which nodes this collector scrapes when several collectors share one warehouse.

`[collector] shard = "k/n"` (k from 1 to n): of one shared target list (file_sd, the Slurm node
list or `targets`), this collector scrapes the targets whose node name hashes to k. The hash is
a stable one (BLAKE2b of the name), so every collector, on every host and after every restart,
agrees on each node's shard without talking to the others; all of a node's targets (sing
exporter, dcgm-exporter, node_exporter) carry its name, so they land in one shard together and
their readings still merge into one row per GPU. A node's inventory versions (`nodes`) are
written by its shard's collector only.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from sing.errors import UserError


@dataclass(frozen=True)
class Shard:
    index: int  # 1..count
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """`"k/n"`; "" is the whole target list (`1/1`)."""
        if not text:
            return cls(1, 1)
        index, _, count = text.partition("/")
        try:
            shard = cls(int(index), int(count))
        except ValueError:
            shard = cls(0, 0)
        if not 1 <= shard.index <= shard.count:
            raise UserError(
                f'[collector] shard = "{text}": write "k/n" with 1 <= k <= n, e.g. "2/3" '
                "for the second of three collectors"
            )
        return shard

    def owns(self, node: str) -> bool:
        """Whether this shard scrapes (and inventories) `node`."""
        return self.count == 1 or bucket(node, self.count) == self.index - 1

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def bucket(node: str, count: int) -> int:
    """The node's shard, 0..count-1: the same on every host and in every run (unlike `hash`)."""
    digest = hashlib.blake2b(node.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count
