"""One SGD step of the article's model on Keras' JAX backend, on 1 and on N devices.

    JAX_NUM_CPU_DEVICES=8 python tools/jax_loss_step.py 8:1 8:8 [--json FILE]
    JAX_NUM_CPU_DEVICES=8 python tools/jax_loss_step.py --loop custom 1:1 8:1 8:8

For each `N:scale`: the AutoEncoder and MSELoss(scale) take one SGD step on
DataParallel over N JAX CPU devices, from the weights and global batch of one
device's step with `fit`. Printed (and with --json written): the step's ratio to
the one-device step (projected onto it; 1.000: the same) and their largest
difference. With the article's scale=1 the ratio is 1 on JAX, where Keras 3 on
tf.distribute needs scale=N: one jitted step sees the whole global batch. With
`--loop custom` (jax_loop.py's step: the per-image errors' sum over the global
batch divided by its size) it is 1 whatever the scale. With `--precision
mixed_float16` (Keras' loss scaling; the record adds the scale after the step) it
is 1 within float16's precision, not the 32768 of a scale left in. JAX and Keras
are imported once the arguments are read: importing this module loads neither.
"""
import argparse
import datetime
import json
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pyimagesearch import exits  # noqa: E402  (no TensorFlow, no Keras)
from pyimagesearch.errors import UserError  # noqa: E402

GLOBAL_BATCH = 32
LEARNING_RATE = 10.0  # large, so that the update dwarfs float round-off


def one_step(devices, scale, images, loop="fit", precision="float32"):
    """One SGD step from seed 0's weights, on DataParallel over `devices`.

    Returns the update and, under mixed_float16, the loss scale after the
    step (Keras' LossScaleOptimizer, as the scripts wrap their optimizer).
    """
    import keras
    import numpy as np

    from pyimagesearch.autoencoder import AutoEncoder
    from pyimagesearch.loss import MSELoss
    from pyimagesearch.strategies import DataParallel

    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy(precision)
    strategy = DataParallel(devices=keras.distribution.list_devices("cpu")[:devices])
    with strategy.scope():
        model = AutoEncoder()
        model.compile(loss=MSELoss(scale=scale), optimizer=optimizer(precision))
        before = [keras.ops.convert_to_numpy(w) for w in model.trainable_weights]
        if loop == "custom":
            custom_step(model, strategy, images)
        else:
            model.fit(images, images, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False,
                      verbose=0)
    keras.mixed_precision.set_global_policy("float32")
    after = [keras.ops.convert_to_numpy(w) for w in model.trainable_weights]
    assert strategy.num_replicas_in_sync == devices
    loss_scale = getattr(model.optimizer, "dynamic_scale", None)
    return (np.concatenate([(a - b).ravel() for a, b in zip(after, before)]),
            None if loss_scale is None else float(keras.ops.convert_to_numpy(loss_scale)))


def optimizer(precision):
    """SGD, wrapped in the package's LossScaleOptimizer under mixed_float16."""
    import keras

    sgd = keras.optimizers.SGD(LEARNING_RATE)
    if precision != "mixed_float16":
        return sgd
    from pyimagesearch.strategies import ReplicasAgreeLossScaleOptimizer

    return ReplicasAgreeLossScaleOptimizer(sgd)


def custom_step(model, strategy, images):
    """One step of the custom loop (its JAX step): the global batch, then it again to validate."""
    import itertools
    import types

    from pyimagesearch.loop import fit_custom

    plan = types.SimpleNamespace(  # what fit_custom reads of a run's plan
        backend="jax", strategy=strategy, global_batch_size=GLOBAL_BATCH, jit_compile=True,
        settings=types.SimpleNamespace(epochs=1), steps_per_epoch=1, callbacks=(),
        resume_step=0, steps_per_execution=1)
    history = fit_custom(model, itertools.repeat((images, images)), [(images, images)], plan,
                         verbose=False)
    assert set(history) == {"loss", "val_loss"}, history


def case(text):
    """'N:scale': devices and MSELoss's scale, each at least 1."""
    try:
        devices, scale = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N:SCALE, such as 8:1, got {text!r}")
    if devices < 1 or scale < 1:
        raise argparse.ArgumentTypeError(f"N and SCALE must be at least 1, got {text!r}")
    return text


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="+", type=case, metavar="N:SCALE")
    parser.add_argument("--loop", choices=("fit", "custom"), default="fit",
                        help="the step of fit (default) or of the custom loop, on N devices")
    parser.add_argument("--precision", choices=("float32", "mixed_float16"),
                        default="float32", help="the step's compute precision; the "
                        "reference is float32's")
    parser.add_argument("--json", metavar="FILE", help="also write the record here")
    return parser


def parse_args(argv=None):
    """The arguments, checked as far as they can be without JAX."""
    return build_parser().parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.json:
        from pyimagesearch.files import check_output_file
        check_output_file(args.json)  # before the steps, not after them
    os.environ["KERAS_BACKEND"] = "jax"  # before Keras' import: this tool is JAX's
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import keras
    import numpy as np

    available = len(keras.distribution.list_devices("cpu"))
    wanted = max(int(text.split(":")[0]) for text in args.cases)
    if wanted > available:
        raise UserError(f"{wanted} devices asked for, JAX has {available}: "
                        f"set JAX_NUM_CPU_DEVICES={wanted}")
    images = np.random.default_rng(7).random((GLOBAL_BATCH, 28, 28, 1)).astype("float32")
    reference, _ = one_step(1, 1, images)  # fit, float32, one device
    record = {"command": ["jax_loss_step.py", *(argv if argv is not None else sys.argv[1:])],
              "backend": keras.backend.backend(), "keras_version": keras.__version__,
              "jax_version": jax.__version__, "python": platform.python_version(),
              "date": datetime.date.today().isoformat(), "global_batch": GLOBAL_BATCH,
              "learning_rate": LEARNING_RATE, "step_size": float(np.abs(reference).max()),
              "loop": args.loop, "precision": args.precision, "steps": {}}
    for text in args.cases:
        devices, scale = (int(part) for part in text.split(":"))
        update, loss_scale = one_step(devices, scale, images, args.loop, args.precision)
        record["steps"][text] = {
            "ratio": float(np.dot(update, reference) / np.dot(reference, reference)),
            "max_difference": float(np.abs(update - reference).max()),
            **({} if loss_scale is None else {"loss_scale": loss_scale})}
    print(json.dumps(record))
    if args.json:
        from pyimagesearch.files import write_json
        write_json(args.json, record)


if __name__ == "__main__":
    exits.run_main(main)
