# USAGE
# python train_gpu.py                  # every visible GPU, 128 images per GPU
# python train_gpu.py --rehearse 2     # no GPU: 2 logical CPU devices stand in
# python tools/launch_workers.py --workers 2 -- train_gpu.py --rehearse 1
"""Train the article's MNIST autoencoder on every visible GPU with MirroredStrategy.

The article's listing, step by step; lines marked "# +" go beyond it. Under a
TF_CONFIG of several machines this is one worker, and only the chief writes.
Writes outputs/gpu.png, gpu.json (the run record) and gpu.keras; a rehearsal
writes gpu_rehearsal.* instead.
"""
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
    args = cli.parse_args("gpu", __doc__, argv)  # + the flags and TF_CONFIG, checked
    # fix the random seed for reproducibility: config.SEED (42) seeds Python's
    # and NumPy's generators too, not only TensorFlow's (--seed changes it)
    tf.keras.utils.set_random_seed(args.seed)

    # initialize the GPU strategy: MirroredStrategy over every visible GPU
    if args.cluster:  # + several machines: one worker of the TF_CONFIG
        # + cluster, trained with the custom loop (Keras 3's fit does not run under it)
        strategy = strategies.multi_worker(args.cluster, args.rehearse,  # +
                                           args.startup_timeout)  # +
    elif args.rehearse:  # + N logical CPU devices stand in for the GPUs
        strategy = strategies.rehearsal(args.rehearse)  # +
    else:  # +
        strategies.check_gpus()  # + no GPU, or a CUDA that will not load: one line
        strategy = tf.distribute.MirroredStrategy()

    # get the number of accelerators
    numAcc = strategy.num_replicas_in_sync
    print(f"[INFO] number of accelerators: {numAcc}")
    plan = cli.plan("gpu", args, strategy)  # + batch, steps and data of the flags
    run = cli.callbacks(plan)  # + callbacks; run.start: steps a backup holds

    # get the training dataset: config.BATCH_SIZE (128) images per replica
    print("[INFO] loading the training and validation datasets...")
    trainDs = get_data(dataName=config.DATA_NAME,
        split=config.TRAIN_FLAG, shuffleSize=config.SHUFFLE_SIZE,
        batchSize=plan.global_batch_size,  # (config.BATCH_SIZE or --batch-size) * numAcc
        plan=plan, skip=run.start)  # + the data source; steps a backup holds

    # get the validation dataset: one pass over the split
    valDs = get_data(dataName=config.DATA_NAME,
        split=config.VALIDATION_FLAG,
        batchSize=plan.global_batch_size,  # (config.BATCH_SIZE or --batch-size) * numAcc
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
            steps_per_execution=plan.steps_per_execution,  # + fewer calls from Python
            jit_compile=args.jit_compile)  # + --jit-compile: XLA

        # train the model
        print("[INFO] training the autoencoder...")
        if plan.loop == "custom":  # + --loop custom, and every cluster: loop.py
            history = custom_loop(model, trainDs, valDs, plan, run)  # +
        else:  # +
            # + a run resumed in mid-epoch trains the rest of that epoch first
            trainDs = run.finish_epoch(model, trainDs, valDs, plan.verbose)  # +
            history = model.fit(trainDs,  # history: for the run record
                epochs=args.epochs,  # config.EPOCHS (5), or --epochs
                steps_per_epoch=plan.steps_per_epoch,  # the epoch's images / batch
                validation_data=valDs,
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

    # save the figure to config.GPU_IMG_PATH (or --output-dir), with the run
    # record and the model beside it: the three replace earlier ones together
    print("[INFO] saving the predicted images...")
    with outputs.RunOutputs(plan, run, record) as staged:  # + all three or none
        fig.savefig(staged.path("png"), dpi=80)  # dpi 80: a 320x1280 figure
        model.save(staged.path("keras"))  # +


if __name__ == "__main__":
    cli.run_main(main)  # + a wrong flag, a lost peer or a signal: one line, an exit status
