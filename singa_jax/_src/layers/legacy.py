"""SINGA 2.x/3.0's layer API inside ``autograd``: ``autograd.Layer``, ``autograd.Linear(in, out)``,
``autograd.Conv2d(in_channels, out_channels, kernel_size, ...)``, ...

In those versions layers created their parameters eagerly in the constructor (on the default
device, float32) and user networks subclassed ``autograd.Layer`` and overrode ``__call__``.
Here each legacy layer is the modern :mod:`singa_jax.layer` class with the old constructor and
parameters built at once, plus the old base's methods: ``get_params`` returns
``{attribute: Tensor}`` (nested dicts for sublayers found by ``find_sublayers``) and
``set_params(**parameters)`` takes the same nesting. The optimizer finds the parameters through
``autograd.backward`` (they store their gradients), as in SINGA.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Dict, List, Tuple

from singa_jax._src.runtime.device import get_default_device
from singa_jax._src.layers.base import assign_values, move_to_device
from singa_jax._src.tensor.tensor import Tensor
from singa_jax._src.base.dtypes import float32
from singa_jax._src.layers import core as _core
from singa_jax._src.layers import conv as _conv
from singa_jax._src.layers import rnn as _rnn
from singa_jax._src.layers import base as _base

__all__ = ["Layer", "Linear", "Conv2d", "SeparableConv2d", "BatchNorm2d", "Pooling2d",
           "MaxPool2d", "AvgPool2d", "MaxPool1d", "AvgPool1d", "RNN_Base", "RNN", "LSTM"]


class Layer(object):
    """SINGA 2.x/3.0's layer base: subclasses hold layers and Tensors as attributes and define
    ``__call__``."""

    def __init__(self):
        self.allow_params = []

    def device_check(self, *inputs: Tensor) -> None:
        """Move every Tensor to the device of the first one."""
        move_to_device(*inputs)

    def find_sublayers(self) -> List[Tuple[str, "Layer"]]:
        """``[(attribute name, layer)]`` for the (legacy) layers held by attributes."""
        attrs = dict(self.__dict__)
        attrs.update(self.__dict__.get("_layers", {}))  # modern layers keep sublayers apart
        return [(k, v) for k, v in attrs.items() if isinstance(v, Layer)]

    def _own_params(self) -> Dict[str, Tensor]:
        names = list(getattr(self, "_param_attrs", ())) + list(self.__dict__.get("allow_params", ()))
        return {n: self.__dict__[n] for n in dict.fromkeys(names)
                if isinstance(self.__dict__.get(n), Tensor)}

    def get_params(self) -> Dict[str, Any]:
        """``{attribute: Tensor}`` of this layer, and ``{attribute: sublayer.get_params()}``.
        Inside a modern network (a non-legacy parent) it answers like a modern layer instead:
        ``{hierarchical name: Tensor}``, so the parent's get_params/get_states stay flat."""
        parent = self.__dict__.get("_parent")
        if isinstance(parent, _base.Layer) and not isinstance(parent, Layer):
            return _base.Layer.get_params(self)
        params: Dict[str, Any] = dict(self._own_params())
        for name, sublayer in self.find_sublayers():
            params[name] = sublayer.get_params()
        return params

    def set_params(self, parameters: Mapping = None, **kwargs) -> None:
        """``set_params(W=array)`` or ``set_params(**{'block1': {'linear1': {'W': array}}})``;
        values are Tensors or arrays. Every name and shape is checked before anything changes."""
        parameters = dict(parameters or {}, **kwargs)
        targets: Dict[str, Tensor] = {}
        flat: Dict[str, Any] = {}
        self._plan(parameters, "", targets, flat)
        assign_values(type(self).__name__, "set_params", targets, flat)

    def _plan(self, parameters: Mapping, prefix: str, targets: Dict[str, Tensor],
              flat: Dict[str, Any]) -> None:
        """Resolve the nested ``parameters`` into ``{dotted path: Tensor}`` and values."""
        sublayers = dict(self.find_sublayers())
        own = self._own_params()
        for name, value in parameters.items():
            path = prefix + name
            if name in sublayers:
                if not isinstance(value, Mapping):
                    raise TypeError(f"{type(self).__name__}.set_params: '{path}' is a layer; give "
                                    f"a dict of its parameters, got {type(value).__name__}")
                sublayers[name]._plan(value, path + ".", targets, flat)
            elif name in own:
                targets[path], flat[path] = own[name], value
            else:
                raise ValueError(f"{type(self).__name__}.set_params: no parameter or sublayer "
                                 f"'{path}'; known: {sorted(list(own) + list(sublayers))}")

    def set_one_param(self, parameter_name: str, parameter_value: Any) -> None:
        """Set the Tensor attribute ``parameter_name`` (must be in ``allow_params``)."""
        if parameter_name not in self._own_params():
            raise ValueError(f"{type(self).__name__}.set_one_param: '{parameter_name}' is not an "
                             f"allowed parameter; allowed: {sorted(self._own_params())}")
        self.set_params({parameter_name: parameter_value})


def _built(layer_obj: Layer, *build_args) -> None:
    """Create the parameters now, on the default device (SINGA 3.0 built them eagerly)."""
    layer_obj._build(*build_args)
    layer_obj._initialized = True
    layer_obj.allow_params = list(getattr(layer_obj, "_param_attrs", ()))


class Linear(Layer, _core.Linear):
    """``y = x W + b``; ``W: (in_features, out_features) ~ N(0, sqrt(2 / (in + out)))``, ``b = 0``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        _core.Linear.__init__(self, in_features, out_features, bias=bias)
        _built(self, in_features, get_default_device(), float32)


class Conv2d(Layer, _conv.Conv2d):
    """2-D convolution; ``W: (out_channels, in_channels / group, kh, kw)``, ``b: (out_channels,)``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1,
                 padding: Any = 0, dilation: Any = 1, group: int = 1, bias: bool = True,
                 pad_mode: str = "NOTSET", **kwargs):
        _conv.Conv2d.__init__(self, out_channels, kernel_size, stride=stride, padding=padding,
                               dilation=dilation, group=group, bias=bias, pad_mode=pad_mode,
                               **kwargs)
        self.out_channels = out_channels
        _built(self, in_channels, get_default_device(), float32)


class SeparableConv2d(Layer, _conv.SeparableConv2d):
    """Depthwise ``Conv2d(in, in, k, group=in)`` then pointwise ``Conv2d(in, out, 1)``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1,
                 padding: Any = 0, bias: bool = False):
        _conv.SeparableConv2d.__init__(self, out_channels, kernel_size, stride=stride,
                                        padding=padding, bias=bias)
        self.in_channels = in_channels
        self.depthwise_conv = Conv2d(in_channels, in_channels, kernel_size, stride, padding,
                                     group=in_channels, bias=bias)
        self.point_conv = Conv2d(in_channels, out_channels, 1, bias=bias)
        self._initialized = True


class BatchNorm2d(Layer, _conv.BatchNorm2d):
    """Batch normalisation of ``num_features`` channels (see :class:`singa_jax.layer.BatchNorm2d`)."""

    def __init__(self, num_features: int, momentum: float = 0.9):
        _conv.BatchNorm2d.__init__(self, num_features, momentum=momentum)
        _built(self, num_features, get_default_device(), float32)


def _with_odd(padding: Any, odd_padding: Any) -> Any:
    """SINGA 3.0's pools took ``odd_padding`` (top, bottom, left, right) beside the padding."""
    odd = tuple(odd_padding)
    if not any(odd):
        return padding
    ph, pw = (padding, padding) if isinstance(padding, int) else tuple(padding)
    return (ph + odd[0], ph + odd[1], pw + odd[2], pw + odd[3])


class Pooling2d(Layer, _conv.Pooling2d):
    """Max (``is_max``) or average pooling."""

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0,
                 is_max: bool = True, pad_mode: str = "NOTSET"):
        _conv.Pooling2d.__init__(self, kernel_size, stride, padding, is_max, pad_mode)


def _legacy_pool(name: str, modern: type, one_d: bool) -> type:
    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0,
                 odd_padding: Tuple[int, int, int, int] = (0, 0, 0, 0)):
        if one_d and any(odd_padding):
            raise ValueError(f"{name}: odd_padding is not supported by 1-D pooling, got "
                             f"{tuple(odd_padding)}")
        modern.__init__(self, kernel_size, stride, padding if one_d else
                        _with_odd(padding, odd_padding))

    return type(name, (Layer, modern), {"__init__": __init__, "__module__": __name__,
                                        "__doc__": modern.__doc__})


MaxPool2d = _legacy_pool("MaxPool2d", _conv.MaxPool2d, False)
AvgPool2d = _legacy_pool("AvgPool2d", _conv.AvgPool2d, False)
MaxPool1d = _legacy_pool("MaxPool1d", _conv.MaxPool1d, True)
AvgPool1d = _legacy_pool("AvgPool1d", _conv.AvgPool1d, True)


class RNN_Base(Layer, _rnn.RNN_Base):
    """Base of the legacy recurrent layers."""

    def __init__(self):
        _rnn.RNN_Base.__init__(self)


class RNN(Layer, _rnn.RNN):
    """Vanilla RNN, ``__call__(xs, h0) -> (list of h_t, h_T)``; ``params = (Wx, Wh, b)``."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 nonlinearity: str = "tanh", bias: bool = True, batch_first: bool = False,
                 dropout: float = 0, bidirectional: bool = False):
        _rnn.RNN.__init__(self, input_size, hidden_size, num_layers, nonlinearity, bias,
                            batch_first, dropout, bidirectional)
        _built(self, get_default_device())
        self.params = (self.Wx, self.Wh, self.b)


class LSTM(Layer, _rnn.LSTM):
    """LSTM, ``__call__(xs, (h0, c0)) -> (list of h_t, h_T, c_T)``; the gate weights are also
    reachable as SINGA 3.0's lists ``Wx``, ``Wh``, ``Bx``, ``Bh`` (order i, f, o, g)."""

    def __init__(self, input_size: int, hidden_size: int, nonlinearity: str = "tanh",
                 num_layers: int = 1, bias: bool = True, batch_first: bool = False,
                 dropout: float = 0, bidirectional: bool = False):
        _rnn.LSTM.__init__(self, input_size, hidden_size, nonlinearity, num_layers, bias,
                             batch_first, dropout, bidirectional)
        _built(self, get_default_device())
        for kind in ("Wx", "Wh", "Bx", "Bh"):
            setattr(self, kind, [getattr(self, f"{kind}_{g}") for g in "ifog"])
        self.params = self.Wx + self.Wh + self.Bx + self.Bh
