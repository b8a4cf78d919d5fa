"""The one exception type of the data layer."""


class DataError(ValueError):
    """A user-facing data problem (missing file, offline hub name, bad schema).

    ``str()`` is one line that says what to pass instead; the CLI prints it and exits with code 2.
    """

    def __init__(self, message: str):
        message = " ".join(str(message).split())   # always one line
        super().__init__(message)
