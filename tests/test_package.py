"""The code's shape: half the size, nothing reaching behind the scripts, every name real.

What issue 50 asked, measured as its note measured it: the package's lines and
its modules' sizes, all the Python outside tests/, an AST scan for writes to
library objects, `sys` and `config`, module-level run state, `os._exit` and
programs in strings; and what runs before TensorFlow loads importing nothing
that loads it. A plain run's lines: tests/test_train_cpu.py.
"""
import ast
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / "pyimagesearch"
MODULES = sorted(PACKAGE.glob("*.py"))
OUTSIDE_TESTS = sorted([*REPO.glob("*.py"), *(REPO / "tools").glob("*.py"), *MODULES])
MAX_PACKAGE_LINES, MAX_MODULE_LINES, MAX_LINE = 4_200, 400, 100
MAX_OUTSIDE_TESTS = 7_825  # the package's 4,200 and the scripts', compare.py's and tools' 3,625
# imported before TensorFlow may load: the scripts' first calls and the notebook's kernel
TENSORFLOW_FREE = ["pyimagesearch", "pyimagesearch.config", "pyimagesearch.errors",
                   "pyimagesearch.host", "pyimagesearch.tpu", "pyimagesearch.notebook"]
# the attributes the package sets on objects not its own, each with its reason; a new one
# fails here until it is read and named (Keras' own way to end fit is the one library's)
SET_ATTRIBUTES = {"model.stop_training": "Keras' documented way to stop fit",
                  "options.autotune.enabled": "tf.data.Options: set by attribute, TF's way",
                  "options.experimental_distribute.auto_shard_policy": "tf.data.Options too"}


def _lines(path):
    return len(path.read_text().splitlines())


def test_the_package_is_at_most_4200_lines_in_modules_of_at_most_400():
    sizes = {path.name: _lines(path) for path in MODULES}
    assert sum(sizes.values()) <= MAX_PACKAGE_LINES, sizes
    assert max(sizes.values()) <= MAX_MODULE_LINES, sizes
    assert not [path for path in PACKAGE.iterdir() if path.is_dir()
                and path.name != "__pycache__"], "one folder: the package has no subfolders"


def test_all_the_python_outside_the_tests_is_at_most_7825_lines_of_100_characters():
    assert sum(map(_lines, OUTSIDE_TESTS)) <= MAX_OUTSIDE_TESTS
    long = [f"{path.relative_to(REPO)}:{number}" for path in OUTSIDE_TESTS
            for number, line in enumerate(path.read_text().splitlines(), 1)
            if len(line) > MAX_LINE]
    assert long == []


def test_each_module_says_what_it_is_for():
    for path in MODULES:
        said = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert said.strip(), f"{path.name} has no docstring"


def _assigned_attributes(tree):
    """(line, "target.attribute") of every attribute assigned or setattr'd in `tree`."""
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("setattr",
                                                                              "delattr"):
            yield node.lineno, f"{ast.unparse(node.args[0])}.<setattr>"
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, ast.Attribute) and isinstance(part.ctx, ast.Store):
                    yield node.lineno, ast.unparse(part)


def _own_objects(tree):
    """The names a module binds to objects of its own classes, or to its own callables."""
    own = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    return own


@pytest.mark.parametrize("path", [*MODULES, *REPO.glob("train_*.py")], ids=lambda p: p.name)
def test_nothing_is_set_on_a_librarys_objects_on_sys_or_on_config(path):
    """self.x of the package's own classes is its own; so are the handler objects it makes
    (exits.Interrupts: `interrupts.ended`); anything else must be in SET_ATTRIBUTES."""
    tree = ast.parse(path.read_text())
    ours = ("self.", "interrupts.", "handler.", "plan.interrupts.")
    found = [(line, target) for line, target in _assigned_attributes(tree)
             if not target.startswith(ours) and target not in SET_ATTRIBUTES]
    assert found == [], f"{path.name} sets attributes of objects not its own: {found}"
    text = path.read_text()
    assert not re.search(r"\bsys\.(stdout|stderr|stdin|meta_path|unraisablehook|excepthook|"
                         r"path_hooks)\s*=", text)
    assert not re.search(r"\bconfig\.[A-Z_]+\s*=", text)


def test_no_module_level_object_carries_a_runs_state():
    # module-level names hold constants: literals, tuples, compiled patterns, functions'
    # results that never change; no instance made at import for the run to fill in
    allowed_calls = {"re.compile", "os.path.join", "frozenset", "tuple", "len", "hasattr",
                     "os.sched_getaffinity"}
    for path in MODULES:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                for call in [n for n in ast.walk(node.value) if isinstance(n, ast.Call)]:
                    name = ast.unparse(call.func)
                    assert name in allowed_calls or name.startswith(("tf.io.", "tf.data.")), (
                        f"{path.name}:{node.lineno} makes {name}() at import")
                if isinstance(node.value, (ast.List, ast.Set)):
                    pytest.fail(f"{path.name}:{node.lineno}: a mutable list or set at import")


def test_one_os_exit_no_helper_programs_no_import_hooks():
    text = "\n".join(path.read_text() for path in MODULES)
    assert text.count("os._exit(") == 1  # exits.leave, its reason beside it
    # the notebook's install runs pip, which is its job; no other module starts a program
    scripts = "\n".join(path.read_text() for path in MODULES if path.name != "notebook.py")
    assert "subprocess" not in scripts and "meta_path" not in text
    started = re.findall(r"subprocess\.\w+\(\s*(\[[^\]]*\]|\w+)",
                         (PACKAGE / "notebook.py").read_text())
    assert started == ['[sys.executable, "-m", "pip", "config", "list"]', "command"]
    assert "unraisablehook" not in text and '"-c"' not in text


@pytest.mark.parametrize("module", TENSORFLOW_FREE)
def test_what_runs_before_tensorflow_imports_nothing_that_loads_it(module):
    relative = pathlib.Path(*module.split("."))
    path = (REPO / relative / "__init__.py") if (REPO / relative).is_dir() else \
        (REPO / relative).with_suffix(".py")
    if not path.is_file():
        pytest.skip(f"{module} is not in the package yet")
    seen, todo = set(), [path]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for node in ast.parse(current.read_text()).body:  # top-level imports only
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module
                     else [])
            for name in names:
                assert name.split(".")[0] not in ("tensorflow", "keras", "jax"), (
                    f"{current.name} imports {name} at its top, before TensorFlow may load")
                if name.startswith("pyimagesearch."):
                    todo.append(PACKAGE / f"{name.split('.')[1]}.py")
            if isinstance(node, ast.ImportFrom) and node.module == "pyimagesearch":
                todo += [PACKAGE / f"{alias.name}.py" for alias in node.names]


def test_every_file_a_comment_names_exists():
    # comments and docstrings name the repo's modules and files as they are, not long gone
    ours = {path.stem for path in MODULES} | {"train_cpu", "train_gpu", "train_tpu", "compare"}
    for path in [*MODULES, *REPO.glob("train_*.py"), REPO / "compare.py",
                 *(REPO / "tools").glob("*.py")]:
        text = path.read_text()
        for name in re.findall(r"(?<![\w/.-])((?:tests|tools|docs)/[\w.-]+\.(?:py|md))", text):
            assert (REPO / name).is_file(), f"{path.name} names {name}"
        for module in re.findall(r"\bpyimagesearch\.(\w+)", text):
            assert module in ours, f"{path.name} names pyimagesearch.{module}"
        for name in re.findall(r"(?<![\w/.-])(\w+)\.py\b", text):  # bare: one of ours
            gone = {"runtime", "terminal", "workarounds", "tpu_runtime", "tpu_lookup",
                    "jax_route", "tfrecord_writer", "notebook"} - ours
            assert name not in gone, f"{path.name} names {name}.py, which is gone"


def test_no_test_imports_a_private_name_of_the_package():
    for path in (REPO / "tests").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "pyimagesearch"):
                assert not [a.name for a in node.names if a.name.startswith("_")], path.name


def test_the_development_page_lists_every_module():
    page = (REPO / "docs" / "development.md").read_text()
    missing = [path.stem for path in MODULES if path.stem != "__init__"
               and f"`{path.stem}`" not in page and f"{path.stem}.py" not in page]
    assert missing == []
