"""Text that `int()` takes as a count: ASCII digits only.

`str.isdigit()` alone also takes "²" or "٣", which `int()` refuses or reads as another number;
every parser of outside text (Slurm output, job profiles, command-line ports) checks with this.
"""


def ascii_digits(text: str) -> bool:
    """True for a non-empty string of the digits 0-9 only."""
    return text.isascii() and text.isdigit()
