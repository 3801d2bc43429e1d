# USAGE
# python train_tpu.py                  # a TPU: Keras on JAX on Colab and Kaggle, else TPUStrategy
# python train_tpu.py --rehearse 8     # no TPU: 8 logical CPU devices stand in
# KERAS_BACKEND=jax python train_tpu.py --rehearse 8   # the JAX route, on 8 JAX CPU devices
"""Train the article's MNIST autoencoder on a TPU (TPUStrategy, or Keras on JAX): its listing.

Lines marked "# +" go beyond the article; skip them and the article's lines
are left, with the departures the README's table lists. Writes outputs/tpu.png,
tpu.json (the run record) and tpu.keras; a rehearsal tpu_rehearsal.*; on JAX, _jax.
"""
# + the route, before TensorFlow's import: Keras on JAX on a JAX TPU image (Colab,
# + Kaggle), else TensorFlow, through its PJRT runtime on a v5e or v6e (docs/tpus.md)
import sys  # +
from pyimagesearch import tpu_runtime  # +
tpu_runtime.prepare(sys.argv[1:])  # +

# import the necessary packages (the seed is fixed once the flags are read)
from pyimagesearch import config
from pyimagesearch.data import get_data
from pyimagesearch.autoencoder import AutoEncoder
from pyimagesearch.loss import MSELoss
from pyimagesearch.data import figure_digits  # the figure's digits: see testIm below
from pyimagesearch import cli, outputs, strategies  # +
import keras  # Keras 3 itself: its backend, JAX or TensorFlow, is the route chosen above
import tensorflow as tf
# the article's five `from tensorflow... import` lines: on TensorFlow 2.20 and
# 2.21 the first and the fourth fail (the README's listings table), so its TPU
# names (TPUClusterResolver, ..., TPUStrategy) go through `tf.` below, and
# array_to_img is not used (see the figure)
from matplotlib.figure import Figure  # import matplotlib.pyplot as plt: no pyplot
# import os: the outputs' folder is made by outputs.RunOutputs (a bucket too)


@cli.one_run()  # + the flags' values hold in config for this run only
def main(argv=None):  # +
    args = cli.parse_args("tpu", __doc__, argv)  # + the flags, checked

    # initialize the TPU and TPU strategy
    if keras.backend.backend() == "jax":  # + DataParallel over the TPU's devices (or N JAX CPUs)
        strategy = strategies.data_parallel(args.rehearse)  # +
    elif args.rehearse:  # + N logical CPU devices stand in for the TPU's cores
        strategy = strategies.rehearsal(args.rehearse)  # +
    else:  # +
        # + any failure: one line; the resolver finds --tpu, within 60 s
        with strategies.tpu_errors(args.tpu):  # +
            tpu = tf.distribute.cluster_resolver.TPUClusterResolver()
            tf.config.experimental_connect_to_cluster(tpu)
            tf.tpu.experimental.initialize_tpu_system(tpu)
        strategy = tf.distribute.TPUStrategy(tpu)

    # get the number of accelerators
    numAcc = strategy.num_replicas_in_sync
    print(f"[INFO] Number of accelerators: {numAcc}")
    # + the flags set config's values: TPU_BATCH_SIZE, the steps derived from
    # + it, EPOCHS, SEED, OPTIMIZER with its learning rate; get_data reads the plan
    plan = cli.configure("tpu", args, strategy)  # +

    # fix the random seed for reproducibility: the article calls tf.random.set_seed(42)
    # right after its import; here config.SEED (42, or --seed), once the flags are read
    tf.keras.utils.set_random_seed(config.SEED)
    run = cli.callbacks(plan)  # + callbacks; a backup's steps, which get_data skips

    # get the training dataset: global batches of config.TPU_BATCH_SIZE
    # (1024 images, 128 per core on the article's 8 cores)
    print("[INFO] loading the training and validation datasets...")
    trainDs = get_data(dataName=config.DATA_NAME,
        split=config.TRAIN_FLAG, shuffleSize=config.SHUFFLE_SIZE,
        batchSize=config.TPU_BATCH_SIZE)

    # get the validation dataset: config.TPU_VALIDATION_STEPS (9 on MNIST, 1 on the
    # sample) full batches of it, cut by get_data as the plan says (see the fit below)
    valDs = get_data(dataName=config.DATA_NAME,
        split=config.VALIDATION_FLAG, batchSize=config.TPU_BATCH_SIZE)

    # train the model in the scope
    with strategy.scope():
        # initialize the autoencoder model and compile it
        print("[INFO] initializing the model...")
        model = AutoEncoder()
        # the article's scale=1 is right on JAX (one jitted step sees the global
        # batch); on tf.distribute, Keras 3 no longer divides a compiled loss by
        # the replicas, as tf.keras 2 did for its default reduction: scale=numAcc
        mseLoss = MSELoss(scale=1 if keras.backend.backend() == "jax" else numAcc)
        model.compile(loss=mseLoss, optimizer=config.OPTIMIZER)
        # + a whole epoch per call; --jit-compile (refused on a TPU; JAX: always);
        # + fit's callbacks and resume point; predict's batch of the figure's digits
        run.tune(model)  # +

        # train the model (the article's validation_steps=config.TPU_VALIDATION_STEPS
        # is left out: Keras 3 would round it up to whole calls of
        # steps_per_execution and carry its iterator on from epoch to epoch)
        print("[INFO] training the autoencoder...")
        if plan.loop == "custom":  # + --loop custom: the explicit loop of loop.py
            from pyimagesearch.loop import custom_loop  # + loaded for it only
            history = custom_loop(model, trainDs, valDs, plan, run)  # +
        else:  # +
            # + a run resumed in mid-epoch trains the rest of that epoch first
            trainDs = run.finish_epoch(model, trainDs, valDs, plan.verbose)  # +
            model.fit(trainDs, epochs=config.EPOCHS,
                steps_per_epoch=config.TPU_STEPS_PER_EPOCH,
                validation_data=valDs)
            history = model.history.history  # + the losses, for the run record

    # grab 8 different digits from the validation set (the article takes valDs'
    # first batch), the same for every run, repeated so every replica has some,
    # and predict them in one batch (Keras' default of 32 starves replicas past 32)
    print("[INFO] evaluating the model...")
    testIm = figure_digits(config.VALIDATION_FLAG, numAcc)
    predIm = model.predict(testIm)
    record = outputs.run_record(plan, run, history)  # + settings, losses, seconds

    # create subplots: a Figure of its own, not pyplot's (no window, no global
    # state); 4 x 16 inches at 80 dpi, not the article's (10, 40) at 100, and
    # no pixel ticks, which tell nothing
    fig = Figure(figsize=(4, 16), layout="constrained", dpi=80)
    axes = fig.subplots(nrows=8, ncols=2, subplot_kw={"xticks": [], "yticks": []})
    fig.suptitle(outputs.figure_title(plan, record), fontsize="medium")  # + the run

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

    # save the figure (RunOutputs makes the folder, the article's os lines)
    print("[INFO] saving the predicted images...")
    # + figure, run record and model replace earlier ones together: in the
    # + block, config.TPU_IMG_PATH is the staged figure's path under --output-dir
    with outputs.RunOutputs(plan, run, record) as staged:  # +
        fig.savefig(config.TPU_IMG_PATH)
        model.save(staged.path("keras"))  # +


if __name__ == "__main__":  # +
    cli.run_main(main)  # + a wrong flag, a lost peer or a signal: one line, an exit status
