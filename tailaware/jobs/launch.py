"""The one entry point, and the only module that defines flags: `tailaware --config=<job>
--workdir=DIR`, the same as `python -m tailaware` and, from a checkout, `python launch.py
--config=configs/<job>.py --workdir=DIR`.

`--config` is a config file, or the name of a config tailaware ships (`tailaware.configs`:
`predict`, `predict.py`, or `configs/predict.py` where no such file is in the working
directory), with the config's `:arg` after it. Every config names the module that runs it
(`config.job`); that module's `run(config, workdir)` does the work, so notebooks and tests call
the same code without flags.

A failure the input causes (a misspelt flag or config field, a value out of range, a file that
is not what it should be) ends in one line on stderr that names the flag or the file and what
was expected, and exit status 1; `--verbose` (or absl's `-v 1`) shows the traceback instead,
and the third-party log lines hidden by default (`jobs/quiet.py`).

`--help` says what tailaware does and lists its jobs and flags; with `--config=NAME` it lists
that config's fields with their defaults and meaning (`jobs/usage.py`); `--version` prints the
version. Each answers on stdout with exit status 0, before any config is parsed.
"""

import difflib
import importlib
import importlib.resources
import os
import re
import runpy
import sys
from typing import NoReturn

from absl import app, flags, logging
from ml_collections import config_flags

from tailaware.io import version
from tailaware.io.errors import InputError
from tailaware.jobs import compilation_cache, quiet


def config_path(value: str) -> str:
    """Returns the config file a `--config` value names, with its `:arg`.

    A file that exists is taken as given; otherwise `name`, `name.py` or `configs/name.py` is
    the config of that name in `tailaware.configs` (in a checkout, configs/ itself).

    Raises:
      InputError: no such file and no config of that name, naming the known configs.
    """
    file, colon, arg = value.partition(":")
    head, name = os.path.split(file)
    if os.path.isfile(file) or os.path.normpath(head) not in (".", "configs"):
        return value  # a file, or a path elsewhere that ml_collections reports as missing
    shipped = importlib.resources.files("tailaware.configs")
    known = sorted(p.name[:-3] for p in shipped.iterdir() if re.fullmatch(r"[a-z]\w*\.py", p.name))
    if name.removesuffix(".py") in known:
        return f"{shipped / name.removesuffix('.py')}.py{colon}{arg}"
    raise InputError(
        f"--config={value}: no such file, nor a config of that name; expected a config file or "
        f"one of {', '.join(known)}"
    )


def _config_args(argv: list[str]) -> list[tuple[int, str, str]]:
    """The `--config` values of `argv` as (index, what precedes the value there, value):
    `--config=X` is one argument, `--config X` two."""
    found = []
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in ("--config", "-config") and eq:
            found.append((i, f"{name}=", value))
        elif name in ("--config", "-config") and i + 1 < len(argv):
            found.append((i + 1, "", argv[i + 1]))
    return found


def _resolve_configs(argv: list[str]) -> list[str]:
    """`argv` with each `--config` value as `config_path` finds it."""
    argv = list(argv)
    for i, before, value in _config_args(argv):
        argv[i] = before + config_path(value)
    return argv


# The demo. ml_collections loads the default as the flag is defined, hence found here: outside
# a checkout, the config tailaware ships.
_DEFAULT_CONFIG = config_path("configs/default.py")
_CONFIG = config_flags.DEFINE_config_file(
    "config",
    _DEFAULT_CONFIG,
    "Job configuration: an ml_collections config file, or the name of a config tailaware ships "
    "(e.g. predict).",
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string("workdir", "workdir/default", "Where results are written.")
_VERBOSE = flags.DEFINE_bool(
    "verbose",
    False,
    "Show the traceback of a failure instead of its one-line message, and the log lines hidden "
    "by default (JAX's libtpu probe, matplotlib's font cache).",
)
# Answered before the flags are parsed (`_explain`); defined so that absl accepts and lists it.
_VERSION = flags.DEFINE_bool("version", False, "Print the version and exit.")
_HELP = ("--help", "-help", "-h", "-?", "--helpshort", "-helpshort")


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


def _fail(message: str) -> NoReturn:
    """Ends the process with `message` as one line on stderr and exit status 1."""
    sys.stderr.write(f"error: {' '.join(str(message).split())}\n")
    sys.exit(1)


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, `--config` found by `config_path`, a failure reported in one line
    (`_fail`)."""
    try:
        argv = _resolve_configs(argv)
        return flags.FLAGS(argv)
    except (flags.Error, AttributeError, KeyError, OSError, InputError) as e:
        if _traceback_wanted(argv):
            raise
        if isinstance(e, InputError):
            _fail(str(e))
        if isinstance(e, flags.Error):
            _fail(f"{e} (--helpfull lists the flags)")
        if isinstance(e, OSError):  # ml_collections: a config file that cannot be loaded
            _fail(f"--config={_config_file(argv)}: cannot load it ({e.__cause__ or e})")
        _fail(_unknown_field(argv, e))  # ml_collections: a config field that is not there


def _config_file(argv: list[str]) -> str:
    """The `--config` file of `argv` (with its `:arg`)."""
    given = [value for _, _, value in _config_args(argv)]
    return given[-1] if given else _DEFAULT_CONFIG


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


def _explain(argv: list[str]) -> None:
    """Answers `--version` and `--help` (with `--config`: that config's fields) on stdout and
    exits 0; returns when `argv` asks neither."""
    args = argv[1 : argv.index("--")] if "--" in argv else argv[1:]
    if any(a in ("--version", "-version") for a in args):
        print(f"tailaware {version.version()}")
        sys.exit(0)
    if not any(a in _HELP for a in args):
        return
    from tailaware.jobs import usage  # here: it imports the library, which a run imports later

    given = [value for _, _, value in _config_args(args)]
    if not given:
        held = (_CONFIG, _WORKDIR, _VERBOSE, _VERSION)
        rows = [(f"--{f.name}", flags.FLAGS[f.name].help) for f in held]
        rows[0] = (rows[0][0], rows[0][1] + " Default: the demo (default).")
        rows[1] = (rows[1][0], rows[1][1] + f" Default: {_WORKDIR.default}.")
        rows += [("--help", "This text."), ("--helpfull", "Every flag, absl's included.")]
        print(usage.main_help(rows))
        sys.exit(0)
    try:
        print(usage.config_help(config_path(given[-1]), given[-1]))
    except InputError as e:
        _fail(str(e))
    except Exception as e:  # the config file itself: missing, or failing to build
        if _traceback_wanted(argv):
            raise
        _fail(f"--config={given[-1]}: cannot load it ({e})")
    sys.exit(0)


def _main(argv: list[str]) -> None:
    """Runs the job `--config` names (absl's main, after the flags are parsed)."""
    if len(argv) > 1:
        _fail(f"unexpected arguments {argv[1:]}; flags look like --name=value")
    try:
        config = _CONFIG.value
        name = config.job  # ml_collections loads the config file on first use
    except OSError as e:
        if _traceback_wanted():
            raise
        _fail(f"--config={_config_file(sys.argv)}: cannot load it ({e.__cause__ or e})")
    # The first progress line, before the job's import (JAX and the library take seconds).
    logging.info("job %s, workdir %s: importing it", name, _WORKDIR.value)
    try:
        job = importlib.import_module(name)
    except ImportError as e:
        if _traceback_wanted():
            raise
        _fail(f"--config.job={name}: cannot import it ({e})")
    logging.info("compilation cache %s", compilation_cache.enable())
    try:
        job.run(config, _WORKDIR.value)
    except (ValueError, OSError, ImportError) as e:  # an input error names the file or flag
        if _traceback_wanted():
            raise
        _fail(str(e))


def main() -> None:
    """The `tailaware` command, `python -m tailaware` and `python launch.py`."""
    # absl's --help lists the flags of the program's main module; they are defined here.
    _explain(sys.argv)
    if not _traceback_wanted(sys.argv):
        quiet.hide_noise()
    for flag in (_CONFIG, _WORKDIR, _VERBOSE, _VERSION):
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[flag.name])
    app.run(_main, flags_parser=_parse_flags)
