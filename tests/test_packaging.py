"""What gets installed: the package list, `tailaware.configs`, and the wheel's files."""

import importlib.util
import pathlib
import shutil
import subprocess
import sys
import tomllib
import zipfile

import pytest

import tailaware.configs

ROOT = pathlib.Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
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


def test_wheel_ships_configs_inside_tailaware_with_its_licence(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        info = next(n for n in names if n.endswith(".dist-info/METADATA")).rsplit("/", 1)[0]
        metadata = z.read(f"{info}/METADATA").decode()
        top_level = z.read(f"{info}/top_level.txt").decode().split()
        licence = z.read(f"{info}/licenses/LICENSE")
    assert top_level == ["tailaware"]
    assert not [n for n in names if not n.startswith(("tailaware/", f"{info}/"))], names
    assert sorted(n for n in names if n.startswith("tailaware/configs/")) == [
        f"tailaware/configs/{name}.py" for name in sorted([*CONFIGS, "__init__"])
    ]
    assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata
    assert licence == (ROOT / "LICENSE").read_bytes()
