"""What the command says about itself: `--help` (what tailaware does, its jobs, its flags) and
`--config=NAME --help` (that config's fields, their defaults and what each means).

Each piece comes from where the thing is defined, so the text cannot drift from the code: a
job's line is the first line of its config's docstring; a field's meaning is the comment beside
it in the config file (or the comment lines just above it), and for a settings block
(`--config.evt.*`, `jobs/config.SETTINGS_BLOCKS`) its entry under "Attributes:" in the settings
class's docstring.
"""

import ast
import importlib.resources
import io
import os
import re
import runpy
import textwrap
import tokenize

from ml_collections import config_dict

import tailaware
from tailaware.io import version
from tailaware.jobs import config as config_lib

WIDTH = 100
# The jobs in the order a new user meets them; other shipped configs follow by name.
ORDER = ("demo", "predict", "ilias", "compare", "validate", "embed")


def _shipped() -> dict[str, str]:
    """{config name: its file} of the configs tailaware ships."""
    folder = importlib.resources.files("tailaware.configs")
    return {p.name[:-3]: str(p) for p in folder.iterdir() if re.fullmatch(r"[a-z]\w*\.py", p.name)}


def _job_of(tree: ast.Module) -> str:
    """The job a config file's `c.job = "..."` names (its module's last part), or ""."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Attribute)
            and node.targets[0].attr == "job"
            and isinstance(node.value, ast.Constant)
        ):
            return str(node.value.value).rsplit(".", 1)[-1]
    return ""


def jobs() -> list[tuple[str, str, str]]:
    """Returns (job, config name, what it does) for every shipped config, in `ORDER`."""
    rows = []
    for name, path in _shipped().items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        doc = (ast.get_docstring(tree) or "").strip().split("\n\n")[0]
        rows.append((_job_of(tree) or name, name, " ".join(doc.split())))
    rank = lambda row: (ORDER.index(row[0]) if row[0] in ORDER else len(ORDER), row[0])
    return sorted(rows, key=rank)


def _wrap(text: str, indent: int, first: str = "") -> list[str]:
    """`first` followed by `text`, wrapped to `WIDTH`, later lines indented by `indent`."""
    pad = " " * indent
    return textwrap.wrap(
        text, WIDTH, initial_indent=first.ljust(indent), subsequent_indent=pad
    ) or [first]


def main_help(flag_rows: list[tuple[str, str]]) -> str:
    """Returns `tailaware --help`: what the tool does, its jobs, `flag_rows` ((flag, help))."""
    summary = (tailaware.__doc__ or "").strip().splitlines()[0].split(": ", 1)[-1]
    rows = jobs()
    width = max(len(job) for job, _, _ in rows) + 2
    lines = [
        f"tailaware {version.version()}: {summary}",
        "Each job reads its inputs, checks them first, and writes its results to --workdir.",
        "",
        "usage: tailaware --config=NAME [--config.FIELD=VALUE ...] --workdir=DIR",
        "       (the same: python -m tailaware ..., and in a checkout python launch.py ...)",
        "       tailaware --config=NAME --help   that config's fields, defaults and meaning",
        "",
        "jobs (--config=NAME; without --config, the demo):",
    ]
    for job, name, doc in rows:
        lines += _wrap(doc, 4 + width + 10, f"  {job:<{width}}{name:<10}")
    lines += ["", "flags:"]
    width = max(len(flag) for flag, _ in flag_rows) + 4
    for flag, text in flag_rows:
        lines += _wrap(text, width, f"  {flag}")
    lines += ["", "docs: README.md; docs/outputs.md lists every output file and field."]
    return "\n".join(lines)


def _comments(source: str) -> tuple[dict[int, str], set[int]]:
    """A source's comments by line ({line: text}) and the lines that hold only a comment."""
    comments, alone = {}, set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            line = tok.start[0]
            comments[line] = tok.string.lstrip("#").strip()
            if not tok.line[: tok.start[1]].strip():
                alone.add(line)
    return comments, alone


def _dotted(target: ast.expr) -> str:
    """`c.a.b` -> "a.b" (the assigned field), or "" for any other target."""
    parts = []
    while isinstance(target, ast.Attribute):
        parts.append(target.attr)
        target = target.value
    return ".".join(reversed(parts)) if isinstance(target, ast.Name) and parts else ""


def field_comments(path: str) -> dict[str, str]:
    """Returns {dotted field: its comment} of a config file and of the shipped configs it
    builds on (`from tailaware.configs import default`), the file's own last.

    A field's comment is the one on its line, else the comment lines just above it.
    """
    with open(path, encoding="utf-8") as f:
        source = f.read()
    tree = ast.parse(source)
    out = {}
    shipped = {name: os.path.realpath(p) for name, p in _shipped().items()}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "tailaware.configs":
            for alias in node.names:
                base = shipped.get(alias.name)
                if base and base != os.path.realpath(path):
                    out.update(field_comments(base))
    comments, alone = _comments(source)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign) or not (name := _dotted(node.targets[0])):
            continue
        end = node.end_lineno or node.lineno  # always set by `ast.parse`
        text = comments.get(end, "") if end not in alone else ""
        above: list[str] = []
        line = node.lineno - 1
        while not text and line in alone:
            above.insert(0, comments[line])
            line -= 1
        text = text or " ".join(above)
        if text:
            out[name] = text
    return out


def attribute_docs(cls) -> dict[str, str]:
    """Returns {attribute: its text} under "Attributes:" in a class's Google-style docstring."""
    doc = (cls.__doc__ or "").split("Attributes:", 1)
    if len(doc) < 2:
        return {}
    lines = doc[1].splitlines()
    indent = next((len(x) - len(x.lstrip()) for x in lines if x.strip()), 0)
    out, name = {}, None
    for line in lines:
        lead = len(line) - len(line.lstrip())
        match = re.match(r"(\w+): (.*)$", line.strip())
        if not line.strip():
            if name:  # a blank line ends the list
                break
        elif lead == indent and match:
            name, text = match.groups()
            out[name] = text
        elif lead > indent and name:
            out[name] += " " + line.strip()
        else:
            break
    return out


def _leaves(config, prefix: str = ""):
    """(dotted name, value) of every field of a config, blocks flattened, in order."""
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, config_dict.ConfigDict):
            yield from _leaves(value, f"{name}.")
        else:
            yield name, value


def config_help(value: str, given: str) -> str:
    """Returns `--config=GIVEN --help`: the fields of the config file `value` (`path[:arg]`, as
    `launch.config_path` finds `given`), each with its default and meaning.

    Raises:
      OSError: the file cannot be read.
      Exception: whatever the config's `get_config` raises.
    """
    path, _, arg = value.partition(":")
    config = runpy.run_path(path)["get_config"](arg or None)
    meaning = field_comments(path)
    for block, cls in config_lib.SETTINGS_BLOCKS.items():
        meaning.update({f"{block}.{k}": v for k, v in attribute_docs(cls).items()})
    lines = [
        f"--config={given}: {path}",
        "Its fields and defaults; set one with --config.FIELD=VALUE.",
    ]
    for name, default in _leaves(config):
        lines.append(f"  {name} = {default!r}")
        if meaning.get(name):
            lines += _wrap(meaning[name], 6, "")
    return "\n".join(lines)
