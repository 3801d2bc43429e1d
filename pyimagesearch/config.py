"""Training configuration, one constant per line: the article's names and this repository's.

The article reads DATA_NAME, TRAIN_FLAG, VALIDATION_FLAG, SHUFFLE_SIZE,
TPU_BATCH_SIZE, EPOCHS, TPU_STEPS_PER_EPOCH, TPU_VALIDATION_STEPS, OPTIMIZER,
BASE_IMG_PATH and TPU_IMG_PATH but never prints this file: its values come
from the article's prose and logs where it gives them. These are defaults,
never changed at run time: a script binds `config = plan.config` (a copy with
the flags' values) in one marked line, and reads the run's values from it.
"""
import os

# --- data -----------------------------------------------------------------
DATA_NAME = "mnist"          # tensorflow_datasets name of the dataset
TRAIN_FLAG = "train"         # split used for training
VALIDATION_FLAG = "test"     # split used for validation (MNIST has no 'validation')
SHUFFLE_SIZE = 1024          # shuffle buffer, in images
TRAIN_IMAGES = 60_000        # images in one epoch: MNIST's training split
VALIDATION_IMAGES = 10_000   # images in MNIST's test split
SAMPLE_VALIDATION_FRACTION = 0.1  # of the 5,000-digit sample held out, per class
IMAGE_SHAPE = (28, 28, 1)    # an MNIST digit: height, width, grey channel

# --- batches and steps ------------------------------------------------------
BATCH_SIZE = 128             # images per replica on CPU and GPU (the article's prose)
TPU_BATCH_SIZE = 1024        # global batch on TPU: 128 per core on 8 cores
EPOCHS = 5                   # the article's logs
STEPS_PER_EPOCH = TRAIN_IMAGES // BATCH_SIZE                  # 468, its CPU and GPU logs
TPU_STEPS_PER_EPOCH = TRAIN_IMAGES // TPU_BATCH_SIZE          # 58, its TPU log
TPU_VALIDATION_STEPS = VALIDATION_IMAGES // TPU_BATCH_SIZE    # 9 full batches
# fit runs this many steps per call into its compiled function at most (a divisor
# of the epoch near it: plan.steps_per_execution); a TPU runs a whole epoch per call
STEPS_PER_EXECUTION = 16

# --- optimisation -----------------------------------------------------------
OPTIMIZER = "adam"           # the article never names its optimizer: Adam is ours
LEARNING_RATE = 1e-3         # Keras' default for Adam
SEED = 42                    # the article's tf.random.set_seed(42)

# --- outputs ----------------------------------------------------------------
BASE_IMG_PATH = "outputs"                                # figures, run records, models
CPU_IMG_PATH = os.path.join(BASE_IMG_PATH, "cpu.png")    # written by train_cpu.py
GPU_IMG_PATH = os.path.join(BASE_IMG_PATH, "gpu.png")    # written by train_gpu.py
TPU_IMG_PATH = os.path.join(BASE_IMG_PATH, "tpu.png")    # written by train_tpu.py
NUM_FIGURE_DIGITS = 8        # rows in the input-vs-reconstruction figure
