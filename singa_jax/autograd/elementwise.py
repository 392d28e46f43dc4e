"""Elementwise operators (unary, binary with NumPy broadcasting, parametrised activations), the
linear-algebra ops (matmul, add_bias, gemm), and the helpers shared by the operator catalogue.

Each operator is a :class:`~singa_jax.autograd.function.Function`: a pure ``jax.numpy`` function
whose forward is one cached ``jax.jit`` kernel and whose backward is its ``jax.vjp`` pullback, so
the gradients are the true ones (un-broadcasting included). Forward conventions (output dtypes,
tie-breaking, argument names and defaults) follow SINGA 5.1; where SINGA's hand-written backward
was wrong we do not copy it (docs/autograd.md lists the differences).

Families of similar ops are declared by table (``_UNARY``, ``_BINARY``) and turned into classes
and SINGA's functional forms by :func:`declare_ops`.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np

from ..tensor import Tensor, to_dtype
from .function import Function, make_function

__all__ = [
    "CTensor", "axis_helper", "back_broadcast", "ctensor2numpy",
    # unary table
    "ReLU", "relu", "Identity", "identity", "Tanh", "tanh", "Cos", "cos", "Cosh", "cosh",
    "Acos", "acos", "Acosh", "acosh", "Sin", "sin", "Sinh", "sinh", "Asin", "asin", "Asinh",
    "asinh", "Tan", "tan", "Atan", "atan", "Atanh", "atanh", "Sigmoid", "sigmoid", "Abs", "abs",
    "Exp", "exp", "Log", "log", "Sqrt", "sqrt", "Sign", "sign", "SoftSign", "softsign",
    "SoftPlus", "softplus", "Negative", "negative", "Reciprocal", "reciprocal", "Ceil", "ceil",
    "Floor", "floor", "Round", "round", "Rounde", "rounde", "Erf", "erf", "Not", "_not",
    # binary table
    "Add", "add", "Sub", "sub", "Mul", "mul", "Div", "div", "Pow", "pow", "PRelu", "prelu",
    "Less", "less", "Greater", "greater", "Equal", "equal", "And", "_and", "Or", "_or",
    "Xor", "_xor",
    # parametrised
    "Clip", "clip", "Elu", "elu", "SeLU", "selu", "LeakyRelu", "leakyrelu", "HardSigmoid",
    "hardsigmoid", "SoftMax", "softmax", "Cast", "cast", "Where", "where",
    # linear algebra
    "Matmul", "matmul", "AddBias", "add_bias", "Gemm", "gemm",
]

CTensor = jax.Array  # SINGA's C++ tensor type; here the array behind every Tensor


# --------------------------------------------------------------------------------------------
# helpers shared by elementwise.py, shape.py and reduce.py
# --------------------------------------------------------------------------------------------
def axis_helper(y_shape: Sequence[int], x_shape: Sequence[int]) -> Tuple[int, ...]:
    """The axes of ``y_shape`` along which an operand of shape ``x_shape`` was broadcast."""
    axes = []
    j = len(x_shape) - 1
    for i in range(len(y_shape) - 1, -1, -1):
        if j < 0 or x_shape[j] != y_shape[i]:
            axes.append(i)
        j -= 1
    return tuple(reversed(axes))


def back_broadcast(y_shape: Sequence[int], x_shape: Sequence[int], x: jax.Array) -> jax.Array:
    """Sum a gradient of shape ``y_shape`` back to the shape ``x_shape`` it was broadcast from."""
    if tuple(y_shape) == tuple(x_shape):
        return x
    return jnp.reshape(jnp.sum(x, axis=axis_helper(y_shape, x_shape)), tuple(x_shape))


def ctensor2numpy(x: jax.Array) -> np.ndarray:
    """A host (NumPy) copy of an array (SINGA's helper; for tests and host-side code only)."""
    return np.asarray(x)


class StaticOp(Function):
    """A Function with static arguments, which are readable as attributes (``op.axis``), as
    SINGA's operators expose them (sonnx reads them)."""

    def __getattr__(self, name: str) -> Any:
        for store in ("static", "tensor_args"):
            values = self.__dict__.get(store)
            if values is not None and name in values:
                return values[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


class TensorArgsOp(StaticOp):
    """An op whose constructor takes array-valued arguments (SINGA's ``Where(condition)``,
    ``Gather(axis, indices)``...). They are appended to the inputs as Tensors so that changing
    their values never recompiles; integer ones get no gradient."""

    tensor_arg_names: Tuple[str, ...] = ()

    def __init__(self, tensor_args: Dict[str, Any], **static):
        super().__init__(**static)
        self.tensor_args = tensor_args

    def __call__(self, *xs: Tensor) -> Tuple[Tensor, ...]:
        if not xs or not isinstance(xs[0], Tensor):
            return super().__call__(*xs)  # let the engine raise its TypeError
        extra = tuple(as_tensor(self.tensor_args[n], xs[0].device) for n in self.tensor_arg_names)
        return super().__call__(*xs, *extra)


def as_tensor(value: Any, device) -> Tensor:
    """``value`` (a Tensor, list or array: a host-side constant) as a Tensor that needs no grad."""
    if isinstance(value, Tensor):
        return value
    arr = value if isinstance(value, jax.Array) else np.asarray(value)
    return Tensor(data=arr, device=device, dtype=arr.dtype, requires_grad=False)


class NonDifferentiable:
    """Mixin for ops whose outputs carry no gradient (comparisons, logic, indices, shapes).

    ``requires_grad`` is pinned to False, so the forward keeps no backward state, the outputs do
    not require grad and ``backward`` never walks into the op.
    """

    requires_grad = property(lambda self: False, lambda self, value: None)

    def backward(self, *dys):
        return (None,) * len(self.src)


def normalize_axis(axis: int, ndim: int) -> int:
    """``axis`` in ``[0, ndim)`` (negative counts from the end); ValueError when out of range."""
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for a {ndim}-d input")
    return axis % ndim


def host_values(op: str, x: jax.Array) -> np.ndarray:
    """The values of ``x`` on the host, for the few ops whose output SHAPE depends on them."""
    if isinstance(x, jax.core.Tracer):
        raise ValueError(f"{op}: the output shape depends on the input's values, so it cannot run "
                         f"inside a compiled (graph-mode / jit) step")
    return np.asarray(jax.device_get(x))


def float_mask(cond: jax.Array, *operands: jax.Array) -> jax.Array:
    """A boolean result in SINGA's dtype: 0/1 in the operands' float dtype (float32 for ints)."""
    dtype = jnp.result_type(*operands)
    return cond.astype(dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.float32)


def functional(op_cls: type, name: str, params: Sequence[str], doc: str = "") -> Callable:
    """SINGA's functional form of a parameterless op: ``name(*params) == op_cls()(*params)[0]``
    with the signature SINGA declares (``params``; ``"*l"`` means variadic)."""
    sig = inspect.Signature([
        inspect.Parameter(p.lstrip("*"), inspect.Parameter.VAR_POSITIONAL if p.startswith("*")
                          else inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params])

    variadic = any(p.startswith("*") for p in params)

    def f(*args, **kwargs):
        if kwargs or variadic or len(args) != len(params):  # the usual call skips the binding
            try:
                args = sig.bind(*args, **kwargs).args
            except TypeError as e:
                raise TypeError(f"{name}(): {e}") from None
        return op_cls()(*args)[0]

    f.__name__ = f.__qualname__ = name
    f.__doc__ = doc or op_cls.__doc__
    f.__signature__ = sig
    f.__module__ = "singa_jax.autograd"
    return f


def declare_ops(table, namespace: Dict[str, Any]) -> None:
    """Turn table rows ``(ClassName, funcname, params, fn, differentiable, doc)`` into an op
    class and its functional form in ``namespace``."""
    for cls_name, func_name, params, fn, differentiable, doc in table:
        if differentiable:
            cls = make_function(cls_name, fn, doc)
        else:
            cls = type(cls_name, (NonDifferentiable, Function),
                       {"fn": staticmethod(fn), "__doc__": doc, "__module__": "singa_jax.autograd"})
        namespace[cls_name] = cls
        namespace[func_name] = functional(cls, func_name, params, doc)


# --------------------------------------------------------------------------------------------
# unary ops
# --------------------------------------------------------------------------------------------
def _round_half_away(x):
    """C's ``round``: halves go away from zero (exact: no ``x + 0.5`` rounding error)."""
    a = jnp.abs(x)
    whole = jnp.floor(a)
    return jnp.sign(x) * (whole + (a - whole >= 0.5))


_UNARY = [
    # (class, function, SINGA's parameter names, pure function, differentiable, doc)
    ("ReLU", "relu", ("x",), jax.nn.relu, True, "y = max(0, x); dy/dx = 1 where x > 0."),
    ("Identity", "identity", ("x",), lambda x: x, True, "y = x."),
    ("Tanh", "tanh", ("x",), jnp.tanh, True, "y = tanh(x)."),
    ("Cos", "cos", ("x",), jnp.cos, True, "y = cos(x)."),
    ("Cosh", "cosh", ("x",), jnp.cosh, True, "y = cosh(x)."),
    ("Acos", "acos", ("x",), jnp.arccos, True, "y = arccos(x)."),
    ("Acosh", "acosh", ("x",), jnp.arccosh, True, "y = arccosh(x)."),
    ("Sin", "sin", ("x",), jnp.sin, True, "y = sin(x)."),
    ("Sinh", "sinh", ("x",), jnp.sinh, True, "y = sinh(x)."),
    ("Asin", "asin", ("x",), jnp.arcsin, True, "y = arcsin(x)."),
    ("Asinh", "asinh", ("x",), jnp.arcsinh, True, "y = arcsinh(x)."),
    ("Tan", "tan", ("x",), jnp.tan, True, "y = tan(x)."),
    ("Atan", "atan", ("x",), jnp.arctan, True, "y = arctan(x)."),
    ("Atanh", "atanh", ("x",), jnp.arctanh, True, "y = arctanh(x)."),
    ("Sigmoid", "sigmoid", ("x",), jax.nn.sigmoid, True, "y = 1 / (1 + exp(-x))."),
    ("Abs", "abs", ("a",), jnp.abs, True, "y = |a|."),
    ("Exp", "exp", ("a",), jnp.exp, True, "y = exp(a)."),
    ("Log", "log", ("x",), jnp.log, True, "y = ln(x)."),
    ("Sqrt", "sqrt", ("x",), jnp.sqrt, True, "y = x ** 0.5."),
    ("Sign", "sign", ("a",), jnp.sign, True, "y = 1, 0 or -1 by the sign of a (zero gradient)."),
    ("SoftSign", "softsign", ("x",), lambda x: x / (1 + jnp.abs(x)), True, "y = x / (1 + |x|)."),
    ("SoftPlus", "softplus", ("x",), jax.nn.softplus, True, "y = ln(exp(x) + 1)."),
    ("Negative", "negative", ("x",), jnp.negative, True, "y = -x."),
    ("Reciprocal", "reciprocal", ("x",), lambda x: 1 / x, True, "y = 1 / x."),
    ("Ceil", "ceil", ("x",), jnp.ceil, True, "y = ceil(x) (zero gradient)."),
    ("Floor", "floor", ("x",), jnp.floor, True, "y = floor(x) (zero gradient)."),
    ("Round", "round", ("x",), _round_half_away, True,
     "y = x rounded to the nearest integer, halves away from zero (zero gradient)."),
    ("Rounde", "rounde", ("x",), jnp.round, True,
     "y = x rounded to the nearest integer, halves to even (zero gradient)."),
    ("Erf", "erf", ("x",), jsp.erf, True, "y = erf(x); dy/dx = 2 / sqrt(pi) * exp(-x^2)."),
    ("Not", "_not", ("x",), lambda x: float_mask(x == 0, x), False,
     "y = 1 where x == 0 else 0 (logical not; no gradient)."),
]
declare_ops(_UNARY, globals())


# --------------------------------------------------------------------------------------------
# binary ops with NumPy broadcasting (the vjp sums gradients back to each operand's shape)
# --------------------------------------------------------------------------------------------
def _div(a, b):
    """a / b; SINGA casts the quotient back to a's dtype when a is not floating (truncation)."""
    q = a / b
    return q if jnp.issubdtype(a.dtype, jnp.inexact) else q.astype(a.dtype)


def _nonzero(x):
    return x != 0


_BINARY = [
    ("Add", "add", ("a", "b"), jnp.add, True, "y = a + b (broadcasting)."),
    ("Sub", "sub", ("a", "b"), jnp.subtract, True, "y = a - b (broadcasting)."),
    ("Mul", "mul", ("x", "y"), jnp.multiply, True, "y = x * y (broadcasting)."),
    ("Div", "div", ("a", "b"), _div, True, "y = a / b (broadcasting)."),
    ("Pow", "pow", ("a", "b"), jnp.power, True,
     "y = a ** b (broadcasting); dy/db = a^b ln(a) needs a > 0."),
    ("PRelu", "prelu", ("x", "slope"), lambda x, s: jnp.where(x >= 0, x, s * x), True,
     "y = x for x >= 0, slope * x for x < 0 (slope broadcasts; both get gradients)."),
    ("Less", "less", ("x", "y"), lambda x, y: float_mask(x < y, x, y), False,
     "y = 1.0 where x < y else 0.0 (no gradient)."),
    ("Greater", "greater", ("x", "y"), lambda x, y: float_mask(x > y, x, y),
     False, "y = 1.0 where x > y else 0.0 (no gradient)."),
    ("Equal", "equal", ("x", "y"), lambda x, y: float_mask(x == y, x, y), False,
     "y = 1.0 where x == y else 0.0 (no gradient)."),
    ("And", "_and", ("a", "b"),
     lambda a, b: float_mask(_nonzero(a) & _nonzero(b), a, b), False,
     "y = 1.0 where both a and b are nonzero (no gradient)."),
    ("Or", "_or", ("a", "b"),
     lambda a, b: float_mask(_nonzero(a) | _nonzero(b), a, b), False,
     "y = 1.0 where a or b is nonzero (no gradient)."),
    ("Xor", "_xor", ("a", "b"),
     lambda a, b: float_mask(_nonzero(a) ^ _nonzero(b), a, b), False,
     "y = 1.0 where exactly one of a, b is nonzero (no gradient)."),
]
declare_ops(_BINARY, globals())


# --------------------------------------------------------------------------------------------
# parametrised elementwise ops
# --------------------------------------------------------------------------------------------
def _clip(x, *, min, max):  # noqa: A002 (SINGA's argument names)
    lo = -jnp.inf if min is None else min
    hi = jnp.inf if max is None else max
    # where(), not jnp.clip: the gradient is 1 on the boundaries too, as in SINGA
    return jnp.where(x < lo, lo, jnp.where(x > hi, hi, x)).astype(x.dtype)


class Clip(StaticOp):
    """y = min(max(x, min), max); ``None`` leaves that side open. dy/dx = 1 inside [min, max]."""

    fn = staticmethod(_clip)

    def __init__(self, min: Optional[float], max: Optional[float]):  # noqa: A002
        super().__init__(min=None if min is None else float(min),
                         max=None if max is None else float(max))


def clip(x: Tensor, min: Optional[float] = None, max: Optional[float] = None) -> Tensor:  # noqa: A002
    """Limit ``x`` to ``[min, max]`` elementwise (see :class:`Clip`)."""
    return Clip(min, max)(x)[0]


def _elu(x, *, alpha):
    # minimum() keeps exp finite in the unselected branch, so its zero gradient is not NaN
    return jnp.where(x >= 0, x, alpha * jnp.expm1(jnp.minimum(x, 0)))


class Elu(StaticOp):
    """y = x for x >= 0, alpha * (exp(x) - 1) for x < 0."""

    fn = staticmethod(_elu)

    def __init__(self, alpha: float = 1.0):
        super().__init__(alpha=float(alpha))


def elu(x: Tensor, alpha: float = 1) -> Tensor:
    """ELU activation (see :class:`Elu`)."""
    return Elu(alpha)(x)[0]


def _selu(x, *, alpha, gamma):
    return gamma * jnp.where(x > 0, x, alpha * jnp.expm1(jnp.minimum(x, 0)))


class SeLU(StaticOp):
    """y = gamma * x for x > 0, gamma * alpha * (exp(x) - 1) for x <= 0."""

    fn = staticmethod(_selu)

    def __init__(self, alpha: float = 1.67326, gamma: float = 1.0507):
        super().__init__(alpha=float(alpha), gamma=float(gamma))


def selu(x: Tensor, alpha: float = 1.67326, gamma: float = 1.0507) -> Tensor:
    """SELU activation (see :class:`SeLU`)."""
    return SeLU(alpha, gamma)(x)[0]


class LeakyRelu(StaticOp):
    """y = x for x >= 0, a * x for x < 0."""

    fn = staticmethod(lambda x, *, a: jnp.where(x >= 0, x, a * x))

    def __init__(self, a: float):
        super().__init__(a=float(a))


def leakyrelu(x: Tensor, a: float = 0.01) -> Tensor:
    """Leaky ReLU (see :class:`LeakyRelu`)."""
    return LeakyRelu(a)(x)[0]


class HardSigmoid(StaticOp):
    """y = max(0, min(1, alpha * x + gamma))."""

    fn = staticmethod(lambda x, *, alpha, gamma: jnp.clip(alpha * x + gamma, 0, 1))

    def __init__(self, alpha: float = 0.2, gamma: float = 0.5):
        super().__init__(alpha=float(alpha), gamma=float(gamma))


def hardsigmoid(x: Tensor, alpha: float = 0.2, gamma: float = 0.5) -> Tensor:
    """Hard sigmoid (see :class:`HardSigmoid`)."""
    return HardSigmoid(alpha, gamma)(x)[0]


def _softmax(x, *, axis):
    if not -x.ndim <= axis < max(x.ndim, 1):
        raise ValueError(f"axis {axis} is out of range for a {x.ndim}-d input")
    # SINGA (like ONNX before opset 13) normalises over ALL axes from ``axis`` on
    return jax.nn.softmax(x, axis=tuple(range(axis % max(x.ndim, 1), x.ndim)))


class SoftMax(StaticOp):
    """y = exp(x) / sum(exp(x)), the sum running over axes ``axis, ..., ndim-1`` jointly (SINGA
    views the input as a matrix ``(prod(shape[:axis]), prod(shape[axis:]))``)."""

    fn = staticmethod(_softmax)

    def __init__(self, axis: int = 1):
        super().__init__(axis=int(axis))


def softmax(x: Tensor, axis: int = 1) -> Tensor:
    """Softmax over the trailing axes from ``axis`` (see :class:`SoftMax`)."""
    return SoftMax(axis)(x)[0]


class Cast(StaticOp):
    """y = x converted to dtype ``to`` (a SINGA dtype code such as 0 = float32, 2 = int32, or any
    dtype). Float-to-float casts pass the gradient through; casts to integers carry none."""

    fn = staticmethod(lambda x, *, to: x.astype(to))

    def __init__(self, to: Any):
        super().__init__(to=to_dtype(to))
        self._requires_grad = False

    @property
    def requires_grad(self) -> bool:  # an integer result carries no gradient
        return self._requires_grad and jnp.issubdtype(self.static["to"], jnp.inexact)

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self._requires_grad = value


def cast(x: Tensor, to: Any) -> Tensor:
    """Convert ``x`` to dtype ``to`` (see :class:`Cast`)."""
    return Cast(to)(x)[0]


def _where(a, b, condition):
    return jnp.where(condition != 0, a, b)


class Where(TensorArgsOp):
    """y = a where ``condition`` is nonzero, else b (broadcasting). ``condition`` is a Tensor or a
    host array/list fixed at construction; a and b get the masked gradients."""

    fn = staticmethod(_where)
    tensor_arg_names = ("condition",)

    def __init__(self, condition: Any):
        super().__init__({"condition": condition})


def where(x: Tensor, y: Tensor, condition: Any) -> Tensor:
    """Choose ``x`` where ``condition`` is nonzero, else ``y`` (see :class:`Where`)."""
    return Where(condition)(x, y)[0]


# --------------------------------------------------------------------------------------------
# linear algebra
# --------------------------------------------------------------------------------------------
def _matmul(x, w):
    if x.ndim == 0 or w.ndim == 0:
        raise ValueError("matmul needs inputs with at least one dimension")
    k_w = w.shape[0] if w.ndim == 1 else w.shape[-2]
    if x.shape[-1] != k_w:
        raise ValueError(f"x's last dimension ({x.shape[-1]}) must equal w's "
                         f"{'only' if w.ndim == 1 else 'second-to-last'} dimension ({k_w})")
    return jnp.matmul(x, w)


class Matmul(Function):
    """y = x @ w (``np.matmul`` semantics: batched for >2-d inputs)."""

    fn = staticmethod(_matmul)


matmul = functional(Matmul, "matmul", ("x", "w"), "y = x @ w (see :class:`Matmul`).")


def _add_bias(x, b, *, axis):
    if x.ndim != 2:
        raise ValueError(f"x must be a matrix (2-d), got shape {x.shape}")
    length = x.shape[1 - axis]
    if b.ndim > 2 or b.size != length or (b.ndim == 2 and 1 not in b.shape):
        raise ValueError(f"b must have {length} elements as shape ({length},), (1, {length}) or "
                         f"({length}, 1) to be added to each {'row' if axis == 0 else 'column'} "
                         f"of x, got shape {b.shape}")
    b = b.reshape(-1)  # the vjp restores b's own shape for its gradient
    return x + (b[None, :] if axis == 0 else b[:, None])


class AddBias(StaticOp):
    """y = x + b added to every row (axis=0: b has x.shape[1] elements) or every column
    (axis=1: b has x.shape[0] elements) of the matrix x."""

    fn = staticmethod(_add_bias)

    def __init__(self, axis: int = 0):
        if axis not in (0, 1):
            raise ValueError(f"AddBias: axis must be 0 (rows) or 1 (columns), got {axis!r}")
        super().__init__(axis=axis)


def add_bias(x: Tensor, b: Tensor, axis: int = 0) -> Tensor:
    """Add the bias ``b`` to each row (axis=0) or column (axis=1) of ``x``."""
    return AddBias(axis)(x, b)[0]


def _gemm(A, B, C=None, *, alpha, beta, transA, transB):
    if A.ndim != 2 or B.ndim != 2:
        raise ValueError(f"A and B must be matrices, got shapes {A.shape} and {B.shape}")
    A = A.T if transA else A
    B = B.T if transB else B
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"A' {A.shape} and B' {B.shape} (after transA={transA}, "
                         f"transB={transB}) do not match for A' @ B'")
    y = alpha * (A @ B)
    return y if C is None else y + beta * C


class Gemm(StaticOp):
    """Y = alpha * A' @ B' + beta * C, where A' = A.T if transA else A (likewise B'); C is
    optional and broadcasts to (M, N)."""

    fn = staticmethod(_gemm)

    def __init__(self, alpha: float = 1.0, beta: float = 1.0, transA: int = 0, transB: int = 0):
        super().__init__(alpha=float(alpha), beta=float(beta), transA=int(bool(transA)),
                         transB=int(bool(transB)))


def gemm(A: Tensor, B: Tensor, C: Optional[Tensor] = None, alpha: float = 1.0,
         beta: float = 1.0, transA: int = 0, transB: int = 0) -> Tensor:
    """General matrix multiplication (see :class:`Gemm`)."""
    op = Gemm(alpha, beta, transA, transB)
    return (op(A, B) if C is None else op(A, B, C))[0]
