"""The one entry point: `python launch.py --config=configs/<job>.py --workdir=DIR`.

Every config names the module that runs it (`config.job`); that module's `run(config, workdir)`
does the work, so notebooks and tests call the same code without flags.

A failure the input causes (a misspelt flag or config field, a value out of range, a file that
is not what it should be) ends in one line on stderr that names the flag or the file and what
was expected, and exit status 1; `--verbose` (or absl's `-v 1`) shows the traceback instead.
"""

import difflib
import importlib
import re
import runpy
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from tailaware.jobs import compilation_cache

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    "configs/default.py",
    "Job configuration (an ml_collections config file).",
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string("workdir", "workdir/default", "Where results are written.")
_VERBOSE = flags.DEFINE_bool(
    "verbose", False, "Show the traceback of a failure instead of its one-line message."
)


def _traceback_wanted(argv=None) -> bool:
    """--verbose, or absl's debug verbosity (-v 1 or more); from `argv` before the flags are
    parsed."""
    if argv is None:
        return _VERBOSE.value or flags.FLAGS.verbosity >= 1
    verbosity = 0
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in ("-v", "--v", "-verbosity", "--verbosity"):
            value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "0")
            verbosity = int(value) if value.lstrip("-").isdigit() else verbosity
        if name in ("--verbose", "-verbose") and value.lower() in ("", "true", "1"):
            return True
    return verbosity >= 1


def _fail(message: str) -> None:
    """Ends the process with `message` as one line on stderr and exit status 1."""
    sys.stderr.write(f"error: {' '.join(str(message).split())}\n")
    sys.exit(1)


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, a failure reported in one line (`_fail`)."""
    try:
        return flags.FLAGS(argv)
    except (flags.Error, AttributeError, KeyError, OSError) as e:
        if _traceback_wanted(argv):
            raise
        if isinstance(e, flags.Error):
            _fail(f"{e} (--helpfull lists the flags)")
        if isinstance(e, OSError):  # ml_collections: a config file that cannot be loaded
            _fail(f"--config={_config_file(argv)}: cannot load it ({e.__cause__ or e})")
        _fail(_unknown_field(argv, e))  # ml_collections: a config field that is not there


def _config_file(argv: list[str]) -> str:
    """The `--config` file of `argv` (with its `:arg`)."""
    given = [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
    return given[-1] if given else _CONFIG.default


def _unknown_field(argv: list[str], error: Exception) -> str:
    """The message for a `--config.a.b=...` whose field does not exist, with the fields there."""
    words = re.findall(r"\w+", str(error))
    for arg in argv:
        path = arg.split("=", 1)[0].removeprefix("--config.").split(".")
        name = next((w for w in words if w in path), None)
        if arg.startswith("--config.") and name:
            break
    else:
        return f"a --config.* flag names a field the config does not have ({error})"
    file, _, config_arg = _config_file(argv).partition(":")
    try:  # the config file again, for the fields beside the misspelt one
        parent = runpy.run_path(file)["get_config"](config_arg or None)
        for part in path[: path.index(name)]:
            parent = parent[part]
        fields = sorted(parent.keys())
    except Exception:  # only the hint is lost
        fields = []
    close = difflib.get_close_matches(name, fields, n=1)
    hint = (f"did you mean '{close[0]}'? " if close else "") + (
        f"expected one of {', '.join(fields)}" if fields else f"see {file}"
    )
    block = ".".join(path[: path.index(name)])
    return (
        f"{arg}: no field '{name}' in {file}" + (f" (block {block})" if block else "") + f"; {hint}"
    )


def main(argv):
    if len(argv) > 1:
        _fail(f"unexpected arguments {argv[1:]}; flags look like --name=value")
    try:
        config = _CONFIG.value
        name = config.job  # ml_collections loads the config file on first use
    except OSError as e:
        if _traceback_wanted():
            raise
        _fail(f"--config={_config_file(sys.argv)}: cannot load it ({e.__cause__ or e})")
    try:
        job = importlib.import_module(name)
    except ImportError as e:
        if _traceback_wanted():
            raise
        _fail(f"--config.job={name}: cannot import it ({e})")
    cache = compilation_cache.enable()
    logging.info("job %s, workdir %s, compilation cache %s", name, _WORKDIR.value, cache)
    try:
        job.run(config, _WORKDIR.value)
    except (ValueError, OSError, ImportError) as e:  # an input error names the file or flag
        if _traceback_wanted():
            raise
        _fail(str(e))


if __name__ == "__main__":
    app.run(main, flags_parser=_parse_flags)
