"""The notebooks: each `.ipynb` is in sync with its jupytext `.py`, and each executes with plots.

Execution uses nbclient with the `python3` kernel, which ipykernel resolves to the interpreter
running the tests (the project's venv), from the repository root as the notebooks expect. The
kernels share a persistent JAX compilation cache for the session: notebooks 2-4 use the same
benchmark shapes, so the tail fits compile once rather than once per notebook.
"""

import os
import pathlib
import time

import jupytext
import nbclient
import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
TIMEOUT_S = 300  # per cell; the four notebooks take about a minute in all on 2 cores

# Kernel-side warnings go to the notebook's stderr, not to pytest; these are harmless there.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def cells(nb):
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


def test_there_are_notebooks():
    assert [p.stem[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04"]


@pytest.mark.parametrize("py", NOTEBOOKS, ids=lambda p: p.stem)
def test_pair_is_in_sync_and_stripped(py):
    ipynb = py.with_suffix(".ipynb")
    assert ipynb.exists(), f"{ipynb.name} missing: run `jupytext --to ipynb {py.name}`"
    paired = nbformat.read(ipynb, as_version=4)
    want = cells(jupytext.read(py))
    assert cells(paired) == want, f"{ipynb.name} differs from {py.name}: rerun jupytext --to ipynb"
    for cell in paired.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, "commit notebooks stripped"


@pytest.fixture(scope="module")
def compilation_cache(tmp_path_factory):
    """Points every kernel started in this module at one JAX compilation cache."""
    env = {
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path_factory.mktemp("jax_cache")),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.5",
    }
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name)
        else:
            os.environ[name] = value


@pytest.mark.slow
@pytest.mark.parametrize("py", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes_and_plots(py, compilation_cache):
    nb = nbformat.read(py.with_suffix(".ipynb"), as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(ROOT)}},
    )
    start = time.time()
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    print(f"{py.stem}: {time.time() - start:.1f} s")
    shows = sum(c.source.count("plt.show()") for c in nb.cells if c.cell_type == "code")
    images = sum(
        "image/png" in out.get("data", {})
        for c in nb.cells
        if c.cell_type == "code"
        for out in c.outputs
    )
    assert images >= shows, f"{py.name}: {images} images rendered for {shows} plt.show() calls"
