"""The scripts are the article's listing: its steps in its order, and the ones that really run.

A reader opens train_tpu.py beside the article. These tests hold each
script to the listing's steps, in order; compare, statement by statement and
argument by argument (through `ast`), what is left of each script once its
"# +" lines are skipped with the listing (ARTICLE_LISTING, written out here:
the tests never read the article), every difference a row of the README's
departures table; count, by wrapping them before a script runs, that
`get_data`, `Model.fit` and `Model.predict` are what it trains and predicts
with. The package's shape: tests/test_package.py.
"""
import ast
import builtins
import copy
import dataclasses
import difflib
import pathlib
import re
import tokenize

import pytest

from pyimagesearch.notebook.listings import marked_lines  # the one reader of "# +"

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / "pyimagesearch"
MAX_SCRIPT_LINES = 145  # the listing's 82 lines, its extras marked, its departures explained
# the listing's steps in order; the strategy's differ by device
STEPS = ["num_replicas_in_sync", "get_data(", "get_data(", "strategy.scope()",
         "AutoEncoder(", "MSELoss(scale=", ".compile(", ".fit(", ".predict(", ".savefig("]
STRATEGY = {
    "train_tpu.py": ["TPUClusterResolver", "connect_to_cluster", "initialize_tpu_system",
                     "TPUStrategy("],
    "train_gpu.py": ["MirroredStrategy("],
    "train_cpu.py": ["get_strategy()"],
}


def _code(path):
    """The script's source with its comments cut out: a step in a comment counts for nothing."""
    lines = path.read_text().splitlines()
    with open(path) as handle:
        for token in tokenize.generate_tokens(handle.readline):
            if token.type == tokenize.COMMENT:
                row, column = token.start
                lines[row - 1] = lines[row - 1][:column]
    return "\n".join(lines)


@pytest.mark.parametrize("script", sorted(STRATEGY))
def test_each_script_holds_the_listing_in_order(script):
    path = REPO / script
    assert len(path.read_text().splitlines()) <= MAX_SCRIPT_LINES
    code = _code(path)
    code = code[code.index("def main("):]
    position = 0
    for step in STRATEGY[script] + STEPS:
        found = code.find(step, position)
        assert found >= 0, f"{script}: {step!r} missing, or out of the article's order"
        position = found + len(step)


# names of this repository's machinery: an unmarked line that uses one departs
# from the article, and its paragraph must say why in a comment
MACHINERY = re.compile(r"\b(args|plan|run|strategies|outputs|cli|staged|record|history)\b"
                       r"|figure_digits|\bFigure\(|\bfind\(")


def _unmarked(path):
    """The script's main() without its '# +' lines: what a reader who skips them reads."""
    source = path.read_text()
    lines, marked = source.splitlines(), marked_lines(source)
    start = next(i for i, line in enumerate(lines) if line.startswith("def main("))
    return [line for number, line in enumerate(lines[start:], start=start + 1)
            if number not in marked]


@pytest.mark.parametrize("script", sorted(STRATEGY))
def test_every_unmarked_departure_says_why(script):
    # a paragraph (lines between blank lines) that uses the repository's
    # machinery on an unmarked line holds a comment that says why
    paragraph, unexplained = [], []
    for line in _unmarked(REPO / script) + [""]:
        if line.strip():
            paragraph.append(line)
            continue
        commented = any("#" in text for text in paragraph)
        unexplained += [text.strip() for text in paragraph
                        if MACHINERY.search(text.split("#", 1)[0]) and not commented]
        paragraph = []
    assert unexplained == [], f"{script}: {unexplained}"


@pytest.mark.parametrize("script", sorted(STRATEGY))
def test_the_articles_values_are_named_where_they_act(script):
    text = (REPO / script).read_text()
    names = ["config.EPOCHS", "config.OPTIMIZER", "config.SEED"] + (
        ["config.TPU_BATCH_SIZE", "config.TPU_STEPS_PER_EPOCH", "config.TPU_VALIDATION_STEPS"]
        if script == "train_tpu.py" else ["config.BATCH_SIZE"])
    assert [name for name in names if name not in text] == []


@pytest.mark.parametrize("script", sorted(STRATEGY))
def test_a_real_run_trains_on_get_data_with_fit_and_predicts(tiny_runs, script):
    # counted in tests/conftest.py's tiny_runs, which ran each script as
    # `python SCRIPT` does with these wrapped first (train_gpu.py and
    # train_tpu.py as rehearsals: `--rehearse 8` is the same code path)
    calls = tiny_runs.calls[script]
    assert calls["get_data"] >= 2 and calls["fit"] >= 1 and calls["predict"] >= 1, calls


# --- the listing, statement by statement ------------------------------------
# The article's train_tpu.py, one statement a row, keyed by the line of the
# article's text (../shared/seed/000_0a29a6fa19fceea0.txt, which the tests
# never read) where it starts; a block's header (`with ...:`) is a statement
# of its own, its body follows it. Written as ast.unparse writes them.
ARTICLE_LISTING = [
    (347, "import tensorflow as tf"),
    (348, "tf.random.set_seed(42)"),
    (351, "from pyimagesearch import config"),
    (352, "from pyimagesearch.data import get_data"),
    (353, "from pyimagesearch.autoencoder import AutoEncoder"),
    (354, "from pyimagesearch.loss import MSELoss"),
    (355, "from tensorflow.distribute.cluster_resolver import TPUClusterResolver"),
    (356, "from tensorflow.config import experimental_connect_to_cluster"),
    (357, "from tensorflow.tpu.experimental import initialize_tpu_system"),
    (358, "from tensorflow.distribute import TPUStrategy"),
    (359, "from tensorflow.keras.preprocessing.image import array_to_img"),
    (360, "import matplotlib.pyplot as plt"),
    (361, "import os"),
    (366, "tpu = TPUClusterResolver()"),
    (367, "experimental_connect_to_cluster(tpu)"),
    (368, "initialize_tpu_system(tpu)"),
    (369, "strategy = TPUStrategy(tpu)"),
    (372, "numAcc = strategy.num_replicas_in_sync"),
    (373, "print(f'[INFO] Number of accelerators: {numAcc}')"),
    (376, "print('[INFO] loading the training and validation datasets...')"),
    (377, "trainDs = get_data(dataName=config.DATA_NAME, split=config.TRAIN_FLAG, "
          "shuffleSize=config.SHUFFLE_SIZE, batchSize=config.TPU_BATCH_SIZE)"),
    (382, "valDs = get_data(dataName=config.DATA_NAME, split=config.VALIDATION_FLAG, "
          "batchSize=config.TPU_BATCH_SIZE)"),
    (392, "with strategy.scope():"),
    (394, "print('[INFO] initializing the model...')"),
    (395, "model = AutoEncoder()"),
    (396, "mseLoss = MSELoss(scale=1)"),
    (397, "model.compile(loss=mseLoss, optimizer=config.OPTIMIZER)"),
    (400, "print('[INFO] training the autoencoder...')"),
    (401, "model.fit(trainDs, epochs=config.EPOCHS, steps_per_epoch=config.TPU_STEPS_PER_EPOCH, "
          "validation_data=valDs, validation_steps=config.TPU_VALIDATION_STEPS)"),
    (417, "print('[INFO] evaluating the model...')"),
    (418, "testIm, _ = next(iter(valDs))"),
    (419, "predIm = model.predict(testIm)"),
    (422, "fig, axes = plt.subplots(nrows=8, ncols=2, figsize=(10, 40))"),
    (425, "print('[INFO] displaying the predicted images...')"),
    (426, "for ax, real, pred in zip(axes, testIm[:8], predIm[:8]):"),
    (428, "ax[0].imshow(array_to_img(real), cmap='gray')"),
    (429, "ax[0].set_title('Input Image')"),
    (432, "ax[1].imshow(array_to_img(pred), cmap='gray')"),
    (433, "ax[1].set_title('Predicted Image')"),
    (437, "if not os.path.exists(config.BASE_IMG_PATH):"),
    (438, "os.makedirs(config.BASE_IMG_PATH)"),
    (441, "print('[INFO] saving the predicted images...')"),
    (442, "fig.savefig(config.TPU_IMG_PATH)"),
]
# train_cpu.py and train_gpu.py: the listing with their own strategy lines
# (the article prints no CPU or GPU listing) in place of lines 366-369
SCRIPTS = ("train_tpu.py", "train_gpu.py", "train_cpu.py")


def listing():
    """The statements every script is held to: the article's TPU listing.

    Each as this Python's ast.unparse writes it, as the scripts' are (3.10's
    writes `(testIm, _) = ...` where 3.11's writes `testIm, _ = ...`). The
    CPU and GPU scripts' strategy lines are departures the README names,
    like any other: the article prints only the TPU's script.
    """
    return [_normal(text) for _, text in ARTICLE_LISTING]


def _header(node):
    """A block's first line as ast.unparse writes it: `with strategy.scope():`."""
    node = copy.copy(node)
    node.body = [ast.Pass()]
    if hasattr(node, "orelse"):
        node.orelse = []
    return ast.unparse(node).splitlines()[0]


def _without_marked_arguments(node, marked):
    """`node` with every argument that stands on marked lines only taken out."""
    def on_marked(part):
        return all(line in marked for line in range(part.lineno, part.end_lineno + 1))

    node = copy.deepcopy(node)
    for call in ast.walk(node):
        if isinstance(call, ast.Call):
            call.args = [arg for arg in call.args if not on_marked(arg)]
            call.keywords = [kw for kw in call.keywords if not on_marked(kw)]
    return node


def unmarked_statements(source):
    """What a reader who skips the '# +' lines reads: the statements left, in order.

    A statement whose first line is marked is left out, and so is every
    argument of a call that stands on marked lines only. A block whose
    header is marked (`def main(...):  # +`, `if args.rehearse:  # +`) is
    left out, not what it holds: its unmarked statements count. The module's
    docstring is not a statement of the listing.
    """
    marked = marked_lines(source)
    statements = []

    def walk(body):
        for node in body:
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # a docstring
            blocks = [getattr(node, name, []) for name in ("body", "orelse", "finalbody")]
            if any(isinstance(block, list) and block and isinstance(block[0], ast.AST)
                   for block in blocks):
                if node.lineno not in marked:
                    statements.append(_header(node))
                for block in blocks:
                    walk(block)
            elif node.lineno not in marked:
                statements.append(ast.unparse(_without_marked_arguments(node, marked)))

    walk(ast.parse(source).body)
    return statements


def _normal(code):
    """One statement (or a block's header) as ast.unparse writes it."""
    code = code.strip()
    if code.endswith(":"):
        return _header(ast.parse(code + "\n    pass").body[0])
    return ast.unparse(ast.parse(code).body[0])


SCRIPT_NAME = re.compile(r"train_(?:cpu|gpu|tpu)\.py")


def departures_table(readme):
    """The README's departures table, a row a Departure.

    A row whose reason opens with scripts (`train_cpu.py` and `train_gpu.py`: ...)
    is theirs alone; a statement of the scripts' column followed by scripts in
    brackets (`...` (train_tpu.py)) is theirs alone.
    """
    section = readme.split("### Departures from the listing", 1)[1].split("\n#", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0] or set(cells[0]) <= set("-: "):
            continue
        article = [_normal(code) for code in re.findall(r"`([^`]+)`", cells[0])]
        ours = [(_normal(code), set(SCRIPT_NAME.findall(after)) or None) for code, after in
                re.findall(r"`([^`]+)`((?:\s*\([^)`]*\))?)", cells[1])]
        opening = re.match(r"((?:`?train_\w+\.py`?(?:,| and|\s)*)+):", cells[2])
        scripts = set(SCRIPT_NAME.findall(opening[1])) if opening else None
        rows.append(Departure(article, ours, cells[2], scripts))
    return rows[1:]  # the header row names the columns


@dataclasses.dataclass
class Departure:
    """A row of the README's departures table."""

    article: list      # the listing's statements it leaves out
    ours: list         # (statement, the scripts it is for, None: all) it puts in
    why: str
    scripts: set | None  # the scripts the row is for; None: all

    def named(self, script):
        """What this row lets `script` leave out and put in."""
        if self.scripts is not None and script not in self.scripts:
            return [], []
        return self.article, [code for code, only in self.ours if only is None or script in only]


def departures(listing, statements):
    """What `statements` leave out of `listing` and what they add, aligned in order."""
    matcher = difflib.SequenceMatcher(None, listing, statements, autojunk=False)
    left_out, added = [], []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            left_out += listing[i1:i2]
            added += statements[j1:j2]
    return left_out, added


def _unexplained(script, source, rows):
    """The departures of `source` from `script`'s listing that no row of the table names."""
    left_out, added = departures(listing(), unmarked_statements(source))
    named_left = {code for row in rows for code in row.named(script)[0]}
    named_added = {code for row in rows for code in row.named(script)[1]}
    return ([code for code in left_out if code not in named_left],
            [code for code in added if code not in named_added])


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_skipping_the_marked_lines_leaves_the_listing_or_a_departure_the_readme_names(script):
    rows = departures_table((REPO / "README.md").read_text())
    assert rows, "the README has no departures table"
    assert all(row.why for row in rows)
    left_out, added = _unexplained(script, (REPO / script).read_text(), rows)
    assert left_out == [], f"{script} leaves out the listing's {left_out}: no departure says why"
    assert added == [], f"{script} adds, unmarked, {added}: no departure says why"


def test_every_departure_in_the_readme_is_one_a_script_makes():
    rows = departures_table((REPO / "README.md").read_text())
    made = {script: departures(listing(),
                               unmarked_statements((REPO / script).read_text()))
            for script in SCRIPTS}
    stale = [row.article + row.ours for row in rows if not any(
        set(row.named(script)[0]) & set(left_out) or set(row.named(script)[1]) & set(added)
        for script, (left_out, added) in made.items())]
    assert stale == []


@pytest.mark.parametrize("label, says", [
    ("sample", "digits 0-7 of the 5,000-digit sample, not MNIST"),
    ("tfrecord (sample)", "digits 0-7 of the 5,000-digit sample, not MNIST"),
    ("stand-in", "images of a stand-in, not MNIST"),
    ("tfds", "digits 0-7 of MNIST (tfds)"),
])
def test_the_figure_names_its_run_and_whose_digits_it_shows(label, says):
    import types

    from pyimagesearch.outputs import figure_title

    plan = types.SimpleNamespace(name="tpu_rehearsal", global_batch_size=1024,
                                 steps_per_epoch=58, learning_rate=0.001,
                                 source=types.SimpleNamespace(label=label))
    title = figure_title(plan, {"val_loss": [0.5, 0.00721]}).splitlines()
    assert title == ["tpu_rehearsal: val_loss 0.0072", "batch 1024, 58 steps/epoch, lr 0.001",
                     says]


# --- the "# +" rule, literally -----------------------------------------------
COMPOUND = (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.FunctionDef, ast.ClassDef)


def _statement_lines(node):
    """The lines of a simple statement, or of a compound one's header, that hold code."""
    last = node.body[0].lineno - 1 if isinstance(node, COMPOUND) else node.end_lineno
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return range(first, last + 1)


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_statement_is_marked_whole_or_not_at_all(script):
    # skipping the marked lines leaves whole statements: none is cut in two
    source = (REPO / script).read_text()
    code_lines = {number for number, line in enumerate(_code(REPO / script).splitlines(), 1)
                  if line.strip()}
    marked = marked_lines(source)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.stmt):
            lines = set(_statement_lines(node)) & code_lines
            assert not (lines & marked) or lines <= marked, \
                f"{script} line {node.lineno}: statement partly marked ({sorted(lines & marked)})"


@pytest.mark.parametrize("script", SCRIPTS)
def test_unmarked_lines_read_only_names_that_unmarked_lines_bind(script):
    # what is left once the marked lines are skipped runs on its own names
    source = (REPO / script).read_text()
    marked = marked_lines(source)
    tree = ast.parse(source)
    bound = set(dir(builtins))
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in marked:
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.FunctionDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    read = {(node.id, node.lineno) for node in ast.walk(tree)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
            and node.lineno not in marked}
    assert sorted(name for name, line in read if name not in bound) == [], script


def test_the_jax_line_that_stands_for_the_articles_tpu_set_up_has_its_row():
    # train_tpu.py on Keras' JAX backend (Colab's and Kaggle's TPUs): one marked line in
    # place of the article's resolver, connect, initialize and TPUStrategy (its lines 47-50)
    jax_line = "strategy = strategies.data_parallel(args.rehearse)"
    assert f"{jax_line}  # +" in (REPO / "train_tpu.py").read_text()
    rows = [row for row in departures_table((REPO / "README.md").read_text())
            if (_normal(jax_line), {"train_tpu.py"}) in row.ours]
    assert len(rows) == 1, "the README's departures table has no row for the JAX route's strategy"
    assert [_normal(line) for line in ("tpu = TPUClusterResolver()",
                                       "experimental_connect_to_cluster(tpu)",
                                       "initialize_tpu_system(tpu)",
                                       "strategy = TPUStrategy(tpu)")] == rows[0].article
    assert rows[0].scripts == {"train_tpu.py"} and "DataParallel" in rows[0].why
