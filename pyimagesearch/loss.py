"""The article's loss: mean squared error, divided by a scale, defined once.

`per_image_mse` is the objective: the mean squared error of each image over
its pixels. `MSELoss` (what `model.compile` gets) averages it over the
replica's batch and divides by `scale`; the custom loop (`loop.py`) averages
the same per-image values over the global batch with
`tf.nn.compute_average_loss`. Both train the same number.

Why the scale. Under a `tf.distribute` strategy with N replicas, Keras runs
the loss once per replica on 1/N of the global batch and *sums* the
replicas' gradients, so each replica's loss must be divided by N. tf.keras 2
(TensorFlow 2.15 and earlier, the article's) divided a compiled loss by N
itself when its reduction was AUTO or SUM_OVER_BATCH_SIZE (not SUM or NONE),
and gave a plain callable like this one AUTO: the article's
`MSELoss(scale=1)` was right there. Keras 3 still divides its own losses
(`"mse"`) but leaves a callable that returns a scalar, like this one, alone
(Keras 3.15, tests/test_loss_scaling.py): under Keras 3 it must be
`MSELoss(scale=strategy.num_replicas_in_sync)`. Otherwise the gradients are N
times too large (SGD steps N times too far; Adam, which divides each step by
the gradient's running size, nearly cancels the factor), and the loss Keras
prints is N times the error too: Keras multiplies the loss it logs by N, to
undo the division it expects to have made (tools/check_listings.py measures
2.000 on 2 replicas, 8.000 on 8). With scale=N it prints the error itself.

Keras 3 on JAX (train_tpu.py's route on Colab's and Kaggle's TPUs) is
different: under `keras.distribution.DataParallel` one jitted step sees the
whole global batch, split across the devices by its sharding, so the mean
over it is already the mean over every replica's images: the article's
`MSELoss(scale=1)` is right there (tools/jax_loss_step.py and
tests/test_jax_route.py: the same SGD step as one device, on 2 and 8 JAX CPU
devices).
"""
import keras
from keras import ops


def per_image_mse(real, pred):
    """Mean squared error of each image over all its pixels: shape (batch,).

    In `keras.ops`, so the same function runs inside a TensorFlow step and a
    jitted JAX step; computed in float32 whatever the model's compute
    precision, so a mixed-precision model is trained on the same objective.
    """
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
        # every image has as many pixels, so the mean of the per-image means
        # is the mean over all pixels of the batch (the article's
        # reduce_mean of a NONE-reduced MeanSquaredError: the same number)
        return ops.mean(per_image_mse(real, pred)) * (1.0 / self.scale)

    def get_config(self):
        return {"scale": self.scale}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
