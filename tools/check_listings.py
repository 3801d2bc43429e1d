"""Run the article's listings as printed, each in a fresh interpreter, and record what happens.

    python tools/check_listings.py        # prints what each listing did, writes nothing
    python tools/check_listings.py --json outputs/quoted/listings/tf221.json
    # the same with TensorFlow 2.20's Python
    VENV220/bin/python tools/check_listings.py --json outputs/quoted/listings/tf220.json

Each listing is the article's code (the matmul timings, the TPU and loss imports,
the model, MSELoss(scale=1) under a strategy, inference, tfds.load with try_gcs;
one SGD step and the loss fit prints with MSELoss(scale=1) on 2 or 8 replicas,
under Keras 3 and tf_keras) run by this script's Python, so the record says which
TensorFlow and Keras it was: each one's exit status, last line printed (its
error, if any) and seconds, printed as it ends and, with --json, recorded. The
README's listings table quotes these records.
"""
import argparse
import importlib.metadata
import importlib.util
import os
import pathlib
import platform
import re
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's root
from pyimagesearch import host  # noqa: E402
host.prepare_tensorflow()  # Keras on TensorFlow (KERAS_BACKEND set aside in one line)

from pyimagesearch import exits, files  # noqa: E402
from pyimagesearch.errors import OneLineParser  # noqa: E402

# TensorFlow's C++ log lines, in 2.21's form ("I0000 00:00:...") or 2.20's ("2026-12-03 ...: I ")
TF_LOG_LINE = re.compile(r"^(WARNING: All log messages|[IWEF]\d{4} |[\d-]+ [\d:.]+: [IWEF] )")

MATMUL = '''
import tensorflow as tf
import time
w = tf.random.normal((1024, 512, 16))
x = tf.random.normal((1024, 16, 512))
b = tf.random.normal((1024, 512, 512))
start = time.time()
output = tf.matmul(w, x) + b
end = time.time()
print(f"time taken: {(end-start):%s} sec")
'''
MATMUL_TPU = '''
import tensorflow as tf
import time
tpu = tf.distribute.cluster_resolver.TPUClusterResolver()
tf.config.experimental_connect_to_cluster(tpu)
tf.tpu.experimental.initialize_tpu_system(tpu)
strategy = tf.distribute.TPUStrategy(tpu)
with strategy.scope():
    w = tf.random.normal((1024, 512, 16))
    x = tf.random.normal((1024, 16, 512))
    b = tf.random.normal((1024, 512, 512))
with strategy.scope():
    start = time.time()
    output = tf.matmul(w, x) + b
    end = time.time()
    print(f"time taken: {(end-start):.2f} sec")
'''
AUTOENCODER = '''
from tensorflow.keras import Model
from tensorflow.keras import Sequential
from tensorflow.keras.layers import InputLayer
from tensorflow.keras.layers import Conv2D
from tensorflow.keras.layers import Conv2DTranspose

class AutoEncoder(Model):
    def __init__(self):
        super().__init__()
        self.encoder = Sequential([
            InputLayer((28, 28, 1)),
            Conv2D(16, (3, 3), activation='relu', padding='same', strides=2),
            Conv2D(8, (3, 3), activation='relu', padding='same', strides=2)])
        self.decoder = Sequential([
            Conv2DTranspose(8, kernel_size=3, strides=2, activation='relu', padding='same'),
            Conv2DTranspose(16, kernel_size=3, strides=2, activation='relu', padding='same'),
            Conv2D(1, kernel_size=(3, 3), activation='sigmoid', padding='same')])

    def call(self, x):
        encoded = self.encoder(x)
        decoded = self.decoder(encoded)
        return decoded
'''
LOSS = '''
from tensorflow.keras.losses import MeanSquaredError
from tensorflow.keras.losses import Reduction
from tensorflow import reduce_mean

class MSELoss():
    def __init__(self, scale):
        self.scale = scale

    def __call__(self, real, pred):
        MSE = MeanSquaredError(reduction=Reduction.NONE)
        loss = MSE(real, pred)
        loss = reduce_mean(loss) * (1. / self.scale)
        return loss
'''
# two logical CPU devices stand in for the TPU cores (as --rehearse does)
TRAIN_AND_INFER = '''
import tensorflow as tf
tf.random.set_seed(42)
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from tensorflow.keras.preprocessing.image import array_to_img
import numpy as np
images = np.random.default_rng(0).random((256, 28, 28, 1), dtype=np.float32)
trainDs = tf.data.Dataset.from_tensor_slices((images, images)).repeat().batch(64)
valDs = tf.data.Dataset.from_tensor_slices((images, images)).batch(64)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    model = AutoEncoder()
    mseLoss = MSELoss(scale=1)
    model.compile(loss=mseLoss, optimizer="adam")
    model.fit(trainDs, epochs=1, steps_per_epoch=2, validation_data=valDs,
              validation_steps=1, verbose=0)
%s
'''
INFERENCE = '''
(testIm, _) = next(iter(valDs))
predIm = model.predict(testIm, verbose=0)
image = array_to_img(predIm[0])
print("inference:", predIm.shape, image.size)
'''
# one SGD step with the article's MSELoss(scale=1) on 2 replicas against 1 device:
# how many times larger the update is (1.0 where Keras divides by the replicas)
UPDATE_RATIO = LOSS + '''
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

def update(strategy):
    with strategy.scope():
        tf.keras.utils.set_random_seed(0)
        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        model.build((None, 4))
        model.compile(loss=MSELoss(scale=1), optimizer=tf.keras.optimizers.SGD(0.1))
    before = [w.numpy() for w in model.weights]
    x = np.random.default_rng(1).random((8, 4)).astype("float32")
    model.fit(x, x.sum(1, keepdims=True), batch_size=8, epochs=1, verbose=0, shuffle=False)
    return sum(float(np.abs(w.numpy() - b).sum()) for w, b in zip(model.weights, before))

one = update(tf.distribute.OneDeviceStrategy("/cpu:0"))
two = update(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
print(f"tf.keras from {tf.keras.Model.__module__.split('.')[0]}: the update on 2 replicas is "
      f"{two / one:.3f} times the update on 1 device")
'''
# what fit prints as `loss` and `val_loss` with the article's MSELoss(scale=1) on N
# replicas, against MSELoss(scale=N) (this repository's): the same weights and
# data, no update (learning rate 0), so the two differ by what Keras prints alone
PRINTED_LOSS = LOSS + '''
import numpy as np
import tensorflow as tf
REPLICAS = %d
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * REPLICAS)
strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])
x = np.random.default_rng(1).random((8 * REPLICAS, 4)).astype("float32")
y = x.sum(1, keepdims=True)

def printed(scale):
    with strategy.scope():
        tf.keras.utils.set_random_seed(0)
        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        model.build((None, 4))
        model.compile(loss=MSELoss(scale=scale), optimizer=tf.keras.optimizers.SGD(0.0))
    history = model.fit(x, y, batch_size=len(x), epochs=1, verbose=0, shuffle=False,
                        validation_data=(x, y)).history
    true = float(np.mean((model.predict(x, verbose=0) - y) ** 2))
    return history["loss"][0], history["val_loss"][0], true

one, val_one, true = printed(1)
scaled, val_scaled, _ = printed(REPLICAS)
print(f"tf.keras from {tf.keras.Model.__module__.split('.')[0]}: on {REPLICAS} replicas the "
      f"printed loss of MSELoss(scale=1) is {one / scaled:.3f} times that of "
      f"MSELoss(scale={REPLICAS}) (val_loss {val_one / val_scaled:.3f} times); "
      f"scale={REPLICAS} prints {scaled / true:.3f} times the true mean squared error")
'''
LISTINGS = {
    "matmul_cpu": MATMUL % ".2f",
    "matmul_gpu": MATMUL % ".6f",
    "matmul_tpu": MATMUL_TPU,
    "import_TPUClusterResolver":
        "from tensorflow.distribute.cluster_resolver import TPUClusterResolver",
    "import_TPUStrategy": "from tensorflow.distribute import TPUStrategy",
    "import_connect_and_initialize":
        "from tensorflow.config import experimental_connect_to_cluster\n"
        "from tensorflow.tpu.experimental import initialize_tpu_system\nprint('imported')",
    "import_array_to_img":
        "from tensorflow.keras.preprocessing.image import array_to_img\nprint('imported')",
    # called once on a batch, so that the decoder's layers are built too
    "autoencoder": AUTOENCODER + "\nimport tensorflow as tf\nmodel = AutoEncoder()\n"
                   "print('output:', tuple(model(tf.zeros((1, 28, 28, 1))).shape), "
                   "'weights:', model.count_params())",
    "loss_reduction_none": LOSS + "\nimport tensorflow as tf\n"
                           "print('loss:', float(MSELoss(scale=1)(tf.zeros((2, 4)), "
                           "tf.ones((2, 4)))))",
    "keras3_reduction": "import keras\nprint(keras.losses.Reduction)",
    "fit_with_MSELoss_scale_1_on_2_replicas":
        AUTOENCODER + LOSS + TRAIN_AND_INFER % "print('trained')",
    "inference": AUTOENCODER + LOSS + TRAIN_AND_INFER % INFERENCE,
    "MSELoss_scale_1_update_on_2_replicas": UPDATE_RATIO,
    "MSELoss_scale_1_update_on_2_replicas_tf_keras": UPDATE_RATIO,
    "MSELoss_printed_loss_on_2_replicas": PRINTED_LOSS % 2,
    "MSELoss_printed_loss_on_8_replicas": PRINTED_LOSS % 8,
    "MSELoss_printed_loss_on_2_replicas_tf_keras": PRINTED_LOSS % 2,
    "tfds_load_try_gcs":
        "import tensorflow_datasets as tfds\n"
        "ds = tfds.load('mnist', split='train', try_gcs=True, as_supervised=True,\n"
        "               data_dir=__import__('tempfile').mkdtemp())\nprint('loaded')",
}
TIMEOUT_SECONDS = {"tfds_load_try_gcs": 30}  # offline it does not fail by itself
# tf.keras 2 instead of Keras 3: the tf_keras package, switched on by this variable
LEGACY_KERAS = {"MSELoss_scale_1_update_on_2_replicas_tf_keras",
                "MSELoss_printed_loss_on_2_replicas_tf_keras"}
DEFAULT_TIMEOUT = 300


def run_listing(code, timeout, legacy_keras=False, tf_keras_path=None):
    """Exit status (None on timeout), last output line and seconds of `code` in a fresh Python."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    if legacy_keras:
        env["TF_USE_LEGACY_KERAS"] = "1"
        if tf_keras_path:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [tf_keras_path,
                                                              env.get("PYTHONPATH")]))
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, f"still running after {timeout} s; stopped", timeout
    # what the listing printed when it ran, its error when it failed; not TensorFlow's
    text = done.stdout if done.returncode == 0 and done.stdout.strip() else done.stderr
    lines = [line for line in text.splitlines() if line.strip() and not TF_LOG_LINE.match(line)]
    return done.returncode, (lines[-1] if lines else ""), round(time.monotonic() - start, 1)


def requirements():
    """What the article's two pip packages require here, and what tfds imports regardless.

    A requirement counts only where it applies to this Python with no extra
    (tensorflow-datasets lists matplotlib under extras, importlib_resources
    for Python < 3.9 only).
    """
    from packaging.requirements import Requirement

    def requires(name):
        applying, listed = [], importlib.metadata.requires(name) or []
        for line in listed:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                applying.append(requirement.name.lower().replace("-", "_"))
        return applying, [line for line in listed
                          if any(key in line for key in ("matplotlib", "importlib_resources"))]

    tf_requires, tf_lines = requires("tensorflow")
    tfds_requires, tfds_lines = requires("tensorflow-datasets")
    tfds_root = os.path.dirname(importlib.util.find_spec("tensorflow_datasets").origin)
    importers = []
    for folder, _, names in os.walk(tfds_root):
        for name in names:
            if name.endswith(".py") and "_test" not in name:
                path = os.path.join(folder, name)
                with open(path, errors="replace") as handle:
                    if "import importlib_resources" in handle.read():
                        importers.append(os.path.relpath(path, tfds_root))
    return {
        "tensorflow_requires_matplotlib": "matplotlib" in tf_requires,
        "tensorflow_datasets_requires_matplotlib": "matplotlib" in tfds_requires,
        "tensorflow_datasets_requires_importlib_resources":
            "importlib_resources" in tfds_requires,
        "declared_lines": {"tensorflow": tf_lines, "tensorflow-datasets": tfds_lines},
        "tensorflow_datasets_files_importing_importlib_resources": sorted(importers),
        "tensorflow_datasets_version": importlib.metadata.version("tensorflow-datasets"),
    }


def main(argv=None):
    parser = OneLineParser(description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", default=None,
                        help="also write the record here (default: only print each outcome)")
    parser.add_argument("--only", nargs="+", choices=tuple(LISTINGS), default=None,
                        metavar="NAME",
                        help="run only these listings: " + ", ".join(LISTINGS))
    parser.add_argument("--tf-keras-path", default=None,
                        help="a folder holding the tf_keras package, if it is not installed "
                             "(pip install --target DIR --no-deps tf_keras)")
    args = parser.parse_args(argv)
    if args.json is not None:
        files.check_output_file(args.json)  # before the listings run, not after
    import keras
    import tensorflow as tf

    results = {}
    for name in args.only or LISTINGS:
        legacy = name in LEGACY_KERAS
        status, last, seconds = run_listing(LISTINGS[name],
                                            TIMEOUT_SECONDS.get(name, DEFAULT_TIMEOUT),
                                            legacy, args.tf_keras_path)
        results[name] = {"exit_status": status, "last_line": last, "seconds": seconds,
                         "TF_USE_LEGACY_KERAS": "1" if legacy else None}
        print(f"{name}: exit {status}, {seconds} s: {last}", flush=True)
    if args.json is None:
        return
    record = {"tensorflow_version": tf.__version__, "keras_version": keras.__version__,
              "python": platform.python_version(), "requirements": requirements(),
              "listings": results, "code": {name: LISTINGS[name] for name in results},
              "command": ["tools/check_listings.py", *(argv or sys.argv[1:])]}
    files.write_json(args.json, record)


if __name__ == "__main__":
    exits.run_main(main)
