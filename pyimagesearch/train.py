"""The article's training listing, once, for train_cpu.py, train_gpu.py and train_tpu.py.

The scripts differ in the strategy they build; `run` does the rest in the
article's order: data, model and loss in the strategy's scope, fit, then the
input-vs-reconstruction figure. It also writes a run record (JSON) and the
trained model, and replaces earlier outputs only when all are written.
"""
import dataclasses
import datetime
import os
import platform
import sys
import tempfile

import keras
import tensorflow as tf

from pyimagesearch import config
from pyimagesearch.autoencoder import IMAGE_SHAPE, AutoEncoder
from pyimagesearch.callbacks import make_callbacks
from pyimagesearch.cluster import peer_loss_reported
from pyimagesearch.data import (figure_digits, get_data, load_images, resolve_data_dir,
                                resolve_source, split_size, usable_images)
from pyimagesearch.errors import UserError
from pyimagesearch.loop import fit_custom
from pyimagesearch.loss import MSELoss
from pyimagesearch.precision import set_precision, with_loss_scaling
from pyimagesearch.files import join, write_json
from pyimagesearch.outputs import StagedOutputs, figure_path, reconstruction_figure


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """The numbers one run trains with, derived from the flags and the strategy."""

    device: str               # cpu, gpu or tpu: the configuration being run
    name: str                 # stem of the output files
    rehearsal: bool           # True when logical CPU devices stand in for the device
    replicas: int             # strategy.num_replicas_in_sync
    global_batch_size: int    # images per step, over all replicas
    steps_per_epoch: int
    steps_per_execution: int  # train steps per call into the compiled function
    fixed_validation: bool    # TPU style: repeated data, full batches, fixed steps


def plan_run(device, args, replicas, rehearsal=False):
    """Work out the global batch and steps for `device` on `replicas` replicas."""
    if device == "tpu":
        # the article's TPU batch is global: 1024 over 8 cores is 128 per core
        global_batch = args.batch_size
        if global_batch % replicas:
            raise UserError(f"--batch-size {global_batch} does not split evenly "
                            f"over {replicas} replicas")
    else:
        # CPU and GPU: the batch is per replica, the global batch grows with them
        global_batch = args.batch_size * replicas
    if args.steps_per_epoch:
        steps = args.steps_per_epoch
    elif device == "tpu" and global_batch == config.TPU_BATCH_SIZE:
        steps = config.TPU_STEPS_PER_EPOCH  # the article's 58, or the reader's value
    else:
        steps = config.TRAIN_IMAGES // global_batch
    if steps < 1:
        raise UserError(f"a global batch of {global_batch} is larger than an epoch "
                        f"of {config.TRAIN_IMAGES} images; lower --batch-size or "
                        "set --steps-per-epoch")
    stem = os.path.splitext(os.path.basename(figure_path(device)))[0]
    name = f"{stem}_rehearsal" if rehearsal else stem
    # a TPU runs the whole epoch per call: every call is a blocking round trip
    execution = steps if device == "tpu" else steps_per_execution(steps)
    return RunPlan(device, name, rehearsal, replicas, global_batch, steps,
                   execution, fixed_validation=device == "tpu")


def steps_per_execution(steps, limit=config.STEPS_PER_EXECUTION):
    """The largest divisor of `steps` up to `limit`.

    Keras runs whole executions, so one that does not divide the epoch would
    train extra steps (58 steps at 8 per execution train 64).
    """
    return max(n for n in range(1, min(limit, steps) + 1) if steps % n == 0)


def scaled_learning_rate(learning_rate, scaling, global_batch_size,
                         base_batch_size=config.BATCH_SIZE):
    """Scale a learning rate tuned for `base_batch_size` to a larger global batch.

    A batch k times larger gives k times fewer updates per epoch; "linear"
    multiplies the rate by k, "sqrt" by the square root of k (gentler, often
    the better match for Adam), "none" leaves it.
    """
    factor = global_batch_size / base_batch_size
    if scaling == "linear":
        return learning_rate * factor
    if scaling == "sqrt":
        return learning_rate * factor ** 0.5
    if scaling == "none":
        return learning_rate
    raise UserError(f"unknown learning-rate scaling {scaling!r}")


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


def training_data(strategy, plan, source, data_dir, seed):
    """The repeated, shuffled training batches."""
    return distributed_input(strategy, lambda context: get_data(
        config.DATA_NAME, config.TRAIN_FLAG, batchSize=plan.global_batch_size,
        shuffleSize=config.SHUFFLE_SIZE, source=source, data_dir=data_dir,
        repeat=True, drop_remainder=True, seed=seed, input_context=context))


def validation_data(strategy, plan, source, data_dir):
    """The validation batches, their count (None: one pass) and how many images they hold.

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
    count = split_size(config.DATA_NAME, config.VALIDATION_FLAG, source, data_dir)
    if plan.fixed_validation:
        batches = max(1, count // plan.global_batch_size)
        if plan.global_batch_size == config.TPU_BATCH_SIZE:
            batches = max(1, min(config.TPU_VALIDATION_STEPS, batches))
        images = batches * plan.global_batch_size
    else:
        batches, images = None, usable_images(count, plan.replicas)
    valDs = distributed_input(strategy, lambda context: get_data(
        config.DATA_NAME, config.VALIDATION_FLAG, batchSize=plan.global_batch_size,
        source=source, data_dir=data_dir, repeat=plan.fixed_validation,
        drop_remainder=plan.fixed_validation, batches=batches, replicas=plan.replicas,
        input_context=context))
    return valDs, batches, images


def make_optimizer(name, learning_rate):
    """A fresh Keras optimizer; create it inside the strategy's scope."""
    if name == "adam":
        return keras.optimizers.Adam(learning_rate=learning_rate)
    if name == "sgd":
        return keras.optimizers.SGD(learning_rate=learning_rate)
    raise UserError(f"unknown optimizer {name!r}; choose adam or sgd")


def machine_info():
    """A short description of the machine, for the run record."""
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as handle:
            model = next((line.split(":", 1)[1].strip() for line in handle
                          if line.startswith("model name")), model)
    except OSError:
        pass
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"platform": platform.platform(), "processor": platform.machine(),
            "cpu_model": model, "cpu_count": cpus, "python": platform.python_version()}


def run(args, strategy, device, rehearsal=False, cluster=None):
    """Train the autoencoder under `strategy` and write figure, record and model.

    `cluster` (from TF_CONFIG) makes this one worker of several: training
    runs the custom loop, and only the chief writes into --output-dir.
    """
    started = datetime.datetime.now(datetime.timezone.utc)
    keras.utils.set_random_seed(args.seed)  # python, numpy and TensorFlow seeds
    loop = "custom" if cluster else args.loop
    if cluster:
        print(f"[INFO] {cluster.task_type} {cluster.task_index} of a {cluster.workers}-"
              "worker cluster; custom loop, since Keras 3's fit does not run under "
              "MultiWorkerMirroredStrategy")

    # how many replicas the strategy trains on decides the global batch
    numAcc = strategy.num_replicas_in_sync
    print(f"[INFO] number of accelerators: {numAcc}")
    plan = plan_run(device, args, numAcc, rehearsal)
    check_levers(args, plan, strategy)
    print(f"[INFO] global batch {plan.global_batch_size} "
          f"({plan.global_batch_size // numAcc} per replica), "
          f"{plan.steps_per_epoch} steps per epoch, "
          f"{plan.steps_per_execution} per execution")

    data_dir = resolve_data_dir(args.data_dir)
    source = resolve_source(args.data_source, config.DATA_NAME, data_dir)
    print(f"[INFO] data source: {source.label} ({source.reason})")
    print("[INFO] loading the training and validation datasets...")
    trainDs = training_data(strategy, plan, source.name, data_dir, args.seed)
    valDs, validation_steps, validation_images = validation_data(
        strategy, plan, source.name, data_dir)
    val_split = load_images(config.DATA_NAME, config.VALIDATION_FLAG, source.name, data_dir)
    if validation_images != len(val_split):
        print(f"[INFO] val_loss is the mean over {validation_images:,} images of the "
              f"{len(val_split):,} in the validation split "
              + ("(repeated to full batches)" if validation_images > len(val_split) else
                 f"(a multiple of the {numAcc} replicas)"))
    testIm = figure_digits(val_split)  # the same digits on every device, in compare.py

    learning_rate = scaled_learning_rate(args.learning_rate, args.lr_scaling,
                                         plan.global_batch_size)
    if args.lr_scaling != "none":
        print(f"[INFO] learning rate {args.learning_rate:g} scaled ({args.lr_scaling}) "
              f"for a global batch of {plan.global_batch_size}: {learning_rate:g}")
    with strategy.scope():
        # model, loss and optimizer must be created inside the scope so that
        # their variables are mirrored on every replica
        print(f"[INFO] initializing the model ({args.precision}"
              + (", XLA" if args.jit_compile else "") + ")...")
        set_precision(args.precision)  # before the model's layers are made
        model = AutoEncoder()
        # divide by the replica count: Keras sums the replicas' gradients
        mseLoss = MSELoss(scale=numAcc)
        optimizer = with_loss_scaling(make_optimizer(args.optimizer, learning_rate),
                                      args.precision)
        model.compile(loss=mseLoss, optimizer=optimizer,
                      steps_per_execution=plan.steps_per_execution,
                      jit_compile=args.jit_compile)
        model.build((None, *IMAGE_SHAPE))  # a backup is restored into it

        # timing, backup (--backup-dir), TensorBoard (--logdir), profiler
        writes = cluster is None or cluster.is_chief
        callbacks, timer, backup = make_callbacks(
            args, plan, loop, backup_identity(args, plan, loop, source, learning_rate),
            testIm, writes)
        initial_epoch = resume(backup, args, strategy, cluster)
        print(f"[INFO] training the autoencoder ({loop} loop)...")
        with peer_loss_reported(cluster):
            if loop == "custom":
                history = fit_custom(model, strategy, trainDs, valDs, args.epochs,
                                     plan.steps_per_epoch, plan.global_batch_size,
                                     steps_per_execution=plan.steps_per_execution,
                                     callbacks=callbacks, initial_epoch=initial_epoch,
                                     jit_compile=args.jit_compile)
            else:
                # one line per epoch where the output is not a terminal (a log file)
                history = model.fit(trainDs, epochs=args.epochs,
                                    steps_per_epoch=plan.steps_per_epoch,
                                    validation_data=valDs, callbacks=callbacks,
                                    initial_epoch=initial_epoch, shuffle=False,
                                    verbose=1 if sys.stdout.isatty() else 2).history

    # a plain call on this process's copy of the model: no collective needed
    print("[INFO] evaluating the model...")
    predIm = model(testIm, training=False).numpy()

    record = run_record(args, strategy, plan, source, data_dir, learning_rate, started,
                        loop=loop, workers=cluster.workers if cluster else 1,
                        history=backup.history if backup else history, timer=timer,
                        resumed_from_epoch=initial_epoch,
                        validation=(validation_steps, validation_images, len(val_split)))
    if not writes:
        # every worker saves, as TensorFlow's multi-worker guide asks; only
        # the chief's copy is kept
        with tempfile.TemporaryDirectory(prefix="pyimagesearch-worker-") as scratch:
            save_outputs(scratch, plan.name, record, model, testIm, predIm, quiet=True)
        print(f"[INFO] {cluster.task_type} {cluster.task_index} done; the chief "
              "writes the outputs")
        return record
    save_outputs(args.output_dir, plan.name, record, model, testIm, predIm)
    if backup:
        backup.finish()  # only now: a failed save must still be able to resume
    return record


def check_levers(args, plan, strategy):
    """Refuse --jit-compile where it cannot work."""
    if not args.jit_compile:
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


def backup_identity(args, plan, loop, source, learning_rate):
    """What a backup must match to be resumed: the same model trained the same way."""
    return {"run": plan.name, "model": AutoEncoder.__name__,
            "global_batch_size": plan.global_batch_size, "replicas": plan.replicas,
            "steps_per_epoch": plan.steps_per_epoch, "loop": loop,
            "precision": args.precision, "optimizer": args.optimizer,
            "learning_rate": learning_rate, "data_source": source.label}


def resume(backup, args, strategy, cluster):
    """The epochs a backup has done (0 without one), the same on every worker."""
    if backup is None:
        return 0
    done = backup.resume()
    if done > args.epochs:
        raise UserError(f"the backup in {args.backup_dir} has {done} epochs done, more "
                        f"than --epochs {args.epochs}; raise --epochs, or delete the "
                        "backup to start fresh")
    if cluster:
        # a collective every worker runs: did they all find the same backup?
        # (all equal exactly when n x sum of squares == square of the sum;
        # every worker gets the same answer, so all stop or none)
        mine = strategy.run(lambda: tf.constant([1.0, done, done * done], tf.float64))
        count, total, squares = strategy.reduce(tf.distribute.ReduceOp.SUM, mine,
                                                axis=None).numpy()
        if count * squares != total * total:
            raise UserError(f"the workers found different backups in {args.backup_dir} "
                            f"(this one: {done} epochs done): every worker must see the "
                            "chief's folder; use a bucket (gs://...) or a shared disk")
    if done:
        print(f"[INFO] resuming from {args.backup_dir}: {done} of {args.epochs} "
              "epochs done")
    return done


def run_record(args, strategy, plan, source, data_dir, learning_rate, started, *,
               loop, workers, history, timer, resumed_from_epoch, validation):
    """The run record: what ran, on what, with which data, and how it went.

    `validation` is (validation steps or None, images val_loss averages,
    images in the split).
    """
    validation_steps, validation_images, split_images = validation
    return {
        "device": plan.device,
        "name": plan.name,
        "rehearsal": plan.rehearsal,
        # MultiWorkerMirroredStrategy's class is CollectiveAllReduceStrategy
        "strategy": ("MultiWorkerMirroredStrategy"
                     if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
                     else type(strategy).__name__),
        "workers": workers,
        "replicas": plan.replicas,
        "global_batch_size": plan.global_batch_size,
        "per_replica_batch_size": plan.global_batch_size // plan.replicas,
        "steps_per_epoch": plan.steps_per_epoch,
        "steps_per_execution": plan.steps_per_execution,
        "epochs": args.epochs,
        "resumed_from_epoch": resumed_from_epoch,
        "loop": loop,
        "precision": args.precision,
        "jit_compile": args.jit_compile,
        "optimizer": args.optimizer,
        "learning_rate": learning_rate,
        "learning_rate_scaling": args.lr_scaling,
        "seed": args.seed,
        "data_source": source.label,
        "data_source_reason": source.reason,
        "train_images": split_size(config.DATA_NAME, config.TRAIN_FLAG, source.name,
                                   data_dir),
        "validation_steps": validation_steps,
        "validation_images": validation_images,
        "validation_split_images": int(split_images),
        "tensorflow_version": tf.__version__,
        "keras_version": keras.__version__,
        "epoch_seconds": timer.epoch_seconds,
        "train_seconds": timer.train_seconds,
        "images_per_second": [plan.steps_per_epoch * plan.global_batch_size / s
                              for s in timer.train_seconds],
        "loss": [float(v) for v in history["loss"]],
        "val_loss": [float(v) for v in history["val_loss"]],
        "command": [os.path.basename(sys.argv[0])] + sys.argv[1:],
        "machine": machine_info(),
        "started_at": started.isoformat(timespec="seconds"),
    }


def save_outputs(folder, name, record, model, testIm, predIm, quiet=False):
    """Write figure, record and model; the old ones are replaced only when all are written."""
    if not quiet:
        print("[INFO] saving the predicted images, run record and model...")
    title = f"{name}: val_loss {record['val_loss'][-1]:.4f}"
    with StagedOutputs(folder) as staged:
        figure = reconstruction_figure(testIm, predIm, title=title)
        figure.savefig(staged.path(f"{name}.png"), format="png", dpi=80)
        write_json(staged.path(f"{name}.json"), record)
        model.save(staged.path(f"{name}.keras"))
    for suffix in ("png", "json", "keras") if not quiet else ():
        print(f"[INFO] wrote {join(folder, name)}.{suffix}")
