# USAGE
# python train_cpu.py                  # 5 epochs, batch 128, outputs/cpu.png
# python train_cpu.py --epochs 1 --data-source sample
"""Train the article's MNIST autoencoder on the CPU (the article prints no CPU script).

The article's TPU listing on TensorFlow's default strategy; lines marked "# +"
go beyond it, and skipping them leaves the listing with the departures the
README's table lists. Writes outputs/cpu.png, cpu.json (the run record) and
cpu.keras.
"""
# + Keras on TensorFlow, whatever KERAS_BACKEND says: its strategies run this
from pyimagesearch import runtime  # +
runtime.tensorflow()  # +

# import the necessary packages (the seed is fixed once the flags are read)
from pyimagesearch import config
from pyimagesearch.data import get_data
from pyimagesearch.autoencoder import AutoEncoder
from pyimagesearch.loss import MSELoss
from pyimagesearch.data import figure_digits  # the figure's digits: see testIm below
from pyimagesearch import cli, outputs, strategies  # +
import tensorflow as tf
# the article's `from tensorflow... import` lines are the TPU's; this script
# needs none of them (array_to_img: see the figure below)
from matplotlib.figure import Figure  # import matplotlib.pyplot as plt: no pyplot
# import os: the outputs' folder is made by outputs.RunOutputs (a bucket too)


@cli.one_run()  # + the flags' values hold in config for this run only
def main(argv=None):  # +
    args = cli.parse_args("cpu", __doc__, argv)  # + the flags, checked

    # the article prints no CPU script: this repository reads its CPU run as
    # TensorFlow's default strategy, any GPU hidden; the code below is the same
    strategies.cpu_only()  # +
    strategy = tf.distribute.get_strategy()

    # get the number of accelerators
    numAcc = strategy.num_replicas_in_sync
    print(f"[INFO] Number of accelerators: {numAcc}")
    # + the flags set config's values: BATCH_SIZE, the steps derived from it,
    # + EPOCHS, SEED, OPTIMIZER with its learning rate; get_data reads the plan
    plan = cli.configure("cpu", args, strategy)  # +

    # fix the random seed for reproducibility: the article calls tf.random.set_seed(42)
    # right after its import; here config.SEED (42, or --seed), once the flags are read
    tf.keras.utils.set_random_seed(config.SEED)
    run = cli.callbacks(plan)  # + callbacks; a backup's steps, which get_data skips

    # get the training dataset: config.BATCH_SIZE (128) images per replica,
    # where the TPU listing's config.TPU_BATCH_SIZE is global
    print("[INFO] loading the training and validation datasets...")
    trainDs = get_data(dataName=config.DATA_NAME,
        split=config.TRAIN_FLAG, shuffleSize=config.SHUFFLE_SIZE,
        batchSize=config.BATCH_SIZE * numAcc)

    # get the validation dataset: one pass over the split
    valDs = get_data(dataName=config.DATA_NAME,
        split=config.VALIDATION_FLAG, batchSize=config.BATCH_SIZE * numAcc)

    # train the model in the scope
    with strategy.scope():
        # initialize the autoencoder model and compile it
        print("[INFO] initializing the model...")
        model = AutoEncoder()
        # the article's scale=1, which numAcc is on one replica (see loss.py
        # and train_tpu.py for several)
        mseLoss = MSELoss(scale=numAcc)
        model.compile(loss=mseLoss, optimizer=config.OPTIMIZER)
        # + steps per call into the compiled step; --jit-compile: XLA; fit's
        # + callbacks and resume point; predict's batch of the figure's digits
        run.tune(model)  # +

        # train the model: an epoch of config.STEPS_PER_EPOCH steps (the TPU
        # listing's config.TPU_STEPS_PER_EPOCH), validation one pass over valDs
        print("[INFO] training the autoencoder...")
        if plan.loop == "custom":  # + --loop custom: the explicit loop of loop.py
            from pyimagesearch.loop import custom_loop  # + loaded for it only
            history = custom_loop(model, trainDs, valDs, plan, run)  # +
        else:  # +
            # + a run resumed in mid-epoch trains the rest of that epoch first
            trainDs = run.finish_epoch(model, trainDs, valDs, plan.verbose)  # +
            model.fit(trainDs, epochs=config.EPOCHS,
                steps_per_epoch=config.STEPS_PER_EPOCH,
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
    # + block, config.CPU_IMG_PATH is the staged figure's path under --output-dir
    with outputs.RunOutputs(plan, run, record) as staged:  # +
        fig.savefig(config.CPU_IMG_PATH)
        model.save(staged.path("keras"))  # +


if __name__ == "__main__":  # +
    cli.run_main(main)  # + a wrong flag, a lost peer or a signal: one line, an exit status
