"""Training configuration, one constant per line: the article's names and this repository's.

The article's listing reads 11 of these names: DATA_NAME, TRAIN_FLAG,
VALIDATION_FLAG, SHUFFLE_SIZE, TPU_BATCH_SIZE, EPOCHS, TPU_STEPS_PER_EPOCH,
TPU_VALIDATION_STEPS, OPTIMIZER, BASE_IMG_PATH and TPU_IMG_PATH. It never
prints config.py: where it gives a value elsewhere, that value is here
(DATA_NAME's MNIST and TPU_BATCH_SIZE's 1024 from its prose, EPOCHS 5 and
TPU_STEPS_PER_EPOCH 58 from its TPU log, BASE_IMG_PATH and TPU_IMG_PATH from
its tree's outputs/tpu.png); the other values are this repository's choice.
The other 12 names are this repository's. Of them BATCH_SIZE (the 128 the
article's prose gives the CPU and GPU), STEPS_PER_EPOCH (468, its CPU and GPU
logs), SEED (its tf.random.set_seed(42)), IMAGE_SHAPE (its
InputLayer((28, 28, 1))), NUM_FIGURE_DIGITS (its figure's 8 rows),
CPU_IMG_PATH and GPU_IMG_PATH (its tree's cpu.png and gpu.png) hold values
the article gives; TRAIN_IMAGES, VALIDATION_IMAGES, SAMPLE_VALIDATION_FRACTION,
STEPS_PER_EXECUTION and LEARNING_RATE are this repository's alone.

Every value here is a default; the training scripts let a flag override it:
cli.configure sets these names to the flags' values for the run, which the
scripts' listing lines read (config.TPU_BATCH_SIZE, config.EPOCHS, ...); a
second run in the same process starts from these defaults again.
Values derived from others (steps per epoch) are computed from them so that
changing one constant cannot leave another stale.
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
BATCH_SIZE = 128             # images per replica on CPU and GPU
TPU_BATCH_SIZE = 1024        # global batch on TPU (128 per core on 8 cores)
EPOCHS = 5                   # passes over TRAIN_IMAGES
# steps per epoch on CPU and GPU (train_cpu.py and train_gpu.py), which
# derive it from their global batch (BATCH_SIZE per replica times the
# replicas), or take --steps-per-epoch; on one replica:
STEPS_PER_EPOCH = TRAIN_IMAGES // BATCH_SIZE                 # 468
# a TPU step needs a full, evenly split batch, so TPU epochs are a fixed
# number of steps over a repeated dataset. train_tpu.py reads both values
# when it runs with TPU_BATCH_SIZE (a --batch-size of its own derives them
# from the batch instead, and --steps-per-epoch overrides the first).
TPU_STEPS_PER_EPOCH = TRAIN_IMAGES // TPU_BATCH_SIZE          # 58
# full batches of the validation split; at most one pass over it (on the
# 500-digit sample, 1 batch that repeats digits)
TPU_VALIDATION_STEPS = VALIDATION_IMAGES // TPU_BATCH_SIZE    # 9

# steps run per call into the compiled train function on CPU and GPU: fewer
# round trips from Python, which matters for a model this small. fit takes a
# divisor of the epoch's steps near this value, since Keras would otherwise
# run past the end of the epoch (training.plan.steps_per_execution); on
# 1, 2, 4, 8 and 16 replicas (468, 234, 117, 58 and 29 steps per epoch) that
# is 13, 13, 13, 29 and 29. The custom loop takes this value and a shorter
# last call. A TPU runs a whole epoch per call: each call is a blocking
# round trip to the TPU host.
STEPS_PER_EXECUTION = 16

# --- optimisation -----------------------------------------------------------
# the article passes config.OPTIMIZER to compile() but never prints its
# config.py: the optimizer it used is not known. Adam is this repository's
# choice. The scripts pass compile() a Keras config of it that also carries
# LEARNING_RATE (or --optimizer and --learning-rate): cli.configure
OPTIMIZER = "adam"           # Keras optimizer name
LEARNING_RATE = 1e-3         # Keras' default for Adam
SEED = 42                    # the article's tf.random.set_seed(42)

# --- outputs ----------------------------------------------------------------
# Each script's default --output-dir is the folder of its figure, and the run
# record and model take the figure's name (cpu.json, cpu.keras); a rehearsal
# adds "_rehearsal" to it. --output-dir replaces the folder, not the name.
BASE_IMG_PATH = "outputs"                                # figures, run records, models
CPU_IMG_PATH = os.path.join(BASE_IMG_PATH, "cpu.png")    # written by train_cpu.py
GPU_IMG_PATH = os.path.join(BASE_IMG_PATH, "gpu.png")    # written by train_gpu.py
TPU_IMG_PATH = os.path.join(BASE_IMG_PATH, "tpu.png")    # written by train_tpu.py
NUM_FIGURE_DIGITS = 8        # rows in the input-vs-reconstruction figure
