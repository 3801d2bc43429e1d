"""The custom loop's step on Keras' JAX backend: `jax.value_and_grad`, jitted, data-parallel.

`--loop custom` on train_tpu.py's JAX route. loop.py drives it (epochs,
callbacks, history, validation) as it drives TensorFlow's step; here is the
step itself, in Keras 3's stateless API, as Keras' own JAX trainer writes
its `train_step` (keras/src/backend/jax/trainer.py, Keras 3.15.1:
`compute_loss_and_updates` under `jax.value_and_grad`, then
`optimizer.stateless_apply`):

- the loss is the article's per-image error (`loss.per_image_mse`, the
  values `MSELoss` averages) with its reduction spelled out: the SUM over
  the images of the global batch divided by the GLOBAL batch size, what
  `tf.nn.compute_average_loss` gives each replica on TensorFlow;
- one jitted function sees the whole global batch, split between the
  DataParallel's devices by its sharding (each batch is placed as
  keras.distribution places fit's: `jax.make_array_from_process_local_data`
  with the distribution's data layout, keras/src/backend/jax/
  distribution_lib.py). XLA adds the devices' partial sums, so every device
  applies the gradient of the mean over all the images: the same SGD step
  as one device on the same batch (tools/jax_loss_step.py --loop custom,
  tests/test_jax_loop.py);
- the variables stay Keras': read before a call of `count` steps, written
  back after it, so the callbacks (backups, TensorBoard, the figure's
  digits) see this step's weights, as they do under `fit`.

Under mixed_float16 the optimizer is a LossScaleOptimizer: `scale_loss`
(in a StatelessScope over the optimizer's variables, as Keras' trainer does)
multiplies the loss before the gradient, and its `stateless_apply` divides
the gradient back and skips a step that overflowed. The skip is decided on
the gradient of the whole global batch, so every device takes the same one.
"""
import inspect

import jax
import keras
import numpy as np
from keras import ops

from pyimagesearch.loss import per_image_mse


class JaxSteps:
    """The compiled steps loop.fit_custom asks for, on Keras' JAX backend."""

    def __init__(self, model, strategy, global_batch_size):
        self.model, self.strategy = model, strategy
        self.global_batch_size = global_batch_size
        self._train_step = self._error_sum = None  # compiled at the first batch

    def _compile(self, images):
        """Build the model for `images` (as fit's first batch does), its optimizer, the steps."""
        model = self.model
        with self.strategy.scope():  # the optimizer's slots replicated like the weights
            if not model.built:
                model.build((None, *images.shape[1:]))
            if not model.optimizer.built:
                model.optimizer.build(model.trainable_variables)
        # the new state keeps the variables' placement (replicated), as Keras' trainer asks
        shardings = [[v.value.sharding for v in variables] for variables in self._variables()]
        self._train_step = jax.jit(self._step, out_shardings=(None, shardings))
        self._error_sum = jax.jit(self._errors)

    def _variables(self):
        """The model's trainable and other variables, and the optimizer's."""
        model = self.model
        return (model.trainable_variables, model.non_trainable_variables,
                model.optimizer.variables)

    def _loss(self, trainable, non_trainable, optimizer_values, images, targets):
        """The loss of the global batch (scaled under float16), and what the step needs."""
        pred, non_trainable = self.model.stateless_call(trainable, non_trainable, images,
                                                        **self._training(True))
        # per image (NONE), summed (SUM), divided by the GLOBAL batch: the mean over it
        loss = ops.sum(per_image_mse(targets, pred)) / self.global_batch_size
        optimizer = self.model.optimizer
        with keras.StatelessScope(state_mapping=list(zip(optimizer.variables,
                                                         optimizer_values))):
            scaled = optimizer.scale_loss(loss)  # a no-op unless mixed_float16
        return scaled, (loss, non_trainable)

    def _step(self, state, images, targets):
        """One SGD (or Adam) step, stateless: the loss, and the new state."""
        trainable, non_trainable, optimizer_values = state
        gradient = jax.value_and_grad(self._loss, has_aux=True)
        (_, (loss, non_trainable)), grads = gradient(trainable, non_trainable,
                                                     optimizer_values, images, targets)
        trainable, optimizer_values = self.model.optimizer.stateless_apply(
            optimizer_values, grads, trainable)
        return loss, [trainable, non_trainable, optimizer_values]

    def _training(self, training):
        """`training=` for the model's call, if its `call` takes it (stateless_call calls it bare)."""
        takes = "training" in inspect.signature(self.model.call).parameters
        return {"training": training} if takes else {}

    def _errors(self, trainable, non_trainable, images, targets):
        """A validation batch's summed per-image error."""
        pred, _ = self.model.stateless_call(trainable, non_trainable, images,
                                            **self._training(False))
        return ops.sum(per_image_mse(targets, pred))

    def _placed(self, batch):
        """(images, targets) split along the batch between the devices, as fit's are."""
        return tuple(jax.make_array_from_process_local_data(
            self.strategy.get_data_layout(part.shape).backend_layout, part)
            for part in batch)

    def iterator(self, dataset):
        """An iterator over `dataset`'s global batches (a tf.data.Dataset, or pairs of arrays)."""
        return iter(dataset.as_numpy_iterator() if hasattr(dataset, "as_numpy_iterator")
                    else dataset)

    def batches(self, dataset):
        """`dataset`'s validation batches, to read once per epoch."""
        return dataset

    def train(self, iterator, count):
        """Train `count` steps from `iterator`: the sum of their losses, a float.

        The losses are added on the devices and read once, after the last
        step: one transfer to the host per call, as TensorFlow's loop does.
        """
        total, state = 0.0, None
        for _ in range(count):
            batch = self._placed(next(iterator))
            if self._train_step is None:
                self._compile(batch[0])
            if state is None:
                state = [[v.value for v in variables] for variables in self._variables()]
            loss, state = self._train_step(state, *batch)
            total = total + loss
        for variables, values in zip(self._variables(), state):
            for variable, value in zip(variables, values):
                variable.assign(value)
        return float(total)

    def validate(self, batch):
        """A validation batch's summed per-image error and image count, as floats."""
        images, targets = (np.asarray(part) for part in batch)  # tf.data gives tensors
        if self._error_sum is None:
            self._compile(images)
        model = self.model
        error_sum = self._error_sum([v.value for v in model.trainable_variables],
                                    [v.value for v in model.non_trainable_variables],
                                    *self._placed((images, targets)))
        return float(error_sum), float(len(images))
