"""The [trace] section of the site config: the anonymization policy applied to every export."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from sing.errors import UserError
from traces.format import DROPPABLE

KEY_BYTES = 32
RARE_SHAPE_POLICIES = ("generalize", "suppress", "keep")


@dataclass(frozen=True)
class TraceSettings:
    """Anonymization policy. Defaults are safe for a public release."""

    # Groups with fewer distinct users are merged into group "other"; resource shapes
    # (nodes x GPUs per node x model) used by fewer users are handled by `rare_shapes`.
    k: int = 5
    # generalize: a rare shape's GPU model becomes "other", and jobs whose shape is still rare
    # are left out; suppress: rare-shape jobs are left out; keep: no change.
    rare_shapes: str = "generalize"
    # Optional jobs fields left out of every release (e.g. ["dependencies", "partition"]).
    drop: tuple[str, ...] = ()
    # File holding the release's secret HMAC key (hex). Empty: a fresh random key per export,
    # so releases are unlinkable. Reuse a key file on purpose to link releases.
    key_file: str = ""
    # Text for the datasheet.
    title: str = "GPU cluster job trace"
    collected_by: str = "sing (telemetry, accounting and trace analytics for GPU clusters)"
    write_csv: bool = True

    def __post_init__(self) -> None:
        if self.k < 1:
            raise UserError(f"[trace] k must be at least 1, got {self.k}")
        if self.rare_shapes not in RARE_SHAPE_POLICIES:
            raise UserError(
                f"[trace] rare_shapes = {self.rare_shapes!r}; use one of "
                + ", ".join(RARE_SHAPE_POLICIES)
            )
        bad = [d for d in self.drop if d not in DROPPABLE]
        if bad:
            raise UserError(
                f"[trace] drop: {', '.join(bad)} cannot be dropped; droppable: "
                + ", ".join(DROPPABLE)
            )


def load_key(key_file: str | Path | None) -> bytes:
    """The release key: read from `key_file` (created with a new random key if missing), or a
    fresh random key that is never stored when no file is named."""
    if not key_file:
        return secrets.token_bytes(KEY_BYTES)
    path = Path(key_file).expanduser()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(KEY_BYTES) + "\n")
    text = path.read_text().strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise UserError(f"{path}: key file must hold one hex string") from None
    if len(key) < 16:
        raise UserError(f"{path}: key is {len(key)} bytes; need at least 16 (32 recommended)")
    return key
