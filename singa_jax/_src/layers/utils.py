"""SINGA's ``utils`` helpers, public in :mod:`singa_jax.utils`: padding arithmetic for SAME
modes, odd-padding helpers, handle renewal, a graph's post order and a progress bar."""
from __future__ import annotations

import collections
import math
import sys
from typing import Any, List, Sequence, Tuple

import jax
import jax.numpy as jnp
from jax import lax

from singa_jax._src.ops.nn import replicate_odd_pad

OrderedDict = collections.OrderedDict

__all__ = ["OrderedDict", "update_progress", "handle_odd_pad_fwd", "handle_odd_pad_bwd",
           "same_pad_shape_check", "re_new_handle", "get_padding_shape", "get_output_shape",
           "force_unicode", "post_order_recursive"]


def update_progress(progress: float, info: str) -> None:
    """Draw a 20-character progress bar for ``progress`` in [0, 1] followed by ``info``
    (negative: halted; >= 1: done), rewriting the same console line."""
    status = ""
    if isinstance(progress, int):
        progress = float(progress)
    if not isinstance(progress, float):
        progress, status = 0.0, "error: progress var must be float. "
    if progress < 0:
        progress, status = 0.0, "Halt. "
    if progress >= 1:
        progress, status = 1.0, "Done. "
    status += info
    filled = int(round(20 * progress))
    text = f"[{'.' * filled}{' ' * (20 - filled)}] {progress * 100:3.1f}% {status}"
    sys.stdout.write(text + "\b" * (9 + 20 + len(status)))
    sys.stdout.flush()


def handle_odd_pad_fwd(x: jax.Array, odd_padding: Sequence[int], is_pool: bool = False):
    """Pad NCHW ``x`` by ``odd_padding`` = (top, bottom, left, right): with zeros for convolution,
    with copies of the border rows/columns for pooling (as SINGA does)."""
    top, bottom, left, right = (int(p) for p in odd_padding)
    if is_pool:
        return replicate_odd_pad(x, (top, bottom, left, right))
    return jnp.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))


def handle_odd_pad_bwd(dx: jax.Array, odd_padding: Sequence[int]):
    """The gradient w.r.t. the unpadded input: cut ``odd_padding`` off ``dx``."""
    top, bottom, left, right = (int(p) for p in odd_padding)
    h, w = dx.shape[2], dx.shape[3]
    return lax.slice(dx, (0, 0, top, left), (dx.shape[0], dx.shape[1], h - bottom, w - right))


def get_output_shape(auto_pad: str, input_spatial_shape: Sequence[int],
                     kernel_spatial_shape: Sequence[int],
                     strides_spatial: Sequence[int]) -> List[int]:
    """ONNX's output size: ``ceil(in / stride)`` for SAME_*, ``ceil((in - k + 1) / stride)`` for
    VALID (zeros for any other mode, as in SINGA)."""
    n = len(input_spatial_shape)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return [math.ceil(input_spatial_shape[i] / strides_spatial[i]) for i in range(n)]
    if auto_pad == "VALID":
        return [math.ceil((input_spatial_shape[i] - kernel_spatial_shape[i] + 1) /
                          strides_spatial[i]) for i in range(n)]
    return [0] * n


def get_padding_shape(pad_mode: str, input_spatial_shape: Sequence[int],
                      kernel_spatial_shape: Sequence[int],
                      strides_spatial: Sequence[int]) -> Tuple[List[int], List[int]]:
    """``(pad_shape, odd_pad_shape)``, each ``[before_0, after_0, before_1, after_1, ...]``: the
    symmetric half of the padding that makes ``get_output_shape`` hold, and the odd remainder,
    which goes after (SAME_UPPER) or before (SAME_LOWER)."""
    out = get_output_shape(pad_mode, input_spatial_shape, kernel_spatial_shape, strides_spatial)
    pads = [0] * (2 * len(input_spatial_shape))
    odd = [0] * (2 * len(input_spatial_shape))
    for i, n in enumerate(input_spatial_shape):
        # clamped: a kernel smaller than its stride needs no padding (SINGA's would be negative)
        total = max((out[i] - 1) * strides_spatial[i] + kernel_spatial_shape[i] - n, 0)
        pads[2 * i] = pads[2 * i + 1] = total // 2
        if total % 2:
            odd[2 * i + (1 if pad_mode == "SAME_UPPER" else 0)] += 1
    return pads, odd


def same_pad_shape_check(handle: Any, pad_mode: str, x: Any) -> List[int]:
    """The padding ``[before_h, after_h, before_w, after_w]`` (odd part excluded) of a SAME mode
    for input ``x``; ValueError when the handle's symmetric padding differs from it (SINGA
    asserts, and its own check halves the wrong value)."""
    shape = tuple(x.shape() if callable(x.shape) else x.shape)
    pads, _ = get_padding_shape(pad_mode, shape[2:], [handle.kernel_h, handle.kernel_w],
                                [handle.stride_h, handle.stride_w])
    expected = [pads[0], pads[2]]
    if [handle.pad_h, handle.pad_w] != expected:
        raise ValueError(f"same_pad_shape_check: for {pad_mode} and input shape {shape} the "
                         f"handle's padding {[handle.pad_h, handle.pad_w]} should be {expected}")
    return pads


def re_new_handle(handle: Any, x: Any, is_pool: bool = False) -> Any:
    """A handle of the same type and configuration for the new input ``x``."""
    kernel = [handle.kernel_h, handle.kernel_w]
    stride = [handle.stride_h, handle.stride_w]
    padding = [handle.pad_h, handle.pad_w]
    if is_pool:
        return type(handle)(x, kernel, stride, padding, handle.is_max_pooling)
    return type(handle)(x, kernel, stride, padding, handle.channels, handle.num_filters,
                        handle.bias_term, handle.group)


def force_unicode(s: Any) -> str:
    """``s`` decoded as UTF-8 when it is bytes, else unchanged."""
    try:
        return s.decode("utf-8")
    except AttributeError:
        return s


def post_order_recursive(root: Any, root_t: Any):
    """The autograd graph ending at operator ``root`` in topological (post-)order:
    ``(nodes, weights, inputs)``, ordered dicts of operators by name, of leaf tensors kept by the
    graph (those with ``stores_grad``, e.g. weights) and of the other leaves' names (graph
    inputs, whose tensors the graph does not keep: the value is None)."""
    nodes, weights, inputs = OrderedDict(), OrderedDict(), OrderedDict()
    seen = set()
    stack = [(root, root_t, False)]
    while stack:  # iterative DFS: deep graphs must not hit Python's recursion limit
        op, t, expanded = stack.pop()
        if op is None:
            continue
        if not expanded:
            stack.append((op, t, True))
            for src_op, _, y, _ in reversed(op.src):
                stack.append((src_op, y, False))
            continue
        if id(op) in seen and type(op).__name__ != "Dummy":
            continue
        seen.add(id(op))
        if type(op).__name__ == "Dummy":
            (weights if t is not None else inputs)[op.name] = t
        else:
            nodes[op.name] = op
    return nodes, weights, inputs
