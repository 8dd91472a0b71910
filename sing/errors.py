"""Errors that the `sing` command prints as one clear line instead of a traceback."""


class UserError(Exception):
    """Bad input from a user or a source (file, command output); the message says what, where."""
