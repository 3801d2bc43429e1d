"""TFRecords read back bit for bit, reshuffled per epoch, split between workers; bad ones refused.

Tiny data throughout: the 5,000-digit sample, or a few hundred of its digits.
"""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

import train_cpu
import write_tfrecords

from pyimagesearch import config, sources, tfrecords
from pyimagesearch.errors import UserError
from pyimagesearch.pipeline import Reading

TRAIN, VAL = config.TRAIN_FLAG, config.VALIDATION_FLAG


@pytest.fixture(scope="module")
def sample():
    """The sample's splits with their labels: {split: (uint8 images, labels)}."""
    return {split: sources.SampleSource("test").examples(split) for split in (TRAIN, VAL)}


@pytest.fixture(scope="module")
def small():
    """300 training and 40 validation digits of the sample, all different."""
    images, labels = sources.SampleSource("test").examples(TRAIN)
    return {TRAIN: (images[:300], labels[:300]), VAL: (images[300:340], labels[300:340])}


def write(folder, splits, shards=4, compression="none", origin="sample", overwrite=False):
    """Write `splits` as a TFRecord folder the way write_tfrecords.py does."""
    return tfrecords.write_folder(str(folder), splits, origin, "a test", ["test"], shards=shards,
                                  compression=compression, overwrite=overwrite)


def read(folder, split, seed=None, **reading):
    """The batches of `split` a run reads from the TFRecord folder: data.Reading's fields."""
    source = sources.resolve_source("tfrecord", config.DATA_NAME, str(folder))
    context = reading.pop("input_context", None)
    return source.dataset(split, Reading(seed=seed, **reading), context)


def as_uint8(batches):
    """(image, target) float batches -> one uint8 array; checks input == target."""
    images = []
    for inputs, targets in batches:
        np.testing.assert_array_equal(inputs, targets)
        images.append(np.round(inputs.numpy() * 255).astype(np.uint8))
    return np.concatenate(images)


def keys(images):
    """Each image's bytes, sorted: equal for two arrays holding the same images."""
    return sorted(image.tobytes() for image in images)


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_round_trip_is_bit_for_bit(tmp_path, sample, compression):
    metadata = write(tmp_path, sample, shards=3, compression=compression)
    assert {split: entry["images"] for split, entry in metadata["splits"].items()} == {
        TRAIN: 4500, VAL: 500}
    assert [shard["file"] for shard in metadata["splits"][VAL]["shards"]] == [
        f"test-0000{i}-of-00003.tfrecord{'.gz' if compression == 'gzip' else ''}"
        for i in range(3)]
    assert json.loads((tmp_path / "metadata.json").read_text()) == metadata
    source = sources.resolve_source("tfrecord", config.DATA_NAME, str(tmp_path))
    for split, (images, labels) in sample.items():
        read_images, read_labels = tfrecords.read_split(str(tmp_path), split, metadata)
        np.testing.assert_array_equal(read_images, images)
        np.testing.assert_array_equal(read_labels, labels)
        assert source.size(split) == len(images)
    # the validation pipeline reads the split in its order, as floats in [0, 1]
    validation = read(tmp_path, VAL, batch_size=128)
    assert int(validation.cardinality()) == 4  # 500 images: 3 x 128 + 116, known to Keras
    np.testing.assert_array_equal(as_uint8(validation), sample[VAL][0])


def test_every_image_once_per_epoch_in_a_new_order(tmp_path, small):
    write(tmp_path, small, shards=4)
    train = read(tmp_path, TRAIN, batch_size=100, shuffle_size=64, repeat=True,
                 drop_remainder=True, seed=7)
    images = as_uint8(train.take(6))  # two epochs of 300
    first, second = images[:300], images[300:]
    assert keys(first) == keys(second) == keys(small[TRAIN][0])
    assert not np.array_equal(first, second)
    # a new iterator (Keras opens one to build the model) reads the same epochs
    np.testing.assert_array_equal(as_uint8(train.take(6)), images)


def shard_of(folder, images):
    """The index of the shard each image was read from."""
    owners = {}
    metadata = tfrecords.read_metadata(str(folder))
    paths, _ = tfrecords.split_files(str(folder), metadata, TRAIN)
    for index, path in enumerate(paths):
        for record in tf.data.TFRecordDataset(path):
            owners[tf.io.parse_example(record[None], tfrecords.FEATURES)["image"][0]
                   .numpy()] = index
    return [owners[image.tobytes()] for image in images]


@pytest.mark.parametrize("seed", [3, pytest.param(None, marks=pytest.mark.slow)])
def test_shard_order_differs_between_epochs(tmp_path, small, seed):
    write(tmp_path, small, shards=6)
    # a shuffle buffer of 1 leaves the records in the order the shards give them
    train = read(tmp_path, TRAIN, batch_size=50, shuffle_size=1, repeat=True,
                 drop_remainder=True, seed=seed)
    owners = shard_of(tmp_path, as_uint8(train.take(6 * 4)))  # four epochs
    orders = [tuple(dict.fromkeys(owners[epoch * 300:(epoch + 1) * 300]))
              for epoch in range(4)]
    assert all(sorted(order) == list(range(6)) for order in orders)
    assert len(set(orders)) > 1


@pytest.mark.parametrize("shards, by_file", [(4, True), (1, False), (3, False)])
def test_multi_worker_training_split_covers_the_data_once(tmp_path, small, shards, by_file):
    write(tmp_path, small, shards=shards)
    owners = None
    seen = []
    for pipeline in range(2):
        # 2 pipelines (workers) of 2 replicas each; a global batch of 20 is
        # 10 per pipeline, 5 per replica
        context = tf.distribute.InputContext(2, pipeline, 4)
        slices = read(tmp_path, TRAIN, batch_size=20, shuffle_size=64, seed=1,
                      by_pipeline=True, input_context=context)
        images = as_uint8(slices)
        assert images.shape == (150, 28, 28, 1)  # its half, in slices of 5
        assert all(len(piece) == 5 for piece, _ in slices)
        if by_file:
            owners = set(shard_of(tmp_path, images))
            assert owners == {pipeline, pipeline + 2}  # every other shard file
        seen.append(images)
    assert keys(np.concatenate(seen)) == keys(small[TRAIN][0])


def test_multi_worker_validation_gives_each_replica_its_slice_of_every_batch(tmp_path, small):
    write(tmp_path, small, shards=4)
    images = small[VAL][0]
    pieces = [as_uint8(read(tmp_path, VAL, batch_size=16, input_context=tf.distribute
                            .InputContext(2, pipeline, 2))) for pipeline in range(2)]
    # 40 images: batches of 16, 16 and 8, each split 8 + 8 (4 + 4 at the end)
    np.testing.assert_array_equal(np.concatenate([pieces[0][:8], pieces[1][:8],
                                                  pieces[0][8:16], pieces[1][8:16],
                                                  pieces[0][16:], pieces[1][16:]]), images)


def test_tpu_style_validation_is_exactly_the_batches_counted(tmp_path, small):
    write(tmp_path, small, shards=4)
    # a TPU run's fixed validation: repeated, full batches, cut to a count
    fixed = read(tmp_path, VAL, batch_size=16, repeat=True, drop_remainder=True, batches=2)
    assert int(fixed.cardinality()) == 2  # Keras stops there, mid-execution or not
    np.testing.assert_array_equal(as_uint8(fixed), small[VAL][0][:32])


def test_a_bucket_path_works_through_gfile(small):
    folder = "ram://tfrecords-test/mnist"
    write(folder, small, shards=2, overwrite=True)
    source = sources.resolve_source("tfrecord", config.DATA_NAME, folder)
    assert source.label == "tfrecord (sample)"
    validation = read(folder, VAL, batch_size=16)
    np.testing.assert_array_equal(as_uint8(validation), small[VAL][0])


@pytest.mark.parametrize("origin, label", [("tfds", "tfrecord"),
                                           ("stand-in", "tfrecord (stand-in)"),
                                           ("sample", "tfrecord (sample)")])
def test_the_label_never_passes_a_stand_in_off_as_mnist(tmp_path, small, origin, label):
    write(tmp_path, small, shards=1, origin=origin)
    source = sources.resolve_source("tfrecord", config.DATA_NAME, str(tmp_path))
    assert source.label == label and str(tmp_path) in source.reason


def test_a_finished_folder_is_replaced_only_with_overwrite(tmp_path, small, capsys):
    out = tmp_path / "records"
    write_tfrecords.main(["--data-source", "sample", "--output-dir", str(out),
                          "--shards", "4"])
    with pytest.raises(UserError, match="already holds TFRecords.*--overwrite"):
        write_tfrecords.main(["--data-source", "sample", "--output-dir", str(out)])
    write_tfrecords.main(["--data-source", "sample", "--output-dir", str(out),
                          "--shards", "2", "--overwrite"])
    # the 4-shard files are gone, no temporary is left
    assert sorted(os.listdir(out)) == ["metadata.json"] + [
        f"{split}-0000{i}-of-00002.tfrecord" for split in (VAL, TRAIN) for i in range(2)]
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["made_by"]["command"][-1] == "--overwrite"
    assert "wrote" in capsys.readouterr().out


# write_tfrecords.py --overwrite, stopped on the way: "shard" sends SIGTERM while the
# second new shard is written, "metadata" while the new metadata is written (held until
# it is in place), "kill" SIGKILLs it there
STOPPED_WRITER = r"""
import os, signal, sys
args, sys.argv = sys.argv[1:], ["write_tfrecords.py"]
from pyimagesearch import host
host.prepare_tensorflow()
from pyimagesearch import exits, files, tfrecords
import write_tfrecords
how, calls, real = os.environ["HOW"], [], files.replace_file
def replace_file(path, write, what=None):
    calls.append(path)
    if (how == "shard" and len(calls) == 2) or (how != "shard" and path.endswith(".json")):
        os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGTERM)
    return real(path, write, what)
tfrecords.replace_file = files.replace_file = replace_file
exits.run_main(write_tfrecords.main, args)
"""


@pytest.mark.parametrize("how, status, said, shards", [
    pytest.param("shard", 143, "stopped by SIGTERM; earlier outputs are untouched", 4,
                 marks=pytest.mark.slow),  # 6 s each; the default keeps the kill
    pytest.param("metadata", 143, "stopped by SIGTERM after the run had ended; the new "
                 "TFRecords in", 2, marks=pytest.mark.slow),
    ("kill", -9, None, 4)])
def test_a_writer_stopped_on_the_way_leaves_the_old_set_or_the_new_and_says_which(
        repo, tmp_path, how, status, said, shards):
    import subprocess
    import sys

    out = tmp_path / "records"
    write_tfrecords.main(["--data-source", "sample", "--output-dir", str(out), "--shards", "4"])
    env = {**os.environ, "HOW": how, "PYTHONPATH": f"{repo}{os.pathsep}{repo / 'tools'}"}
    done = subprocess.run(
        [sys.executable, "-c", STOPPED_WRITER, "--data-source", "sample", "--output-dir",
         str(out), "--shards", "2", "--overwrite"], cwd=repo, env=env, capture_output=True,
        text=True, timeout=300)
    assert done.returncode == status, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if ": error: " in line]
    if said:
        assert len(errors) == 1 and said in errors[0], done.stderr[-2000:]
    source = sources.tfrecord_source(str(out))  # every shard whole and as its metadata says
    assert len(source.metadata["splits"][TRAIN]["shards"]) == shards
    assert not [name for name in os.listdir(out) if name.startswith(".")]


# --- bad input: one UserError naming the file --------------------------------

@pytest.fixture
def folder(tmp_path, small):
    """A finished 4-shard folder to break."""
    write(tmp_path / "records", small, shards=4)
    return tmp_path / "records"


def first_shard(folder):
    """The first training shard of `folder`."""
    return folder / "train-00000-of-00004.tfrecord"


def test_a_missing_folder(tmp_path):
    with pytest.raises(UserError, match=f"{tmp_path / 'nope'} does not exist"):
        sources.resolve_source("tfrecord", config.DATA_NAME, str(tmp_path / "nope"))


def test_no_metadata_and_no_shards(tmp_path):
    with pytest.raises(UserError, match="metadata.json is missing.*holds no TFRecords"):
        sources.resolve_source("tfrecord", config.DATA_NAME, str(tmp_path))


def test_shards_without_metadata_are_an_unfinished_write(folder):
    (folder / "metadata.json").unlink()
    with pytest.raises(UserError, match="8 shard files but no metadata, an unfinished"):
        sources.resolve_source("tfrecord", config.DATA_NAME, str(folder))


def test_a_missing_shard(folder):
    first_shard(folder).unlink()
    with pytest.raises(UserError, match=f"{first_shard(folder)} is missing"):
        sources.resolve_source("tfrecord", config.DATA_NAME, str(folder))


def test_a_truncated_shard(folder):
    shard = first_shard(folder)
    os.truncate(shard, shard.stat().st_size // 2)
    with pytest.raises(UserError, match=f"{shard} is .* bytes, metadata.json says .*cut short"):
        sources.resolve_source("tfrecord", config.DATA_NAME, str(folder))


def test_a_corrupt_shard_of_the_right_size(folder):
    shard = first_shard(folder)
    content = bytearray(shard.read_bytes())
    content[len(content) // 2:len(content) // 2 + 16] = b"\xff" * 16
    shard.write_bytes(bytes(content))
    with pytest.raises(UserError, match=f"{shard} is truncated or corrupt at or after record"):
        sources.resolve_source("tfrecord", config.DATA_NAME, str(folder))


def test_a_record_with_the_wrong_shape(folder, small):
    images, labels = small[TRAIN]
    shard = first_shard(folder)
    records = [tfrecords.serialize(image, label) for image, label in zip(images[:75], labels)]
    records[3] = tfrecords.serialize(np.zeros((27, 28, 1), np.uint8), 0)
    with tf.io.TFRecordWriter(str(shard)) as writer:
        for record in records:
            writer.write(record)
    metadata = json.loads((folder / "metadata.json").read_text())
    metadata["splits"][TRAIN]["shards"][0]["bytes"] = shard.stat().st_size
    (folder / "metadata.json").write_text(json.dumps(metadata))
    with pytest.raises(UserError, match=rf"{shard}: record 3 has shape \(27, 28, 1\)"):
        sources.resolve_source("tfrecord", config.DATA_NAME, str(folder))


@pytest.mark.parametrize("text, complaint", [
    ("{not json", r"\(Expecting property name.*\); run tools/write_tfrecords.py again"),
    ('{"format": "something else"}', "not a pyimagesearch-tfrecords metadata file"),
])
def test_corrupt_metadata(folder, text, complaint):
    (folder / "metadata.json").write_text(text)
    with pytest.raises(UserError, match=rf"{folder / 'metadata.json'}.*{complaint}"):
        sources.resolve_source("tfrecord", config.DATA_NAME, str(folder))


@pytest.mark.parametrize("splits", [
    {"train": {"images": "many", "shards": 3}, "test": None},
    {"train": {"images": 1, "shards": [{"file": "a", "records": True}]}},
    {"train": {"images": -1, "shards": [{"file": "a", "records": -1}]}},
    {"train": {"images": 1, "shards": "a"}},
])
def test_metadata_of_the_wrong_types(folder, splits):
    metadata = json.loads((folder / "metadata.json").read_text())
    (folder / "metadata.json").write_text(json.dumps({**metadata, "splits": splits}))
    with pytest.raises(UserError, match="metadata.json: split 'train' lists no shards"):
        sources.resolve_source("tfrecord", config.DATA_NAME, str(folder))


def test_counts_that_disagree_with_the_metadata(folder):
    metadata = json.loads((folder / "metadata.json").read_text())
    metadata["splits"][VAL]["shards"][1]["records"] += 1
    metadata["splits"][VAL]["images"] += 1
    (folder / "metadata.json").write_text(json.dumps(metadata))
    with pytest.raises(UserError, match="test-00001-of-00004.tfrecord holds 10 records, "
                                        "metadata.json says 11"):
        sources.resolve_source("tfrecord", config.DATA_NAME, str(folder))


def test_a_tfrecord_folder_that_is_a_file_or_a_shard_that_is_a_folder(tmp_path):
    (tmp_path / "metadata.json").write_text("{}")
    with pytest.raises(UserError, match="metadata.json is a file, not a folder"):
        sources.resolve_source("tfrecord", "mnist", str(tmp_path / "metadata.json"))
    (tmp_path / "shard").mkdir()
    with pytest.raises(UserError, match="shard is a folder"):
        tfrecords.verify_shard(str(tmp_path / "shard"), {"records": 1}, (28, 28, 1), "")


def test_a_shard_swapped_for_another_of_the_same_size_is_refused(tmp_path):
    images, labels = sources.SampleSource("test").examples("test")
    write(tmp_path, {"train": (images[:40], labels[:40]), "test": (images[:40], labels[:40])})
    first, second = sorted(tmp_path.glob("test-*"))[:2]
    assert first.stat().st_size == second.stat().st_size  # fixed-size records
    first.write_bytes(second.read_bytes())  # the same size, count and shapes
    with pytest.raises(UserError, match=rf"{first.name} is not the shard metadata.json lists "
                                        r"\(its SHA-256 differs\)"):
        sources.resolve_source("tfrecord", "mnist", str(tmp_path))


def test_training_on_a_truncated_shard_is_one_line_and_keeps_earlier_outputs(
        folder, tmp_path, in_process):
    shard = first_shard(folder)
    os.truncate(shard, shard.stat().st_size // 2)
    out = tmp_path / "out"
    out.mkdir()
    earlier = "cpu_data-source-tfrecord.json"  # the run's name says its flag
    (out / earlier).write_text("earlier run")
    done = in_process("train_cpu.py", "--data-source", "tfrecord",
                      "--data-dir", str(folder), "--output-dir", str(out))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("train_cpu.py: error: ") and str(shard) in lines[0]
    assert sorted(os.listdir(out)) == [earlier]
    assert (out / earlier).read_text() == "earlier run"


# --- the real entry points, tiny ------------------------------------------------

def test_a_tiny_training_run_reads_tfrecords(tmp_path, sample):
    write(tmp_path / "records", sample, shards=4)
    train_cpu.main(["--data-source", "tfrecord", "--data-dir", str(tmp_path / "records"),
                    "--epochs", "1", "--steps-per-epoch", "2", "--batch-size", "32",
                    "--output-dir", str(tmp_path / "out")])
    name = "cpu_epochs-1_batch-size-32_steps-per-epoch-2_data-source-tfrecord"
    record = json.loads((tmp_path / "out" / f"{name}.json").read_text())
    assert record["data_source"] == "tfrecord (sample)"
    assert str(tmp_path / "records") in record["data_source_reason"]
    assert record["train_images"] == 4500  # from the metadata
    assert record["validation_images"] == record["validation_split_images"] == 500
    assert np.isfinite(record["val_loss"][0])


@pytest.mark.slow  # the default suite's budget (docs/development.md); CI runs it
def test_a_training_run_reads_the_metadata_once(tmp_path, sample, monkeypatch):
    write(tmp_path / "records", sample, shards=2)
    reads = []
    read_metadata = tfrecords.read_metadata

    def counted(folder):
        reads.append(folder)
        return read_metadata(folder)

    monkeypatch.setattr(tfrecords, "read_metadata", counted)
    train_cpu.main(["--data-source", "tfrecord", "--data-dir", str(tmp_path / "records"),
                    "--epochs", "1", "--steps-per-epoch", "1", "--batch-size", "32",
                    "--output-dir", str(tmp_path / "out")])
    assert reads == [str(tmp_path / "records")]  # on gs://, each read is a round trip


def test_an_overwrite_writes_beside_the_earlier_shards_and_removes_them_last(tmp_path, small):
    write(tmp_path, small, shards=2)
    before = sorted(os.listdir(tmp_path))
    metadata = write(tmp_path, small, shards=2, overwrite=True)
    names = [shard["file"] for shard in metadata["splits"][TRAIN]["shards"]]
    assert all(".tfrecord" in name and name not in before for name in names)  # stamped
    assert sorted(os.listdir(tmp_path)) == sorted(["metadata.json"] + names + [
        shard["file"] for shard in metadata["splits"][VAL]["shards"]])
    third = write(tmp_path, small, shards=2, overwrite=True)  # the plain names are free again
    assert third["splits"][TRAIN]["shards"][0]["file"] == "train-00000-of-00002.tfrecord"


def test_on_one_host_the_strategy_is_not_asked_to_shard_a_tfrecord_run(tmp_path, small):
    # its rewrite would only drop the batch count, with a warning in every run
    import dataclasses

    from pyimagesearch.data import get_data
    from pyimagesearch.plan import Settings, make_plan, with_validation

    write(tmp_path, small, shards=2)
    source = sources.resolve_source("tfrecord", config.DATA_NAME, str(tmp_path))
    plan = make_plan("cpu", Settings(batch_size=20), 1)
    plan = with_validation(dataclasses.replace(plan, strategy=tf.distribute.get_strategy()),
                           source)
    off = tf.data.experimental.AutoShardPolicy.OFF
    for split, shuffle in ((TRAIN, 64), (VAL, None)):
        dataset = get_data(config.DATA_NAME, split, 20, shuffle, plan=plan)
        assert dataset.options().experimental_distribute.auto_shard_policy == off
