"""docs/article-map.md held to the code: each row's line here holds the code it names, and every
line of train_tpu.py that is not the article's to the letter has a row or is marked "# +".

The article is not in the repository, so the tests never read it: ARTICLE_CODE_LINES gives,
for each listing, the numbers of its lines that hold code (not blank, not a comment), as the
article numbers them, and the map must cover each.
"""
import ast
import io
import pathlib
import re
import tokenize

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
MAP = REPO / "docs" / "article-map.md"


def _numbers(*spans):
    return {number for span in spans for number in (
        range(span[0], span[1] + 1) if isinstance(span, tuple) else [span])}


ARTICLE_CODE_LINES = {
    "train_tpu.py": _numbers(5, 6, (9, 19), (22, 25), 28, 29, (32, 35), 38, 39, 42, (44, 47),
                             (50, 54), (57, 59), 62, 65, 66, 68, 69, 72, 73, 77, 78, 81, 82),
    "pyimagesearch/autoencoder.py": _numbers((2, 6), (8, 10), (12, 17), (20, 26), 28, 31, 32,
                                             35),
    "pyimagesearch/loss.py": _numbers((2, 4), 6, 7, 9, 11, 13, 16, 19, 22),
}


def _span(text):
    first, _, last = text.strip().partition("-")
    return int(first), int(last or first)


def rows():
    """(listing, article lines, script, script lines, code) for each row of the map."""
    found, listing = [], None
    for line in MAP.read_text().splitlines():
        heading = re.match(r"^## `(.+)`$", line)
        if heading:
            listing = heading[1]
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if listing and len(cells) == 4 and re.match(r"^\d", cells[0]):
            script, _, lines = cells[1].rpartition(" ")
            found.append((listing, _span(cells[0]), script.strip("`") or listing, _span(lines),
                          re.fullmatch(r"`(.+?)`", cells[2])[1]))
    return found


def test_the_map_has_a_table_for_each_listing():
    assert {row[0] for row in rows()} == set(ARTICLE_CODE_LINES)


def misplaced(repo=REPO):
    """The rows whose line in `repo` does not hold the code they name."""
    found = []
    for row in rows():
        _, _, script, (first, last), code = row
        lines = (repo / script).read_text().splitlines()
        held = " ".join(" ".join(lines[max(first, 1) - 1:last]).split())
        if not 1 <= first <= last <= len(lines) or " ".join(code.split()) not in held:
            found.append(row)
    return found


def test_each_rows_line_holds_the_code_it_names():
    assert misplaced() == []


def test_a_line_that_moves_without_its_row_is_caught(tmp_path):
    (tmp_path / "pyimagesearch").mkdir()
    for name in ("train_tpu.py", "train_cpu.py", "train_gpu.py", "pyimagesearch/loss.py",
                 "pyimagesearch/autoencoder.py"):
        (tmp_path / name).write_text((REPO / name).read_text())
    (tmp_path / "train_tpu.py").write_text("\n" + (REPO / "train_tpu.py").read_text())
    moved = {row[2] for row in misplaced(tmp_path)}
    assert moved == {"train_tpu.py"}


@pytest.mark.parametrize("listing", sorted(ARTICLE_CODE_LINES))
def test_every_line_of_the_articles_code_has_a_row(listing):
    mapped = set()
    for row in rows():
        if row[0] == listing:
            mapped |= set(range(row[1][0], row[1][1] + 1))
    assert sorted(ARTICLE_CODE_LINES[listing] - mapped) == []
    assert max(mapped) <= max(ARTICLE_CODE_LINES[listing])


def unmarked(script):
    """{line number: code} of `script`'s lines that hold code and are not marked "# +"."""
    source = (REPO / script).read_text()
    docstring = ast.parse(source).body[0]
    skipped = set(range(docstring.lineno, docstring.end_lineno + 1)) if isinstance(
        docstring, ast.Expr) else set()
    code, marked = {}, set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and token.string.startswith("# +"):
            marked.add(token.start[0])
        elif token.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE,
                                tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            for number in range(token.start[0], token.end[0] + 1):
                code[number] = source.splitlines()[number - 1].split("  #")[0].strip()
    return {number: text for number, text in code.items()
            if number not in marked and number not in skipped}


def _covered(script):
    return {number for row in rows() if row[2] == script
            for number in range(row[3][0], row[3][1] + 1)}


def test_every_unmarked_line_of_train_tpu_has_a_row():
    left = {number: text for number, text in unmarked("train_tpu.py").items()
            if number not in _covered("train_tpu.py")}
    assert left == {}


@pytest.mark.parametrize("script, device", [("train_cpu.py", "CPU"), ("train_gpu.py", "GPU")])
def test_the_cpu_and_gpu_scripts_are_train_tpus_lines_but_for_their_rows(script, device):
    tpu_lines = set(unmarked("train_tpu.py").values())
    left = {number: text for number, text in unmarked(script).items()
            if number not in _covered(script) and text.replace(device, "TPU").replace(
                f'"{device.lower()}"', '"tpu"') not in tpu_lines}
    assert left == {}


# --- the scripts as the listing: its steps in order, "# +" on whole statements -------------------

SCRIPTS = ("train_cpu.py", "train_gpu.py", "train_tpu.py")
MAX_SCRIPT_LINES = 145  # the listing's 82 lines, its extras marked, its departures explained
STEPS = ["num_replicas_in_sync", "get_data(", "get_data(", "strategy.scope()", "AutoEncoder(",
         "MSELoss(scale=", ".compile(", ".fit(", "figure_digits(", ".predict(", ".savefig("]
STRATEGY = {"train_tpu.py": ["find_tpu(", "connect_to_cluster(", "initialize_tpu_system(",
                             "TPUStrategy("],
            "train_gpu.py": ["MirroredStrategy("], "train_cpu.py": ["get_strategy()"]}


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_script_holds_the_listings_steps_in_order(script):
    source = (REPO / script).read_text()
    assert len(source.splitlines()) <= MAX_SCRIPT_LINES
    code = "\n".join(unmarked(script).values())
    position = 0
    for step in STRATEGY[script] + STEPS:
        found = code.find(step, position)
        assert found >= 0, f"{script}: {step!r} missing, or out of the article's order"
        position = found + len(step)


def _marked(source):
    return {token.start[0] for token in tokenize.generate_tokens(io.StringIO(source).readline)
            if token.type == tokenize.COMMENT and token.string.startswith("# +")}


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_statement_is_marked_whole_or_not_at_all(script):
    # skipping the marked lines leaves whole statements: none is cut in two
    source = (REPO / script).read_text()
    code, marked = set(unmarked(script)) | _marked(source), _marked(source)
    compound = (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.FunctionDef)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.stmt):
            last = node.body[0].lineno - 1 if isinstance(node, compound) else node.end_lineno
            lines = set(range(node.lineno, last + 1)) & code
            assert not (lines & marked) or lines <= marked, f"{script} line {node.lineno}"


def test_a_real_run_trains_on_get_data_with_fit_and_predicts_its_figure(in_process, monkeypatch,
                                                                        tmp_path):
    import keras
    import train_cpu
    calls = {"get_data": 0, "fit": 0, "call": 0}

    def counted(name, real):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return wrapper
    monkeypatch.setattr(train_cpu, "get_data", counted("get_data", train_cpu.get_data))
    monkeypatch.setattr(keras.Model, "fit", counted("fit", keras.Model.fit))
    monkeypatch.setattr(keras.Model, "__call__", counted("call", keras.Model.__call__))
    done = in_process("train_cpu.py", "--epochs", "1", "--steps-per-epoch", "2", "--batch-size",
                      "32", "--data-source", "sample", "--output-dir", tmp_path)
    assert done.returncode == 0, done.stderr
    assert calls["get_data"] == 2 and calls["fit"] == 1 and calls["call"] >= 1, calls


def test_the_readme_counts_the_listings_lines_that_stand_as_printed():
    verbatim = set()
    for line in MAP.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[1][:1].isdigit() and cells[3].startswith("verbatim"):
            first, last = _span(cells[0])
            verbatim |= set(range(first, last + 1))
    code = ARTICLE_CODE_LINES["train_tpu.py"]
    said = " ".join((REPO / "README.md").read_text().split())
    assert f"Of the TPU listing's {len(code)} lines of code, {len(verbatim & code)} stand as " \
           "printed" in said
