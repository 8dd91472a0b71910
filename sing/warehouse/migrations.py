"""Schema versions of a warehouse directory, and the steps that upgrade an older one.

`ROOT/_meta.json` records the version. Opening a warehouse runs every step between its version
and `CURRENT_VERSION`, in order, each under the maintenance lock, and records the new version
only after the step finished, so an interrupted upgrade is simply run again.

Adding a column needs no step (the first write adds it to the table's Delta schema,
`delta.add_new_columns`; older rows read as NULL); renaming or
re-typing one, or changing the layout, does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from sing.errors import UserError
from sing.warehouse import files, upgrade
from sing.warehouse.files import Location

if TYPE_CHECKING:
    from sing.warehouse.store import Warehouse

META = "_meta.json"


def _roll_up_closed_days(wh: Warehouse) -> None:
    """Version 2 added the rollup tier; the step to version 3 ends by building every rollup."""


# STEPS[n] upgrades a warehouse from version n to n + 1. Version 3: Delta Lake tables.
STEPS: dict[int, Callable[[Warehouse], None]] = {1: _roll_up_closed_days, 2: upgrade.to_delta}
CURRENT_VERSION = 3


def read_version(wh: Warehouse) -> int | None:
    return read_version_of(wh.root)


def read_version_of(root: Location) -> int | None:
    text = files.read_text(files.join(root, META))
    return None if text is None else int(json.loads(text)["schema_version"])


def write_version(wh: Warehouse, version: int) -> None:
    files.write_text(files.join(wh.root, META), json.dumps({"schema_version": version}) + "\n")


def check_readable(wh: Warehouse) -> None:
    """A warehouse this process may not write must already be at a version it reads."""
    version = read_version(wh)
    if version is not None and version != CURRENT_VERSION:
        raise UserError(
            f"warehouse {wh.root} has schema version {version} and this sing reads version "
            f"{CURRENT_VERSION}; it is read-only here, so run any sing command once where it "
            "is writable to upgrade it"
            if version < CURRENT_VERSION
            else f"warehouse {wh.root} has schema version {version}, newer than this sing "
            f"({CURRENT_VERSION}); upgrade sing"
        )


def upgrade(wh: Warehouse) -> None:
    version = read_version(wh)
    if version is None:  # a new, empty warehouse starts at the current version
        write_version(wh, CURRENT_VERSION)
        return
    if version > CURRENT_VERSION:
        raise UserError(
            f"warehouse {wh.root} has schema version {version}, newer than this sing "
            f"({CURRENT_VERSION}); upgrade sing"
        )
    while version < CURRENT_VERSION:
        STEPS[version](wh)
        version += 1
        write_version(wh, version)
