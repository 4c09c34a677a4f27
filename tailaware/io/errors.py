"""The error every reader and config check raises on a user's input: one line that names it.

`InputError` is a `ValueError` whose message is one line of the form `SOURCE: field 'X': what was
expected` (`field_error`), SOURCE being the file or the config flag; `launch.py` prints it as
that line, without a traceback unless asked (`--verbose`). `MissingInput` is the same for a
file that is not there, and is also a `FileNotFoundError`.
"""

import os


class InputError(ValueError):
    """A file or a config flag is not what it should be; the message names it, in one line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class MissingInput(InputError, FileNotFoundError):
    """A file that should be there is not."""


def field_error(source: str | os.PathLike, field: str, expected: str) -> InputError:
    """Returns the `InputError` "SOURCE: field 'FIELD': EXPECTED"."""
    return InputError(f"{os.fspath(source)}: field '{field}': {expected}")


def require_file(path: str | os.PathLike, what: str) -> str:
    """Returns `path` as a string; raises `MissingInput` naming it and `what` it should be when
    there is no such file (a folder is not a file)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        there = "a folder" if os.path.isdir(path) else "no such file"
        raise MissingInput(f"{path}: {there}; expected {what}")
    return path
