"""get_data through the real tfds.load path (mocked data), the sample, and `auto`.

A prepared tfds dataset that cannot be read, or lists no splits, is one line.
"""
import json

import numpy as np
import pytest
import tensorflow_datasets as tfds

import train_cpu

from pyimagesearch import config, data

from pyimagesearch import sources
from pyimagesearch.pipeline import Reading, make_pipeline
from pyimagesearch.errors import UserError

# the network probe's answers, as resolve_source gets them
SILENT = {"verdict": sources.SILENT, "via": "storage.googleapis.com:443"}
REFUSED = {"verdict": sources.REFUSED, "via": "storage.googleapis.com:443"}


@pytest.fixture(autouse=True)
def _fresh_caches():
    sources.split_sample.cache_clear()
    yield
    sources.split_sample.cache_clear()


def test_get_data_through_tfds_load(tmp_path):
    with tfds.testing.mock_data(num_examples=40):
        ds = data.get_data(config.DATA_NAME, config.TRAIN_FLAG, batchSize=16,
                           shuffleSize=64,
                           source=sources.TfdsSource("tfds' mock data", str(tmp_path)))
        batches = list(ds)
    assert [len(x) for x, _ in batches] == [16, 16, 8]
    images, targets = batches[0]
    assert images.shape == (16, 28, 28, 1) and images.dtype == "float32"
    np.testing.assert_array_equal(images, targets)  # input is its own target
    assert 0.0 <= float(np.min(images)) and float(np.max(images)) <= 1.0


def test_sample_split_is_stratified_deterministic_and_disjoint():
    train = sources.SampleSource().images(config.TRAIN_FLAG)
    val = sources.SampleSource().images(config.VALIDATION_FLAG)
    assert train.shape == (4500, 28, 28, 1) and val.shape == (500, 28, 28, 1)
    assert train.dtype == np.uint8 and val.max() > 200  # real pixel values
    train_rows = {row.tobytes() for row in train}
    assert not any(row.tobytes() in train_rows for row in val)
    sources.split_sample.cache_clear()
    np.testing.assert_array_equal(
        sources.split_sample()[config.VALIDATION_FLAG][0], val)


def test_sample_validation_holds_every_digit_in_proportion():
    pixels, labels = sources.read_sample()
    val = sources.SampleSource().images(config.VALIDATION_FLAG)
    index = {row.tobytes(): label for row, label in zip(pixels, labels)}
    val_labels = np.array([index[row.tobytes()] for row in val])
    counts = np.bincount(val_labels, minlength=10)
    expected = np.round(np.bincount(labels, minlength=10) * 0.1)
    np.testing.assert_array_equal(counts, expected)


def test_training_pipeline_shuffles_repeats_and_keeps_full_batches():
    kwargs = dict(dataName=config.DATA_NAME, split=config.TRAIN_FLAG, batchSize=1000,
                  source="sample", repeat=True, drop_remainder=True)
    shuffled = data.get_data(shuffleSize=4500, seed=3, **kwargs)
    ordered = data.get_data(**kwargs)
    first = [x.numpy() for x, _ in shuffled.take(6)]  # 6,000 > 4,500: repeats
    assert all(batch.shape[0] == 1000 for batch in first)
    plain = next(iter(ordered))[0].numpy()
    assert not np.array_equal(first[0], plain)


def test_validation_pipeline_keeps_order():
    val = sources.SampleSource().images(config.VALIDATION_FLAG)
    ds = data.get_data(config.DATA_NAME, config.VALIDATION_FLAG, batchSize=128,
                       source="sample")
    first = next(iter(ds))[0].numpy()
    np.testing.assert_allclose(first, val[:128] / 255.0, atol=1e-7)
    assert sum(len(x) for x, _ in ds) == 500


def test_auto_offline_picks_the_sample_without_calling_tfds_load(tmp_path, monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("tfds.load must not run when offline and unprepared")

    monkeypatch.setattr(tfds, "load", no_load)
    monkeypatch.setattr(sources, "probe_network", lambda *a, **k: SILENT)
    source = sources.resolve_source("auto", config.DATA_NAME, str(tmp_path))
    assert source.name == "sample"
    assert "did not answer within 3 s" in source.reason


def test_tfds_source_offline_and_unprepared_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "probe_network", lambda *a, **k: REFUSED)
    with pytest.raises(UserError, match="cannot be reached.*--data-source sample"):
        sources.resolve_source("tfds", config.DATA_NAME, str(tmp_path))


def test_a_slow_network_does_not_refuse_an_explicit_tfds(tmp_path, monkeypatch):
    # no answer within 3 s is not a no: tfds, asked for, gets its chance
    monkeypatch.setattr(sources, "probe_network", lambda *a, **k: SILENT)
    source = sources.resolve_source("tfds", config.DATA_NAME, str(tmp_path))
    assert source.name == "tfds" and "tfds downloads it anyway" in source.reason
    auto = sources.resolve_source("auto", config.DATA_NAME, str(tmp_path),
                                  network=lambda: REFUSED)  # a cluster's shared answer
    assert auto.name == "sample" and "cannot be reached" in auto.reason


def test_network_probe_reports_a_closed_port_as_refused():
    # port 9 on loopback: nothing listens there, the connection is refused
    assert sources.probe_network(("127.0.0.1", 9), timeout=1.0, environ={}) == {
        "verdict": sources.REFUSED, "via": "127.0.0.1:9"}


class _StandInProxy:
    """An HTTP proxy on loopback that answers every CONNECT with `reply` (None: never)."""

    def __init__(self, reply):
        import socket
        import threading

        self.reply, self.asked = reply, []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.asked.append(client.recv(4096).decode())
            if self.reply is not None:
                client.sendall(self.reply)
                client.close()
            else:
                self.silent = client  # held open, unanswered

    def close(self):
        self.server.close()


@pytest.mark.parametrize("reply, verdict", [
    (b"HTTP/1.1 200 Connection established\r\n\r\n", sources.ANSWERS),
    (b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n", sources.REFUSED),
    (b"", sources.REFUSED),
    (None, sources.SILENT)])
def test_the_probe_goes_through_the_proxy_tfds_would_use(reply, verdict):
    proxy = _StandInProxy(reply)
    try:
        found = sources.probe_network(timeout=0.5, environ={
            "HTTPS_PROXY": f"http://reader:s3cret@127.0.0.1:{proxy.port}"})
    finally:
        proxy.close()
    assert found == {"verdict": verdict, "via": f"the proxy http://127.0.0.1:{proxy.port}"}
    assert proxy.asked[0].startswith("CONNECT storage.googleapis.com:443 HTTP/1.1\r\n")
    assert "Proxy-Authorization: Basic cmVhZGVyOnMzY3JldA==" in proxy.asked[0]


def test_no_proxy_sends_the_probe_straight_to_the_host():
    found = sources.probe_network(("127.0.0.1", 9), timeout=1.0, environ={
        "https_proxy": "http://127.0.0.1:9", "no_proxy": "localhost,127.0.0.1"})
    assert found == {"verdict": sources.REFUSED, "via": "127.0.0.1:9"}


def test_a_data_dir_not_there_yet_is_not_prepared_and_not_created(tmp_path, monkeypatch):
    # as in tfds, which creates its data dir when it downloads
    missing = str(tmp_path / "not-yet")
    monkeypatch.setenv("TFDS_DATA_DIR", missing)
    monkeypatch.setattr(sources, "probe_network", lambda *a, **k: REFUSED)
    assert sources.resolve_data_dir(None) == missing
    assert sources.resolve_source("sample", "mnist", missing).name == "sample"
    assert sources.resolve_source("auto", "mnist", missing).name == "sample"
    with pytest.raises(UserError, match="cannot be reached"):
        sources.resolve_source("tfds", "mnist", missing)
    assert not (tmp_path / "not-yet").exists()


def test_corrupt_sample_file_is_a_user_error(tmp_path, monkeypatch):
    broken = tmp_path / "mnist_5k.csv.gz"
    broken.write_bytes(b"\x1f\x8b\x08 this is not gzip")
    monkeypatch.setattr(sources, "sample_path", lambda: str(broken))
    with pytest.raises(UserError, match="cannot read the MNIST sample"):
        sources.SampleSource().images(config.TRAIN_FLAG)


def test_a_stand_in_dataset_is_labelled_as_one(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "tfds_prepared", lambda name, data_dir: True)
    real = sources.resolve_source("tfds", "mnist", str(tmp_path))
    assert "stand-in" not in real.reason and real.label == "tfds"
    (tmp_path / "mnist").mkdir()
    (tmp_path / "mnist" / sources.STAND_IN_MARKER).write_text("tiled sample")
    source = sources.resolve_source("auto", "mnist", str(tmp_path))
    assert source.name == "tfds" and "stand-in" in source.reason
    assert source.label == "stand-in"  # what the run record and Table 1 show


def test_a_stand_in_in_tfds_default_data_dir_is_found(tmp_path, monkeypatch):
    # no data dir given: tfds' own default is where the marker must be looked for
    class Builder:
        data_dir = str(tmp_path / "default" / "mnist" / "3.0.1")

    monkeypatch.setattr(tfds, "builder", lambda name, data_dir=None: Builder())
    monkeypatch.setattr(sources, "tfds_prepared", lambda name, data_dir: True)
    assert sources.resolve_source("auto", "mnist", None).label == "tfds"
    (tmp_path / "default" / "mnist").mkdir(parents=True)
    (tmp_path / "default" / "mnist" / sources.STAND_IN_MARKER).write_text("tiled sample")
    assert sources.resolve_source("auto", "mnist", None).label == "stand-in"


def test_training_data_is_reshuffled_every_epoch():
    train = sources.SampleSource().images(config.TRAIN_FLAG)
    dataset = make_pipeline(train, Reading(batch_size=4500, shuffle_size=4500,
                                           repeat=True, drop_remainder=True, seed=5))
    first, second = [(images.numpy() * 255).round().astype(np.uint8)
                     for images, _ in dataset.take(2)]
    keys = {row.tobytes() for row in train}
    # each epoch is the whole split once, in a new order
    assert {row.tobytes() for row in first} == keys == {row.tobytes() for row in second}
    assert not np.array_equal(first, second)


@pytest.mark.parametrize("replicas", [3, 4])
def test_each_replica_gets_its_slice_of_every_global_batch(replicas):
    import tensorflow as tf

    train = sources.SampleSource().images(config.TRAIN_FLAG)
    reading = Reading(batch_size=12, shuffle_size=100, repeat=True,
                      drop_remainder=True, seed=1)
    whole = [images.numpy() for images, _ in make_pipeline(train, reading).take(3)]
    for pipelines in (1, replicas):
        local = replicas // pipelines
        for pipeline in range(pipelines):
            context = tf.distribute.InputContext(pipelines, pipeline, replicas)
            pieces = [images.numpy() for images, _ in make_pipeline(
                train, reading, input_context=context).take(3 * local)]
            per = 12 // replicas
            for step in range(3):
                for offset in range(local):
                    replica = pipeline * local + offset
                    np.testing.assert_array_equal(
                        pieces[step * local + offset],
                        whole[step][replica * per:(replica + 1) * per])


def test_a_broken_prepared_dataset_is_one_line(tmp_path):
    info = tmp_path / "mnist" / "3.0.1" / "dataset_info.json"
    info.parent.mkdir(parents=True)
    info.write_text("{not json")
    with pytest.raises(UserError, match=r"^cannot read the prepared mnist in .*prepare it "
                                        "again"):
        sources.tfds_prepared("mnist", str(tmp_path))


def test_a_prepared_dataset_without_its_splits_is_one_line(tmp_path):
    # a dataset_info.json that parses but lists no split: tfds.load raised
    # KeyError ("`splits` is empty") from inside, a traceback
    info = tmp_path / "tfds" / "mnist" / "3.0.1" / "dataset_info.json"
    info.parent.mkdir(parents=True)
    info.write_text(json.dumps({"name": "mnist", "version": "3.0.1", "splits": []}))
    with pytest.raises(UserError, match=r"^the prepared mnist in .*tfds has no readable train "
                                        r"split \(Trying to access `splits\['train'\]` but "
                                        r"`splits` is empty.*\); delete its mnist folder"):
        train_cpu.main(["--data-source", "tfds", "--data-dir", str(tmp_path / "tfds"),
                        "--epochs", "1", "--steps-per-epoch", "1",
                        "--output-dir", str(tmp_path / "out")])
    assert not list((tmp_path / "out").glob("*.png"))  # no figure, of any name
