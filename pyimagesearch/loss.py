"""The article's loss: mean squared error, divided by a scale.

Why the scale matters. Under a `tf.distribute` strategy with N replicas, Keras
runs the loss once per replica on 1/N of the global batch and *sums* the
replicas' gradients. Keras divides its own built-in losses (`"mse"`) by N for
you. A loss that already returns a scalar, like this one, is left alone
(checked with Keras 3.15, see tests/test_loss_scaling.py), so it must be
divided by N itself: `MSELoss(scale=strategy.num_replicas_in_sync)`. With
`scale=1`, as in the article's TPU listing, every update is N times too large
and the loss Keras reports is N times too high.
"""
import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="pyimagesearch")
class MSELoss:
    """Scalar mean of the per-pixel squared error, times 1/scale."""

    def __init__(self, scale=1):
        if scale <= 0:
            raise ValueError(f"scale must be positive, got {scale}")
        self.scale = scale
        # reduction=None keeps one value per image (mean over the last axis
        # only); the mean over the whole replica batch is taken below
        self._mse = keras.losses.MeanSquaredError(reduction=None)

    def __call__(self, real, pred):
        per_image = self._mse(real, pred)
        return tf.reduce_mean(per_image) * (1.0 / self.scale)

    def get_config(self):
        return {"scale": self.scale}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
