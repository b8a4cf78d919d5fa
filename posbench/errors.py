"""The user-facing error type.

Every mistake a user can make on the command line or in a file (an unknown name, a bad option, a missing
directory, an unreadable checkpoint...) raises a subclass of ``UserError`` whose ``str()`` is one line.
The CLI catches ``UserError`` alone, prints that line and exits with code 2, so a new subsystem only has to
subclass it to get the same behaviour. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(ValueError):
    """Bad input from the user; ``str()`` is one line."""

    def __init__(self, message: object = ""):
        super().__init__(" ".join(str(message).split()))


class ConfigError(UserError):
    """A bad preset, key or value."""
