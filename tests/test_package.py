"""The package's shape: one folder by concern, modules of a readable size, light where it must be.

A newcomer holds the house in one listing (docs/development.md draws it): the
article's four modules, then one module per concern, and `notebook/`, the
only subfolder, for the notebook's driver. What must run before TensorFlow
loads (a script's first call, the TPU's runtime, the notebook's kernel)
imports nothing that loads it. A plain run's budget of modules is held by
tests/test_train_cpu.py, which counts what a real run loads. Two budgets
keep the rest in view: the imports made inside functions (each loads an
opt-in feature), and the module-level state the package changes as it runs.
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
    # below the scripts, the model is built by the scripts (and loop.py's and
    # jax_loop.py's loss) only; outputs.load_model registers its classes
    for path in PACKAGE.rglob("*.py"):
        if path.stem in ("outputs", "autoencoder", "loss", "loop", "jax_loop"):
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


def _functions_imports():
    """(module, line, function, what) of every import inside a function of the package."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        seen = set()
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and node.lineno not in seen:
                    seen.add(node.lineno)
                    found.append((str(path.relative_to(REPO)), node.lineno, function.name,
                                  ast.unparse(node)))
    return found


# each loads what a plain run must not (an opt-in module: cluster, workarounds,
# tfrecords; tensorflow_datasets' 0.6 s), or what only some machines have (IPython,
# google.colab, libtpu); the comment beside each says which
MAX_IMPORTS_IN_FUNCTIONS = 30


def test_imports_inside_functions_are_few():
    found = _functions_imports()
    assert len(found) <= MAX_IMPORTS_IN_FUNCTIONS, "\n".join(
        [f"{len(found)} imports inside functions, over {MAX_IMPORTS_IN_FUNCTIONS}:"]
        + [f"{path}:{line} {function}(): {what}" for path, line, function, what in found])


_MUTATORS = {"append", "extend", "insert", "remove", "pop", "popitem", "clear", "update",
             "setdefault", "add", "discard", "set", "sort", "reverse"}


def _module_level_states():
    """(module, name) of each module-level name the package rebinds (`global`) or mutates.

    A name counts if a function rebinds it through `global`, or if a function anywhere
    in the package calls a mutating method on it (`.append`, `.set`, `.clear`, ...) or
    stores into it (`name[k] = v`, `name.attr = v`, `del name[k]`). Constant tables
    (a dict of names, a compiled pattern) that no function changes do not count, nor
    what a module sets up once as it loads.
    """
    trees = {path: ast.parse(path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))}

    def named(node):  # `name`, or `module.name`: the name it ends with
        if isinstance(node, ast.Name):
            return node.id
        return node.attr if isinstance(node, ast.Attribute) else None

    changed = set()
    functions = [node for tree in trees.values() for node in ast.walk(tree)
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for function in functions:
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in _MUTATORS:
                changed.add(named(node.func.value))
            elif isinstance(node, (ast.Subscript, ast.Attribute)) \
                    and isinstance(node.ctx, (ast.Store, ast.Del)):
                changed.add(named(node.value))
            elif isinstance(node, ast.AugAssign):
                changed.add(named(node.target))
    states = []
    for path, tree in trees.items():
        rebound = {name for node in ast.walk(tree) if isinstance(node, ast.Global)
                   for name in node.names}
        names = {target.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                 for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                 if isinstance(target, ast.Name)}
        module = path.relative_to(REPO).with_suffix("").as_posix().replace("/", ".")
        states += [(module, name) for name in sorted(names & (rebound | changed))]
    return states


# plan._under_way (the run under way: config's values before it, its plan), exits._process
# (how the process ends: SIGTERM's events), runtime.this_process (what the process did that a
# later step of it must know: the TPU runtime prepared, the outputs put in place, the noise
# filter): each says beside it why it is state
MAX_MODULE_LEVEL_STATES = 3


def test_few_module_level_mutable_states():
    states = _module_level_states()
    assert len(states) <= MAX_MODULE_LEVEL_STATES, (
        f"{len(states)} module-level states, over {MAX_MODULE_LEVEL_STATES}: "
        + ", ".join(f"{module}.{name}" for module, name in states))


MAX_TEST_FILE_LINES = 600


def _private_names_taken(tree):
    """`from pyimagesearch... import _name` and `module._name(...)` on a package or tools module."""
    modules, taken = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pyimagesearch"):
            taken += [f"from {node.module} import {alias.name}" for alias in node.names
                      if alias.name.startswith("_")]
            modules |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules |= {(alias.asname or alias.name).split(".")[0] for alias in node.names
                        if (REPO / "tools" / f"{alias.name}.py").exists()}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name) and node.func.value.id in modules \
                and node.func.attr.startswith("_") and not node.func.attr.startswith("__"):
            taken.append(f"{node.func.value.id}.{node.func.attr}(...)")
    return taken


def test_tests_hold_to_their_rules():
    # each test file at most MAX_TEST_FILE_LINES lines, and tests call the package's
    # public functions: none imports or calls one of its private (_name) ones
    broken = []
    for path in sorted((REPO / "tests").glob("*.py")):
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MAX_TEST_FILE_LINES:
            broken.append(f"{path.name}: {lines} lines, over {MAX_TEST_FILE_LINES}")
        broken += [f"{path.name}: {taken}" for taken in _private_names_taken(ast.parse(text))]
    assert not broken, "\n".join(broken)
