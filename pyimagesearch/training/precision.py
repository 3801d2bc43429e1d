"""The two speed levers TensorFlow's performance guide puts first: mixed precision and XLA.

Mixed precision computes in 16 bits where it is safe and keeps the variables
in float32. `mixed_float16` is for NVIDIA GPUs with tensor cores (Volta and
later); its narrow range needs loss scaling (Keras' `LossScaleOptimizer`,
which multiplies the loss before the gradients and divides them after).
`mixed_bfloat16` has float32's range and needs none: it is what TPUs compute
in natively, and what recent CPUs (AVX512-BF16, AMX) and Ampere-or-later GPUs
support. The model's last layer and the loss stay float32 (see AutoEncoder and
loss.per_image_mse), so the saved model's output is float32.

XLA (`--jit-compile`) compiles the train step into fused kernels.
"""
import keras

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")


def set_precision(name):
    """Set Keras' global dtype policy; call it before the model is built."""
    keras.mixed_precision.set_global_policy(name)


def with_loss_scaling(optimizer, name):
    """Wrap `optimizer` in a LossScaleOptimizer where float16 needs it.

    Keras would wrap it inside `compile` too; wrapping here makes it the same
    optimizer for `fit` and the custom loop, which scales its loss itself.
    """
    if name == "mixed_float16":
        return ReplicasAgreeLossScaleOptimizer(optimizer)
    return optimizer


@keras.saving.register_keras_serializable(package="pyimagesearch")
class ReplicasAgreeLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """Keras' LossScaleOptimizer, with every replica taking the same skip decision.

    Keras 3.15 decides whether gradients overflowed from each replica's own
    gradients before they are all-reduced: under MirroredStrategy from the
    first replica's alone (so another replica's inf reaches the update and
    stays in Adam's state), under MultiWorkerMirroredStrategy per replica (so
    one worker enters the all-reduce inside `apply` while another skips it,
    and both hang). Here the replicas all-reduce their "finite" flags first.
    """

    def check_finite(self, grads):
        finite = super().check_finite(grads)
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return finite
        overflowed = context.all_reduce(tf.distribute.ReduceOp.SUM,
                                        tf.cast(tf.logical_not(finite), tf.float32))
        return tf.equal(overflowed, 0.0)
