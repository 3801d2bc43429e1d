# USAGE
# python train_tpu.py                  # a TPU: Keras on JAX on Colab and Kaggle, else TPUStrategy
# python train_tpu.py --rehearse 8     # no TPU: 8 logical CPU devices stand in
# KERAS_BACKEND=jax python train_tpu.py --rehearse 8   # the JAX route, on 8 JAX CPU devices
"""Train the article's MNIST autoencoder on a TPU (TPUStrategy, or Keras on JAX): its listing.

Lines marked "# +" go beyond the article; the others are its lines, or the
departures docs/article-map.md lists. Writes outputs/tpu.png, tpu.json (the
run record) and tpu.keras; a rehearsal tpu_rehearsal.*; on JAX, *_jax.*.
"""
# + the route (Keras on JAX or TensorFlow) and the TPU's runtime, chosen before the import
import sys  # +
from pyimagesearch import tpu as tpus  # +
tpus.prepare(sys.argv[1:])  # +

# import tensorflow (the seed is set once the flags are read, below)
import tensorflow as tf

# import the necessary packages
from pyimagesearch import config
from pyimagesearch.data import get_data
from pyimagesearch.autoencoder import AutoEncoder
from pyimagesearch.loss import MSELoss
from pyimagesearch.data import figure_digits  # + the figure's digits, below
from pyimagesearch import cli, exits, outputs, strategies  # +
import io  # +
import keras  # + Keras 3: its backend, JAX or TensorFlow, is the route chosen above
# the article's TPU imports (`from tensorflow.distribute... import`) fail on TensorFlow
# 2.20 and 2.21: its TPU names are reached through `tf.` below
from matplotlib.figure import Figure  # not pyplot: no window, no global state


def main(argv=None):  # +
    args = cli.parse_args("tpu", __doc__, argv)  # + the flags, checked

    # initialize the TPU and TPU strategy
    if keras.backend.backend() == "jax":  # + DataParallel over the TPU's chips, every host's
        strategy = strategies.data_parallel(args.rehearse, args.startup_timeout)  # +
    elif args.rehearse:  # + N logical CPU devices stand in for the TPU's cores
        strategy = strategies.rehearsal(args.rehearse)  # +
    else:  # +
        # the article's TPUClusterResolver(): --tpu, this TPU VM's chips, or the
        # environment's TPU, found within 60 s (a failure is one line)
        tpu = tpus.find_tpu(args.tpu)
        with tpus.tpu_errors():  # + a failure below: one line with TensorFlow's cause
            tf.config.experimental_connect_to_cluster(tpu)
            tf.tpu.experimental.initialize_tpu_system(tpu)
        strategy = tf.distribute.TPUStrategy(tpu)

    # get the number of accelerators
    numAcc = strategy.num_replicas_in_sync
    print(f"[INFO] Number of accelerators: {numAcc}")
    plan = cli.plan("tpu", args, strategy)  # + the run: batch, steps, data, callbacks, backup
    config = plan.config  # + config's names with the flags' values for this run

    # fix the random seed (the article's tf.random.set_seed(42), under its import):
    # config.SEED, 42 or --seed, for Python, NumPy and the backend alike
    keras.utils.set_random_seed(config.SEED)

    # get the training dataset: global batches of config.TPU_BATCH_SIZE
    # (1024 images, 128 per core on the article's 8), the plan's order and resume point
    print("[INFO] loading the training and validation datasets...")
    trainDs = get_data(dataName=config.DATA_NAME,
        split=config.TRAIN_FLAG, shuffleSize=config.SHUFFLE_SIZE,
        batchSize=config.TPU_BATCH_SIZE, plan=plan)

    # get the validation dataset: config.TPU_VALIDATION_STEPS full batches (9 on
    # MNIST, 1 on the sample), cut by get_data as the plan says
    valDs = get_data(dataName=config.DATA_NAME,
        split=config.VALIDATION_FLAG, batchSize=config.TPU_BATCH_SIZE, plan=plan)

    # train the model in the scope
    with strategy.scope():
        # initialize the autoencoder model and compile it
        print("[INFO] initializing the model...")
        model = AutoEncoder()
        # the article's scale=1 is right on JAX (one jitted step sees the global
        # batch); on tf.distribute, Keras 3 no longer divides a compiled loss by
        # the replicas, as tf.keras 2 did: scale=numAcc
        mseLoss = MSELoss(scale=1 if keras.backend.backend() == "jax" else numAcc)
        # a whole epoch per call into the TPU; XLA is --jit-compile's
        model.compile(loss=mseLoss, optimizer=config.OPTIMIZER,
            steps_per_execution=plan.steps_per_execution, jit_compile=plan.jit_compile)

        # train the model: the article's validation_steps is left out (Keras 3 would
        # round it up to whole executions); fit gets the run's callbacks and the
        # epoch a backup resumes at
        print("[INFO] training the autoencoder...")
        if plan.loop == "custom":  # + --loop custom: loop.py's explicit loop
            from pyimagesearch.loop import fit_custom  # +
            history = fit_custom(model, trainDs, valDs, plan)  # +
        else:  # +
            trainDs = plan.finish_epoch(model, trainDs, valDs)  # + a backup's part epoch
            model.fit(trainDs, epochs=config.EPOCHS,
                steps_per_epoch=config.TPU_STEPS_PER_EPOCH,
                validation_data=valDs,
                callbacks=plan.callbacks, initial_epoch=plan.initial_epoch,
                verbose=plan.verbose, shuffle=False)
            history = model.history.history  # + the losses, for the run record
    record = outputs.run_record(plan, plan.history(history))  # + settings, losses

    # grab 8 different digits of the validation set (the article takes valDs'
    # first batch), the same for every run, repeated so every replica has some,
    # and predict them in one batch
    print("[INFO] evaluating the model...")
    testIm = figure_digits(plan.source, numAcc)
    predIm = plan.predict(model, testIm)

    # create subplots: a Figure of its own, 4 x 16 inches at 80 dpi (not the
    # article's (10, 40)), no pixel ticks, and the run in its title
    fig = Figure(figsize=(4, 16), layout="constrained", dpi=80)
    axes = fig.subplots(nrows=8, ncols=2, subplot_kw={"xticks": [], "yticks": []})
    fig.suptitle(outputs.figure_title(record), fontsize="medium")  # +

    # iterate over the subplots and fill with test and predicted images, in
    # their true grey levels (array_to_img would stretch each one's contrast)
    print("[INFO] displaying the predicted images...")
    for ax, real, pred in zip(axes, testIm[:8], predIm[:8]):
        # plot the input image
        ax[0].imshow(real[..., 0], cmap="gray", vmin=0, vmax=1)
        ax[0].set_title("Input Image")

        # plot the predicted image
        ax[1].imshow(pred[..., 0], cmap="gray", vmin=0, vmax=1)
        ax[1].set_title("Predicted Image")

    # save the figure: the article's os.makedirs lines are gone (the output folder,
    # which may be a bucket, was made and checked before training); the figure is
    # drawn into memory and written whole at config.TPU_IMG_PATH, the model and
    # the run record beside it
    print("[INFO] saving the predicted images...")
    image = io.BytesIO()  # +
    fig.savefig(image, format="png")
    outputs.save(config.TPU_IMG_PATH, image.getvalue(), model, record, plan)


if __name__ == "__main__":  # +
    exits.run_main(main)  # + a wrong flag, a lost peer or a signal: one line, an exit status
