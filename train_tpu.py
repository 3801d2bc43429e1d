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

# import the necessary packages (pyimagesearch first: it keeps TensorFlow's
# start-up notices off the terminal; the seed is fixed once the flags are read)
from pyimagesearch import config
from pyimagesearch.data import get_data
from pyimagesearch.autoencoder import AutoEncoder
from pyimagesearch.loss import MSELoss
from pyimagesearch.data import figure_digits  # the figure's digits: see testIm below
from pyimagesearch import cli, outputs, strategies  # +
import keras  # + its backend, JAX or TensorFlow, is the route tpu_runtime chose
import tensorflow as tf
# the article's five `from tensorflow... import` lines: on TensorFlow 2.20 and
# 2.21 the first and the fourth fail (the README's listings table), so its TPU
# names (TPUClusterResolver, ..., TPUStrategy) go through `tf.` below, and
# array_to_img is not used (see the figure)
from matplotlib.figure import Figure  # import matplotlib.pyplot as plt: no pyplot
# import os: the outputs' folder is made by outputs.RunOutputs (a bucket too)


def main(argv=None):  # +
    args = cli.parse_args("tpu", __doc__, argv)  # + the flags, checked
    on_jax = keras.backend.backend() == "jax"  # + Keras on JAX: the TPU images' own

    # initialize the TPU and TPU strategy
    if on_jax:  # + keras.distribution.DataParallel over the TPU's devices (or N JAX CPUs)
        strategy = strategies.data_parallel(args.rehearse)  # +
    elif args.rehearse:  # + N logical CPU devices stand in for the TPU's cores
        strategy = strategies.rehearsal(args.rehearse)  # +
    else:  # +
        with strategies.tpu_errors(args.tpu) as find:  # + any failure: one line
            # find: TPUClusterResolver(--tpu), given 60 s at most to answer
            tpu = find(tf.distribute.cluster_resolver.TPUClusterResolver)
            tf.config.experimental_connect_to_cluster(tpu)
            tf.tpu.experimental.initialize_tpu_system(tpu)
        strategy = tf.distribute.TPUStrategy(tpu)

    # get the number of accelerators
    numAcc = strategy.num_replicas_in_sync
    print(f"[INFO] Number of accelerators: {numAcc}")
    # + the flags set config's values: TPU_BATCH_SIZE, the steps derived from
    # + it, EPOCHS, SEED, OPTIMIZER with its learning rate (cli.configure)
    plan = cli.configure("tpu", args, strategy)  # +

    # fix the random seed for reproducibility: the article calls tf.random.set_seed(42)
    # right after its import; here config.SEED (42, or --seed), once the flags are read
    tf.keras.utils.set_random_seed(config.SEED)
    run = cli.callbacks(plan)  # + callbacks; run.start: steps a backup holds

    # get the training dataset: global batches of config.TPU_BATCH_SIZE
    # (1024 images, 128 per core on the article's 8 cores)
    print("[INFO] loading the training and validation datasets...")
    trainDs = get_data(dataName=config.DATA_NAME,
        split=config.TRAIN_FLAG, shuffleSize=config.SHUFFLE_SIZE,
        batchSize=config.TPU_BATCH_SIZE,
        plan=plan, skip=run.start)  # + the data source; steps a backup holds

    # get the validation dataset: config.TPU_VALIDATION_STEPS (9 on MNIST, 1 on the
    # sample) full batches of it, cut by get_data as the plan says (see the fit below)
    valDs = get_data(dataName=config.DATA_NAME,
        split=config.VALIDATION_FLAG, batchSize=config.TPU_BATCH_SIZE,
        plan=plan)  # +

    # train the model in the scope
    with strategy.scope():
        # initialize the autoencoder model and compile it
        print("[INFO] initializing the model...")
        model = AutoEncoder()
        # the article's scale=1 is right on JAX (one jitted step sees the global batch);
        # Keras 3 on tf.distribute sums replicas' gradients, unlike tf.keras 2: scale=numAcc
        mseLoss = MSELoss(scale=1 if on_jax else numAcc)
        model.compile(loss=mseLoss, optimizer=config.OPTIMIZER,
            steps_per_execution=plan.steps_per_execution,  # + a whole epoch per call
            jit_compile=plan.jit_compile)  # + --jit-compile (refused on a TPU); JAX: always

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
                validation_data=valDs,
                initial_epoch=run.initial_epoch, callbacks=run.callbacks,  # +
                shuffle=False, verbose=plan.verbose)  # + trainDs is shuffled
            history = model.history.history  # + the losses, for the run record

    # grab 8 different digits from the validation set (the article takes valDs'
    # first batch), the same for every run, repeated so every replica has some,
    # and predict them in one batch (Keras' default of 32 starves replicas past 32)
    print("[INFO] evaluating the model...")
    testIm = figure_digits(plan.source.examples(config.VALIDATION_FLAG), numAcc)
    predIm = model.predict(testIm,
        batch_size=len(testIm), verbose=0)  # +
    record = outputs.run_record(plan, run, history)  # + settings, losses, seconds

    # create subplots: a Figure of its own, not pyplot's (no window, no global
    # state); 4 x 16 inches at 80 dpi, not the article's (10, 40) at 100
    fig = Figure(figsize=(4, 16), layout="constrained")
    axes = fig.subplots(nrows=8, ncols=2,
        subplot_kw={"xticks": [], "yticks": []})  # + pixel ticks tell nothing
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

    # save the figure: the article's fig.savefig(config.TPU_IMG_PATH) (under
    # --output-dir), staged with the run record and the model, the three
    # replacing earlier ones together (RunOutputs also makes the folder)
    print("[INFO] saving the predicted images...")
    with outputs.RunOutputs(plan, run, record) as staged:  # + all three or none
        fig.savefig(staged.path("png"), dpi=80)  # + config.TPU_IMG_PATH, staged
        model.save(staged.path("keras"))  # +


if __name__ == "__main__":  # +
    cli.run_main(main)  # + a wrong flag, a lost peer or a signal: one line, an exit status
