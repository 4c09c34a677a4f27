"""Which tailaware wrote a file: the version every JSON output records (`KEY`) and
`tailaware --version` prints."""

import importlib.metadata
import os
import tomllib

KEY = "tailaware_version"
# A checkout that is not installed has no package metadata; its pyproject.toml has the version.
_PYPROJECT = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "pyproject.toml")


def version() -> str:
    """Returns the installed package's version, else the checkout's pyproject.toml's, else
    "unknown"."""
    try:
        return importlib.metadata.version("tailaware")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        with open(_PYPROJECT, "rb") as f:
            return str(tomllib.load(f)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"
