"""Data-parallel training launched by MPI, SLURM or a TPU pod (SINGA's examples/cnn/train_mpi.py).

    mpiexec -n 2 python examples/cnn/train_mpi.py cnn mnist -d plain
    srun --ntasks=8 python examples/cnn/train_mpi.py resnet cifar10
    python examples/cnn/train_mpi.py cnn mnist          # no launcher: one rank

``opt.DistOpt(sgd)`` joins the cluster the launcher describes through
``jax.distributed.initialize()``'s auto-detection (OpenMPI, SLURM, Cloud TPU pods); without a
launcher set ``JAX_COORDINATOR_ADDRESS=host:port JAX_NUM_PROCESSES=N JAX_PROCESS_ID=r`` in each
process's shell. With none of these it trains as the only rank. Flags are SINGA's (``-d``,
``-s``, ...); see docs/distributed.md.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import train_cnn  # noqa: E402
from train_multiprocess import parse_args, singa_dtype  # noqa: E402
from singa_jax import opt  # noqa: E402


def main(argv=None):
    args = parse_args(argv)  # -w is ignored: the launcher decides the world size
    sgd = opt.SGD(lr=args.lr, momentum=0.9, weight_decay=1e-5, dtype=singa_dtype[args.precision])
    sgd = opt.DistOpt(sgd)
    return train_cnn.run(sgd.global_rank, sgd.world_size, 0, args.max_epoch, args.batch_size,
                         args.model, args.data, sgd, args.graph, args.verbosity,
                         args.dist_option, args.spars, args.precision, data_dir=args.data_dir,
                         checkpoint=args.checkpoint if sgd.global_rank == 0 else None,
                         quick=args.quick, autocast=args.autocast)


if __name__ == '__main__':
    main()
