"""The node inventory (`nodes`): which GPUs each node has, as versions over time.

Capacity is only known if someone writes it down, so the collector does, from two witnesses:
- the exporters, every round: GPU count, model and memory size, as the node's payload says;
- the executor (`sinfo` on Slurm), at each job sync: the node list, partitions and Gres counts.

Merge rule, per node and round: count, model and memory from the exporter when it answers with
GPU series (else from its last exporter-based version, so one failed scrape changes nothing;
else from the executor's Gres); the partition from the executor. A node the executor listed
before and lists no more, with no exporter answering for it, gets a version with gpus = 0 (it
left). A node known only from exporters is never retired: a failed scrape is not a departure.

A version is written only when (gpus, model, memory, partition) differ from the node's last
version or the node is new, with `valid_from` = the round's time. The last versions are read
back from the warehouse at start, so a restart writes nothing new for unchanged nodes.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime
from typing import Any

from sing.collector.convert import Hardware
from sing.config import Config
from sing.executors.records import NodeRecord
from sing.warehouse.store import Warehouse

log = logging.getLogger(__name__)

# (cluster, node)
NodeKey = tuple[str, str]
DEFAULT = "sing.collector.inventory:executor_inventory"


@dataclasses.dataclass(frozen=True)
class NodeVersion:
    gpus: int
    gpu_model: str | None
    gpu_memory_bytes: int | None
    partition: str | None
    source: str

    def same_as(self, other: NodeVersion | None) -> bool:
        """Equal in what the inventory tracks; who said so does not make a new version."""
        return other is not None and dataclasses.replace(other, source=self.source) == self


class Inventory:
    """The last written version of every node, and the rule that makes the next one."""

    def __init__(self, last: dict[NodeKey, NodeVersion] | None = None) -> None:
        self.last: dict[NodeKey, NodeVersion] = dict(last or {})

    def copy(self) -> Inventory:
        """A snapshot, to go back to when the versions computed from here are not written."""
        return Inventory(self.last)

    def versions(
        self,
        ts: datetime,
        hardware: dict[NodeKey, Hardware],
        listed: dict[NodeKey, NodeRecord] | None,
    ) -> list[dict[str, Any]]:
        """The `nodes` rows for one round: exporter `hardware` of the nodes that answered with
        GPU series, and the executor's `listed` nodes (None: no executor inventory)."""
        keys = hardware.keys() | (listed or {}).keys()
        if listed is not None:
            keys |= {k for k, v in self.last.items() if "sinfo" in v.source and v.gpus}
        rows = []
        for key in sorted(keys):
            version = self._merge(key, hardware.get(key), (listed or {}).get(key))
            if version.same_as(self.last.get(key)):
                continue
            self.last[key] = version
            cluster, node = key
            rows.append(
                {"cluster": cluster, "node": node, "valid_from": ts} | dataclasses.asdict(version)
            )
        return rows

    def _merge(self, key: NodeKey, hw: Hardware | None, listed: NodeRecord | None) -> NodeVersion:
        previous = self.last.get(key)
        if hw is None and listed is None:  # listed before, not now, no exporter answer: it left
            assert previous is not None
            return dataclasses.replace(previous, gpus=0, partition=None, source="sinfo")
        if hw is None and previous is not None and previous.source.startswith("exporter"):
            # The exporter did not answer this round: its last word stands.
            hw = Hardware(previous.gpus, previous.gpu_model, previous.gpu_memory_bytes)
        if hw is None:
            return NodeVersion(listed.gpus, listed.gpu_model, None, listed.partition, "sinfo")
        partition = listed.partition if listed else None
        source = "exporter+sinfo" if listed else "exporter"
        return NodeVersion(hw.gpus, hw.model, hw.memory_bytes, partition, source)


def load_inventory(warehouse: Warehouse, default_cluster: str) -> Inventory:
    """The newest version of every node in the warehouse (old rows: no cluster, no valid_from)."""
    con = warehouse.connect()
    try:
        rows = con.execute(
            """
            SELECT coalesce(cluster, ?), node, gpus, gpu_model, gpu_memory_bytes, partition,
                   coalesce(source, 'import')
            FROM nodes
            QUALIFY row_number() OVER (
                PARTITION BY coalesce(cluster, ?), node ORDER BY valid_from DESC NULLS LAST) = 1
            """,
            [default_cluster, default_cluster],
        ).fetchall()
    finally:
        con.close()
    return Inventory({(c, n): NodeVersion(*version) for c, n, *version in rows})


def executor_inventory(config: Config) -> list[NodeRecord]:
    """The default source: the configured `[executor]`'s node list (`sinfo` on Slurm)."""
    from sing.executors.base import make_executor

    return make_executor(config).inventory()
