"""Errors that the `sing` command prints as one clear line instead of a traceback."""


class UserError(Exception):
    """Bad input from a user or a source (file, command output); the message says what, where."""


class UsageError(UserError):
    """Options that contradict each other (a window that ends before it starts): the command
    exits 2, as argparse does for any other bad option."""
