"""The package's shape: one folder by concern, modules of a readable size, light where it must be.

A newcomer holds the house in one listing (docs/development.md draws it): the
article's four modules, then one module per concern, and `notebook/`, the
only subfolder, for the notebook's driver. What must run before TensorFlow
loads (a script's first call, the TPU's runtime, the notebook's kernel)
imports nothing that loads it. A plain run's budget of modules is held by
tests/test_train_cpu.py, which counts what a real run loads.
"""
import ast
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / "pyimagesearch"
ARTICLE_MODULES = {"config", "data", "autoencoder", "loss"}
SMALL_ALLOWED = ARTICLE_MODULES | {"errors", "__init__"}  # the article's, and one for errors
MIN_LINES, MAX_LINES = 60, 500
MAX_FUNCTION_LINES = 60  # a def's first to last line, docstring included
# imported before TensorFlow may load: by every script's first call
# (runtime), train_tpu.py's (tpu_runtime), and the notebook's kernel
TENSORFLOW_FREE = ["pyimagesearch", "pyimagesearch.config", "pyimagesearch.errors",
                   "pyimagesearch.terminal", "pyimagesearch.runtime",
                   "pyimagesearch.tpu_runtime", "pyimagesearch.notebook",
                   "pyimagesearch.notebook.install", "pyimagesearch.notebook.listings",
                   "pyimagesearch.notebook.records"]
THE_MODEL = ("pyimagesearch.autoencoder", "pyimagesearch.loss")


def _path(module):
    """The file of a dotted pyimagesearch module name."""
    relative = pathlib.Path(*module.split("."))
    package = REPO / relative / "__init__.py"
    return package if package.is_file() else REPO / relative.with_suffix(".py")


def _imports(path, top_level_only=False):
    """The modules `path` imports (dotted names; `from pyimagesearch import x` gives both)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            if node.module.startswith("pyimagesearch"):
                found.update(f"{node.module}.{alias.name}" for alias in node.names
                             if _path(f"{node.module}.{alias.name}").is_file())
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_package_is_one_folder_with_the_notebooks_driver_beside_it():
    folders = sorted(path.name for path in PACKAGE.iterdir()
                     if path.is_dir() and path.name != "__pycache__")
    assert folders == ["notebook"]
    assert list((PACKAGE / "notebook").glob("*/*.py")) == []


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda path: path.name)
def test_each_module_is_of_a_size_that_shows_one_job(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(REPO)}: {lines} lines, over {MAX_LINES}"
    if path.stem not in SMALL_ALLOWED:
        assert lines >= MIN_LINES, f"{path.relative_to(REPO)}: {lines} lines, a module of its own?"


def test_each_module_says_what_it_holds():
    for path in PACKAGE.rglob("*.py"):
        said = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert said.strip(), f"{path.relative_to(REPO)} has no docstring"


@pytest.mark.parametrize("module", TENSORFLOW_FREE)
def test_what_runs_before_tensorflow_imports_nothing_that_loads_it(module):
    # followed through the package's own top-level imports
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for imported in _imports(_path(name), top_level_only=True):
            assert imported.split(".")[0] not in ("tensorflow", "keras", "jax"), \
                f"{module} loads {imported} (through {name})"
            if imported.startswith("pyimagesearch") and _path(imported).is_file():
                todo.append(imported)


def test_only_the_model_loader_imports_the_model():
    # below the scripts, the model is built by the scripts (and loop.py's
    # loss) only; outputs.load_model registers its classes
    for path in PACKAGE.rglob("*.py"):
        if path.stem in ("outputs", "autoencoder", "loss", "loop"):
            continue
        assert not any(name.startswith(THE_MODEL) for name in _imports(path)), path


def test_get_data_opens_data_py():
    source = (PACKAGE / "data.py").read_text()
    first = next(node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef))
    assert first.name == "get_data"


def test_no_function_is_over_60_lines():
    # the package, compare.py and the tools; the training scripts' main, which
    # follows the article's listing step by step, is the one exception
    paths = [*sorted(PACKAGE.rglob("*.py")), REPO / "compare.py",
             *sorted((REPO / "tools").glob("*.py")), *sorted(REPO.glob("train_*.py"))]
    offenders = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if path.name.startswith("train_") and node.name == "main":
                continue
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines})")
    assert not offenders, f"over {MAX_FUNCTION_LINES} lines: " + ", ".join(offenders)
