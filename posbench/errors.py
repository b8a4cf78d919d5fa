"""The user-facing error types.

Every mistake a user can make on the command line or in a file (an unknown name, a bad option, a missing
directory, an unreadable checkpoint...) raises a subclass of ``UserError`` whose ``str()`` is one line.
The CLI catches ``UserError`` alone, prints that line and exits with the error's ``exit_code``: 2 for bad
input, 1 for ``EnvironmentFault`` (the machine refused: a full disk, a permission, a process of the job that
stopped answering, a damaged cache). A new subsystem only has to subclass one of them to get the same
behaviour. ``os_error`` turns an ``OSError`` into the right one of the two. Anything else is a bug and keeps
its traceback.
"""

from __future__ import annotations

import errno
import os


class UserError(ValueError):
    """Bad input from the user; ``str()`` is one line."""

    exit_code = 2

    def __init__(self, message: object = ""):
        super().__init__(" ".join(str(message).split()))


class ConfigError(UserError):
    """A bad preset, key or value."""


class EnvironmentFault(UserError):
    """Not the user's input but the machine: disk full, no permission, a lost process; exit code 1."""

    exit_code = 1


#: errors of the machine (exit code 1); every other OSError is a bad path given by the user (exit code 2)
_ENVIRONMENT = {errno.ENOSPC: "no space left on the device (disk full)", errno.EDQUOT: "disk quota exceeded",
                errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
                errno.EROFS: "read-only file system", errno.EIO: "input/output error",
                errno.EMFILE: "too many open files", errno.ENFILE: "too many open files",
                errno.EFBIG: "file too large (a file size limit)"}


def os_error(exc: OSError, action: str = "") -> UserError:
    """``exc`` as one line (``cannot ACTION PATH: reason``): an ``EnvironmentFault`` for a full disk, a
    permission or an I/O error, else a ``UserError`` (a path that is a file, a name too long...)."""
    reason = _ENVIRONMENT.get(exc.errno) or exc.strerror or str(exc) or type(exc).__name__
    where = exc.filename if exc.filename is not None else ""
    if exc.errno == errno.EEXIST and where and os.path.exists(where) and not os.path.isdir(where):
        reason = "it is a file, not a directory"          # mkdir where a file is
    text = " ".join(part for part in (f"cannot {action}" if action else "cannot use", str(where)) if part)
    kind = EnvironmentFault if exc.errno in _ENVIRONMENT else UserError
    error = kind(f"{text}: {reason}")
    error.reason = reason                   # for a caller that names the whole it was writing
    return error
