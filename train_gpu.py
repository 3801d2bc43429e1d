# USAGE
# python train_gpu.py                  # every visible GPU, 128 images per GPU
# python train_gpu.py --rehearse 2     # no GPU: 2 logical CPU devices stand in
# python tools/launch_workers.py --workers 2 -- train_gpu.py --rehearse 1
"""Train the article's MNIST autoencoder on every visible GPU with MirroredStrategy.

The article's TPU listing with a GPU's strategy; lines marked "# +" go beyond
it, the others are its lines or the departures docs/article-map.md lists.
Under a TF_CONFIG of several machines this is one worker, and only the chief
writes. Writes outputs/gpu.png, gpu.json (the run record) and gpu.keras; a
rehearsal writes gpu_rehearsal.* instead.
"""
# + Keras on TensorFlow, the TPU left alone, a missing package one line: before the import
from pyimagesearch import host  # +
host.prepare_tensorflow()  # +

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
import keras  # + Keras 3 itself, on TensorFlow: its seed below
from matplotlib.figure import Figure  # not pyplot: no window, no global state


def main(argv=None):  # +
    args = cli.parse_args("gpu", __doc__, argv)  # + the flags, checked

    # the article prints no GPU script: this repository reads it as
    # MirroredStrategy over every visible GPU
    if args.cluster:  # + several machines: one worker of the TF_CONFIG cluster
        strategy = strategies.multi_worker(args.cluster, args.rehearse,  # +
                                           args.startup_timeout)  # +
    elif args.rehearse:  # + N logical CPU devices stand in for the GPUs
        strategy = strategies.rehearsal(args.rehearse)  # +
    else:  # +
        strategies.check_gpus()  # + no GPU: one line
        strategy = tf.distribute.MirroredStrategy()

    # get the number of accelerators
    numAcc = strategy.num_replicas_in_sync
    print(f"[INFO] Number of accelerators: {numAcc}")
    plan = cli.plan("gpu", args, strategy)  # + the run: batch, steps, data, callbacks, backup
    config = plan.config  # + config's names with the flags' values for this run

    # fix the random seed (the article's tf.random.set_seed(42), under its import):
    # config.SEED, 42 or --seed, for Python, NumPy and the backend alike
    keras.utils.set_random_seed(config.SEED)

    # get the training dataset: config.BATCH_SIZE (128) images per replica, in
    # global batches of that times numAcc, the plan's order and resume point
    print("[INFO] loading the training and validation datasets...")
    trainDs = get_data(dataName=config.DATA_NAME,
        split=config.TRAIN_FLAG, shuffleSize=config.SHUFFLE_SIZE,
        batchSize=config.BATCH_SIZE * numAcc, plan=plan)

    # get the validation dataset: one pass over it, every batch split between the
    # replicas, cut by get_data as the plan says
    valDs = get_data(dataName=config.DATA_NAME,
        split=config.VALIDATION_FLAG, batchSize=config.BATCH_SIZE * numAcc, plan=plan)

    # train the model in the scope
    with strategy.scope():
        # initialize the autoencoder model and compile it
        print("[INFO] initializing the model...")
        model = AutoEncoder()
        # the article's scale=1: Keras 3 sums the replicas' gradients and,
        # unlike the article's tf.keras 2, leaves dividing this loss to us
        mseLoss = MSELoss(scale=numAcc)
        # steps per call into the compiled step (fewer round trips); XLA is --jit-compile's
        model.compile(loss=mseLoss, optimizer=config.OPTIMIZER,
            steps_per_execution=plan.steps_per_execution, jit_compile=plan.jit_compile)

        # train the model: the article's validation_steps is left out (Keras 3 would
        # round it up to whole executions); fit gets the run's callbacks and the
        # epoch a backup resumes at
        print("[INFO] training the autoencoder...")
        if plan.loop == "custom":  # + --loop custom, and every cluster: loop.py's loop
            from pyimagesearch.loop import fit_custom  # +
            history = fit_custom(model, trainDs, valDs, plan)  # +
        else:  # +
            trainDs = plan.finish_epoch(model, trainDs, valDs)  # + a backup's part epoch
            model.fit(trainDs, epochs=config.EPOCHS,
                steps_per_epoch=config.STEPS_PER_EPOCH,
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
    # drawn into memory and written whole at config.GPU_IMG_PATH, the model and
    # the run record beside it
    print("[INFO] saving the predicted images...")
    image = io.BytesIO()  # +
    fig.savefig(image, format="png")
    outputs.save(config.GPU_IMG_PATH, image.getvalue(), model, record, plan)


if __name__ == "__main__":  # +
    exits.run_main(main)  # + a wrong flag, a lost peer or a signal: one line, an exit status
