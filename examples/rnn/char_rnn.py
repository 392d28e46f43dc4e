"""Character-level LSTM language model (SINGA's examples/rnn/char_rnn.py, ported to singa_jax).

    python examples/rnn/char_rnn.py [TEXT_FILE] [-b BATCH] [-l SEQ_LEN] [-d HIDDEN] [-m EPOCHS]

The text file defaults to ``examples/rnn/data/lighthouse.txt`` (a few KB of prose written for
this repository). The model reads one-hot characters through ``layer.LSTM`` and predicts the
next character; after training it prints validation loss and a sample of generated text.
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from common.training import (Progress, load_checkpoint, pick_device,  # noqa: E402
                             save_checkpoint, scalar)
from singa_jax import autograd, layer, model, opt, tensor  # noqa: E402

DEFAULT_TEXT = os.path.join(HERE, 'data', 'lighthouse.txt')
QUICK = dict(batch_size=8, seq_length=6, hidden_size=16, max_epoch=2, batches=6)


class CharRNN(model.Model):
    """LSTM over a list of one-hot (batch, vocab) tensors, then a shared linear read-out."""

    def __init__(self, vocab_size, hidden_size=32, lr=0.01):
        super().__init__()
        self.rnn = layer.LSTM(vocab_size, hidden_size)
        self.cat = layer.Cat()
        self.reshape1 = layer.Reshape()
        self.dense = layer.Linear(hidden_size, vocab_size)
        self.reshape2 = layer.Reshape()
        self.softmax_cross_entropy = layer.SoftMaxCrossEntropy()
        self.optimizer = opt.SGD(lr, momentum=0.9)
        self.hidden_size = hidden_size
        self.vocab_size = vocab_size

    def reset_states(self, dev):
        self.hx.to_device(dev)
        self.cx.to_device(dev)
        self.hx.set_value(0.0)
        self.cx.set_value(0.0)

    def initialize(self, inputs):
        batch_size = inputs[0].shape[0]
        self.hx = tensor.Tensor((batch_size, self.hidden_size), inputs[0].device)
        self.cx = tensor.Tensor((batch_size, self.hidden_size), inputs[0].device)
        self.reset_states(inputs[0].device)

    def forward(self, inputs):
        # the LSTM's final state is kept so that sampling can continue from it
        x, hx, cx = self.rnn(inputs, (self.hx, self.cx))
        self.hx.copy_data(hx)
        self.cx.copy_data(cx)
        x = self.cat(x)  # (seq * batch, hidden), time-major
        x = self.reshape1(x, (-1, self.hidden_size))
        return self.dense(x)

    def train_one_batch(self, x, y):
        out = self.forward(x)
        y = self.reshape2(y, (-1,))
        loss = self.softmax_cross_entropy(out, y)
        self.optimizer(loss)
        return out, loss


class Data:
    """A plain-text file cut into (seq_length + 1)-character rows, split into train and test."""

    def __init__(self, fpath, batch_size=32, seq_length=100, train_ratio=0.8, seed=0):
        with open(fpath, 'r', encoding='iso-8859-1') as f:
            self.raw_data = f.read()
        chars = sorted(set(self.raw_data))  # sorted: the same vocabulary on every run
        self.vocab_size = len(chars)
        self.char_to_idx = {ch: i for i, ch in enumerate(chars)}
        self.idx_to_char = dict(enumerate(chars))
        codes = np.asarray([self.char_to_idx[c] for c in self.raw_data], dtype=np.int32)
        num_rows = len(codes) // (seq_length + 1)
        rows = codes[:num_rows * (seq_length + 1)].reshape(num_rows, seq_length + 1)
        np.random.RandomState(seed).shuffle(rows)
        num_train = int(num_rows * train_ratio)
        self.train_dat, self.val_dat = rows[:num_train], rows[num_train:]
        self.num_train_batch = num_train // batch_size
        self.num_test_batch = self.val_dat.shape[0] // batch_size
        if self.num_train_batch == 0:
            raise ValueError(f"char_rnn: {fpath} has {len(codes)} characters, too few for one "
                             f"batch of {batch_size} rows of {seq_length + 1}")
        print('train dat', self.train_dat.shape)
        print('val dat', self.val_dat.shape)


def convert(batch, vocab_size, inputs, labels):
    """Copy a (batch, seq_length + 1) block of codes into the one-hot input tensors (one per
    time step) and the time-major next-character labels."""
    one_hot = np.eye(vocab_size, dtype=np.float32)[batch[:, :-1]]  # (batch, seq, vocab)
    for t, x in enumerate(inputs):
        x.copy_from_numpy(one_hot[:, t])
    labels.copy_from_numpy(np.ascontiguousarray(batch[:, 1:].T).reshape(-1))


def placeholders(batch_size, seq_length, vocab_size, dev):
    inputs = [tensor.Tensor((batch_size, vocab_size), dev) for _ in range(seq_length)]
    labels = tensor.Tensor((batch_size * seq_length,), dev, tensor.int32)
    return inputs, labels


def evaluate(net, data, batch_size, inputs, labels, dev):
    """Mean per-character cross-entropy on the held-out rows."""
    net.eval()
    total = 0.0
    for b in range(data.num_test_batch):
        convert(data.val_dat[b * batch_size:(b + 1) * batch_size], data.vocab_size, inputs,
                labels)
        net.reset_states(dev)
        loss = autograd.softmax_cross_entropy(net(inputs), labels)
        total += scalar(loss)
    return total / max(data.num_test_batch, 1)


def sample(net, data, dev, seed_text='The ', nsamples=100, use_max=False, rng=None):
    """Feed ``seed_text`` one character at a time, then draw ``nsamples`` more characters."""
    rng = rng or np.random.RandomState(0)
    net.eval()
    seed_text = ''.join(c for c in seed_text if c in data.char_to_idx) or data.idx_to_char[0]
    x = tensor.Tensor((1, data.vocab_size), dev)

    def step(code):
        x.copy_from_numpy(np.eye(data.vocab_size, dtype=np.float32)[[code]])
        return tensor.to_numpy(tensor.softmax(net([x])))[0]

    saved = net.hx, net.cx
    net.hx = tensor.Tensor((1, net.hidden_size), dev)
    net.cx = tensor.Tensor((1, net.hidden_size), dev)
    net.reset_states(dev)
    for c in seed_text:
        prob = step(data.char_to_idx[c])
    text = seed_text
    for _ in range(nsamples):
        prob = prob.astype(np.float64)
        prob /= prob.sum()  # renormalise in float64: choice() checks the sum to 1e-8
        code = int(np.argmax(prob)) if use_max else int(rng.choice(data.vocab_size, p=prob))
        text += data.idx_to_char[code]
        prob = step(code)
    net.hx, net.cx = saved
    return text


def train(data, max_epoch, hidden_size=100, seq_length=100, batch_size=16, lr=0.01,
          graph=True, checkpoint=None, resume=False, max_batches=None, nsamples=200):
    """Returns the history: per-step training losses and per-epoch validation losses."""
    dev = pick_device()
    dev.SetRandSeed(0)
    net = CharRNN(data.vocab_size, hidden_size, lr)
    inputs, labels = placeholders(batch_size, seq_length, data.vocab_size, dev)
    # as in SINGA's example there is no compile (its inputs are a list of tensors): the layers
    # initialise on the first call
    net.graph(graph, False)
    first_epoch = 0
    if resume:
        net.eval()
        net(inputs)  # create the parameters, then overwrite them
        first_epoch = load_checkpoint(net, checkpoint, net.optimizer)

    num_batches = data.num_train_batch
    if max_batches is not None:
        num_batches = min(num_batches, max_batches)
    history = {'losses': [], 'val_loss': []}
    for epoch in range(first_epoch, max_epoch):
        net.train()
        bar = Progress(num_batches, batch_size * seq_length, f'Epoch {epoch}')
        for b in bar:
            convert(data.train_dat[b * batch_size:(b + 1) * batch_size], data.vocab_size,
                    inputs, labels)
            _, loss = net(inputs, labels)
            net.reset_states(dev)  # every row starts from a zero state (initialize zeroes them)
            loss_value = scalar(loss)
            history['losses'].append(loss_value)
            bar.update(loss_value)
        bar.close()
        val_loss = evaluate(net, data, batch_size, inputs, labels, dev)
        history['val_loss'].append(val_loss)
        if checkpoint is not None:
            save_checkpoint(net, checkpoint, epoch, net.optimizer)
        print(f'Epoch {epoch}: train loss = {bar.mean_loss:.4f}, validation loss = '
              f'{val_loss:.4f} per character, {bar.throughput:.0f} chars/s', flush=True)
    if nsamples:
        print('Sample:', sample(net, data, dev, nsamples=nsamples))
    return history


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Train multi-stack LSTM for modeling character sequence from plain text '
        'files')
    parser.add_argument('data', type=str, nargs='?', default=DEFAULT_TEXT, help='training file')
    parser.add_argument('-b', type=int, default=16, help='batch_size')
    parser.add_argument('-l', type=int, default=64, help='sequence length')
    parser.add_argument('-d', type=int, default=128, help='hidden size')
    parser.add_argument('-m', type=int, default=50, help='max num of epoch')
    parser.add_argument('--lr', type=float, default=0.5, help='learning rate of SGD (momentum 0.9)')
    parser.add_argument('--graph', action=argparse.BooleanOptionalAction, default=True,
                        help='compile each training step into one XLA program')
    parser.add_argument('-c', '--checkpoint', default=os.path.join('checkpoints', 'char_rnn.zip'))
    parser.add_argument('-r', '--resume', action='store_true',
                        help='continue from the checkpoint')
    parser.add_argument('--quick', action='store_true', help='a few tiny batches (for tests)')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    sizes = dict(batch_size=args.b, seq_length=args.l, hidden_size=args.d, max_epoch=args.m,
                 batches=None)
    if args.quick:
        sizes = QUICK
    data = Data(args.data, batch_size=sizes['batch_size'], seq_length=sizes['seq_length'])
    return train(data, sizes['max_epoch'], hidden_size=sizes['hidden_size'],
                 seq_length=sizes['seq_length'], batch_size=sizes['batch_size'], lr=args.lr,
                 graph=args.graph, checkpoint=args.checkpoint, resume=args.resume,
                 max_batches=sizes['batches'], nsamples=5 if args.quick else 200)


if __name__ == '__main__':
    main()
