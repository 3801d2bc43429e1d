"""The article's loss: mean squared error divided by a scale, and the per-image error under it.

Why the scale. Under a `tf.distribute` strategy of N replicas, Keras runs the
loss once per replica on 1/N of the global batch and sums the replicas'
gradients. tf.keras 2 (the article's) divided a compiled loss by N itself, so
the article's `MSELoss(scale=1)` was right there; Keras 3 leaves a callable
that returns a scalar alone, so on tf.distribute it must be `scale=N`, or the
gradients and the printed loss are N times too large
(tests/test_loss_scaling.py). On Keras' JAX backend one jitted step sees the
whole global batch: `scale=1` is right again (tools/jax_loss_step.py).
"""
import keras
from keras import ops


def per_image_mse(real, pred):
    """Mean squared error of each image over its pixels, in float32: shape (batch,)."""
    squared = ops.square(ops.cast(real, "float32") - ops.cast(pred, "float32"))
    return ops.mean(squared, axis=tuple(range(1, len(squared.shape))))


@keras.saving.register_keras_serializable(package="pyimagesearch")
class MSELoss:
    """Scalar mean of the per-pixel squared error, times 1/scale."""

    def __init__(self, scale=1):
        if scale <= 0:
            raise ValueError(f"scale must be positive, got {scale}")
        self.scale = scale

    def __call__(self, real, pred):
        # the mean of the per-image means: the mean over every pixel of the batch, as
        # the article's reduce_mean of a NONE-reduced MeanSquaredError
        return ops.mean(per_image_mse(real, pred)) * (1.0 / self.scale)

    def get_config(self):
        return {"scale": self.scale}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
