"""Recurrent layers: RNN and LSTM (SINGA's per-gate weights) and CudnnRNN (one flat weight).

SINGA unrolls RNN/LSTM step by step in Python; here the whole sequence is one operator whose
kernel is a ``jax.lax.scan`` (one compiled loop, gradients by ``jax.vjp``), with the input
projections of all steps done in one matmul before the loop. All three layers run the same
scan kernel, ``ops.nn.rnn_direction`` (cuDNN's cell): RNN/LSTM only lay their per-gate
weights out as cuDNN's stacked matrices first. ``step_forward`` keeps SINGA's single-step form
built from autograd ops.
"""
from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import jax
import jax.numpy as jnp

from singa_jax._src.layers import initializer as init
from singa_jax._src.ops.declare import make_function
from singa_jax._src.ops.nn import rnn_direction
from singa_jax._src.tensor.tensor import Tensor
from singa_jax._src.layers.base import Layer
from singa_jax._src.ops.elementwise import add, add_bias, matmul, mul, relu, sigmoid, tanh
from singa_jax._src.ops.handles import CudnnRNNHandle
from singa_jax._src.ops.nn import _RNN
from singa_jax._src.ops.shape import transpose

__all__ = ["RNN_Base", "RNN", "LSTM", "CudnnRNN"]

# SINGA's rnn_mode names -> cuDNN mode numbers (0: relu RNN, 1: tanh RNN, 2: LSTM, 3: GRU)
_CUDNN_MODES = {"relu": 0, "vanilla": 1, "tanh": 1, "lstm": 2, "gru": 3}
_RNN_NONLINEARITIES = ("relu", "tanh")
_LSTM_GATES = ("i", "f", "o", "g")  # layer.LSTM's parameter order (SINGA's)
_CUDNN_LSTM_GATES = ("i", "f", "g", "o")  # the order of cuDNN's cell (and its packed weights)


def _broadcast_batch(xs: jax.Array, hidden: int, *states: jax.Array):
    """``xs: (T, batch, in)`` and the initial states broadcast to one batch, as SINGA's step
    ops broadcast ``x_t`` against the state: a state may be ``(1, hidden)`` or ``(hidden,)``,
    and inputs of batch 1 may run against a state of batch B (char_rnn samples that way)."""
    batch = max([xs.shape[1]] + [s.shape[0] for s in states if s.ndim == 2])
    xs = jnp.broadcast_to(xs, (xs.shape[0], batch, xs.shape[2]))
    return xs, tuple(jnp.broadcast_to(s, (batch, hidden)) for s in states)


def _rnn_sequence(*arrays, n_steps: int, nonlinearity: str):
    """``h_t = act(x_t Wx + h_{t-1} Wh + b)``; inputs ``x_1..x_T, h0, Wx, Wh, b``; returns
    ``(h_1, ..., h_T)``. cuDNN's cell with ``W = Wx^T``, ``R = Wh^T``, ``b_W = b``, ``b_R = 0``."""
    xs, (h0, wx, wh, b) = jnp.stack(arrays[:n_steps]), arrays[n_steps:]
    xs, (h0,) = _broadcast_batch(xs, wh.shape[0], h0)
    hs, _, _ = rnn_direction(_CUDNN_MODES[nonlinearity], xs, None, h0, jnp.zeros_like(h0),
                              wx.T, wh.T, b, jnp.zeros_like(b))
    return tuple(hs[t] for t in range(n_steps))


def _lstm_sequence(*arrays, n_steps: int):
    """SINGA's LSTM; inputs ``x_1..x_T, h0, c0`` then ``Wx_{i,f,o,g}, Wh_{i,f,o,g},
    Bx_{i,f,o,g}, Bh_{i,f,o,g}``; returns ``(h_1, ..., h_T, c_T)``::

        i, f, o = sigmoid(x Wx_* + Bx_* + h Wh_* + Bh_*);  g = tanh(x Wx_g + Bx_g + h Wh_g + Bh_g)
        c' = f * c + i * g;  h' = o * tanh(c')

    which is cuDNN's LSTM cell once the gates are stacked in its order (i, f, g, o).
    """
    xs, (h0, c0), w = jnp.stack(arrays[:n_steps]), arrays[n_steps:n_steps + 2], arrays[n_steps + 2:]
    xs, (h0, c0) = _broadcast_batch(xs, w[4].shape[0], h0, c0)
    per_kind = {kind: dict(zip(_LSTM_GATES, w[4 * k:4 * k + 4]))
                for k, kind in enumerate(("Wx", "Wh", "Bx", "Bh"))}

    def stacked(kind: str, axis: int):  # one kind of weight, its gates in cuDNN's order
        return jnp.concatenate([per_kind[kind][g] for g in _CUDNN_LSTM_GATES], axis=axis)

    # both biases folded into the input projection's (one add per step fewer); b_R = 0
    bias = stacked("Bx", 0) + stacked("Bh", 0)
    hs, _, c_last = rnn_direction(_CUDNN_MODES["lstm"], xs, None, h0, c0, stacked("Wx", 1).T,
                                   stacked("Wh", 1).T, bias, jnp.zeros_like(bias))
    return tuple(hs[t] for t in range(n_steps)) + (c_last,)


_RNNSequence = make_function("_RNNSequence", _rnn_sequence)
_LSTMSequence = make_function("_LSTMSequence", _lstm_sequence)


def _broadcasts_to(shape: Tuple[int, ...], target: Tuple[int, ...]) -> bool:
    """Whether NumPy broadcasting takes ``shape`` to exactly ``target``."""
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(shape[::-1], target[::-1]))


class RNN_Base(Layer):
    """Common checks of SINGA's recurrent layers (inputs: a list of ``(batch, input_size)``)."""

    def step_forward(self, x=None, h=None, c=None, Wx=None, Wh=None, Bx=None, Bh=None, b=None):
        raise NotImplementedError(f"{type(self).__name__}.step_forward is not implemented")

    def _configure(self, input_size: int, hidden_size: int, num_layers: int, nonlinearity: str,
                   bias: bool, batch_first: bool, dropout: float, bidirectional: bool) -> None:
        """Record SINGA's constructor options (one unidirectional layer runs, as in SINGA)."""
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.nonlinearity = nonlinearity
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = dropout
        self.bidirectional = bidirectional

    def _check_sequence(self, xs: Any, states: Sequence[Tensor]) -> List[Tensor]:
        if isinstance(xs, Tensor) or not isinstance(xs, (list, tuple)) or len(xs) == 0:
            raise TypeError(f"{self._describe()}: xs must be a non-empty list of Tensors of "
                            f"shape (batch, {self.input_size}), got {type(xs).__name__}")
        xs = list(xs)
        batch = xs[0].shape[0] if xs[0].ndim() == 2 else None
        for x in xs:
            if x.ndim() != 2 or x.shape != (batch, self.input_size):
                raise self._input_error("shape (batch, input_size)", (batch, self.input_size), x)
        # SINGA's ops broadcast x_t against the initial state: a state may be (1, hidden) or
        # (hidden,), and inputs of batch 1 may run against a state of batch B
        if batch == 1:
            batch = max([1] + [s.shape[0] for s in states if s.ndim() == 2])
        for s in states:
            if not _broadcasts_to(s.shape, (batch, self.hidden_size)):
                raise ValueError(f"{self._describe()}: initial state must have shape "
                                 f"(batch, hidden_size) = {(batch, self.hidden_size)} or one "
                                 f"that broadcasts to it, got {s.shape}")
        return xs


class RNN(RNN_Base):
    """Vanilla RNN: ``h_t = act(x_t Wx + h_{t-1} Wh + b)`` with ``act`` tanh or relu.
    ``Wx: (input_size, hidden_size)``, ``Wh: (hidden_size, hidden_size)`` ~ N(0, 1); ``b = 0``.
    ``forward(xs, h0)`` returns ``(list of h_t, h_T)``. As in SINGA, ``num_layers``,
    ``batch_first``, ``dropout`` and ``bidirectional`` are recorded but one layer runs."""

    _param_attrs = ("Wx", "Wh", "b")

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 nonlinearity: str = "tanh", bias: bool = True, batch_first: bool = False,
                 dropout: float = 0, bidirectional: bool = False):
        super().__init__()
        if nonlinearity not in _RNN_NONLINEARITIES:
            raise ValueError(f"RNN: nonlinearity must be one of {list(_RNN_NONLINEARITIES)}, "
                             f"got {nonlinearity!r}")
        self._configure(input_size, hidden_size, num_layers, nonlinearity, bias, batch_first,
                        dropout, bidirectional)

    def initialize(self, xs, h0) -> None:
        self._build(h0.device)

    def _build(self, device) -> None:
        self.Wx = init.gaussian_fill(self._new_param((self.input_size, self.hidden_size), device))
        self.Wh = init.gaussian_fill(self._new_param((self.hidden_size, self.hidden_size), device))
        self.b = self._new_param((self.hidden_size,), device)

    def forward(self, xs, h0) -> Tuple[List[Tensor], Tensor]:
        xs = self._check_sequence(xs, [h0])
        self.device_check(h0, *xs, self.Wx, self.Wh, self.b)
        op = _RNNSequence(n_steps=len(xs), nonlinearity=self.nonlinearity)
        out = list(op(*xs, h0, self.Wx, self.Wh, self.b))
        return out, out[-1]

    def step_forward(self, x, h, Wx, Wh, b) -> Tensor:
        """One step with autograd ops: ``act(h Wh + x Wx + b)``."""
        y = add(matmul(h, Wh), matmul(x, Wx))
        y = add_bias(y, b, axis=0)
        return tanh(y) if self.nonlinearity == "tanh" else relu(y)


class LSTM(RNN_Base):
    """SINGA's LSTM with one weight per gate: ``Wx_{i,f,o,g}: (input_size, hidden)``,
    ``Wh_*: (hidden, hidden)`` ~ N(0, 0.01), biases ``Bx_*``, ``Bh_*: (hidden,)`` = 0.
    ``forward(xs, (h0, c0))`` returns ``(list of h_t, h_T, c_T)``."""

    _param_attrs = tuple(f"{kind}_{gate}" for kind in ("Wx", "Wh", "Bx", "Bh")
                         for gate in _LSTM_GATES)

    def __init__(self, input_size: int, hidden_size: int, nonlinearity: str = "tanh",
                 num_layers: int = 1, bias: bool = True, batch_first: bool = False,
                 dropout: float = 0, bidirectional: bool = False):
        super().__init__()
        self._configure(input_size, hidden_size, num_layers, nonlinearity, bias, batch_first,
                        dropout, bidirectional)

    def initialize(self, xs, h0_c0) -> None:
        self._build(h0_c0[0].device)

    def _build(self, device) -> None:
        shapes = {"Wx": (self.input_size, self.hidden_size),
                  "Wh": (self.hidden_size, self.hidden_size),
                  "Bx": (self.hidden_size,), "Bh": (self.hidden_size,)}
        for attr in self._param_attrs:
            t = self._new_param(shapes[attr[:2]], device)
            if attr.startswith("W"):
                init.gaussian_fill(t, 0.0, 0.01)
            setattr(self, attr, t)

    def _params(self) -> List[Tensor]:
        return [getattr(self, attr) for attr in self._param_attrs]

    def forward(self, xs, h0_c0) -> Tuple[List[Tensor], Tensor, Tensor]:
        h0, c0 = h0_c0
        xs = self._check_sequence(xs, [h0, c0])
        self.device_check(h0, c0, *xs, *self._params())
        outs = _LSTMSequence(n_steps=len(xs))(*xs, h0, c0, *self._params())
        out = list(outs[:-1])
        return out, out[-1], outs[-1]

    def step_forward(self, x, h, c, Wx=None, Wh=None, Bx=None, Bh=None) -> Tuple[Tensor, Tensor]:
        """One step with autograd ops (SINGA's formulation); returns ``(h', c')``. The weights
        default to the layer's own; SINGA 3.0 passed them as lists ordered (i, f, o, g)."""
        weights = {kind: given if given is not None else
                   [getattr(self, f"{kind}_{g}") for g in _LSTM_GATES]
                   for kind, given in (("Wx", Wx), ("Wh", Wh), ("Bx", Bx), ("Bh", Bh))}

        def gate(g, act):
            k = _LSTM_GATES.index(g)
            y1 = add_bias(matmul(x, weights["Wx"][k]), weights["Bx"][k], axis=0)
            y2 = add_bias(matmul(h, weights["Wh"][k]), weights["Bh"][k], axis=0)
            return act(add(y1, y2))

        i, f, o = (gate(g, sigmoid) for g in ("i", "f", "o"))
        g = gate("g", tanh)
        c_new = add(mul(f, c), mul(i, g))
        return mul(o, tanh(c_new)), c_new


class CudnnRNN(Layer):
    """SINGA's cuDNN-style RNN (vanilla relu/tanh, LSTM or GRU; multi-layer; bidirectional) with
    all weights in one flat parameter ``W: (weights_size,) ~ U(-1/sqrt(hidden), 1/sqrt(hidden))``
    in cuDNN's packed layout (see ``autograd.RNNHandle``). Runs the portable ``lax.scan`` kernel of
    ``_RNN`` on every device.

    ``forward(x, hx=None, cx=None, seq_lengths=None)``: ``x`` is ``(batch, seq, feature)`` when
    ``batch_first`` else ``(seq, batch, feature)``; ``hx``/``cx`` default to zeros of shape
    ``(num_layers * directions, batch, hidden)``. Returns the outputs of all steps (same layout as
    ``x``) when ``return_sequences``, else those of the last step ``(batch, hidden * directions)``.
    With ``use_mask``, ``seq_lengths`` (a Tensor of per-sequence lengths) limits each sequence.
    """

    _param_attrs = ("W",)

    def __init__(self, hidden_size: int, activation: str = "tanh", num_layers: int = 1,
                 bias: bool = True, batch_first: bool = True, dropout: float = 0,
                 bidirectional: bool = False, rnn_mode: str = "lstm", use_mask: bool = False,
                 return_sequences: bool = True):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"CudnnRNN: num_layers must be > 0, got {num_layers}")
        if not 0 <= dropout < 1:
            raise ValueError(f"CudnnRNN: dropout must be in [0, 1), got {dropout}")
        if rnn_mode not in _CUDNN_MODES:
            raise ValueError(f"CudnnRNN: rnn_mode must be one of {sorted(_CUDNN_MODES)}, got "
                             f"{rnn_mode!r}")
        self.rnn_mode = rnn_mode
        self.cudnn_rnn_mode = _CUDNN_MODES[rnn_mode]
        self.activation = activation
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.dropout = dropout
        self.bidirectional = 1 if bidirectional else 0
        self.return_sequences = return_sequences
        self.batch_first = batch_first
        self.use_mask = use_mask

    def _seq_first_shape(self, x: Tensor) -> Tuple[int, int, int]:
        if x.ndim() != 3:
            raise self._input_error("3 dimensions", "(batch, seq, feature)" if self.batch_first
                                    else "(seq, batch, feature)", x)
        return (x.shape[1], x.shape[0], x.shape[2]) if self.batch_first else tuple(x.shape)

    def initialize(self, x: Tensor, hx=None, cx=None, seq_lengths=None) -> None:
        shape = self._seq_first_shape(x)
        self.input_size = shape[2]
        self.handle = CudnnRNNHandle(
            jax.ShapeDtypeStruct(shape, x.dtype), self.hidden_size, mode=self.cudnn_rnn_mode,
            num_layers=self.num_layers, bias=int(bool(self.bias)), dropout=self.dropout,
            bidirectional=self.bidirectional)
        self.W = self._new_param((self.handle.weights_size,), x.device, x.dtype)
        limit = 1.0 / self.hidden_size ** 0.5
        init.uniform_fill(self.W, -limit, limit)

    def _zero_state(self, x: Tensor) -> Tensor:
        shape = (self.num_layers * (2 if self.bidirectional else 1), x.shape[1], self.hidden_size)
        return Tensor(shape=shape, device=x.device, dtype=x.dtype, requires_grad=False)

    def forward(self, x: Tensor, hx=None, cx=None, seq_lengths=None) -> Tensor:
        shape = self._seq_first_shape(x)
        if shape[2] != self.input_size:
            raise self._input_error("feature size (last axis)", self.input_size, x)
        self.device_check(x, self.W)
        if self.batch_first:  # (batch, seq, feature) -> (seq, batch, feature)
            x = transpose(x, (1, 0, 2))
        hx = self._zero_state(x) if hx is None else hx
        cx = self._zero_state(x) if cx is None else cx
        if self.use_mask and not isinstance(seq_lengths, Tensor):
            raise TypeError(f"{self._describe()}: use_mask=True needs seq_lengths as a Tensor, "
                            f"got {type(seq_lengths).__name__}")
        op = _RNN(self.handle, return_sequences=self.return_sequences,
                           use_mask=self.use_mask,
                           seq_lengths=seq_lengths if self.use_mask else None)
        y = op(x, hx, cx, self.W)[0]
        if self.return_sequences and self.batch_first:
            y = transpose(y, (1, 0, 2))
        return y
