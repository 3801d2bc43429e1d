"""README.md and docs/: every command, link and step of the listing they name points at what exists.

Every `python ...` command names a file that exists, every tool is documented and
answers --help, every command the README gives gets past its script's argument checks
as written, the test suite's timings the README gives are docs/development.md's, every
relative link resolves, and the README's map of the article's listing points at the
lines of this repository that run each step. No training. The README's shape, Table 1
and the quoted figures are held by test_docs.py.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

from test_docs import README, REPO, _flat, documents, headings

TOOLS = sorted(path.name for path in (REPO / "tools").glob("*.py"))
HELP_TIMEOUT_SECONDS = 180  # importing TensorFlow on a busy 2-core machine

# --- commands and links ------------------------------------------------------------

SCRIPT = re.compile(r"python3? ((?:[\w.-]+/)*[\w.-]+\.py)")
AFTER_DASHES = re.compile(r" -- ((?:[\w.-]+/)*[\w.-]+\.py)")  # launch_workers' script
NAMED = re.compile(r"(?<![\w/.])((?:tests|tools|pyimagesearch)/[\w/.-]*?\w\.py)\b")  # any file


def test_every_documented_command_names_a_file_that_exists():
    missing = []
    for name, text in documents().items():
        for pattern in (SCRIPT, AFTER_DASHES, NAMED):
            for script in pattern.findall(text):
                if not (REPO / script).is_file():
                    missing.append(f"{name}: {script}")
    assert missing == []


def test_every_tool_is_documented_as_python_tools():
    text = "\n".join(documents().values())
    for tool in TOOLS:
        assert f"python tools/{tool}" in text, tool
    # no tool is documented at its old place, at the top level
    assert not [s for s in SCRIPT.findall(text) if s in TOOLS]


# Runs every tool as `python tools/NAME.py --help` would, one after the other
# in one interpreter (one TensorFlow start-up, not one per tool); prints
# {tool: [exit status, what it printed]} as JSON.
HELP_DRIVER = r"""
import contextlib, io, json, runpy, sys
answers = {}
for tool in sys.argv[1:]:
    printed = io.StringIO()
    sys.argv = [f"tools/{tool}", "--help"]
    try:
        with contextlib.redirect_stdout(printed):
            runpy.run_path(f"tools/{tool}", run_name="__main__")
        status = 0
    except SystemExit as stop:
        status = stop.code or 0
    answers[tool] = [status, printed.getvalue()]
print(json.dumps(answers))
"""


def test_every_tool_answers_help():
    result = subprocess.run([sys.executable, "-c", HELP_DRIVER, *TOOLS], cwd=REPO,
                            capture_output=True, text=True, timeout=HELP_TIMEOUT_SECONDS)
    assert result.returncode == 0, result.stderr
    answers = json.loads(result.stdout.splitlines()[-1])
    for tool in TOOLS:
        status, printed = answers[tool]
        assert status == 0, (tool, result.stderr)
        assert printed.startswith("usage:"), tool


# --- the README's commands, as written -------------------------------------------------

FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
SPAN = re.compile(r"`([^`]+)`")
# a command line: VAR=value words, then python and a script; or `...` and its flags
COMMAND = re.compile(r"\s*(?:[A-Z_][A-Z0-9_]*=\S*\s+)*python3?\s+\S+\.py(?:\s|$)|\s*\.\.\.\s+-")


def readme_commands(text):
    """[(script, args)] of every `python X.py ...` in the README's code, as a shell splits it.

    Fenced blocks line by line, inline spans whole (a span may wrap); `&&` and `;`
    separate commands, leading VAR=value words are the environment, and a span
    that opens with `...` continues the command before it (the large-batch table).
    """
    import shlex

    pieces = [line for block in FENCED.findall(text) for line in block.splitlines()]
    pieces += [" ".join(span.split()) for span in SPAN.findall(FENCED.sub("", text))]
    commands = []
    for piece in pieces:
        for part in re.split(r"&&|;", piece):
            if not COMMAND.match(part):
                continue
            words = shlex.split(part, comments=True)
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
                words = words[1:]
            if len(words) > 1 and words[0] in ("python", "python3") and \
                    words[1].endswith(".py"):
                commands.append((words[1], words[2:]))
            elif words[:1] == ["..."] and commands:
                commands.append((commands[-1][0], words[1:]))
    return commands


class _Parsed(Exception):
    """Raised where a script's own argparse call returns: the flags parsed."""


def _expand(args):
    """The arguments as the shell passes them: a glob that matches, expanded."""
    import glob

    expanded = []
    for arg in args:
        matches = sorted(glob.glob(arg, root_dir=REPO)) if any(c in arg for c in "*?[") else []
        expanded += matches or [arg]
    return expanded


def parse_problem(script, args, monkeypatch):
    """'' if `python SCRIPT ARGS` gets past its argument checks, else what it said.

    A module with its own parse_args (argument checks and all, without side
    effects) is asked that; any other script runs its main() until its
    argparse call returns, so that nothing after the parsing runs.
    """
    import argparse
    import contextlib
    import importlib
    import io

    module = importlib.import_module(Path(script).stem)
    monkeypatch.setattr(sys, "argv", [script, *args])  # the usage line's name
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            own = getattr(module, "parse_args", None)
            if own is not None and own.__module__ == module.__name__:
                own(_expand(args))
            else:
                original = argparse.ArgumentParser.parse_args

                def parse_then_stop(self, *given, **named):
                    original(self, *given, **named)
                    raise _Parsed

                with monkeypatch.context() as patch:
                    patch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
                    module.main(_expand(args))
                return f"{script}: main() returned without parsing its arguments"
    except _Parsed:
        pass
    except SystemExit as stop:
        return f"{' '.join([script, *args])}: exit {stop.code}: {said.getvalue().strip()}"
    return ""


def test_every_readme_command_parses_as_written(monkeypatch):
    commands = readme_commands(README.read_text())
    scripts = {script for script, _ in commands}
    # the tools and scripts a reader is told to run, each at least once
    assert {"train_cpu.py", "train_gpu.py", "train_tpu.py", "compare.py",
            "tools/check_listings.py", "tools/matmul_benchmark.py"} <= scripts, scripts
    problems = [parse_problem(script, args, monkeypatch) for script, args in commands]
    assert [problem for problem in problems if problem] == []


def test_readme_command_extraction_and_parse_check_catch_a_missing_argument(monkeypatch):
    text = ("run `python tools/benchmark_pipeline.py --input-only`, then\n"
            "```\nA=1 python train_tpu.py --rehearse 8 && python -m pytest\n```\n"
            "and `... --lr-scaling sqrt`")
    commands = readme_commands(text)
    assert commands == [("train_tpu.py", ["--rehearse", "8"]),
                        ("tools/benchmark_pipeline.py", ["--input-only"]),
                        ("tools/benchmark_pipeline.py", ["--lr-scaling", "sqrt"])]
    assert parse_problem(*commands[0], monkeypatch) == ""
    assert "--data-dir is needed" in parse_problem(*commands[1], monkeypatch)
    assert "unrecognized arguments: --lr-scaling" in parse_problem(*commands[2], monkeypatch)


# the test suite's timings the README gives, as docs/development.md records them
SUITE_TIMING = re.compile(r"\d+ passed in \d+ s")


def test_the_readmes_test_suite_timings_are_development_mds():
    recorded = _flat((REPO / "docs" / "development.md").read_text())
    quoted = SUITE_TIMING.findall(_flat(README.read_text()))
    assert quoted, "the README quotes no test suite timing"
    assert [timing for timing in quoted if timing not in recorded] == []


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(title):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def anchors(path):
    return {slug(title) for level in range(1, 5) for title in headings(path.read_text(), level)}


def test_every_relative_link_resolves():
    broken = []
    for name, text in documents().items():
        base = (REPO / name).parent
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            resolved = (base / path).resolve() if path else REPO / name
            if not resolved.exists():
                broken.append(f"{name}: {target}")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{name}: {target} (no such heading)")
    assert broken == []
