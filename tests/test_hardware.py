"""The hardware table (runtime.HARDWARE): one row per device and route, and the package reads it.

Each row's script, figure name and requirements file exist and the script
says its device; no package module but runtime.py spells a script's name to
select behaviour (a few do, each allowed below with its reason).
"""
import ast
import os
import pathlib
import re

import pytest

from pyimagesearch import config
from pyimagesearch.runtime import DEVICES, HARDWARE, SCRIPTS, hardware

REPO = pathlib.Path(__file__).resolve().parent.parent
SCRIPT_NAME = re.compile(r"train_\w*\.py")
# (module, literal): why it may spell a script's name
ALLOWED = {
}


def test_the_table_has_a_row_per_script_and_device():
    assert sorted(SCRIPTS) == sorted(path.name for path in REPO.glob("train_*.py"))
    assert DEVICES == ("cpu", "gpu", "tpu")
    for row in HARDWARE.values():
        assert hardware(row.device, row.backend) is row
    with pytest.raises(KeyError):
        hardware("gpu", "jax")


@pytest.mark.parametrize("route", HARDWARE)
def test_each_row_names_what_exists(route):
    row = HARDWARE[route]
    assert (REPO / row.script).is_file()
    assert isinstance(getattr(config, row.figure), str)
    assert (REPO / row.requirements).is_file()
    assert row.backend in ("tensorflow", "jax")
    assert row.rehearse is None or row.rehearse >= 1
    assert row.strategy and row.checks


@pytest.mark.parametrize("route", HARDWARE)
def test_each_script_says_its_device_and_backend(route):
    row = HARDWARE[route]
    text = (REPO / row.script).read_text()
    usage = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    said = (ast.get_docstring(ast.parse(text)) + usage)
    assert row.device.upper() in said
    assert row.backend == "tensorflow" or row.backend.upper() in said.upper()
    assert os.path.basename(getattr(config, row.figure)) in said


def _literals(tree):
    """The non-docstring string literals of a module, f-strings as their constant parts joined
    by {}: (line, text)."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    parts = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts.update(id(value) for value in node.values)
            yield node.lineno, "".join(value.value if isinstance(value, ast.Constant) else "{}"
                                       for value in node.values)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in docstrings and id(node) not in parts):
            yield node.lineno, node.value


def test_only_runtime_spells_a_script_name_to_select_behaviour():
    """A literal that is a script's name, whole ("train_tpu.py", f"train_{device}.py"),
    outside runtime.py; a name inside a sentence is text, not a choice."""
    found = set()
    modules = sorted((REPO / "pyimagesearch").rglob("*.py")) + [REPO / "compare.py"]
    for path in modules:
        name = str(path.relative_to(REPO))
        if name == "pyimagesearch/runtime.py":
            continue
        for line, text in _literals(ast.parse(path.read_text())):
            if SCRIPT_NAME.fullmatch(text.replace("{}", "x")):
                found.add((name, text))
    assert found == set(ALLOWED), "spell it through runtime.HARDWARE, or allow it with a reason"
