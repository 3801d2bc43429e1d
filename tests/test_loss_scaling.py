"""Loss scaling, proven on logical CPU devices with plain SGD.

SGD moves the weights by exactly learning_rate x gradient, so a gradient
that is N times too large shows as an update N times too large (Adam would
normalise it away). Each test takes one step from the same initial weights
on the same global batch.
"""
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

from pyimagesearch.autoencoder import AutoEncoder
from pyimagesearch.loop import fit_custom
from pyimagesearch.loss import MSELoss
from pyimagesearch.strategies import rehearsal as rehearsal_strategy

GLOBAL_BATCH = 32
LEARNING_RATE = 10.0  # large, so that the update dwarfs float round-off


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(7).random((GLOBAL_BATCH, 28, 28, 1)).astype("float32")


def _dataset(images):
    return tf.data.Dataset.from_tensor_slices((images, images)).batch(GLOBAL_BATCH).repeat()


def one_step(strategy, loss, images, loop="fit"):
    """Initial weights and the update of one SGD step under `strategy`."""
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = AutoEncoder()
        model.compile(loss=loss, optimizer=keras.optimizers.SGD(LEARNING_RATE))
    before = [w.numpy() for w in model.trainable_weights]
    if loop == "fit":
        model.fit(_dataset(images), epochs=1, steps_per_epoch=1, shuffle=False, verbose=0)
    else:
        plan = types.SimpleNamespace(
            backend="tensorflow", strategy=strategy, global_batch_size=GLOBAL_BATCH,
            jit_compile=False, settings=types.SimpleNamespace(epochs=1), steps_per_epoch=1,
            steps_per_execution=1, callbacks=(), resume_step=0)
        fit_custom(model, _dataset(images), _dataset(images).take(1), plan, verbose=False)
    after = [w.numpy() for w in model.trainable_weights]
    return before, [a - b for a, b in zip(after, before)]


@pytest.fixture(scope="module")
def single_device(images):
    return one_step(tf.distribute.OneDeviceStrategy("/cpu:0"), MSELoss(scale=1), images)


@pytest.mark.parametrize("replicas", [2, 4])
def test_scaled_loss_on_n_replicas_equals_one_device(images, single_device, replicas):
    before, update = one_step(rehearsal_strategy(replicas), MSELoss(scale=replicas), images)
    for start, reference in zip(before, single_device[0]):
        np.testing.assert_array_equal(start, reference)  # same starting point
    for step, reference in zip(update, single_device[1]):
        np.testing.assert_allclose(step, reference, rtol=1e-4, atol=1e-7)
    assert max(np.abs(step).max() for step in update) > 1e-3  # a real step


def test_unscaled_loss_on_two_replicas_doubles_the_update(images, single_device):
    # the article's MSELoss(scale=1) under a 2-replica strategy
    _, update = one_step(rehearsal_strategy(2), MSELoss(scale=1), images)
    for step, reference in zip(update, single_device[1]):
        np.testing.assert_allclose(step, 2 * reference, rtol=1e-4, atol=1e-7)


def test_builtin_mse_is_scaled_by_keras_itself(images, single_device):
    _, update = one_step(rehearsal_strategy(2), "mse", images)
    for step, reference in zip(update, single_device[1]):
        np.testing.assert_allclose(step, reference, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("replicas", [1, 2])
def test_custom_loop_equals_fit(images, single_device, replicas):
    strategy = (tf.distribute.OneDeviceStrategy("/cpu:0") if replicas == 1
                else rehearsal_strategy(replicas))
    _, update = one_step(strategy, MSELoss(scale=replicas), images, loop="custom")
    for step, reference in zip(update, single_device[1]):
        np.testing.assert_allclose(step, reference, rtol=1e-4, atol=1e-7)


def test_under_the_tpu_first_reduction_the_record_still_holds_the_global_mean(monkeypatch):
    # Keras 3 reduces a TPU's step outputs with "first": the progress bar
    # shows core 0's running loss. Forced here on a 2-device rehearsal, where
    # replica 0's half of the batch has a loss of 0 and replica 1's of 16:
    # the batch logs say 0, the epoch's history and evaluate say 8, the mean
    from keras.src.backend.tensorflow import trainer

    reduce = trainer.reduce_per_replica

    def first(values, strategy, reduction):
        return reduce(values, strategy, "first" if reduction == "auto" else reduction)

    monkeypatch.setattr(trainer, "reduce_per_replica", first)
    strategy = rehearsal_strategy(2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(
            1, kernel_initializer="zeros", bias_initializer="zeros")])
        model.compile(loss=MSELoss(scale=2), optimizer=keras.optimizers.SGD(0.0))
    x = np.ones((4, 1), "float32")
    y = np.array([[0.0], [0.0], [4.0], [4.0]], "float32")  # replica 0: 0, 0; replica 1: 4, 4
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    batch_losses = []
    seen = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: batch_losses.append(float(logs["loss"])))
    history = model.fit(data.repeat(), epochs=1, steps_per_epoch=1, validation_data=data,
                        callbacks=[seen], verbose=0).history
    assert batch_losses == [0.0]  # core 0's alone: what a TPU's progress bar shows
    assert history["loss"] == [8.0] and history["val_loss"] == [8.0]  # what the record keeps
    assert model.evaluate(data, verbose=0) == 8.0
