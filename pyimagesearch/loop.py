"""--loop custom: the explicit form of what `model.fit` does under a strategy.

Two things the article's "Losses" section is about, in plain sight:
- each replica computes a loss per image and averages it over the GLOBAL batch
  (`tf.nn.compute_average_loss(..., global_batch_size=...)`), so the replicas'
  gradients, which the optimizer sums, add up to the gradient of the mean;
- `strategy.run` runs one step on every replica.
The loop (epochs, callbacks, history, validation) serves both of Keras'
backends; the compiled step is `TensorFlowSteps` here, or on JAX
jax_loop.JaxSteps. tests/test_loss_scaling.py holds it to fit's weights.
"""
import time

import keras
import tensorflow as tf

from pyimagesearch.loss import per_image_mse


def fit_custom(model, trainDs, valDs, plan, verbose=True):
    """Train `model` (compiled in the strategy's scope) as `plan` says; a fit-style history.

    The callbacks get the hooks fit calls: train, epoch and test begin and end,
    and a batch begin and end per execution of several steps, with fit's step
    indices. A resumed run goes on from its very step (`plan.resume_step`).
    """
    if plan.backend == "jax":
        from pyimagesearch.jax_loop import JaxSteps  # jax is installed on that route only
        steps = JaxSteps(model, plan.strategy, plan.global_batch_size)
    else:
        steps = TensorFlowSteps(model, plan.strategy, plan.global_batch_size, plan.jit_compile)
    train, validation = steps.iterator(trainDs), steps.batches(valDs)
    epochs, per_epoch = plan.settings.epochs, plan.steps_per_epoch
    callbacks = keras.callbacks.CallbackList(list(plan.callbacks), model=model, epochs=epochs,
                                             steps=per_epoch, verbose=0)
    history = {"loss": [], "val_loss": []}
    first_epoch, first_step = divmod(plan.resume_step, per_epoch)
    model.stop_training = False
    callbacks.on_train_begin()
    try:
        for epoch in range(first_epoch, epochs):
            callbacks.on_epoch_begin(epoch)
            if verbose:  # the lines fit prints where its output is not a terminal
                print(f"Epoch {epoch + 1}/{epochs}", flush=True)
            start, done = time.perf_counter(), 0
            count = per_epoch - (first_step if epoch == first_epoch else 0)
            total = 0.0
            while done < count and not model.stop_training:
                size = min(plan.steps_per_execution, count - done)
                callbacks.on_train_batch_begin(done)
                part = steps.train(train, size)
                total, done = total + part, done + size
                callbacks.on_train_batch_end(done - 1, {"loss": part / size})
            history["loss"].append(total / count)
            callbacks.on_test_begin()
            sums = [steps.validate(batch) for batch in validation]
            history["val_loss"].append(sum(s for s, _ in sums) / max(sum(n for _, n in sums), 1.0))
            logs = {key: values[-1] for key, values in history.items()}
            callbacks.on_epoch_end(epoch, logs)
            if verbose:
                print(f"{count}/{count} - {time.perf_counter() - start:.1f}s - loss: "
                      f"{logs['loss']:.4f} - val_loss: {logs['val_loss']:.4f}", flush=True)
            if model.stop_training:
                break
    finally:
        callbacks.on_train_end()  # even on an error: temporary folders, writers
    return history


class TensorFlowSteps:
    """The custom loop's compiled steps under a tf.distribute strategy.

    What the loop asks of them (jax_loop.JaxSteps answers the same): an iterator
    over the training batches, the validation batches, `train` (count steps;
    their summed loss) and `validate` (a batch's summed per-image error, count).
    """

    def __init__(self, model, strategy, global_batch_size, jit_compile):
        self.strategy, optimizer = strategy, model.optimizer
        with strategy.scope():
            if not optimizer.built:  # its slots now, not inside strategy.run
                optimizer.build(model.trainable_variables)
            # each replica adds up its shares of the steps' global means; reading it
            # sums the replicas: one all-reduce per call, as Keras' loss tracker does
            loss_sum = tf.Variable(0.0, trainable=False,
                                   synchronization=tf.VariableSynchronization.ON_READ,
                                   aggregation=tf.VariableAggregation.SUM)

        @tf.function(jit_compile=jit_compile)
        def train_step(images, targets):
            with tf.GradientTape() as tape:
                pred = model(images, training=True)
                # the sum over this replica's images divided by the GLOBAL batch
                loss = tf.nn.compute_average_loss(per_image_mse(targets, pred),
                                                  global_batch_size=global_batch_size)
                scaled = optimizer.scale_loss(loss)  # a no-op but under mixed_float16
            gradients = tape.gradient(scaled, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            loss_sum.assign_add(loss)

        @tf.function
        def train_steps(iterator, count):
            loss_sum.assign(0.0)
            for _ in tf.range(count):
                strategy.run(train_step, args=next(iterator))
            return loss_sum.read_value()

        def val_step(images, targets):
            errors = per_image_mse(targets, model(images, training=False))
            return tf.reduce_sum(errors), tf.cast(tf.size(errors), tf.float32)

        @tf.function
        def val_batch(batch):
            sums, counts = strategy.run(val_step, args=batch)
            return (strategy.reduce(tf.distribute.ReduceOp.SUM, sums, axis=None),
                    strategy.reduce(tf.distribute.ReduceOp.SUM, counts, axis=None))

        self._train_steps, self._val_batch = train_steps, val_batch

    def batches(self, dataset):
        """`dataset` split between the replicas, unless it already is."""
        if isinstance(dataset, tf.data.Dataset):
            return self.strategy.experimental_distribute_dataset(dataset)
        return dataset

    def iterator(self, dataset):
        return iter(self.batches(dataset))

    def train(self, iterator, count):
        return float(self._train_steps(iterator, tf.constant(count)))

    def validate(self, batch):
        error_sum, count = self._val_batch(batch)
        return float(error_sum), float(count)
