"""The one exception type of the data layer."""

from posbench.errors import UserError


class DataError(UserError):
    """A user-facing data problem (missing file, offline hub name, bad schema).

    ``str()`` is one line that says what to pass instead; the CLI prints it and exits with code 2.
    """
