# USAGE
# python train_tpu.py                  # Colab, Kaggle or a Cloud TPU VM
# python train_tpu.py --rehearse 8     # no TPU: 8 logical CPU devices stand in
"""Train the article's MNIST autoencoder on a TPU with TPUStrategy: its listing, step by step.

Lines marked "# +" go beyond the article. Writes outputs/tpu.png, tpu.json
(the run record) and tpu.keras; a rehearsal writes tpu_rehearsal.* instead.
"""
# + a TPU v5e, v5p or v6e: TensorFlow reaches it only through its PJRT
# + runtime, which must be chosen before TensorFlow is imported (docs/tpus.md)
import sys  # +
from pyimagesearch.platforms import tpu_runtime  # +
tpu_runtime.prepare(sys.argv[1:])  # +

# import the necessary packages (pyimagesearch first: it keeps TensorFlow's
# start-up notices off the terminal)
from pyimagesearch import config
from pyimagesearch.data import get_data, figure_digits
from pyimagesearch.autoencoder import AutoEncoder
from pyimagesearch.loss import MSELoss
from pyimagesearch import cli, outputs, strategies  # +
from pyimagesearch.training.loop import custom_loop  # +
from matplotlib.figure import Figure
import tensorflow as tf


def main(argv=None):
    args = cli.parse_args("tpu", __doc__, argv)  # + the flags, checked
    # fix the random seed for reproducibility: config.SEED (42) seeds Python's
    # and NumPy's generators too, not only TensorFlow's (--seed changes it)
    tf.keras.utils.set_random_seed(args.seed)

    # initialize the TPU and TPU strategy
    if args.rehearse:  # + N logical CPU devices stand in for the TPU's cores
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
    print(f"[INFO] number of accelerators: {numAcc}")
    plan = cli.plan("tpu", args, strategy)  # + batch, steps and data of the flags
    run = cli.callbacks(plan)  # + callbacks; run.start: steps a backup holds

    # get the training dataset: global batches of config.TPU_BATCH_SIZE
    # (1024 images, 128 per core on the article's 8 cores)
    print("[INFO] loading the training and validation datasets...")
    trainDs = get_data(dataName=config.DATA_NAME,
        split=config.TRAIN_FLAG, shuffleSize=config.SHUFFLE_SIZE,
        batchSize=plan.global_batch_size,  # config.TPU_BATCH_SIZE, or --batch-size
        plan=plan, skip=run.start)  # + the data source; steps a backup holds

    # get the validation dataset: config.TPU_VALIDATION_STEPS (9) full batches
    # of it, cut here (Keras would round fit's validation_steps up to whole calls)
    valDs = get_data(dataName=config.DATA_NAME,
        split=config.VALIDATION_FLAG,
        batchSize=plan.global_batch_size,  # config.TPU_BATCH_SIZE, or --batch-size
        plan=plan)  # +

    # train the model in the scope
    with strategy.scope():
        # initialize the autoencoder model and compile it
        print("[INFO] initializing the model...")
        model = AutoEncoder()
        # Keras 3 sums the replicas' gradients and, unlike the article's
        # tf.keras 2, leaves dividing this loss to us (see loss.py)
        mseLoss = MSELoss(scale=numAcc)
        model.compile(loss=mseLoss,
            optimizer=plan.optimizer(),  # config.OPTIMIZER (adam), or --optimizer
            steps_per_execution=plan.steps_per_execution,  # + a whole epoch per call
            jit_compile=args.jit_compile)  # + --jit-compile (refused on a TPU)

        # train the model
        print("[INFO] training the autoencoder...")
        if plan.loop == "custom":  # + --loop custom: the explicit loop of loop.py
            history = custom_loop(model, trainDs, valDs, plan, run)  # +
        else:  # +
            # + a run resumed in mid-epoch trains the rest of that epoch first
            trainDs = run.finish_epoch(model, trainDs, valDs, plan.verbose)  # +
            history = model.fit(trainDs,  # history: for the run record
                epochs=args.epochs,  # config.EPOCHS (5), or --epochs
                steps_per_epoch=plan.steps_per_epoch,  # config.TPU_STEPS_PER_EPOCH (58)
                validation_data=valDs,  # cut to config.TPU_VALIDATION_STEPS above
                initial_epoch=run.initial_epoch, callbacks=run.callbacks,  # +
                shuffle=False, verbose=plan.verbose).history  # + trainDs is shuffled

    # grab 8 different digits from the validation set (the article takes valDs'
    # first batch), the same for every run, repeated so every replica has some,
    # and predict them in one batch (Keras' default of 32 starves replicas past 32)
    print("[INFO] evaluating the model...")
    testIm = figure_digits(plan.source.examples(config.VALIDATION_FLAG), numAcc)
    predIm = model.predict(testIm, batch_size=len(testIm), verbose=0)
    record = outputs.run_record(plan, run, history)  # + settings, losses, seconds

    # create subplots: a Figure of its own, not pyplot's (no window, no
    # global state), 8 rows; the title says which run it shows
    fig = Figure(figsize=(4, 2 * config.NUM_FIGURE_DIGITS), layout="constrained")
    fig.suptitle(f"{plan.name}: val_loss {record['val_loss'][-1]:.4f}\n"
        f"batch {plan.global_batch_size}, {plan.steps_per_epoch} steps/epoch, "
        f"lr {plan.learning_rate:g}", fontsize="medium")

    # iterate over the subplots and fill with test and predicted images, in
    # their true grey levels (array_to_img would stretch each one's contrast)
    print("[INFO] displaying the predicted images...")
    rows = fig.subplots(nrows=config.NUM_FIGURE_DIGITS, ncols=2,
        subplot_kw={"xticks": [], "yticks": []})  # pixel ticks tell nothing here
    for ax, real, pred in zip(rows, testIm, predIm):
        # plot the input image
        ax[0].imshow(real[..., 0], cmap="gray", vmin=0, vmax=1)
        ax[0].set_title("Input Image")

        # plot the predicted image
        ax[1].imshow(pred[..., 0], cmap="gray", vmin=0, vmax=1)
        ax[1].set_title("Predicted Image")

    # save the figure to config.TPU_IMG_PATH (or --output-dir), with the run
    # record and the model beside it: the three replace earlier ones together
    print("[INFO] saving the predicted images...")
    with outputs.RunOutputs(plan, run, record) as staged:  # + all three or none
        fig.savefig(staged.path("png"), dpi=80)  # dpi 80: a 320x1280 figure
        model.save(staged.path("keras"))  # +


if __name__ == "__main__":
    cli.run_main(main)  # + a wrong flag, a lost peer or a signal: one line, an exit status
