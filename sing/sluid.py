"""Slurm 26.05's SLUID ("Slurm Lexicographically-sortable Unique ID"), one per run of a job.

Text form, from Slurm's src/common/sluid.c `print_sluid`: "s" and 13 characters of Crockford's
base32 alphabet (digits and capitals without I, L, O, U), 14 in all, e.g. "s0G2J8K4P1XY05".
Slurm's `str2sluid` also takes a capital "S" and lower case; sing stores the printed form.
Shared by the executors (JSON fields) and the exporter (cgroup directory names), so both agree.
"""

from __future__ import annotations

import re

# Crockford base32 digits as Slurm's cb32map has them: "0123456789ABCDEFGHJKMNPQRSTVWXYZ".
SLUID_TEXT = r"[sS][0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{13}"
_WHOLE = re.compile(SLUID_TEXT)


def normal_sluid(text: str) -> str | None:
    """The printed form of a SLUID ('s' + 13 capitals), or None when `text` is not one."""
    if not _WHOLE.fullmatch(text):
        return None
    return "s" + text[1:].upper()
