"""What recording an eager operator must cost in CPython, against what it costs in singa_jax.

An eager SINGA operator, recorded by replay (see ``singa_jax/replay.py``), must leave behind an
operator object with its graph edges, an output Tensor whose creator it is, a placeholder for
the pending value and the kernel's record in the thread's segment. ``floor`` does exactly that
with ``__slots__`` classes and the same kind of tree lookup, and nothing else: the least a
Python eager core can spend per operator. ``singa_jax`` is the evaluation forward of the
100-block dispatch-bound network of ``bench_eager.py`` (Conv2d, BatchNorm2d, ReLU), recorded and
flushed, per operator. The two take turns in one process; the gap is the generic path (the
layer's checks, the functional wrapper, the operator's construction, the engine's call,
replay's record), which a recording path per operator kind would skip.

    .venv/bin/python benchmarks/bench_record_floor.py [--rounds 7]
"""
from __future__ import annotations

import argparse
import statistics
import time
import weakref

import numpy as np

from singa_jax import autograd, layer, replay, tensor

OPS = 300
_AVAL = ((1, 8, 8, 8), "float32")


class _Op:
    __slots__ = ("name", "src", "y_id2idx", "requires_grad", "device", "static")


class _Tensor:
    __slots__ = ("_data", "creator", "requires_grad", "stores_grad", "device", "name",
                 "__weakref__")


class _Pending:
    __slots__ = ("aval", "shape", "dtype", "segment", "index", "value")

    def __init__(self, aval, segment, index):
        self.aval, self.shape, self.dtype = aval, aval[0], aval[1]
        self.segment, self.index, self.value = segment, index, None


class _Segment:
    def __init__(self):
        self.calls, self.leaves, self.tensors = [], [], []


_TREE: dict = {}


def _record(x, w, segment, static):
    """One recorded operator, the least of it: operator, edges, output, placeholder, record."""
    op = _Op()
    op.name, op.static, op.requires_grad, op.device = "Conv2d", static, True, x.device
    op.src = [(x.creator, id(x), None, False), (w.creator, id(w), w, True)]
    key = ("conv", static, (x._data.index, _AVAL))
    node = _TREE.get(key)
    if node is None:
        node = _TREE[key] = key
    segment.calls.append(node)
    value = _Pending(_AVAL, segment, len(segment.leaves))
    segment.leaves.append(value)
    y = _Tensor()
    y._data, y.creator, y.requires_grad, y.stores_grad = value, op, True, False
    y.device, y.name = x.device, None
    op.y_id2idx = {id(y): 0}
    segment.tensors.append(weakref.ref(y))
    return y


def floor_forward() -> None:
    segment = _Segment()
    x, w = _Tensor(), _Tensor()
    x._data, x.creator, x.device = _Pending(_AVAL, segment, 0), None, "cpu"
    w._data, w.creator, w.device = None, None, "cpu"
    static = (("stride", (1, 1)), ("padding", (1, 1)))
    for _ in range(OPS):
        x = _record(x, w, segment, static)


def singa_jax_forward(blocks, x) -> None:
    h = x
    for conv, bn, relu in blocks:
        h = relu(bn(conv(h)))
    del h
    replay.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    blocks = [(layer.Conv2d(8, 8, 3, padding=1), layer.BatchNorm2d(8), layer.ReLU())
              for _ in range(OPS // 3)]
    x = tensor.from_numpy(np.random.default_rng(0).standard_normal((1, 8, 8, 8))
                          .astype(np.float32))
    autograd.training = False
    for _ in range(5):
        singa_jax_forward(blocks, x)
    times = {"floor": [], "singa_jax": []}
    for _ in range(args.rounds):
        for name, run in (("floor", floor_forward),
                          ("singa_jax", lambda: singa_jax_forward(blocks, x))):
            samples = []
            for _ in range(10):
                t0 = time.perf_counter()
                run()
                samples.append(time.perf_counter() - t0)
            times[name].append(statistics.median(samples) / OPS * 1e6)
    floor, ours = statistics.median(times["floor"]), statistics.median(times["singa_jax"])
    print(f"recording floor (CPython, the least an operator records): {floor:.2f} us an op")
    print(f"singa_jax, evaluation forward recorded (incl. its flush):  {ours:.2f} us an op")
    print(f"singa_jax / floor = {ours / floor:.1f}")


if __name__ == "__main__":
    main()
