"""The scripts are the article's listing: its steps in its order, and the ones that really run.

A reader opens train_tpu.py beside the article. These tests hold each
script to the listing's steps, in order; count, by wrapping them before a
script runs, that `get_data`, `Model.fit` and `Model.predict` are what it
trains and predicts with; and hold the package to the article's shape, with
its imports running downwards only.
"""
import ast
import pathlib
import re
import tokenize

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / "pyimagesearch"
MAX_SCRIPT_LINES = 130  # the listing's 82 lines, its extras marked, its departures explained
# the listing's steps in order; the strategy's differ by device
STEPS = ["num_replicas_in_sync", "get_data(", "get_data(", "strategy.scope()",
         "AutoEncoder(", "MSELoss(scale=", ".compile(", ".fit(", ".predict(", ".savefig("]
STRATEGY = {
    "train_tpu.py": ["TPUClusterResolver", "connect_to_cluster", "initialize_tpu_system",
                     "TPUStrategy("],
    "train_gpu.py": ["MirroredStrategy("],
    "train_cpu.py": ["get_strategy()"],
}
ARTICLE_MODULES = {"config", "data", "autoencoder", "loss"}
MAX_MORE_MODULES = 3  # top-level modules the scripts call besides the article's


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


# the article's statements, as each script has them once the marked lines are
# skipped (whitespace folded); where a script departs from the article, the
# departure is explained beside it (the next test)
LISTING = {
    "train_tpu.py": ["tpu = find(tf.distribute.cluster_resolver.TPUClusterResolver)",
                     "tf.config.experimental_connect_to_cluster(tpu)",
                     "tf.tpu.experimental.initialize_tpu_system(tpu)",
                     "strategy = tf.distribute.TPUStrategy(tpu)"],
    "train_gpu.py": ["strategy = tf.distribute.MirroredStrategy()"],
    "train_cpu.py": ["strategy = tf.distribute.get_strategy()"],
}
LISTING_AFTER_THE_STRATEGY = [
    "numAcc = strategy.num_replicas_in_sync",
    'print(f"[INFO] number of accelerators: {numAcc}")',
    'print("[INFO] loading the training and validation datasets...")',
    "trainDs = get_data(dataName=config.DATA_NAME, split=config.TRAIN_FLAG, "
    "shuffleSize=config.SHUFFLE_SIZE, batchSize=",
    "valDs = get_data(dataName=config.DATA_NAME, split=config.VALIDATION_FLAG, batchSize=",
    "with strategy.scope():", 'print("[INFO] initializing the model...")',
    "model = AutoEncoder()", "mseLoss = MSELoss(scale=numAcc)",
    "model.compile(loss=mseLoss, optimizer=", 'print("[INFO] training the autoencoder...")',
    "model.fit(trainDs, epochs=", "steps_per_epoch=", "validation_data=valDs,",
    'print("[INFO] evaluating the model...")', "predIm = model.predict(testIm",
    "ax[0].imshow(", 'ax[0].set_title("Input Image")', "ax[1].imshow(",
    'ax[1].set_title("Predicted Image")', 'print("[INFO] saving the predicted images...")',
    "fig.savefig(",
]
# names of this repository's machinery: an unmarked line that uses one departs
# from the article, and its paragraph must say why in a comment
MACHINERY = re.compile(r"\b(args|plan|run|strategies|outputs|cli|staged|record|history)\b"
                       r"|figure_digits|\bFigure\(|\bfind\(")


def _unmarked(path):
    """The script's main() without its '# +' lines: what a reader who skips them reads."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("def main("))
    return [line for line in lines[start:] if "# +" not in line]


@pytest.mark.parametrize("script", sorted(STRATEGY))
def test_skipping_the_marked_lines_leaves_the_listing(script):
    code = " ".join(" ".join(line.split("#", 1)[0].split()) for line in _unmarked(REPO / script))
    code = code.replace("( ", "(").replace(" )", ")")
    position = 0
    for statement in LISTING[script] + LISTING_AFTER_THE_STRATEGY:
        found = code.find(statement, position)
        assert found >= 0, f"{script}: {statement!r} missing once the marked lines are skipped"
        position = found + len(statement)


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


def test_the_package_top_level_is_the_articles_plus_three():
    top = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__"}
    assert ARTICLE_MODULES <= top
    assert len(top - ARTICLE_MODULES) <= MAX_MORE_MODULES, sorted(top - ARTICLE_MODULES)


def test_get_data_opens_data_py():
    source = (PACKAGE / "data.py").read_text()
    definition = re.search(r"^def get_data\(", source, flags=re.MULTILINE)
    assert definition and source[:definition.start()].count("\n") < 120


def _imports(path):
    """The pyimagesearch modules `path` imports, as dotted names."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(
                "pyimagesearch"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names
                         if alias.name.startswith("pyimagesearch"))
    return found


TOP_ABOVE_THE_SUBPACKAGES = ("pyimagesearch.data", "pyimagesearch.cli",
                             "pyimagesearch.strategies", "pyimagesearch.outputs")


@pytest.mark.parametrize("subpackage", ["datasets", "training", "platforms"])
def test_each_subpackage_says_what_it_holds(subpackage):
    # a regular package, whose docstring names every module in it
    init = PACKAGE / subpackage / "__init__.py"
    assert init.is_file(), f"{subpackage}/ has no __init__.py"
    said = ast.get_docstring(ast.parse(init.read_text())) or ""
    missing = [path.stem for path in (PACKAGE / subpackage).glob("*.py")
               if path.stem != "__init__" and f"`{path.stem}`" not in said]
    assert missing == [], f"{subpackage}/__init__.py does not name {missing}"


@pytest.mark.parametrize("subpackage", ["datasets", "training", "platforms"])
def test_no_import_runs_back_up(subpackage):
    for path in (PACKAGE / subpackage).glob("*.py"):
        imported = _imports(path)
        upward = [name for name in imported if any(
            name == top or name.startswith(top + ".") for top in TOP_ABOVE_THE_SUBPACKAGES)]
        assert upward == [], f"{path.name} imports {upward}"
        if subpackage == "training":
            assert not any(name.startswith("pyimagesearch.datasets") for name in imported), \
                path.name


def test_platforms_and_the_package_top_import_nothing_that_loads_tensorflow():
    # a TPU v5e's runtime must be chosen before TensorFlow loads, and the
    # notebook's kernel never loads it: what they import must not either
    allowed = {"pyimagesearch.platforms", "pyimagesearch.training.workarounds",
               "pyimagesearch.training.errors"}
    for path in [PACKAGE / "__init__.py", *(PACKAGE / "platforms").glob("*.py")]:
        tree = ast.parse(path.read_text())
        top_level = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
        for node in top_level:
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""])
            for name in names:
                assert name.split(".")[0] not in ("tensorflow", "keras"), (path.name, name)
                if name.startswith("pyimagesearch"):
                    assert any(name == a or name.startswith(a + ".") for a in allowed), \
                        (path.name, name)
