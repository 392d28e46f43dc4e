"""What recording an eager operator must cost in CPython, against what it costs in singa_jax.

An eager SINGA operator, recorded by replay (see ``singa_jax/replay.py``), must leave behind an
operator object with its graph edges, an output Tensor whose creator it is, a placeholder for
the pending value and the kernel's record in the thread's segment. Three variants, per operator
of a chain of 300 ``Conv2d(8, 8, 3, padding=1)`` layers on one 8x8x8 image in evaluation mode
(recorded, then flushed), taking turns in one process:

* ``floor``: exactly that bookkeeping with ``__slots__`` classes and the same kind of tree
  lookup, and nothing else -- the least a Python eager core can spend per operator;
* ``singa_jax``: the layers called as users call them;
* ``collapsed``: a prototype of a recording path per operator kind -- for the signature of the
  layer's last call, the operator built from a template and recorded through singa_jax's own
  ``replay.run`` and ``result_tensor``, skipping the layer's wrapper, the functional, the
  operator's constructors and the engine's generic call. A measurement, not an implementation:
  it covers this one case (no autocast, no PyTorch-style tracking, no training-mode pullback).

    .venv/bin/python benchmarks/bench_record_floor.py [--rounds 15]
"""
from __future__ import annotations

import argparse
import statistics
import time
import weakref

import numpy as np

from singa_jax import autograd, layer, tensor
from singa_jax._src.eager import replay
from singa_jax._src.autodiff import kernels
from singa_jax._src.ops import nn as nn_ops
from singa_jax._src.base.modes import is_grad_enabled, is_training
from singa_jax._src.tensor.tensor import result_tensor

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


def _collapsed_conv(conv, x):
    """``conv(x)`` recorded by the prototype path (see the module docstring), or by the layer
    when the call is not the one the template was made for."""
    W, b, dev = conv.W, conv.b, x.device
    if not (x.shape == conv.__dict__.get("_handle_shape") and W.device is dev and
            b.device is dev and W.dtype == x.dtype and b.dtype == x.dtype and replay.active()
            and not is_training()):
        return conv(x)
    template = conv.__dict__.get("_collapsed")
    if template is None:
        probe = nn_ops._Conv2d(conv.handle, conv.odd_padding)
        static = probe._static
        template = conv.__dict__["_collapsed"] = (
            dict(static=probe.static, _static=static, handle=conv.handle,
                 odd_padding=conv.odd_padding),
            kernels.interned((nn_ops._Conv2d.fn, static)))
    attrs, statics = template
    op = object.__new__(nn_ops._Conv2d)
    state = op.__dict__
    state["name"] = "_Conv2d"
    state.update(attrs)
    state["src"] = [(x.creator, id(x), None, False), (W.creator, id(W), W, True),
                    (b.creator, id(b), b, True)]
    grad = is_grad_enabled()
    state["requires_grad"], state["device"] = grad, dev
    state["input_needs_grad"] = (False, True, True)
    out = replay.run(kernels.forward_kernel, statics, (x._data, W._data, b._data), dev)
    y = result_tensor(out, dev, grad, op, None, True)
    replay.bind(y, out)
    state["y_id2idx"] = {id(y): 0}
    return y


def singa_jax_forward(convs, x, collapsed: bool = False) -> None:
    h = x
    for conv in convs:
        h = _collapsed_conv(conv, h) if collapsed else conv(h)
    del h
    replay.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    convs = [layer.Conv2d(8, 8, 3, padding=1) for _ in range(OPS)]
    x = tensor.from_numpy(np.random.default_rng(0).standard_normal((1, 8, 8, 8))
                          .astype(np.float32))
    autograd.training = False
    variants = {"floor": floor_forward,
                "singa_jax": lambda: singa_jax_forward(convs, x),
                "collapsed": lambda: singa_jax_forward(convs, x, collapsed=True)}
    for run in variants.values():
        for _ in range(5):
            run()
    results = []
    for collapsed in (False, True):  # the prototype computes what the layers compute
        h = x
        for conv in convs:
            h = _collapsed_conv(conv, h) if collapsed else conv(h)
        results.append(tensor.to_numpy(h))
    np.testing.assert_array_equal(results[0], results[1])
    times: dict = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, run in variants.items():
            samples = []
            for _ in range(5):
                t0 = time.perf_counter()
                run()
                samples.append(time.perf_counter() - t0)
            times[name].append(statistics.median(samples) / OPS * 1e6)
    us = {name: statistics.median(t) for name, t in times.items()}
    print(f"floor (CPython, the least an operator records): {us['floor']:6.2f} us an op")
    print(f"singa_jax, the layers called:                    {us['singa_jax']:6.2f} us an op")
    print(f"collapsed recording path (prototype):            {us['collapsed']:6.2f} us an op")
    print(f"singa_jax / floor = {us['singa_jax'] / us['floor']:.1f}   "
          f"collapsed / singa_jax = {us['collapsed'] / us['singa_jax']:.2f}")


if __name__ == "__main__":
    main()
