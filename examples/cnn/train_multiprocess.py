"""Data-parallel training with one process per rank (SINGA's examples/cnn/train_multiprocess.py).

    python examples/cnn/train_multiprocess.py cnn mnist -w 2 -d plain [-b 64] [-m 10]

The parent makes ``singa_wrap.NcclIdHolder()`` (a ``jax.distributed`` coordinator address on
this host) and starts ``-w`` processes with ``multiprocessing``; each wraps its SGD in
``opt.DistOpt(sgd, nccl_id, local_rank, world_size)`` and trains on its share of the data.
``-d`` picks SINGA's update: plain | half | partialUpdate | sparseTopK | sparseThreshold (``-s``
is the sparsity). On a CPU-only machine every process uses the host (set
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` to give each process N devices); on a
GPU box process r drives GPU r. The parent must not use JAX before the workers start (JAX's
backend must start after ``jax.distributed.initialize``). See docs/distributed.md.
"""
import argparse
import multiprocessing
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import train_cnn  # noqa: E402
from singa_jax import opt, tensor  # noqa: E402
from singa_jax import singa_wrap as singa  # noqa: E402

singa_dtype = {"float16": tensor.float16, "float32": tensor.float32}
DIST_OPTIONS = ['plain', 'half', 'partialUpdate', 'sparseTopK', 'sparseThreshold']


def run(args, local_rank, world_size, nccl_id):
    """One rank: SINGA's worker (the optimizer is made before DistOpt, as in SINGA)."""
    sgd = opt.SGD(lr=args.lr, momentum=0.9, weight_decay=1e-5,
                  dtype=singa_dtype[args.precision])
    sgd = opt.DistOpt(sgd, nccl_id=nccl_id, local_rank=local_rank, world_size=world_size)
    # each process owns its devices (jax.local_devices()): the rank's first device is index 0
    train_cnn.run(sgd.global_rank, sgd.world_size, 0, args.max_epoch, args.batch_size,
                  args.model, args.data, sgd, args.graph, args.verbosity, args.dist_option,
                  args.spars, args.precision, data_dir=args.data_dir,
                  checkpoint=args.checkpoint if sgd.global_rank == 0 else None,
                  quick=args.quick, autocast=args.autocast)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Data-parallel training, one process per rank.')
    parser.add_argument('model', nargs='?', choices=sorted(train_cnn.MODELS), default='cnn')
    parser.add_argument('data', nargs='?', choices=train_cnn.DATASETS, default='mnist')
    parser.add_argument('-p', choices=['float32', 'float16'], default='float32', dest='precision')
    train_cnn.add_autocast_argument(parser)
    parser.add_argument('-m', '--max-epoch', default=None, type=int, dest='max_epoch',
                        help='maximum epochs')
    parser.add_argument('-b', '--batch-size', default=64, type=int, dest='batch_size',
                        help='batch size of each rank')
    parser.add_argument('-l', '--learning-rate', default=None, type=float, dest='lr',
                        help='initial learning rate (not rescaled by the world size)')
    parser.add_argument('-w', '--world-size', default=2, type=int, dest='world_size',
                        help='number of processes (ranks)')
    parser.add_argument('-d', '--dist-option', default='plain', choices=DIST_OPTIONS,
                        dest='dist_option', help='distributed training options')
    parser.add_argument('-s', '--sparsification', default=0.05, type=float, dest='spars',
                        help='the sparsity parameter used for sparsification, between 0 to 1')
    parser.add_argument('-g', '--disable-graph', default=True, action='store_false',
                        dest='graph', help='disable graph')
    parser.add_argument('-v', '--log-verbosity', default=0, type=int, dest='verbosity')
    parser.add_argument('--data-dir', default=None,
                        help='folder with the MNIST/CIFAR files (default: bundled digits)')
    parser.add_argument('-c', '--checkpoint', default=None,
                        help='checkpoint file written by rank 0 (default: none)')
    parser.add_argument('--quick', action='store_true', help='a few small batches (for tests)')
    args = parser.parse_args(argv)
    if args.lr is None:
        args.lr = train_cnn.FAST_LR if args.model in ('cnn', 'mlp') else train_cnn.SINGA_LR
    if args.max_epoch is None:
        args.max_epoch = train_cnn.QUICK_EPOCHS if args.quick else train_cnn.DEFAULT_EPOCHS
    return args


def main(argv=None):
    args = parse_args(argv)
    # the rendezvous: a coordinator address, picklable, made without starting JAX
    nccl_id = singa.NcclIdHolder()
    process = [multiprocessing.Process(target=run, args=(args, rank, args.world_size, nccl_id))
               for rank in range(args.world_size)]
    for p in process:
        p.start()
    for p in process:
        p.join()
    failed = [rank for rank, p in enumerate(process) if p.exitcode != 0]
    if failed:
        sys.exit(f"ranks {failed} failed (exit codes "
                 f"{[process[r].exitcode for r in failed]})")


if __name__ == '__main__':
    main()
