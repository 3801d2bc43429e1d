"""Loss scaling, proven on logical CPU devices with plain SGD.

SGD moves the weights by exactly learning_rate x gradient, so a gradient
that is N times too large shows as an update N times too large (Adam would
normalise it away). Each test takes one step from the same initial weights
on the same global batch.
"""
import keras
import numpy as np
import pytest
import tensorflow as tf

from pyimagesearch.autoencoder import AutoEncoder
from pyimagesearch.training.loop import fit_custom
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
        fit_custom(model, strategy, _dataset(images), _dataset(images).take(1),
                   epochs=1, steps_per_epoch=1, global_batch_size=GLOBAL_BATCH,
                   verbose=False)
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
