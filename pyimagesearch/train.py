"""The article's training listing, once, for train_cpu.py, train_gpu.py and train_tpu.py.

The scripts differ in the strategy they build; `run` does the rest in the
article's order: the data, then model, loss and optimizer in the strategy's
scope, training, prediction and the input-vs-reconstruction figure. It also
writes a run record (JSON) and the trained model, and replaces earlier
outputs only when all are written.
"""
import dataclasses
import datetime
import math
import sys

import keras
import tensorflow as tf

from pyimagesearch import config
from pyimagesearch.autoencoder import IMAGE_SHAPE, AutoEncoder
from pyimagesearch.callbacks import make_callbacks
from pyimagesearch.cluster import check_workers_agree
from pyimagesearch.data import (Reading, figure_digits, resolve_data_dir, resolve_source,
                                usable_images)
from pyimagesearch.errors import UserError
from pyimagesearch.loop import fit_custom
from pyimagesearch.loss import MSELoss
from pyimagesearch.outputs import run_record, save_outputs
from pyimagesearch.plan import plan_run
from pyimagesearch.precision import set_precision, with_loss_scaling


def run(settings, strategy, device, rehearsal=False, cluster=None):
    """Train the autoencoder under `strategy` and write figure, record and model.

    `cluster` (from TF_CONFIG) makes this one worker of several: training
    runs the custom loop, and only the chief writes into --output-dir.
    """
    started = datetime.datetime.now(datetime.timezone.utc)
    keras.utils.set_random_seed(settings.seed)  # python, numpy and TensorFlow seeds

    # how many replicas the strategy trains on decides the global batch
    numAcc = strategy.num_replicas_in_sync
    print(f"[INFO] number of accelerators: {numAcc}")
    plan = plan_run(device, settings, numAcc, rehearsal, cluster)
    check_levers(plan, strategy)
    print(plan.describe())

    source = resolve_source(settings.data_source, config.DATA_NAME,
                            resolve_data_dir(settings.data_dir))
    print(f"[INFO] data source: {source.label} ({source.reason})")
    # the same digits on every device, in compare.py
    testIm = figure_digits(source.images(config.VALIDATION_FLAG))
    # timing, backup (--backup-dir), TensorBoard (--logdir), profiler; a
    # backup says how many steps are trained already, so the data skips them
    check_workers_agree(cluster, agreed_facts(plan, source, strategy))
    callbacks = make_callbacks(plan, source, testIm)
    start = callbacks.resume(cluster)
    print("[INFO] loading the training and validation datasets...")
    trainDs = training_data(strategy, plan, source, skip=start)
    valDs, validation = validation_data(strategy, plan, source)

    with strategy.scope():
        # model, loss and optimizer must be created inside the scope so that
        # their variables are mirrored on every replica
        print(f"[INFO] initializing the model ({settings.precision}"
              + (", XLA" if settings.jit_compile else "") + ")...")
        set_precision(settings.precision)  # before the model's layers are made
        model = AutoEncoder()
        # divide by the replica count: Keras sums the replicas' gradients
        mseLoss = MSELoss(scale=numAcc)
        optimizer = with_loss_scaling(make_optimizer(settings.optimizer, plan.learning_rate),
                                      settings.precision)
        model.compile(loss=mseLoss, optimizer=optimizer,
                      steps_per_execution=plan.steps_per_execution,
                      jit_compile=settings.jit_compile)
        model.build((None, *IMAGE_SHAPE))  # a backup is restored into it
        optimizer.build(model.trainable_variables)  # ...and into the optimizer's state
        print(f"[INFO] training the autoencoder ({plan.loop} loop)...")
        history = train_model(model, strategy, plan, source, trainDs, valDs, callbacks)

    # a plain call on this process's copy of the model: no collective needed
    print("[INFO] evaluating the model...")
    predIm = model(testIm, training=False).numpy()

    record = run_record(plan, strategy, source, validation, started=started,
                        history=callbacks.history(history), timer=callbacks.timer,
                        resumed_from_step=start)
    save_outputs(plan, record, model, testIm, predIm)
    callbacks.finish()
    return record


def agreed_facts(plan, source, strategy):
    """What every worker of a cluster must share: devices, data and training settings."""
    settings = plan.settings
    return {"devices per worker": len(strategy.extended.worker_devices),
            "data source": source.label,
            "training images": source.size(config.TRAIN_FLAG),
            "validation images": source.size(config.VALIDATION_FLAG),
            "global batch": plan.global_batch_size, "steps per epoch": plan.steps_per_epoch,
            "epochs": settings.epochs, "seed": settings.seed, "optimizer": settings.optimizer,
            "learning rate": plan.learning_rate, "precision": settings.precision,
            "XLA": settings.jit_compile, "loop": plan.loop}


def distributed_input(strategy, build):
    """`build(input_context)` as the strategy's input.

    In one process `build(None)` gives whole global batches and Keras (or
    the custom loop) splits each between the replicas. Across worker
    processes every worker must build its own replicas' slices of the same
    global batches, which `distribute_datasets_from_function` asks for.
    """
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return strategy.distribute_datasets_from_function(build)
    return build(None)


def training_data(strategy, plan, source, skip=0):
    """The repeated, shuffled training batches, after the first `skip` of them.

    The stream is seeded and the same on every worker, so a run resumed
    after `skip` steps sees exactly the batches an uninterrupted run would.
    """
    if plan.global_batch_size > source.size(config.TRAIN_FLAG):
        raise UserError(f"a global batch of {plan.global_batch_size:,} images is more "
                        f"than the {source.size(config.TRAIN_FLAG):,} training images "
                        f"of {source.label}; lower --batch-size")
    reading = Reading(plan.global_batch_size, config.SHUFFLE_SIZE, seed=plan.settings.seed,
                      repeat=True, drop_remainder=True, skip=skip)
    return distributed_input(strategy, lambda context: source.dataset(
        config.TRAIN_FLAG, reading, context))


@dataclasses.dataclass(frozen=True)
class Validation:
    """What val_loss is the mean over."""

    steps: int | None     # batches per evaluation; None: one pass over the split
    images: int           # images val_loss averages
    split_images: int     # images in the validation split


def validation_data(strategy, plan, source):
    """The validation batches, and the `Validation` they make up.

    On CPU and GPU it is one pass over the split, every batch split evenly
    between the replicas: a split that is not a multiple of the replica count
    leaves out its last few images (498 of 500 on 3 replicas) rather than
    give a replica an empty batch. The TPU configuration needs full batches:
    the split is repeated and cut to config.TPU_VALIDATION_STEPS batches when
    the batch is config.TPU_BATCH_SIZE, else to `len // global batch`; never
    more than one pass, never fewer than 1 batch (on the 500-digit sample one
    batch of 1024 repeats digits). The cut is made in the dataset, not with
    Keras' validation_steps, because Keras rounds those up to whole multiples
    of steps_per_execution.
    """
    count = source.size(config.VALIDATION_FLAG)
    if plan.fixed_validation:
        batches = max(1, count // plan.global_batch_size)
        if plan.global_batch_size == config.TPU_BATCH_SIZE:
            batches = max(1, min(config.TPU_VALIDATION_STEPS, batches))
        validation = Validation(batches, batches * plan.global_batch_size, count)
        reading = Reading(plan.global_batch_size, repeat=True, drop_remainder=True,
                          batches=batches)
    else:
        validation = Validation(None, usable_images(count, plan.replicas), count)
        reading = Reading(plan.global_batch_size, images=validation.images)
    if validation.images != count:
        print(f"[INFO] val_loss is the mean over {validation.images:,} images of the "
              f"{count:,} in the validation split "
              + ("(repeated to full batches)" if validation.images > count else
                 f"(a multiple of the {plan.replicas} replicas)"))
    valDs = distributed_input(strategy, lambda context: source.dataset(
        config.VALIDATION_FLAG, reading, context))
    return valDs, validation


def make_optimizer(name, learning_rate):
    """A fresh Keras optimizer; create it inside the strategy's scope."""
    if name == "adam":
        return keras.optimizers.Adam(learning_rate=learning_rate)
    if name == "sgd":
        return keras.optimizers.SGD(learning_rate=learning_rate)
    raise UserError(f"unknown optimizer {name!r}; choose adam or sgd")


def train_model(model, strategy, plan, source, trainDs, valDs, callbacks):
    """model.fit, or the custom loop that does the same explicitly; the history.

    A run resumed in the middle of an epoch first trains the rest of that
    epoch. `fit` cannot start mid-epoch, so it trains that part in a call of
    its own, then goes on from the next epoch with the batches after it.
    A loss that is not finite stops the run before anything is written.
    """
    settings = plan.settings
    epoch, step = divmod(callbacks.start, plan.steps_per_epoch)
    if plan.loop == "custom":
        history = fit_custom(model, strategy, trainDs, valDs, settings.epochs,
                             plan.steps_per_epoch, plan.global_batch_size,
                             steps_per_execution=plan.steps_per_execution,
                             callbacks=callbacks.callbacks, initial_epoch=epoch,
                             initial_step=step, jit_compile=settings.jit_compile)
    else:
        def fit(data, first, epochs, steps):
            """model.fit from epoch `first`, with this run's validation and callbacks."""
            # one line per epoch where the output is not a terminal (a log file)
            return model.fit(data, epochs=epochs, initial_epoch=first, steps_per_epoch=steps,
                             validation_data=valDs, callbacks=callbacks.callbacks,
                             shuffle=False, verbose=1 if sys.stdout.isatty() else 2).history

        history = {"loss": [], "val_loss": []}
        if step:
            print(f"[INFO] finishing epoch {epoch + 1}: {plan.steps_per_epoch - step} of its "
                  f"{plan.steps_per_epoch} steps are left")
            rest = fit(trainDs, epoch, epoch + 1, plan.steps_per_epoch - step)
            history = {key: rest[key] for key in history}
            epoch += 1
            trainDs = training_data(strategy, plan, source, skip=epoch * plan.steps_per_epoch)
        if not model.stop_training:  # also with no epoch left: fit restores the backup
            more = fit(trainDs, epoch, settings.epochs, plan.steps_per_epoch)
            history = {key: history[key] + more.get(key, []) for key in history}
    losses = history["loss"] + history["val_loss"]
    if not all(math.isfinite(loss) for loss in losses):
        raise UserError(f"training diverged (loss {history['loss'][-1]}, val_loss "
                        f"{history['val_loss'][-1]}); lower --learning-rate. Nothing "
                        "was written: earlier outputs are untouched")
    return history


def check_levers(plan, strategy):
    """Refuse --jit-compile where it cannot work."""
    if not plan.settings.jit_compile:
        return
    if plan.device == "tpu" and not plan.rehearsal:
        raise UserError("--jit-compile is for CPUs and GPUs: a TPU compiles every step "
                        "with XLA anyway")
    if plan.rehearsal and strategy.extended.worker_devices[1:]:
        # XLA compiles the step for CPU:0 and then cannot reach the variables
        # of the other logical CPUs ("Trying to access resource ... located
        # in device CPU:1 from device CPU:0"); real GPUs each compile their own
        raise UserError("--jit-compile cannot rehearse on several logical CPU devices "
                        "in one process; use --rehearse 1, or leave out --jit-compile")
