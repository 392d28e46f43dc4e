"""Train an image classifier (SINGA's examples/cnn/train_cnn.py, ported to singa_jax).

    python examples/cnn/train_cnn.py [model] [data] [-m EPOCHS] [-b BATCH] [-l LR]
                                     [--graph | --no-graph] [--data-dir DIR] [--resume]

model: cnn (default), alexnet, resnet (ResNet-50), xceptionnet, mlp.
data:  mnist (default), cifar10, cifar100.  With ``--data-dir`` the standard MNIST IDX files or
CIFAR python batches are read from that folder; without it the data is scikit-learn's bundled
8x8 digits upsampled to 28x28 (mnist) or 32x32x3 (cifar*), so the default run needs no download.

Each epoch shows a progress bar (loss, accuracy, images/s), prints a summary and saves a
checkpoint in SINGA's zip format (``Model.save_states``); ``--resume`` continues from it.
``--quick`` trains a few small batches (used by the tests).
"""
import argparse
import importlib
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # examples/: common, mlp
sys.path.insert(0, HERE)  # examples/cnn: model, data
from common.digits import resize_images  # noqa: E402
from common.training import (Progress, accuracy, load_checkpoint, pick_device,  # noqa: E402
                             save_checkpoint, scalar)
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


def augmentation(x, rng, flip, shift=4):
    """Random shifts of up to ``shift`` pixels (symmetric padding, then a random crop) and, when
    ``flip``, random horizontal flips, as SINGA's example does. Digits are not mirror-symmetric,
    so MNIST-like data is only shifted."""
    side = x.shape[2]
    padded = np.pad(x, [[0, 0], [0, 0], [shift, shift], [shift, shift]], 'symmetric')
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        top, left = rng.randint(2 * shift + 1, size=2)
        crop = padded[i, :, top:top + side, left:left + side]
        out[i] = crop[:, :, ::-1] if flip and rng.randint(2) else crop
    return out


def build_model(name, num_channels, num_classes, data_size, quick):
    module_name, constructor, quick_size = MODELS[name]
    factory = getattr(importlib.import_module(module_name), constructor)
    if name == 'mlp':
        return factory(data_size=data_size, num_classes=num_classes)
    kwargs = dict(num_channels=num_channels, num_classes=num_classes)
    if quick and quick_size is not None:
        kwargs['input_size'] = quick_size
    return factory(**kwargs)


def prepare(x, net, precision):
    """A host batch in the layout and size the model takes."""
    if net.dimension == 4:
        if x.shape[2] != net.input_size:
            x = resize_images(x, net.input_size)
    else:
        x = x.reshape(x.shape[0], -1)
    return x.astype(np_dtype[precision])


def evaluate(net, val_x, val_y, tx, batch_size, precision, max_batches=None):
    """Test accuracy over every test image; the last short batch is zero-padded so the input
    shape (and a graph-mode compilation) stays the same."""
    net.eval()
    correct, seen = 0, 0
    starts = range(0, len(val_y), batch_size)
    if max_batches is not None:
        starts = starts[:max_batches]
    for start in starts:
        x = val_x[start:start + batch_size]
        y = val_y[start:start + batch_size]
        count = len(y)
        if count < batch_size:
            x = np.concatenate([x, np.zeros((batch_size - count,) + x.shape[1:], x.dtype)])
        tx.copy_from_numpy(prepare(x, net, precision))
        out = tensor.to_numpy(net(tx))[:count]
        correct += accuracy(out, y)
        seen += count
    return correct / max(seen, 1)


def _share(a: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank ``rank``'s contiguous 1/world_size of ``a`` (the remainder is dropped)."""
    size = len(a) // world_size
    return a[rank * size:(rank + 1) * size]


def run(global_rank, world_size, local_rank, max_epoch, batch_size, model, data, sgd, graph,
        verbosity, dist_option='plain', spars=None, precision='float32', data_dir=None,
        checkpoint=None, resume=False, quick=False, autocast=None):
    """SINGA's ``run`` for one process; returns the history (per-step losses, per-epoch
    training loss/accuracy and test accuracy)."""
    dev = pick_device(local_rank)
    dev.SetRandSeed(0)
    rng = np.random.RandomState(0)

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
    num_train_batch = train_x.shape[0] // batch_size
    if quick:
        num_train_batch = min(num_train_batch, QUICK_TRAIN_BATCHES)
    idx = np.arange(train_x.shape[0], dtype=np.int32)

    net.set_optimizer(sgd)
    net.compile([tx], is_train=True, use_graph=graph, sequential=False, autocast=autocast)
    dev.SetVerbosity(verbosity)

    first_epoch = 0
    if resume:
        if checkpoint is None or not os.path.isfile(checkpoint):
            raise FileNotFoundError(f"--resume: no checkpoint at {checkpoint}")
        first_epoch = load_checkpoint(net, checkpoint, sgd)
        print(f"Resumed from {checkpoint}: continuing at epoch {first_epoch}")

    history = {'losses': [], 'train_loss': [], 'train_acc': [], 'test_acc': []}
    flip = data.startswith('cifar') and data_dir is not None
    for epoch in range(first_epoch, max_epoch):
        start_time = time.time()
        if not quick:  # quick runs revisit the same few batches so their loss must fall
            rng.shuffle(idx)
        net.train()
        bar = Progress(num_train_batch, batch_size, f'Epoch {epoch}', quiet=global_rank != 0)
        for b in bar:
            batch = idx[b * batch_size:(b + 1) * batch_size]
            x = train_x[batch]
            if net.dimension == 4:
                x = augmentation(x, rng, flip, MAX_SHIFT[data])
            tx.copy_from_numpy(prepare(x, net, precision))
            ty.copy_from_numpy(train_y[batch])
            out, loss = net(tx, ty, dist_option, spars)
            loss_value = scalar(loss)
            history['losses'].append(loss_value)
            bar.update(loss_value, accuracy(tensor.to_numpy(out), train_y[batch]))
        bar.close()

        test_acc = evaluate(net, val_x, val_y, tx, batch_size, precision,
                            QUICK_EVAL_BATCHES if quick else None)
        history['train_loss'].append(bar.mean_loss)
        history['train_acc'].append(bar.accuracy)
        history['test_acc'].append(test_acc)
        if checkpoint is not None:
            save_checkpoint(net, checkpoint, epoch, sgd)
        if global_rank == 0:
            print(f"Epoch {epoch}: training loss = {bar.mean_loss:.4f}, "
                  f"training accuracy = {bar.accuracy:.4f}, test accuracy = {test_acc:.4f}, "
                  f"{bar.throughput:.0f} img/s, {time.time() - start_time:.1f}s"
                  + (f", checkpoint {checkpoint}" if checkpoint else ''), flush=True)

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
