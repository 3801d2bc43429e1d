"""Train the article's MNIST autoencoder on the CPU.

    python train_cpu.py                      # 5 epochs, batch 128, outputs/cpu.png
    python train_cpu.py --epochs 1 --data-source sample

Writes outputs/cpu.png (inputs beside reconstructions), outputs/cpu.json
(the run record) and outputs/cpu.keras (the trained model). Runs on the CPU
even when a GPU is visible.
"""
from pyimagesearch import cli


def main(argv=None):
    settings = cli.run_settings(cli.build_parser("cpu", __doc__).parse_args(argv))
    cli.read_cluster("cpu")  # refuses a cluster; an evaluator has nothing to do
    cli.check_run_flags(settings)

    from pyimagesearch import strategy as strategies, train
    # one device, the CPU: the strategy only pins the work there
    strategy = strategies.cpu_strategy()
    train.run(settings, strategy, device="cpu")


if __name__ == "__main__":
    cli.run_main(main)
