"""Elementwise operators (unary, binary with NumPy broadcasting, parametrised activations), the
linear-algebra ops (matmul, add_bias, gemm), and the helpers shared by the operator catalogue.

Each operator is a :class:`~singa_jax.autograd.Function`: a pure ``jax.numpy`` function
whose forward is one cached ``jax.jit`` kernel and whose backward is its ``jax.vjp`` pullback, so
the gradients are the true ones (un-broadcasting included). Forward conventions (output dtypes,
tie-breaking, argument names and defaults) follow SINGA 5.1; where SINGA's hand-written backward
was wrong we do not copy it (docs/autograd.md lists the differences).

Families of similar ops are declared one row each: ``Exp, exp = declare("Exp", "exp", ...)``
gives the op class and SINGA's functional form (see :func:`~singa_jax._src.ops.declare.declare`).
"""
from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp

from singa_jax._src.autodiff.autocast import COMPUTE, FLOAT32
from singa_jax._src.autodiff.autocast import declare as declare_autocast
from singa_jax._src.tensor.tensor import Tensor
from singa_jax._src.base.dtypes import to_dtype
from singa_jax._src.autodiff import residuals
from singa_jax._src.autodiff.function import Function, InvalidInput, TensorArgsOp
from singa_jax._src.ops.declare import declare

__all__ = [
    # unary
    "ReLU", "relu", "Identity", "identity", "Tanh", "tanh", "Cos", "cos", "Cosh", "cosh",
    "Acos", "acos", "Acosh", "acosh", "Sin", "sin", "Sinh", "sinh", "Asin", "asin", "Asinh",
    "asinh", "Tan", "tan", "Atan", "atan", "Atanh", "atanh", "Sigmoid", "sigmoid", "Abs", "abs",
    "Exp", "exp", "Log", "log", "Sqrt", "sqrt", "Sign", "sign", "SoftSign", "softsign",
    "SoftPlus", "softplus", "Negative", "negative", "Reciprocal", "reciprocal", "Ceil", "ceil",
    "Floor", "floor", "Round", "round", "Rounde", "rounde", "Erf", "erf", "Not", "_not",
    # binary
    "Add", "add", "Sub", "sub", "Mul", "mul", "Div", "div", "Pow", "pow", "PRelu", "prelu",
    "Less", "less", "Greater", "greater", "Equal", "equal", "And", "_and", "Or", "_or",
    "Xor", "_xor",
    # parametrised
    "Clip", "clip", "Elu", "elu", "SeLU", "selu", "LeakyRelu", "leakyrelu", "HardSigmoid",
    "hardsigmoid", "SoftMax", "softmax", "Cast", "cast", "Where", "where",
    # linear algebra
    "Matmul", "matmul", "AddBias", "add_bias", "Gemm", "gemm",
]

def float_mask(cond: jax.Array, *operands: jax.Array) -> jax.Array:
    """A boolean result in SINGA's dtype: 0/1 in the operands' float dtype (float32 for ints)."""
    dtype = jnp.result_type(*operands)
    return cond.astype(dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.float32)


# --------------------------------------------------------------------------------------------
# unary ops
# --------------------------------------------------------------------------------------------
def _round_half_away(x):
    """C's ``round``: halves go away from zero (exact: no ``x + 0.5`` rounding error)."""
    a = jnp.abs(x)
    whole = jnp.floor(a)
    return jnp.sign(x) * (whole + (a - whole >= 0.5))


ReLU, relu = declare("ReLU", "relu", ("x",), jax.nn.relu, "y = max(0, x); dy/dx = 1 where x > 0.")
Identity, identity = declare("Identity", "identity", ("x",), lambda x: x, "y = x.")
Tanh, tanh = declare("Tanh", "tanh", ("x",), jnp.tanh, "y = tanh(x).")
Cos, cos = declare("Cos", "cos", ("x",), jnp.cos, "y = cos(x).")
Cosh, cosh = declare("Cosh", "cosh", ("x",), jnp.cosh, "y = cosh(x).")
Acos, acos = declare("Acos", "acos", ("x",), jnp.arccos, "y = arccos(x).")
Acosh, acosh = declare("Acosh", "acosh", ("x",), jnp.arccosh, "y = arccosh(x).")
Sin, sin = declare("Sin", "sin", ("x",), jnp.sin, "y = sin(x).")
Sinh, sinh = declare("Sinh", "sinh", ("x",), jnp.sinh, "y = sinh(x).")
Asin, asin = declare("Asin", "asin", ("x",), jnp.arcsin, "y = arcsin(x).")
Asinh, asinh = declare("Asinh", "asinh", ("x",), jnp.arcsinh, "y = arcsinh(x).")
Tan, tan = declare("Tan", "tan", ("x",), jnp.tan, "y = tan(x).")
Atan, atan = declare("Atan", "atan", ("x",), jnp.arctan, "y = arctan(x).")
Atanh, atanh = declare("Atanh", "atanh", ("x",), jnp.arctanh, "y = arctanh(x).")
Sigmoid, sigmoid = declare("Sigmoid", "sigmoid", ("x",), jax.nn.sigmoid, "y = 1 / (1 + exp(-x)).")


def _keeping_output(fn, backward) -> None:
    """Register for ``fn`` a lean form whose pullback keeps its output ``y`` alone -- the
    kernel's own output, not copied (see residuals.register_lean) -- and gives ``dx =
    backward(y, dy)``; for real floating inputs (others keep JAX's form)."""
    lean = jax.custom_vjp(fn)

    def forward(x):
        y = fn(x)
        return y, y

    lean.defvjp(forward, lambda y, dy: (backward(y, dy),))

    def form(static):
        return lambda x: lean(x) if jnp.issubdtype(x.dtype, jnp.floating) else fn(x)
    residuals.register_lean(fn, form)


# JAX's own keep more: relu a mask and an array of zeros, each as large as x; tanh and sigmoid
# a derived array (1 - y, ...) of x's size. The same formulas as JAX's derivatives (SINGA's
# ReLU gives 0 at x <= 0, whatever dy is).
_keeping_output(jax.nn.relu, lambda y, dy: jnp.where(y > 0, dy, jnp.zeros_like(dy)))
_keeping_output(jnp.tanh, lambda y, dy: (dy + dy * y) * (1 - y))
_keeping_output(jax.nn.sigmoid, lambda y, dy: dy * (y * (1 - y)))


Abs, abs = declare("Abs", "abs", ("a",), jnp.abs, "y = |a|.")
Exp, exp = declare("Exp", "exp", ("a",), jnp.exp, "y = exp(a).")
Log, log = declare("Log", "log", ("x",), jnp.log, "y = ln(x).")
Sqrt, sqrt = declare("Sqrt", "sqrt", ("x",), jnp.sqrt, "y = x ** 0.5.")
Sign, sign = declare("Sign", "sign", ("a",), jnp.sign,
                     "y = 1, 0 or -1 by the sign of a (zero gradient).")
SoftSign, softsign = declare("SoftSign", "softsign", ("x",), lambda x: x / (1 + jnp.abs(x)),
                             "y = x / (1 + |x|).")
SoftPlus, softplus = declare("SoftPlus", "softplus", ("x",), jax.nn.softplus, "y = ln(exp(x) + 1).")
Negative, negative = declare("Negative", "negative", ("x",), jnp.negative, "y = -x.")
Reciprocal, reciprocal = declare("Reciprocal", "reciprocal", ("x",), lambda x: 1 / x, "y = 1 / x.")
Ceil, ceil = declare("Ceil", "ceil", ("x",), jnp.ceil, "y = ceil(x) (zero gradient).")
Floor, floor = declare("Floor", "floor", ("x",), jnp.floor, "y = floor(x) (zero gradient).")
Round, round = declare("Round", "round", ("x",), _round_half_away,
                       "y = x rounded to the nearest integer, halves away from zero (zero gradient).")
Rounde, rounde = declare("Rounde", "rounde", ("x",), jnp.round,
                         "y = x rounded to the nearest integer, halves to even (zero gradient).")
Erf, erf = declare("Erf", "erf", ("x",), jsp.erf, "y = erf(x); dy/dx = 2 / sqrt(pi) * exp(-x^2).")
Not, _not = declare("Not", "_not", ("x",), lambda x: float_mask(x == 0, x),
                    "y = 1 where x == 0 else 0 (logical not; no gradient).", differentiable=False)


# --------------------------------------------------------------------------------------------
# binary ops with NumPy broadcasting (the vjp sums gradients back to each operand's shape)
# --------------------------------------------------------------------------------------------
def _div(a, b):
    """a / b; SINGA casts the quotient back to a's dtype when a is not floating (truncation)."""
    q = a / b
    return q if jnp.issubdtype(a.dtype, jnp.inexact) else q.astype(a.dtype)


def _nonzero(x):
    return x != 0


Add, add = declare("Add", "add", ("a", "b"), jnp.add, "y = a + b (broadcasting).")
Sub, sub = declare("Sub", "sub", ("a", "b"), jnp.subtract, "y = a - b (broadcasting).")
Mul, mul = declare("Mul", "mul", ("x", "y"), jnp.multiply, "y = x * y (broadcasting).")
Div, div = declare("Div", "div", ("a", "b"), _div, "y = a / b (broadcasting).")
Pow, pow = declare("Pow", "pow", ("a", "b"), jnp.power,
                   "y = a ** b (broadcasting); dy/db = a^b ln(a) needs a > 0.")
PRelu, prelu = declare("PRelu", "prelu", ("x", "slope"), lambda x, s: jnp.where(x >= 0, x, s * x),
                       "y = x for x >= 0, slope * x for x < 0 (slope broadcasts; both get gradients).")
Less, less = declare("Less", "less", ("x", "y"), lambda x, y: float_mask(x < y, x, y),
                     "y = 1.0 where x < y else 0.0 (no gradient).", differentiable=False)
Greater, greater = declare("Greater", "greater", ("x", "y"), lambda x, y: float_mask(x > y, x, y),
                           "y = 1.0 where x > y else 0.0 (no gradient).", differentiable=False)
Equal, equal = declare("Equal", "equal", ("x", "y"), lambda x, y: float_mask(x == y, x, y),
                       "y = 1.0 where x == y else 0.0 (no gradient).", differentiable=False)
And, _and = declare("And", "_and", ("a", "b"), lambda a, b: float_mask(_nonzero(a) & _nonzero(b), a, b),
                    "y = 1.0 where both a and b are nonzero (no gradient).", differentiable=False)
Or, _or = declare("Or", "_or", ("a", "b"), lambda a, b: float_mask(_nonzero(a) | _nonzero(b), a, b),
                  "y = 1.0 where a or b is nonzero (no gradient).", differentiable=False)
Xor, _xor = declare("Xor", "_xor", ("a", "b"), lambda a, b: float_mask(_nonzero(a) ^ _nonzero(b), a, b),
                    "y = 1.0 where exactly one of a, b is nonzero (no gradient).", differentiable=False)


# --------------------------------------------------------------------------------------------
# parametrised elementwise ops
# --------------------------------------------------------------------------------------------
def _clip(x, *, min, max):  # noqa: A002 (SINGA's argument names)
    lo = -jnp.inf if min is None else min
    hi = jnp.inf if max is None else max
    # where(), not jnp.clip: the gradient is 1 on the boundaries too, as in SINGA
    return jnp.where(x < lo, lo, jnp.where(x > hi, hi, x)).astype(x.dtype)


class Clip(Function):
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


class Elu(Function):
    """y = x for x >= 0, alpha * (exp(x) - 1) for x < 0."""

    fn = staticmethod(_elu)

    def __init__(self, alpha: float = 1.0):
        super().__init__(alpha=float(alpha))


def elu(x: Tensor, alpha: float = 1) -> Tensor:
    """ELU activation (see :class:`Elu`)."""
    return Elu(alpha)(x)[0]


def _selu(x, *, alpha, gamma):
    return gamma * jnp.where(x > 0, x, alpha * jnp.expm1(jnp.minimum(x, 0)))


class SeLU(Function):
    """y = gamma * x for x > 0, gamma * alpha * (exp(x) - 1) for x <= 0."""

    fn = staticmethod(_selu)

    def __init__(self, alpha: float = 1.67326, gamma: float = 1.0507):
        super().__init__(alpha=float(alpha), gamma=float(gamma))


def selu(x: Tensor, alpha: float = 1.67326, gamma: float = 1.0507) -> Tensor:
    """SELU activation (see :class:`SeLU`)."""
    return SeLU(alpha, gamma)(x)[0]


class LeakyRelu(Function):
    """y = x for x >= 0, a * x for x < 0."""

    fn = staticmethod(lambda x, *, a: jnp.where(x >= 0, x, a * x))

    def __init__(self, a: float):
        super().__init__(a=float(a))


def leakyrelu(x: Tensor, a: float = 0.01) -> Tensor:
    """Leaky ReLU (see :class:`LeakyRelu`)."""
    return LeakyRelu(a)(x)[0]


class HardSigmoid(Function):
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


class SoftMax(Function):
    """y = exp(x) / sum(exp(x)), the sum running over axes ``axis, ..., ndim-1`` jointly (SINGA
    views the input as a matrix ``(prod(shape[:axis]), prod(shape[axis:]))``)."""

    fn = staticmethod(_softmax)

    def __init__(self, axis: int = 1):
        super().__init__(axis=int(axis))


def softmax(x: Tensor, axis: int = 1) -> Tensor:
    """Softmax over the trailing axes from ``axis`` (see :class:`SoftMax`)."""
    return SoftMax(axis)(x)[0]


class Cast(Function):
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


Matmul, matmul = declare("Matmul", "matmul", ("x", "w"), _matmul,
                         "y = x @ w (``np.matmul`` semantics: batched for >2-d inputs).")


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


class AddBias(Function):
    """y = x + b added to every row (axis=0: b has x.shape[1] elements) or every column
    (axis=1: b has x.shape[0] elements) of the matrix x."""

    fn = staticmethod(_add_bias)

    def __init__(self, axis: int = 0):
        if axis not in (0, 1):
            raise InvalidInput(f"AddBias: axis must be 0 (rows) or 1 (columns), got {axis!r}")
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


class Gemm(Function):
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


# what computes in half precision under autograd.autocast (see autocast.declare)
declare_autocast(COMPUTE, Matmul, Gemm, AddBias)
declare_autocast(FLOAT32, SoftMax, Exp, Log, Pow, Reciprocal, SoftPlus, Cosh, Sinh, Acos, Asin, Tan)
