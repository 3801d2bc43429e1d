"""Train the article's MNIST autoencoder on every visible GPU with MirroredStrategy.

    python train_gpu.py                  # all visible GPUs, 128 images per GPU
    python train_gpu.py --rehearse 2     # no GPU needed: 2 logical CPU devices
    TF_CONFIG='{"cluster": {"worker": ["host-a:12345", "host-b:12345"]},
               "task": {"type": "worker", "index": 0}}' python train_gpu.py
                                         # one worker of two machines (index 1 on host-b)
    python tools/launch_workers.py --workers 2 -- train_gpu.py --rehearse 1
                                         # that cluster rehearsed on this machine

One GPU is the article's case; with several, MirroredStrategy keeps a copy of
the model on each, splits every global batch (128 x GPUs) between them and
sums their gradients, which is why the loss is scaled by the replica count.
Writes outputs/gpu.png, gpu.json and gpu.keras; a rehearsal writes
gpu_rehearsal.* instead, so it cannot be mistaken for a GPU run. Under
TF_CONFIG only the chief (or worker 0) writes, and training runs the custom
loop (Keras 3's fit does not run under MultiWorkerMirroredStrategy).
"""
from pyimagesearch import cli
from pyimagesearch.cluster import peer_loss_reported


def main(argv=None):
    args = cli.build_parser("gpu", __doc__).parse_args(argv)
    settings = cli.run_settings(args)
    # a TF_CONFIG naming several workers makes this process one of them
    cluster = cli.read_cluster("gpu")
    cli.check_run_flags(settings, is_chief=cluster is None or cluster.is_chief)

    from pyimagesearch import strategy as strategies, train
    # MirroredStrategy over the GPUs (MultiWorkerMirroredStrategy across
    # machines), or over N logical CPUs to rehearse
    strategy = strategies.get_strategy("gpu", rehearse=args.rehearse, cluster=cluster,
                                       startup_timeout_s=args.startup_timeout)
    if cluster:
        print(f"[INFO] {cluster.task_type} {cluster.task_index} of a {cluster.workers}-"
              "worker cluster; custom loop, since Keras 3's fit does not run under "
              "MultiWorkerMirroredStrategy")
    # a collective that fails because a peer died becomes one line
    with peer_loss_reported(cluster):
        train.run(settings, strategy, device="gpu", rehearsal=bool(args.rehearse),
                  cluster=cluster)
    if cluster and not cluster.is_chief:
        print(f"[INFO] {cluster.task_type} {cluster.task_index} done; the chief "
              "writes the outputs")


if __name__ == "__main__":
    cli.run_main(main)
