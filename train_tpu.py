"""Train the article's MNIST autoencoder on a TPU with TPUStrategy.

    python train_tpu.py                           # Colab, Kaggle or a TPU VM
    python train_tpu.py --tpu my-tpu             # a named Cloud TPU
    python train_tpu.py --rehearse 8              # no TPU: 8 logical CPU devices
    python train_tpu.py --steps-per-epoch 468     # fight the large-batch blur

The TPU configuration: a global batch of 1024 (128 per core on 8 cores), so
an epoch of 60,000 images is only 58 steps, over repeated datasets with full
batches so every core always gets an equal share. Writes outputs/tpu.png,
tpu.json and tpu.keras; a rehearsal writes tpu_rehearsal.* instead.
"""
from pyimagesearch import cli


def main(argv=None):
    args = cli.build_parser("tpu", __doc__).parse_args(argv)
    settings = cli.run_settings(args)
    cli.read_cluster("tpu")  # refuses a cluster; an evaluator has nothing to do
    cli.check_run_flags(settings)

    from pyimagesearch import strategy as strategies, train
    # resolve, connect to and initialise the TPU, then build TPUStrategy;
    # --rehearse N stands N logical CPU devices in for the TPU cores
    strategy = strategies.get_strategy("tpu", rehearse=args.rehearse, tpu=args.tpu)
    train.run(settings, strategy, device="tpu", rehearsal=bool(args.rehearse))


if __name__ == "__main__":
    cli.run_main(main)
