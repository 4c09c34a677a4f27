"""What gets installed: the package list, `tailaware.configs`, the `tailaware` command (and
`--config` by name), and the wheel's files."""

import importlib.metadata
import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import tomllib
import warnings
import zipfile

import pytest

import tailaware.configs
from tailaware.io.errors import InputError

ROOT = pathlib.Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
ILIAS_TAXONOMY = ("ilias_taxonomy.json", "ilias_taxonomy.LICENSE")
CONFIGS = sorted(p.stem for p in (ROOT / "configs").glob("*.py") if p.stem != "__init__")


def test_every_package_is_listed_and_configs_is_mapped():
    setuptools = PYPROJECT["tool"]["setuptools"]
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "tailaware").rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    assert set(setuptools["packages"]) == found | {"tailaware.configs"}
    assert setuptools["package-dir"] == {"tailaware.configs": "configs"}


def test_configs_import_from_the_repository_folder():
    # The editable install maps `tailaware.configs` onto configs/ (pip install -e . again after
    # pulling this change: an older install knows only a top-level `configs`).
    (folder,) = tailaware.configs.__path__
    assert pathlib.Path(folder).samefile(ROOT / "configs")
    assert CONFIGS == ["compare", "default", "embed", "ilias", "predict", "validate"]
    for name in CONFIGS:
        config = importlib.import_module(f"tailaware.configs.{name}").get_config()
        assert importlib.util.find_spec(config.job), f"configs/{name}.py: job {config.job}"


@pytest.fixture(scope="module")
def launch():
    """The launcher module; importing it defines its flags and loads the default config, which
    ml_collections does with the deprecated `load_module()`."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "the load_module", DeprecationWarning)
        return importlib.import_module("tailaware.jobs.launch")


def test_config_names_are_the_shipped_files_and_a_file_there_comes_first(
    launch, tmp_path, monkeypatch
):
    for name in CONFIGS:
        assert launch.config_path(f"configs/{name}.py") == f"configs/{name}.py"  # in a checkout
    monkeypatch.chdir(tmp_path)  # where a user of the wheel runs it: no configs/ here
    for name in CONFIGS:
        for value in (name, f"{name}.py", f"configs/{name}.py", f"./configs/{name}.py"):
            assert pathlib.Path(launch.config_path(value)).samefile(ROOT / "configs" / f"{name}.py")
    assert launch.config_path("embed:mu").endswith(f"configs{os.sep}embed.py:mu")
    (tmp_path / "predict.py").write_text("")
    assert launch.config_path("predict.py") == "predict.py"  # a file that exists, as given
    assert launch.config_path("elsewhere/predict.py") == "elsewhere/predict.py"  # reported later
    known = "one of compare, default, embed, ilias, predict, validate"
    for value in ("nope", "configs/nope.py", "__init__", "configs"):
        with pytest.raises(InputError, match=f"^--config={value}: no such file.*{known}$"):
            launch.config_path(value)


def test_command_is_launch_py_and_python_m_tailaware(launch, tmp_path):
    (script,) = importlib.metadata.entry_points(group="console_scripts", name="tailaware")
    assert script.load() is launch.main
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    runs = {  # all at once: most of each run is starting Python and JAX
        "launch.py": ([sys.executable, "launch.py", "--help"], ROOT),
        "-m": ([sys.executable, "-m", "tailaware", "--help"], tmp_path),
        "nope": ([sys.executable, "-m", "tailaware", "--config=nope"], tmp_path),
    }
    pipe = subprocess.PIPE
    procs = {
        name: subprocess.Popen(cmd, cwd=cwd, env=env, stdout=pipe, stderr=pipe, text=True)
        for name, (cmd, cwd) in runs.items()
    }
    out = {name: p.communicate(timeout=120) for name, p in procs.items()}
    for name in ("launch.py", "-m"):  # the jobs and flags (tests/test_launch.py: the text)
        stdout = out[name][0]
        assert procs[name].returncode == 0
        assert all(flag in stdout for flag in ("--config ", "--workdir ", "--verbose ")), stdout
    assert out["launch.py"][0] == out["-m"][0]
    assert procs["nope"].returncode == 1 and out["nope"][1].splitlines() == [
        "error: --config=nope: no such file, nor a config of that name; expected a config file "
        "or one of compare, default, embed, ilias, predict, validate"
    ]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """Builds the wheel from a copy of the sources (no stale build/ folder), offline."""
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} cannot build the licence fields (77+)")
    tmp = tmp_path_factory.mktemp("wheel")
    src, dist = tmp / "src", tmp / "dist"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    for name in ("tailaware", "configs"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    build = (
        "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", build, str(dist)],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return dist / out.stdout.split()[-1]


def test_wheel_ships_configs_inside_tailaware_its_licence_and_command(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        info = next(n for n in names if n.endswith(".dist-info/METADATA")).rsplit("/", 1)[0]
        metadata = z.read(f"{info}/METADATA").decode()
        top_level = z.read(f"{info}/top_level.txt").decode().split()
        licence = z.read(f"{info}/licenses/LICENSE")
        scripts = z.read(f"{info}/entry_points.txt").decode()
        shipped = {
            n: z.read(f"tailaware/io/{n}") for n in ILIAS_TAXONOMY if f"tailaware/io/{n}" in names
        }
    assert top_level == ["tailaware"]
    assert "[console_scripts]\ntailaware = tailaware.jobs.launch:main" in scripts
    assert not [n for n in names if not n.startswith(("tailaware/", f"{info}/"))], names
    assert sorted(n for n in names if n.startswith("tailaware/configs/")) == [
        f"tailaware/configs/{name}.py" for name in sorted([*CONFIGS, "__init__"])
    ]
    assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata
    assert licence == (ROOT / "LICENSE").read_bytes()
    # ILIAS's taxonomy, the ILIAS report's default, with its MIT licence beside it.
    assert shipped == {n: (ROOT / "tailaware" / "io" / n).read_bytes() for n in ILIAS_TAXONOMY}


# The `embed` extra: the Flax backbones and what flax brings, which the base install leaves out.
EMBED_ONLY = ("flax", "chex", "optax", "orbax-checkpoint", "tensorstore", "rich", "treescope")
BASE_JOBS = ("predict", "ilias", "compare", "validate", "demo", "launch")


def _name(requirement: str) -> str:
    """The distribution name of a PEP 508 requirement, normalised."""
    name = requirement.split(";")[0].split("[")[0]
    for sep in "<>=!~ ":
        name = name.split(sep)[0]
    return name.strip().lower().replace("_", "-")


def test_base_install_leaves_flax_to_the_embed_extra():
    project = PYPROJECT["project"]
    base = {_name(r) for r in project["dependencies"]}
    assert not base & set(EMBED_ONLY), base & set(EMBED_ONLY)
    assert {_name(r) for r in project["optional-dependencies"]["embed"]} == {"flax", "chex"}
    # The lock of the base install pins none of them either (nor any other extra's package).
    pinned = {
        _name(line)
        for line in (ROOT / "requirements.lock").read_text().splitlines()
        if "==" in line
    }
    assert not pinned & {*EMBED_ONLY, "torch", "faiss-cpu", "tokenizers", "pytest"}, pinned


def test_base_jobs_import_no_flax():
    # Each job in a fresh interpreter, as `tailaware --config=JOB` imports it.
    code = (
        "import importlib, sys; importlib.import_module(sys.argv[1]); "
        "print(' '.join(m for m in ('flax', 'chex', 'optax', 'orbax', 'tensorstore', 'rich', "
        "'treescope', 'tailaware.models', 'tailaware.embed') if m in sys.modules))"
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    modules = ["tailaware", *(f"tailaware.jobs.{job}" for job in BASE_JOBS)]
    procs = {
        m: subprocess.Popen(
            [sys.executable, "-c", code, m], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
        )
        for m in modules
    }
    loaded = {m: p.communicate(timeout=120)[0].strip() for m, p in procs.items()}
    assert all(p.returncode == 0 for p in procs.values()), loaded
    assert loaded == {m: "" for m in modules}


def test_embed_job_without_flax_says_which_extra(tmp_path):
    # flax absent (None in sys.modules: its import fails as if not installed).
    code = (
        "import sys; sys.modules['flax'] = None; from tailaware.jobs import launch; "
        "sys.argv = ['tailaware', '--config=embed', f'--workdir={sys.argv[1]}']; launch.main()"
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1
    # One error line, after the launcher's progress line (logged before the job's import).
    *logged, last = out.stderr.splitlines()
    assert last == (
        "error: --config.job=tailaware.jobs.embed: cannot import it (the embed job needs flax, "
        'in the embed extra: pip install "tailaware[embed]")'
    )
    assert len(logged) == 1 and "job tailaware.jobs.embed" in logged[0], logged
