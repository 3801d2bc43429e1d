"""A custom training loop: the explicit form of what `model.fit` does under a strategy.

`fit` hides two things the article's "Losses" section is about. Here they are
in plain sight:

- each replica computes a loss *per image* and averages it over the
  **global** batch with `tf.nn.compute_average_loss(..., global_batch_size=...)`,
  so that the replicas' gradients, which the optimizer sums, add up to the
  gradient of the mean over the whole global batch;
- `strategy.run` runs one step on every replica; each replica adds up its
  share of the loss, and the replicas' sums are added up once per call, for
  the log.

The objective is `loss.per_image_mse`, the one `MSELoss` averages for
`fit`. Selected with `--loop custom` on every training script; tests check
that it gives the same weights and losses as `fit`
(tests/test_loss_scaling.py).

The loop itself (epochs, callbacks, history, validation) is one for both of
Keras' backends that train_tpu.py takes; what differs is the compiled step:
`TensorFlowSteps` here, `jax_loop.JaxSteps` on Keras' JAX backend (a
`jax.value_and_grad` of the same sum over the global batch), loaded only there.
"""
import time

import keras
import tensorflow as tf

from pyimagesearch.loss import per_image_mse


def execution_sizes(steps_per_epoch, steps_per_execution):
    """Steps of each call into the compiled function, adding up to the epoch."""
    full, rest = divmod(steps_per_epoch, steps_per_execution)
    return [steps_per_execution] * full + ([rest] if rest else [])


def fit_custom(model, strategy, trainDs, valDs, epochs, steps_per_epoch,
               global_batch_size, steps_per_execution=1, callbacks=(), initial_epoch=0,
               initial_step=0, jit_compile=False, verbose=True, backend=None):
    """Train `model` (built and compiled in `strategy`'s scope); return fit-style history.

    `trainDs` is repeated (an epoch is `steps_per_epoch` steps); `valDs` is
    finite and read to its end after every epoch. On TensorFlow either may
    be a tf.data.Dataset, which is distributed here, or already distributed
    (`strategy.distribute_datasets_from_function`); on JAX (`backend`, Keras'
    own unless given) a dataset of global batches, which jax_loop.py splits
    between the DataParallel's devices. Keras callbacks get the
    hooks `fit` would call: train begin and end, epoch begin and end (with
    the logs), test begin, and a batch begin and end per execution, given
    its first and last step as `fit` gives them. Epochs start at
    `initial_epoch` (a resumed run), as in `fit`, and the first of them
    after its `initial_step` steps (a run resumed mid-epoch; its step
    indices then count from there). `jit_compile` compiles each replica's
    step with XLA (JAX jits every step anyway).
    Under mixed_float16 the optimizer is a LossScaleOptimizer: the loss is
    scaled up before the gradients are taken, and applying them scales
    them back down (and skips a step whose gradients overflowed).
    """
    steps = _steps(model, strategy, global_batch_size, jit_compile,
                   backend or keras.backend.backend())
    train_iterator = steps.iterator(trainDs)
    val_batches = steps.batches(valDs)
    callbacks = keras.callbacks.CallbackList(list(callbacks), model=model, epochs=epochs,
                                             steps=steps_per_epoch, verbose=0)
    history = {"loss": [], "val_loss": []}
    model.stop_training = False
    callbacks.on_train_begin()
    try:
        for epoch in range(initial_epoch, epochs):
            callbacks.on_epoch_begin(epoch)
            if verbose:  # the lines fit prints where its output is not a terminal
                print(f"Epoch {epoch + 1}/{epochs}", flush=True)
            start = time.perf_counter()
            count = steps_per_epoch - (initial_step if epoch == initial_epoch else 0)
            history["loss"].append(_train_epoch(model, callbacks, steps, train_iterator,
                                                count, steps_per_execution) / count)
            callbacks.on_test_begin()
            history["val_loss"].append(_validation_loss(steps, val_batches))
            callbacks.on_epoch_end(epoch, {"loss": history["loss"][-1],
                                           "val_loss": history["val_loss"][-1]})
            if verbose:
                print(f"{count}/{count} - "
                      f"{time.perf_counter() - start:.1f}s - loss: {history['loss'][-1]:.4f}"
                      f" - val_loss: {history['val_loss'][-1]:.4f}", flush=True)
            if model.stop_training:
                break
    finally:
        callbacks.on_train_end()  # even on an error: temporary folders, writers
    return history


def _steps(model, strategy, global_batch_size, jit_compile, backend):
    """The compiled steps of `backend`: TensorFlowSteps, or jax_loop.JaxSteps."""
    if backend == "jax":
        # lazy: jax is installed on the JAX route only (requirements-jax-tpu.txt), and
        # TensorFlow's route, on a Cloud TPU VM, has none
        from pyimagesearch.jax_loop import JaxSteps
        return JaxSteps(model, strategy, global_batch_size)
    return TensorFlowSteps(model, strategy, global_batch_size, jit_compile)


class TensorFlowSteps:
    """The custom loop's compiled steps under a tf.distribute strategy.

    What the loop asks of them (jax_loop.JaxSteps answers the same): an
    iterator over the training batches, the validation batches, `train`
    (count steps; their summed loss) and `validate` (a batch's summed
    per-image error and its image count).
    """

    def __init__(self, model, strategy, global_batch_size, jit_compile):
        self.strategy = strategy
        _build_optimizer(model, strategy)
        self._train_steps = _train_steps_function(model, strategy, global_batch_size,
                                                  jit_compile)
        self._val_batch = _val_batch_function(model, strategy)

    def iterator(self, dataset):
        """An iterator over `dataset`, split between the replicas."""
        return iter(_distributed(self.strategy, dataset))

    def batches(self, dataset):
        """`dataset` split between the replicas, to read once per epoch."""
        return _distributed(self.strategy, dataset)

    def train(self, iterator, count):
        """Train `count` steps from `iterator`: the sum of their losses, a float."""
        return float(self._train_steps(iterator, tf.constant(count)))

    def validate(self, batch):
        """A validation batch's summed per-image error and image count, as floats."""
        error_sum, count = self._val_batch(batch)
        return float(error_sum), float(count)


def _build_optimizer(model, strategy):
    """Create the optimizer's slots for the model's weights, unless they exist."""
    optimizer = model.optimizer
    if not optimizer.built:
        with strategy.scope():
            # create the optimizer's slots now, in cross-replica context, not
            # lazily inside strategy.run where new variables are not allowed
            optimizer.build(model.trainable_variables)


def _train_steps_function(model, strategy, global_batch_size, jit_compile):
    """The tf.function that runs `count` training steps on every replica; their loss summed."""
    optimizer = model.optimizer
    with strategy.scope():
        # each replica adds up its own shares of the steps' global means; a
        # read in cross-replica context sums the replicas: one all-reduce
        # per call, as Keras' loss tracker does, not one per step
        loss_sum = tf.Variable(0.0, trainable=False, name="custom_loop_loss_sum",
                               synchronization=tf.VariableSynchronization.ON_READ,
                               aggregation=tf.VariableAggregation.SUM)

    @tf.function(jit_compile=jit_compile)
    def train_step(images, targets):
        with tf.GradientTape() as tape:
            pred = model(images, training=True)
            # sum over this replica's images divided by the GLOBAL batch
            loss = tf.nn.compute_average_loss(
                per_image_mse(targets, pred), global_batch_size=global_batch_size)
            # a no-op unless the optimizer scales losses (mixed_float16)
            scaled = optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        loss_sum.assign_add(loss)  # this replica's share of the step's mean

    @tf.function
    def train_steps(iterator, count):
        loss_sum.assign(0.0)
        for _ in tf.range(count):
            strategy.run(train_step, args=next(iterator))
        return loss_sum.read_value()

    return train_steps


def _val_batch_function(model, strategy):
    """The tf.function that gives a validation batch's summed per-image error and image count."""
    def val_step(images, targets):
        errors = per_image_mse(targets, model(images, training=False))
        return tf.reduce_sum(errors), tf.cast(tf.size(errors), tf.float32)

    @tf.function
    def val_batch(batch):
        sums, counts = strategy.run(val_step, args=batch)
        return (strategy.reduce(tf.distribute.ReduceOp.SUM, sums, axis=None),
                strategy.reduce(tf.distribute.ReduceOp.SUM, counts, axis=None))

    return val_batch


def _train_epoch(model, callbacks, steps, train_iterator, count, steps_per_execution):
    """Run an epoch's `count` steps, with fit's batch hooks; the sum of their losses."""
    total, step = 0.0, 0
    for size in execution_sizes(count, steps_per_execution):
        # the step indices fit passes: first and last step of the call
        callbacks.on_train_batch_begin(step)
        part = steps.train(train_iterator, size)
        total += part
        step += size
        callbacks.on_train_batch_end(step - 1, {"loss": part / size})
        if model.stop_training:  # keras.callbacks.TerminateOnNaN, say
            break
    return total


def _validation_loss(steps, val_batches):
    """The mean per-image error over every validation batch (0 if there are none)."""
    error_sum, count = 0.0, 0.0
    for batch in val_batches:
        batch_sum, batch_count = steps.validate(batch)
        error_sum, count = error_sum + batch_sum, count + batch_count
    return error_sum / max(count, 1.0)


def _distributed(strategy, dataset):
    """`dataset` split between the replicas, unless it already is."""
    if isinstance(dataset, tf.data.Dataset):
        return strategy.experimental_distribute_dataset(dataset)
    return dataset


def custom_loop(model, trainDs, valDs, plan, run):
    """`fit_custom` as the training scripts call it: the settings of `plan`, the callbacks of `run`.

    A resumed run (`run.start` steps done) goes on from that very step. The
    steps are the plan's backend's: TensorFlow's, or on train_tpu.py's JAX
    route jax_loop.py's.
    """
    epoch, step = divmod(run.start, plan.steps_per_epoch)
    return fit_custom(model, plan.strategy, trainDs, valDs, plan.settings.epochs,
                      plan.steps_per_epoch, plan.global_batch_size,
                      steps_per_execution=plan.steps_per_execution, callbacks=run.callbacks,
                      initial_epoch=epoch, initial_step=step,
                      jit_compile=plan.settings.jit_compile, backend=plan.backend)
