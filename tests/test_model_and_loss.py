"""The article's autoencoder and its loss: shapes, size, scaling, saving."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import pyimagesearch.outputs  # noqa: F401  (registers the classes with Keras)
from pyimagesearch.autoencoder import AutoEncoder
from pyimagesearch.loss import MSELoss


def test_autoencoder_shapes_and_parameter_count():
    model = AutoEncoder()
    images = tf.random.uniform((2, 28, 28, 1))
    out = model(images)
    assert out.shape == (2, 28, 28, 1)
    assert model.encoder(images).shape == (2, 7, 7, 8)  # the bottleneck
    assert model.count_params() == 3217
    assert float(tf.reduce_min(out)) >= 0.0 and float(tf.reduce_max(out)) <= 1.0


def test_mse_loss_matches_keras_mse_and_divides_by_scale():
    rng = np.random.default_rng(0)
    real = rng.random((4, 28, 28, 1)).astype("float32")
    pred = rng.random((4, 28, 28, 1)).astype("float32")
    expected = float(np.mean((real - pred) ** 2))
    assert float(MSELoss(scale=1)(real, pred)) == pytest.approx(expected, rel=1e-5)
    assert float(MSELoss(scale=4)(real, pred)) == pytest.approx(expected / 4, rel=1e-5)
    assert MSELoss(scale=1)(real, pred).shape == ()  # a scalar, not per image


def test_mse_loss_rejects_non_positive_scale():
    with pytest.raises(ValueError):
        MSELoss(scale=0)


def test_saved_model_loads_back_with_its_loss(tmp_path):
    model = AutoEncoder()
    model.compile(loss=MSELoss(scale=2), optimizer="adam")
    images = tf.random.uniform((3, 28, 28, 1), seed=1)
    before = model.predict(images, verbose=0)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, AutoEncoder)
    np.testing.assert_allclose(loaded.predict(images, verbose=0), before, atol=1e-6)
    assert loaded.loss.scale == 2
