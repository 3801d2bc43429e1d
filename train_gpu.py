"""Train the article's MNIST autoencoder on every visible GPU with MirroredStrategy.

    python train_gpu.py                  # all visible GPUs, 128 images per GPU
    python train_gpu.py --rehearse 2     # no GPU needed: 2 logical CPU devices

One GPU is the article's case; with several, MirroredStrategy keeps a copy of
the model on each, splits every global batch (128 x GPUs) between them and
sums their gradients, which is why the loss is scaled by the replica count.
Writes outputs/gpu.png, gpu.json and gpu.keras; a rehearsal writes
gpu_rehearsal.* instead, so it cannot be mistaken for a GPU run.
"""
from pyimagesearch import cli


def main(argv=None):
    args = cli.build_parser("gpu", __doc__).parse_args(argv)
    cli.check_output_dir(args.output_dir)

    from pyimagesearch import strategy, train
    # MirroredStrategy over the GPUs, or over N logical CPUs to rehearse
    gpuStrategy = strategy.get_strategy("gpu", rehearse=args.rehearse)
    train.run(args, gpuStrategy, device="gpu", rehearsal=bool(args.rehearse))


if __name__ == "__main__":
    cli.run_main(main)
