"""Slurm's text figures in SI units: durations and sizes as its clients print them.

Formats, from Slurm's source (src/common/parse_time.c `secs2time_str`, src/sacct/print.c
`_elapsed_time`, src/common/slurm_protocol_api.c `convert_num_unit2`, src/common/slurmdb_defs.c
`slurmdb_make_tres_string_from_simple`; the same in 22.05 and 24.11):
- durations: `D-HH:MM:SS`, `HH:MM:SS`, and `MM:SS.mmm` (sacct's CPU times below an hour);
- sizes: a count with an optional 1024-based suffix, `12048K`, `2G`, `2.50G`. By default Slurm
  converts only while no precision is lost (CONVERT_NUM_UNIT_EXACT), so the text is exact;
- usage TRES (sstat/sacct `TRESUsageInTot`, `TRESUsageInMax`): `cpu=` a duration (whole
  seconds: Slurm divides its milliseconds), every other entry a size (`mem=`, `vmem=` and
  `fs/disk=` in bytes), `NONE` where Slurm has no figure.
"""

from __future__ import annotations

import re

from sing.errors import UserError

DURATION_RE = re.compile(
    r"(?:(?P<days>\d+)-)?(?:(?P<hours>\d{2}):)?(?P<minutes>\d{2}):(?P<seconds>\d{2}(?:\.\d{1,3})?)"
)
SIZE_RE = re.compile(r"(?P<count>\d+(?:\.\d+)?)(?P<suffix>[KMGTP]?)")
SUFFIXES = "KMGTP"
MIB = 1 << 20


def duration_s(text: str, where: str) -> float:
    """'1-02:03:04' -> 93784.0, '00:04.762' -> 4.762."""
    match = DURATION_RE.fullmatch(text)
    if not match or (match["days"] and not match["hours"]):
        raise UserError(f"{where}: {text!r} is not a Slurm duration ([D-]HH:MM:SS or MM:SS.mmm)")
    days, hours, minutes = (int(match[name] or 0) for name in ("days", "hours", "minutes"))
    return days * 86400 + hours * 3600 + minutes * 60 + float(match["seconds"])


def size_bytes(text: str, where: str) -> int:
    """'12048K' -> 12337152, '2.50G' -> 2684354560, '300' -> 300 (no suffix: the unit itself)."""
    match = SIZE_RE.fullmatch(text)
    if not match:
        raise UserError(f"{where}: {text!r} is not a Slurm size (a count, K, M, G, T or P)")
    power = SUFFIXES.index(match["suffix"]) + 1 if match["suffix"] else 0
    return round(float(match["count"]) * 1024**power)


def usage_tres(text: str, where: str) -> dict[str, float | int | None]:
    """'cpu=00:00:03,mem=231748K,fs/disk=3372774' -> {'cpu': 3.0, 'mem': 237309952, ...};
    a `NONE` entry is None."""
    out: dict[str, float | int | None] = {}
    for item in filter(None, text.split(",")):
        name, sep, value = item.partition("=")
        if not sep:
            raise UserError(f"{where}: TRES entry {item!r} is not NAME=VALUE")
        if value == "NONE":
            out[name] = None
        elif name == "cpu":
            out[name] = duration_s(value, f"{where}: {name}")
        else:
            out[name] = size_bytes(value, f"{where}: {name}")
    return out
