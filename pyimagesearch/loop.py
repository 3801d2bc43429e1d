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
               initial_step=0, jit_compile=False, verbose=True):
    """Train `model` (built and compiled in `strategy`'s scope); return fit-style history.

    `trainDs` is repeated (an epoch is `steps_per_epoch` steps); `valDs` is
    finite and read to its end after every epoch. Either may be a
    tf.data.Dataset, which is distributed here, or already distributed
    (`strategy.distribute_datasets_from_function`). Keras callbacks get the
    hooks `fit` would call: train begin and end, epoch begin and end (with
    the logs), test begin, and a batch begin and end per execution, given
    its first and last step as `fit` gives them. Epochs start at
    `initial_epoch` (a resumed run), as in `fit`, and the first of them
    after its `initial_step` steps (a run resumed mid-epoch; its step
    indices then count from there). `jit_compile` compiles each replica's step with XLA.
    Under mixed_float16 the optimizer is a LossScaleOptimizer: the loss is
    scaled up before the gradients are taken, and `apply_gradients` scales
    them back down (and skips a step whose gradients overflowed).
    """
    _build_optimizer(model, strategy)
    train_steps = _train_steps_function(model, strategy, global_batch_size, jit_compile)
    val_batch = _val_batch_function(model, strategy)
    train_iterator = iter(_distributed(strategy, trainDs))
    val_batches = _distributed(strategy, valDs)
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
            steps = steps_per_epoch - (initial_step if epoch == initial_epoch else 0)
            history["loss"].append(_train_epoch(model, callbacks, train_steps, train_iterator,
                                                steps, steps_per_execution) / steps)
            callbacks.on_test_begin()
            history["val_loss"].append(_validation_loss(val_batch, val_batches))
            callbacks.on_epoch_end(epoch, {"loss": history["loss"][-1],
                                           "val_loss": history["val_loss"][-1]})
            if verbose:
                print(f"{steps}/{steps} - "
                      f"{time.perf_counter() - start:.1f}s - loss: {history['loss'][-1]:.4f}"
                      f" - val_loss: {history['val_loss'][-1]:.4f}", flush=True)
            if model.stop_training:
                break
    finally:
        callbacks.on_train_end()  # even on an error: temporary folders, writers
    return history


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


def _train_epoch(model, callbacks, train_steps, train_iterator, steps, steps_per_execution):
    """Run an epoch's `steps` steps, with fit's batch hooks; the sum of their losses."""
    total, step = 0.0, 0
    for count in execution_sizes(steps, steps_per_execution):
        # the step indices fit passes: first and last step of the call
        callbacks.on_train_batch_begin(step)
        part = float(train_steps(train_iterator, tf.constant(count)))
        total += part
        step += count
        callbacks.on_train_batch_end(step - 1, {"loss": part / count})
        if model.stop_training:  # keras.callbacks.TerminateOnNaN, say
            break
    return total


def _validation_loss(val_batch, val_batches):
    """The mean per-image error over every validation batch (0 if there are none)."""
    error_sum, count = 0.0, 0.0
    for batch in val_batches:
        batch_sum, batch_count = val_batch(batch)
        error_sum, count = error_sum + float(batch_sum), count + float(batch_count)
    return error_sum / max(count, 1.0)


def _distributed(strategy, dataset):
    """`dataset` split between the replicas, unless it already is."""
    if isinstance(dataset, tf.data.Dataset):
        return strategy.experimental_distribute_dataset(dataset)
    return dataset


def custom_loop(model, trainDs, valDs, plan, run):
    """`fit_custom` as the training scripts call it: the settings of `plan`, the callbacks of `run`.

    A resumed run (`run.start` steps done) goes on from that very step.
    """
    epoch, step = divmod(run.start, plan.steps_per_epoch)
    return fit_custom(model, plan.strategy, trainDs, valDs, plan.settings.epochs,
                      plan.steps_per_epoch, plan.global_batch_size,
                      steps_per_execution=plan.steps_per_execution, callbacks=run.callbacks,
                      initial_epoch=epoch, initial_step=step,
                      jit_compile=plan.settings.jit_compile)
