"""Every seed the --seed flag accepts trains, in both loops and on several replicas.

TensorFlow truncates seeds modulo 2**31 - 1, so 0 and 2**31 - 1 (and
2 * (2**31 - 1)) are the seeds that once crashed the seeded input pipeline;
2**32 - 1 is the largest the flag accepts.
"""
import json

import numpy as np
import pytest

import train_cpu
import train_gpu
from conftest import saved_weights
from pyimagesearch import cli

ONE_STEP = ["--epochs", "1", "--steps-per-epoch", "1", "--batch-size", "32",
            "--data-source", "sample"]
EDGE_SEEDS = [0, 1, 2**31 - 1, 2 * (2**31 - 1), cli.MAX_SEED]


def _only(folder, stem, suffix):
    """The one output of `suffix` in `folder` of a run whose name starts with `stem`.

    A run's name carries its flags (cpu_epochs-1_..._seed-0); `stem_` and not
    `stem` alone, so that "cpu" does not match "cpu_gpu-runtime" of another stem.
    """
    [path] = folder.glob(f"{stem}_*.{suffix}")
    return path


def _record(folder, name):
    return json.loads(_only(folder, name, "json").read_text())


class Runs(dict):
    """{(seed, loop): the record of train_cpu.py's one-step run}, trained when first asked for."""

    def __init__(self, folder):
        super().__init__()
        self.folder = folder

    def __missing__(self, key):
        seed, loop = key
        out = self.folder / f"{seed}-{loop}"
        train_cpu.main(ONE_STEP + ["--seed", str(seed), "--loop", loop,
                                   "--output-dir", str(out)])
        self[key] = _record(out, "cpu")
        return self[key]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One-step runs by seed and loop, shared by the tests of this module."""
    return Runs(tmp_path_factory.mktemp("seeds"))


SLOW = pytest.mark.slow  # the same code path as a default case next to it


# the edges 0 and the largest in the default suite; the others are slow
@pytest.mark.parametrize("seed, loop", [(seed, "fit") if seed in (0, cli.MAX_SEED)
                                        else pytest.param(seed, "fit", marks=SLOW)
                                        for seed in EDGE_SEEDS]
                         + [pytest.param(0, "custom", marks=SLOW),
                            pytest.param(1, "custom", marks=SLOW), (2**31 - 1, "custom")])
def test_every_edge_seed_trains_a_step(runs, seed, loop):
    record = runs[seed, loop]
    assert record["seed"] == seed and record["loop"] == loop
    assert np.isfinite(record["loss"]).all() and np.isfinite(record["val_loss"]).all()


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=SLOW),
                                  pytest.param(2**31 - 1, marks=SLOW)])
def test_edge_seeds_train_on_a_two_device_rehearsal(tmp_path, seed):
    train_gpu.main(ONE_STEP + ["--seed", str(seed), "--rehearse", "2",
                               "--output-dir", str(tmp_path)])
    record = _record(tmp_path, "gpu_rehearsal")
    assert record["seed"] == seed and record["replicas"] == 2
    assert np.isfinite(record["loss"]).all()


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
def test_seed_zero_rehearsal_step_equals_the_cpu_step(tmp_path):
    sgd = ["--epochs", "1", "--steps-per-epoch", "1", "--optimizer", "sgd",
           "--learning-rate", "0.5", "--data-source", "sample", "--seed", "0"]
    train_cpu.main(sgd + ["--batch-size", "256", "--output-dir", str(tmp_path)])
    train_gpu.main(sgd + ["--batch-size", "128", "--rehearse", "2",
                          "--output-dir", str(tmp_path)])
    cpu, gpu = saved_weights(_only(tmp_path, "cpu", "keras")), saved_weights(
        _only(tmp_path, "gpu_rehearsal", "keras"))
    for a, b in zip(cpu, gpu):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


def test_seeds_zero_and_one_draw_different_batches(runs):
    assert runs[0, "fit"]["loss"][0] != runs[1, "fit"]["loss"][0]


@pytest.mark.parametrize("seed, complaint", [
    ("-1", "must be from 0 to 4294967295, got -1"),
    (str(cli.MAX_SEED + 1), "must be from 0 to 4294967295, got 4294967296")])
def test_seeds_outside_the_range_are_refused(seed, complaint, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.build_parser("cpu").parse_args(["--seed", seed])
    assert stop.value.code == 2 and complaint in capsys.readouterr().err
