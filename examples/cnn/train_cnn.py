"""Train an image classifier (SINGA's examples/cnn/train_cnn.py, ported to singa_jax).

    python examples/cnn/train_cnn.py [model] [data] [-m EPOCHS] [-b BATCH] [-l LR]
                                     [--graph | --no-graph] [--data-dir DIR] [--resume]

model: cnn (default), alexnet, resnet (ResNet-50), xceptionnet, mlp.
data:  mnist (default), cifar10, cifar100.  With ``--data-dir`` the standard MNIST IDX files or
CIFAR python batches are read from that folder; without it the data is scikit-learn's bundled
8x8 digits upsampled to 28x28 (mnist) or 32x32x3 (cifar*), so the default run needs no download.

Batches come from ``singa_jax.data.DeviceLoader``: a background thread slices them, puts them
on the device (split over the devices when graph mode runs a DistOpt over several) and runs
the augmentation (random shifts, flips) and the resize to the model's input as one jitted
function there, two batches ahead of the step. The loop rebinds the model's input Tensors to
those device arrays and keeps each step's loss and correct count on the device; the host reads
them when the progress bar refreshes (every 0.5 s) and at the epoch's end, so it never waits
for a step without need.

Each epoch shows a progress bar (loss, accuracy, images/s, the share of time spent waiting
for input), prints a summary -- with how the training time split between the step, waiting
for input and other host work -- and saves a checkpoint in SINGA's zip format
(``Model.save_states``); ``--resume`` continues from it. ``--quick`` trains a few small
batches (used by the tests).
"""
import argparse
import importlib
import os
import sys
import time

import jax
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # examples/: common, mlp
sys.path.insert(0, HERE)  # examples/cnn: model, data
from common.training import (DeviceProgress, beside, correct_in,  # noqa: E402
                             load_checkpoint, pick_device, save_checkpoint)
from singa_jax import data as pipeline  # noqa: E402  (``data`` is the dataset's name here)
from singa_jax import opt, tensor  # noqa: E402

np_dtype = {"float16": np.float16, "float32": np.float32}
singa_dtype = {"float16": tensor.float16, "float32": tensor.float32}

# model name -> (module, constructor, input side used by --quick; None keeps the model's own)
MODELS = {
    'cnn': ('model.cnn', 'create_model', None),
    'alexnet': ('model.alexnet', 'create_model', 112),
    'resnet': ('model.resnet', 'resnet50', 32),
    'xceptionnet': ('model.xceptionnet', 'create_model', 71),
    'mlp': ('mlp.model', 'create_model', None),
}
DATASETS = ('mnist', 'cifar10', 'cifar100')

# the default run (SINGA's cnn on the digits) passes 97% test accuracy after 3-4 epochs
DEFAULT_EPOCHS = 10
# SINGA's default learning rate suits the deep models; the small ones learn the digits faster
SINGA_LR, FAST_LR = 0.005, 0.02
# --quick: epochs, train batches per epoch, evaluation batches, largest batch size
QUICK_EPOCHS, QUICK_TRAIN_BATCHES, QUICK_EVAL_BATCHES, QUICK_BATCH = 3, 4, 2, 16


# largest random shift (pixels) of the training images; SINGA uses 4 for every dataset, but the
# digits fill their whole (upsampled) frame, so they are shifted less
MAX_SHIFT = {'mnist': 2, 'cifar10': 4, 'cifar100': 4}
# batches the loader makes ahead of the step
PREFETCH = 2
# steps the host may dispatch ahead of the device (more only holds more batches in memory)
IN_FLIGHT = 2
# the share of the training time outside the step above which the epoch line flags it
OUTSIDE_STEP_WARNING = 0.10


def transforms(net, data, flip, precision, train):
    """The device-side transform of a batch: for training, random shifts of up to
    ``MAX_SHIFT[data]`` pixels (symmetric padding, then a random crop) and, when ``flip``,
    random horizontal flips, as SINGA's example does (digits are not mirror-symmetric, so
    MNIST-like data is only shifted); then the resize to the model's input (AlexNet, ResNet and
    Xception take larger images than the data) and the cast to the model's dtype. An MLP
    takes flat rows."""
    if net.dimension != 4:
        return pipeline.compose(pipeline.flatten(), pipeline.cast(np_dtype[precision]))
    pieces = []
    if train:
        pieces.append(pipeline.random_shift(MAX_SHIFT[data], mode='symmetric'))
        if flip:
            pieces.append(pipeline.random_flip())
    pieces += [pipeline.resize(net.input_size), pipeline.cast(np_dtype[precision])]
    return pipeline.compose(*pieces)


def batch_placement(sgd, graph, dev):
    """Where the training batches go: split over this process's devices when graph mode runs a
    DistOpt over several of them in one process (the compiled step splits the batch over the
    mesh; a batch already laid out that way is taken as it is), else on ``dev``. With several
    processes each rank hands its own batch to the step, which places it on the mesh itself
    (opt/spmd.py), so it stays on the rank's device."""
    if graph and isinstance(sgd, opt.DistOpt) and sgd.world_size == 1 \
            and jax.local_device_count() > 1:
        return {'sharding': sgd.mesh}  # the loader splits the batch over all its axes
    return {'device': dev}


def build_model(name, num_channels, num_classes, data_size, quick):
    module_name, constructor, quick_size = MODELS[name]
    factory = getattr(importlib.import_module(module_name), constructor)
    if name == 'mlp':
        return factory(data_size=data_size, num_classes=num_classes)
    kwargs = dict(num_channels=num_channels, num_classes=num_classes)
    if quick and quick_size is not None:
        kwargs['input_size'] = quick_size
    return factory(**kwargs)


def evaluate(net, loader, tx):
    """Test accuracy over every test image (the loader zero-pads the last short batch so the
    input shape, and a graph-mode compilation, stays the same). The correct counts stay on
    the device until the pass ends."""
    net.eval()
    correct, seen = [], 0
    batches = loader.epoch(0)
    for x, y in batches:
        tx.array = x
        out = net(tx).array
        correct.append(correct_in(out, beside(y, out), batches.count))
        seen += batches.count
        if len(correct) > IN_FLIGHT:  # keep the host at most IN_FLIGHT batches ahead
            correct[-1 - IN_FLIGHT].block_until_ready()
    return int(np.sum(jax.device_get(correct))) / max(seen, 1)


def time_shares(split):
    """The epoch line's account of where the training time went."""
    text = (f"step {split['step']:.0%} of training time (input wait {split['input']:.0%}, "
            f"host {split['host']:.0%})")
    if split['input'] > split['host'] and 1 - split['step'] > OUTSIDE_STEP_WARNING:
        text += ', input-bound'
    if split['compile'] >= 0.05:
        text += f", compiling {split['compile']:.1f}s not counted"
    return text


def _share(a: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank ``rank``'s contiguous 1/world_size of ``a`` (the remainder is dropped)."""
    size = len(a) // world_size
    return a[rank * size:(rank + 1) * size]


def run(global_rank, world_size, local_rank, max_epoch, batch_size, model, data, sgd, graph,
        verbosity, dist_option='plain', spars=None, precision='float32', data_dir=None,
        checkpoint=None, resume=False, quick=False, autocast=None):
    """SINGA's ``run`` for one process; returns the history (per-step losses, per-epoch
    training loss/accuracy, test accuracy, training img/s and ``DeviceProgress.time_split``)."""
    dev = pick_device(local_rank)
    dev.SetRandSeed(0)

    train_x, train_y, val_x, val_y = importlib.import_module('data.' + data).load(data_dir)
    if world_size > 1:  # each rank trains and tests on its own share, as SINGA's run() does
        train_x, train_y = _share(train_x, global_rank, world_size), _share(train_y, global_rank,
                                                                             world_size)
        val_x, val_y = _share(val_x, global_rank, world_size), _share(val_y, global_rank,
                                                                     world_size)
    if data_dir is None and global_rank == 0:
        print(f"No --data-dir: training on scikit-learn's digits shaped like {data} "
              f"({len(train_y)} train / {len(val_y)} test images).")
    num_channels = train_x.shape[1]
    data_size = int(np.prod(train_x.shape[1:]))
    num_classes = int(np.max(train_y)) + 1

    if quick:
        batch_size = min(batch_size, QUICK_BATCH)
    net = build_model(model, num_channels, num_classes, data_size, quick)

    if net.dimension == 4:
        tx = tensor.Tensor((batch_size, num_channels, net.input_size, net.input_size), dev,
                           singa_dtype[precision])
    else:
        tx = tensor.Tensor((batch_size, data_size), dev, singa_dtype[precision])
    ty = tensor.Tensor((batch_size,), dev, tensor.int32)
    flip = data.startswith('cifar') and data_dir is not None
    # quick runs revisit the same few batches (no shuffle) so their loss must fall
    train_loader = pipeline.DeviceLoader(
        train_x, train_y, batch_size, shuffle=not quick, seed=0, drop_last=True,
        transform=transforms(net, data, flip, precision, train=True), prefetch=PREFETCH,
        batches_per_epoch=QUICK_TRAIN_BATCHES if quick else None,
        **batch_placement(sgd, graph, dev))
    test_loader = pipeline.DeviceLoader(
        val_x, val_y, batch_size, drop_last=False, pad_last=True,
        transform=transforms(net, data, flip, precision, train=False), prefetch=PREFETCH,
        device=dev, batches_per_epoch=QUICK_EVAL_BATCHES if quick else None)
    num_train_batch = len(train_loader)

    net.set_optimizer(sgd)
    net.compile([tx], is_train=True, use_graph=graph, sequential=False, autocast=autocast)
    dev.SetVerbosity(verbosity)

    first_epoch = 0
    if resume:
        if checkpoint is None or not os.path.isfile(checkpoint):
            raise FileNotFoundError(f"--resume: no checkpoint at {checkpoint}")
        first_epoch = load_checkpoint(net, checkpoint, sgd)
        print(f"Resumed from {checkpoint}: continuing at epoch {first_epoch}")

    history = {'losses': [], 'train_loss': [], 'train_acc': [], 'test_acc': [],
               'img_per_s': [], 'time_split': []}
    for epoch in range(first_epoch, max_epoch):
        start_time = time.time()
        net.train()
        batches = train_loader.epoch(epoch)  # its thread starts making batches now
        bar = DeviceProgress(num_train_batch, batch_size, f'Epoch {epoch}', batches,
                             quiet=global_rank != 0, in_flight=IN_FLIGHT)
        for x, y in batches:
            tx.array, ty.array = x, y  # rebind: the batch is on the device already
            traces = net.graph_stats()["traces"]  # a call that traced compiled
            started = time.perf_counter()
            out, loss = net(tx, ty, dist_option, spars)
            if net.graph_stats()["traces"] != traces:
                bar.exclude(time.perf_counter() - started)  # compiling, not training
            bar.record(loss.array, out.array, y)
        bar.finish()
        history['losses'].extend(bar.losses)
        split = bar.time_split()

        test_acc = evaluate(net, test_loader, tx)
        history['train_loss'].append(bar.mean_loss)
        history['train_acc'].append(bar.accuracy)
        history['test_acc'].append(test_acc)
        history['img_per_s'].append(bar.throughput)
        history['time_split'].append(split)
        if checkpoint is not None:
            save_checkpoint(net, checkpoint, epoch, sgd)
        if global_rank == 0:
            print(f"Epoch {epoch}: training loss = {bar.mean_loss:.4f}, "
                  f"training accuracy = {bar.accuracy:.4f}, test accuracy = {test_acc:.4f}, "
                  f"{bar.throughput:.0f} img/s, {time.time() - start_time:.1f}s"
                  + (f", checkpoint {checkpoint}" if checkpoint else '')
                  + f"; {time_shares(split)}", flush=True)

    if verbosity > 0:
        dev.PrintTimeProfiling()
    return history


def add_autocast_argument(parser):
    """``--autocast bfloat16|float16``: mixed precision with float32 master weights (see
    docs/mixed_precision.md); ``-p float16`` is SINGA's float16 model instead."""
    parser.add_argument('--autocast', choices=['bfloat16', 'float16'], default=None,
                        help='compute products in this dtype, parameters float32 (float16: '
                        'with loss scaling)')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Training using the autograd and graph.')
    parser.add_argument('model', nargs='?', choices=sorted(MODELS), default='cnn')
    parser.add_argument('data', nargs='?', choices=DATASETS, default='mnist')
    parser.add_argument('-p', choices=['float32', 'float16'], default='float32',
                        dest='precision')
    add_autocast_argument(parser)
    parser.add_argument('-m', '--max-epoch', default=None, type=int,
                        help=f'maximum epochs (default {DEFAULT_EPOCHS}; '
                        f'{QUICK_EPOCHS} with --quick)',
                        dest='max_epoch')
    parser.add_argument('-b', '--batch-size', '--batch', default=64, type=int,
                        help='batch size', dest='batch_size')
    parser.add_argument('-l', '--learning-rate', '--lr', default=None, type=float,
                        help='initial learning rate (default 0.02 for cnn and mlp, SINGA\'s '
                        '0.005 for the deep models)', dest='lr')
    parser.add_argument('-i', '--device-id', default=0, type=int,
                        help='which device (of the default backend) to use', dest='device_id')
    parser.add_argument('-g', '--disable-graph', default=True, action='store_false',
                        help='disable graph (same as --no-graph)', dest='graph')
    parser.add_argument('--graph', action=argparse.BooleanOptionalAction, default=True,
                        help='compile each training step into one XLA program', dest='graph')
    parser.add_argument('-v', '--log-verbosity', default=0, type=int,
                        help='logging verbosity', dest='verbosity')
    parser.add_argument('-d', '--data-dir', default=None,
                        help='folder with the MNIST/CIFAR files (default: bundled digits)')
    parser.add_argument('-c', '--checkpoint', default=None,
                        help='checkpoint file (default: checkpoints/<model>_<data>.zip)')
    parser.add_argument('-r', '--resume', action='store_true',
                        help='continue from the checkpoint')
    parser.add_argument('--quick', action='store_true',
                        help='a few small batches on small inputs (for tests)')
    args = parser.parse_args(argv)
    if args.lr is None:
        args.lr = FAST_LR if args.model in ('cnn', 'mlp') else SINGA_LR
    if args.max_epoch is None:
        args.max_epoch = QUICK_EPOCHS if args.quick else DEFAULT_EPOCHS
    if args.checkpoint is None:
        args.checkpoint = os.path.join('checkpoints', f'{args.model}_{args.data}.zip')
    return args


def main(argv=None):
    args = parse_args(argv)
    sgd = opt.SGD(lr=args.lr, momentum=0.9, weight_decay=1e-5,
                  dtype=singa_dtype[args.precision])
    return run(0, 1, args.device_id, args.max_epoch, args.batch_size, args.model, args.data,
               sgd, args.graph, args.verbosity, precision=args.precision,
               data_dir=args.data_dir, checkpoint=args.checkpoint, resume=args.resume,
               quick=args.quick, autocast=args.autocast)


if __name__ == '__main__':
    main()
