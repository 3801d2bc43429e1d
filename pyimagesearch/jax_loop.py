"""--loop custom's step on Keras' JAX backend: `jax.value_and_grad`, jitted, data-parallel.

loop.py drives it as it drives TensorFlow's step. The step is written in Keras
3's stateless API, as Keras' own JAX trainer writes its `train_step`
(keras/src/backend/jax/trainer.py): the loss is the per-image error summed over
the global batch and divided by its size, what `tf.nn.compute_average_loss`
gives each replica on TensorFlow. One jitted function sees the whole global
batch, split between the DataParallel's devices by its sharding, so every
device applies the gradient of the mean over all the images. The variables
stay Keras': read before a call of several steps, written back after it, so
the callbacks see this step's weights. Under mixed_float16 the optimizer's
`scale_loss` and `stateless_apply` scale the loss and skip an overflowed step,
decided on the whole batch's gradient.
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
        """Build the model (as fit's first batch does), its optimizer, the jitted steps."""
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
        """`training=` for the model's call, if its `call` takes it (stateless_call passes none)."""
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
