"""prepare_mnist.py: real-format idx files round-trip through tfds, wrong ones end in one line.

The idx files here are written by the test itself (header with struct,
then bytes), not by prepare_mnist's own writer, so a mistake in that writer
cannot hide a mistake in the reader. TensorFlow's own log lines may reach
stderr; tfds' and absl's may not.
"""
import gzip
import os
import struct

import numpy as np
import pytest
import tensorflow_datasets as tfds

import prepare_mnist
from conftest import ENV, one_line, run, tensorflows

from pyimagesearch import config, sources
from pyimagesearch.errors import UserError

TRAIN, TEST = 60, 10  # images per split: small, so tfds writes them in a second
NAMES = {"train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
         "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}
# lines that absl and tfds print on their own, which must not reach a reader
NOISE = ("downloaded", "Downloading", "absl", "Generating", "Traceback", "Dataset")


def _images_bytes(images, magic=2051):
    return struct.pack(">iiii", magic, len(images), *images.shape[1:]) + images.tobytes()


def _labels_bytes(labels, magic=2049):
    return struct.pack(">ii", magic, len(labels)) + labels.tobytes()


def _arrays(seed=0):
    """Random uint8 digits and labels for both splits."""
    rng = np.random.default_rng(seed)
    return {"train_images": rng.integers(0, 256, (TRAIN, 28, 28), dtype=np.uint8),
            "train_labels": rng.integers(0, 10, TRAIN, dtype=np.uint8),
            "test_images": rng.integers(0, 256, (TEST, 28, 28), dtype=np.uint8),
            "test_labels": rng.integers(0, 10, TEST, dtype=np.uint8)}


def _write_folder(folder, contents, gzipped=("train_images", "train_labels")):
    """Write idx files as MNIST ships them: gzipped ones get .gz; the rest stay raw."""
    folder.mkdir(exist_ok=True)
    for key, raw in contents.items():
        if key in gzipped:
            (folder / (NAMES[key] + ".gz")).write_bytes(gzip.compress(raw))
        else:
            (folder / NAMES[key]).write_bytes(raw)
    return folder


def _valid_contents(arrays):
    return {key: _images_bytes(value) if value.ndim == 3 else _labels_bytes(value)
            for key, value in arrays.items()}


def _truncated_gzip(contents):
    """The train images gzipped, then cut off mid-stream."""
    return gzip.compress(contents["train_images"])[:200]


def _read_back(data_dir, split):
    """All (image, label) pairs of a prepared split, through tfds.load, sorted."""
    dataset = tfds.load(config.DATA_NAME, split=split, data_dir=str(data_dir),
                        as_supervised=True)
    pairs = [(image[..., 0].tobytes(), int(label)) for image, label in tfds.as_numpy(dataset)]
    return sorted(pairs)


def _as_pairs(images, labels):
    return sorted((image.tobytes(), int(label)) for image, label in zip(images, labels))


def _ours(stderr):
    """The lines of `stderr` that are not TensorFlow's own native log lines."""
    return [line for line in stderr.splitlines() if not tensorflows(line)]


# the native log level left to the tool, as a reader's shell leaves it
CLEAN_ENV = {key: value for key, value in ENV.items() if key != "TF_CPP_MIN_LOG_LEVEL"}


def test_idx_files_round_trip_through_tfds_load(tmp_path, capsys):
    arrays = _arrays()
    source = _write_folder(tmp_path / "idx", _valid_contents(arrays))
    data_dir = tmp_path / "tfds"
    prepare_mnist.main(["--data-dir", str(data_dir), "--from-idx", str(source)])
    out, err = capsys.readouterr()
    assert out.startswith("[INFO] prepared mnist") and "train 60, test 10" in out
    assert out.count("\n") == 1 and err == ""
    # tfds shuffles examples as it writes them, so compare the pairs as sets
    assert _read_back(data_dir, "train") == _as_pairs(arrays["train_images"],
                                                      arrays["train_labels"])
    assert _read_back(data_dir, "test") == _as_pairs(arrays["test_images"],
                                                     arrays["test_labels"])
    assert not (data_dir / "mnist" / sources.STAND_IN_MARKER).exists()
    assert sorted(os.listdir(data_dir)) == ["mnist"]  # no tfds downloads/ folder
    assert "stand-in" not in sources.resolve_source("tfds", "mnist", str(data_dir)).reason


# name -> (change the valid contents, what the one line must say)
WRONG = {
    "bad magic": (lambda c: c.update(train_images=_images_bytes(
        np.zeros((TRAIN, 28, 28), np.uint8), magic=2049)),
        r"train-images-idx3-ubyte.gz has magic number 2049 \(an idx label file\)"),
    "truncated": (lambda c: c.update(test_images=c["test_images"][:-100]),
                  r"t10k-images-idx3-ubyte is truncated: its header promises 10 images"),
    "extra bytes": (lambda c: c.update(test_labels=c["test_labels"] + b"\0\0"),
                    r"t10k-labels-idx1-ubyte has 2 bytes after the 10 labels"),
    "not 28x28": (lambda c: c.update(test_images=_images_bytes(
        np.zeros((TEST, 32, 32), np.uint8))), r"holds 32x32 images, expected MNIST's 28x28"),
    "counts differ": (lambda c: c.update(test_labels=_labels_bytes(np.zeros(9, np.uint8))),
                      r"t10k-images-idx3-ubyte holds 10 images but .*t10k-labels-idx1-ubyte "
                      r"holds 9 labels"),
    "label 10": (lambda c: c.update(test_labels=_labels_bytes(np.full(TEST, 10, np.uint8))),
                 r"has label 10 at position 0; MNIST labels are 0-9"),
    "too short": (lambda c: c.update(test_labels=b"\0\0\x08"), r"too short for the header"),
}


@pytest.mark.parametrize("case", sorted(WRONG))
def test_wrong_idx_files_are_one_user_error_and_leave_nothing(tmp_path, case):
    change, message = WRONG[case]
    contents = _valid_contents(_arrays())
    change(contents)
    source = _write_folder(tmp_path / "idx", contents)
    data_dir = tmp_path / "tfds"
    with pytest.raises(UserError, match=message):
        prepare_mnist.main(["--data-dir", str(data_dir), "--from-idx", str(source)])
    assert not data_dir.exists()  # checked before the data dir is even created


def test_gzip_that_is_not_gzip_and_a_broken_gzip(tmp_path):
    contents = _valid_contents(_arrays())
    source = _write_folder(tmp_path / "idx", contents)
    (source / "train-images-idx3-ubyte.gz").write_bytes(b"<html>404 Not Found</html>")
    with pytest.raises(UserError, match=r"idx3-ubyte.gz is not gzip"):
        prepare_mnist.prepare(str(tmp_path / "tfds"), str(source))
    (source / "train-images-idx3-ubyte.gz").write_bytes(_truncated_gzip(contents))
    with pytest.raises(UserError, match=r"idx3-ubyte.gz is broken gzip"):
        prepare_mnist.prepare(str(tmp_path / "tfds"), str(source))
    (source / "train-images-idx3-ubyte.gz").unlink()
    with pytest.raises(UserError, match=r"train-images-idx3-ubyte\(.gz\) not found"):
        prepare_mnist.prepare(str(tmp_path / "tfds"), str(source))
    assert not (tmp_path / "tfds").exists()


@pytest.mark.parametrize("kind", ["a named pipe", "a dangling link", "a folder"])
def test_an_idx_file_that_is_not_a_regular_file_is_one_line_not_a_wait(tmp_path, kind):
    # a pipe would block the read for ever; none of these is "not found"
    source = _write_folder(tmp_path / "idx", _valid_contents(_arrays()))
    for name in ("t10k-labels-idx1-ubyte", "t10k-labels-idx1-ubyte.gz"):
        (source / name).unlink(missing_ok=True)
    path = source / "t10k-labels-idx1-ubyte.gz"
    if kind == "a named pipe":
        os.mkfifo(path)
    elif kind == "a dangling link":
        path.symlink_to(tmp_path / "gone.gz")
    else:
        path.mkdir()
    with pytest.raises(UserError, match=rf"^{path} is not a regular file; put the downloaded"):
        prepare_mnist.prepare(str(tmp_path / "tfds"), str(source))
    assert not (tmp_path / "tfds").exists()


def test_an_unpacked_file_with_a_gz_name_is_read_as_what_it_is(tmp_path):
    # some browsers unpack a download and keep the .gz name
    arrays = _arrays()
    contents = _valid_contents(arrays)
    source = _write_folder(tmp_path / "idx", contents, gzipped=())
    os.rename(source / NAMES["test_images"], source / (NAMES["test_images"] + ".gz"))
    splits = prepare_mnist.prepare(str(tmp_path / "tfds"), str(source))
    assert splits["test"].num_examples == TEST


def test_a_wrong_file_from_the_command_line_is_one_line_and_exit_2(tmp_path, in_process):
    contents = _valid_contents(_arrays())
    contents["test_images"] = contents["test_images"][:-1]
    source = _write_folder(tmp_path / "idx", contents)
    data_dir = tmp_path / "tfds"
    result = in_process("tools/prepare_mnist.py", "--data-dir", data_dir, "--from-idx", source)
    line = one_line(result)
    assert line.startswith("prepare_mnist.py: error: ") and "truncated" in line
    assert str(source / NAMES["test_images"]) in line
    assert result.stdout == "" and not data_dir.exists()


def test_a_failure_inside_tfds_is_one_line_and_leaves_no_half_dataset(tmp_path, monkeypatch):
    def out_of_space(self, **kwargs):
        # as tfds would: a half-written version folder, then the error
        os.makedirs(os.path.join(self.data_dir_root, "mnist", "3.0.1.incomplete"))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", out_of_space)
    source = _write_folder(tmp_path / "idx", _valid_contents(_arrays()))
    data_dir = tmp_path / "tfds"
    with pytest.raises(UserError, match="cannot prepare mnist in .*: No space left"):
        prepare_mnist.prepare(str(data_dir), str(source))
    assert os.listdir(data_dir) == []


def test_stand_in_is_the_sample_tiled_and_says_so(tmp_path, monkeypatch, capfd):
    # config's sizes, shrunk: tfds writes 70 PNGs instead of 70,000
    monkeypatch.setattr(config, "TRAIN_IMAGES", 50)
    monkeypatch.setattr(config, "VALIDATION_IMAGES", 20)
    data_dir = tmp_path / "tfds"
    prepare_mnist.main(["--data-dir", str(data_dir), "--stand-in"])
    out, err = capfd.readouterr()
    assert out.startswith("[INFO] prepared stand-in mnist") and out.count("\n") == 1
    assert "train 50, test 20" in out and err == ""
    assert not any(word in out for word in NOISE)
    images, labels = sources.read_sample()
    sample = dict(_as_pairs(images[..., 0], labels))
    for split, count in (("train", 50), ("test", 20)):
        pairs = _read_back(data_dir, split)
        assert len(pairs) == count
        assert all(sample.get(image) == label for image, label in pairs)
    assert (data_dir / "mnist" / sources.STAND_IN_MARKER).exists()
    source = sources.resolve_source("tfds", "mnist", str(data_dir))
    assert "stand-in" in source.reason


def test_prepare_mnist_refuses_a_prepared_data_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(tfds.core.DatasetBuilder, "is_prepared", lambda self: True)
    with pytest.raises(UserError, match="already prepared"):
        prepare_mnist.prepare(str(tmp_path), idx_folder=None)


@pytest.mark.slow  # writes all 70,000 images
def test_full_size_stand_in_from_the_command_line_prints_only_our_line(tmp_path):
    # the whole script as a reader runs it, native log level untouched
    result = run("tools/prepare_mnist.py", "--data-dir", tmp_path, "--stand-in", env=CLEAN_ENV)
    assert result.returncode == 0, result.stderr
    assert _ours(result.stderr) == []
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("[INFO] prepared stand-in mnist")
    assert "train 60,000, test 10,000" in lines[0]
    assert not any(word in lines[0] for word in NOISE)
