"""The arithmetic behind :class:`~singa_jax.tensor.Tensor`'s operators and SINGA's tensor
functions: operand checks (type, device), NumPy broadcasting with errors that name the op, the
binary-op helper, writing results into SINGA's ``out=`` tensors, and SINGA's ``mult`` and
``copy_data_to_from``.
"""
from __future__ import annotations

import builtins
import contextlib
import threading
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from singa_jax._src.backend.xla_options import kernel
from singa_jax._src.tensor.base import TensorBase, is_array

if TYPE_CHECKING:
    from singa_jax._src.tensor.tensor import Tensor

__all__ = ["copy_data_to_from", "mult"]


def to_scalar(x: jax.Array):
    """A Python float of a 0-d result (SINGA returns floats); the array itself while tracing."""
    return x if isinstance(x, jax.core.Tracer) else float(x)


def write_flat(arr: jax.Array, offset: int, values: jax.Array) -> jax.Array:
    """``arr`` with its flattened elements ``offset ...`` replaced by ``values``."""
    if offset == 0 and values.size == arr.size:
        return values.reshape(arr.shape)
    return arr.reshape(-1).at[offset:offset + values.size].set(values).reshape(arr.shape)


def _describe(x: Any) -> str:
    if isinstance(x, TensorBase):
        return f"Tensor of shape {x.shape}, dtype {x.dtype} on {x.device}"
    return f"{type(x).__name__} of shape {np.shape(x)}"


def same_device(op: str, *tensors: Tensor) -> None:
    first = tensors[0]
    for t in tensors[1:]:
        if t.device.jax_device != first.device.jax_device:
            raise ValueError(f"{op}: operands are on different devices: {_describe(first)} and "
                             f"{_describe(t)}; move one with Tensor.to_device()")


def check_tensor(op: str, name: str, x: Any) -> Tensor:
    if not isinstance(x, TensorBase):
        raise TypeError(f"{op}: {name} must be a Tensor, got {type(x).__name__}")
    return x


def operand(op: str, t: Tensor, x: Any):
    """``x`` as an operand of ``t`` in ``op``: its array (same device enforced) or a scalar/array;
    NotImplemented for other types, so Python can try the other operand's operator."""
    if isinstance(x, TensorBase):
        same_device(op, t, x)
        return x.array
    if isinstance(x, (bool, int, float)):
        return x
    if isinstance(x, np.generic):
        return x.item()  # a Python scalar stays weakly typed: it does not promote t's dtype
    if isinstance(x, np.ndarray) or is_array(x):
        return x
    return NotImplemented


def broadcast_shapes(op: str, a: Tuple[int, ...], b: Tuple[int, ...]) -> Tuple[int, ...]:
    a, b = tuple(a), tuple(b)
    shape = _BROADCASTS.get((a, b))  # (NumPy's rule costs ~4 us a call: known per shape pair)
    if shape is None:
        try:
            shape = tuple(np.broadcast_shapes(a, b))
        except ValueError:
            raise ValueError(f"{op}: shapes {a} and {b} do not broadcast together (NumPy "
                             f"broadcasting rules)") from None
        if len(_BROADCASTS) < 4096:
            _BROADCASTS[a, b] = shape
    return shape


_BROADCASTS: Dict[Tuple[Tuple[int, ...], Tuple[int, ...]], Tuple[int, ...]] = {}


@contextlib.contextmanager
def shape_errors(op: str, *operands: Any) -> Iterator[None]:
    """Re-raise JAX's complaints about operand shapes (TypeError or ValueError there) as a
    ValueError naming ``op`` and the operands."""
    try:
        yield
    except jax.errors.ConcretizationTypeError:
        raise
    except (TypeError, ValueError) as e:
        described = "; ".join(_describe(x) for x in operands)
        raise ValueError(f"{op}: {e} (operands: {described})") from e


def binary(op: str, fn: Callable, lhs: Tensor, rhs: Any, reflected: bool = False,
            dtype: Any = None):
    """``fn(lhs, rhs)`` on arrays (``fn(rhs, lhs)`` if reflected) with NumPy broadcasting,
    cast to ``dtype`` if given, as one cached kernel (see :func:`_elementwise_kernel`)."""
    b = operand(op, lhs, rhs)
    if b is NotImplemented:
        return b
    broadcast_shapes(op, lhs.shape, () if type(b) in _SCALARS else b.shape)
    x, y = (b, lhs.array) if reflected else (lhs.array, b)
    number = _number_of(fn)
    if number is None:  # jnp.power
        if not reflected and type(b) is int and -_STATIC_EXPONENT <= b <= _STATIC_EXPONENT:
            return _integer_power_kernel(b, dtype, x)  # (``t ** 2``)
        return _cast(fn(x, y), dtype)
    return _elementwise_kernel(number, dtype, x, y)


def _cast(z: Any, dtype: Any) -> Any:
    """``z`` in ``dtype`` (as it is for None)."""
    return z if dtype is None else z.astype(dtype)


# the Python integer exponents ``t ** n`` compiles a kernel each for (|n| up to this)
_STATIC_EXPONENT = 16


@partial(kernel, static_argnums=(0, 1))
def _integer_power_kernel(n: int, dtype: Any, x: Any) -> jax.Array:
    """``jnp.power(x, n)`` for a Python int ``n`` (multiplied out, as eagerly), cast to
    ``dtype`` unless None, as one cached kernel per exponent."""
    return _cast(jnp.power(x, n), dtype)


_SCALARS = (bool, int, float)


@partial(kernel, static_argnums=(0, 1))
def _elementwise_kernel(number: int, dtype: Any, x: Any, y: Any) -> jax.Array:
    """``fn(x, y)`` for the ``number``-th function of :func:`_number_of`, cast to ``dtype``
    unless None, as one cached kernel. An eager jnp call dispatches each primitive it binds, a
    Python scalar operand converted on the way (``jnp.multiply(x, 2.0)`` on an (8, 8) array
    ~34 us; a comparison's cast is another dispatch); one jitted call ~11-24 us, the scalar an
    argument (a new value is no new program)."""
    return _cast(_FUNCTIONS[number](x, y), dtype)


# The functions _elementwise_kernel applies, by number: its static argument is the number,
# because a jnp ufunc hashes in Python (twice a call, as a static argument). Numbered by id
# (the list keeps each function alive, so its id stays its own).
_FUNCTIONS: List[Callable] = []
_NUMBERS: Dict[int, Optional[int]] = {}


def _number_of(fn: Callable) -> Optional[int]:
    """``fn``'s number for :func:`_elementwise_kernel`, or None for a function run as it is:
    ``jnp.power``, which eagerly multiplies out a Python integer exponent (``x ** 2`` as
    ``x * x``), a constant that a kernel's argument is not."""
    number = _NUMBERS.get(id(fn), -1)
    if number == -1:
        with _numbering:  # (two threads must not give two functions one number)
            number = _NUMBERS.get(id(fn), -1)
            if number == -1:
                number = None
                if fn is not jnp.power:
                    number = len(_FUNCTIONS)
                    _FUNCTIONS.append(fn)
                _NUMBERS[id(fn)] = number
    return number


_numbering = threading.Lock()


def _store(op: str, out: Tensor, arr: jax.Array) -> Tensor:
    """Write ``arr`` into ``out`` (SINGA's ``ret=``/``out=``/``C=``): same shape, out's dtype."""
    check_tensor(op, "the output", out)
    if tuple(arr.shape) != out.shape:
        raise ValueError(f"{op}: result of shape {tuple(arr.shape)} does not fit the output "
                         f"tensor of shape {out.shape}")
    out.array = out.device.put(arr.astype(out.dtype))
    return out


def result(op: str, like: Tensor, arr: Any, out: Optional[Tensor]) -> Tensor:
    if arr is NotImplemented:
        raise TypeError(f"{op}: unsupported operand; expected a Tensor, a number or an array")
    return like._new(arr) if out is None else _store(op, out, arr)


def as_line(op: str, M: Tensor, v: Any, axis: int) -> jax.Array:
    """``v`` as a column (axis 0) or row (axis 1) of the 2-d tensor ``M``, for broadcasting."""
    check_tensor(op, "M", M)
    check_tensor(op, "v", v)
    if M.ndim() != 2:
        raise ValueError(f"{op}: expects a 2-d tensor, got shape {M.shape}")
    same_device(op, M, v)
    n = M.shape[axis]
    if v.size() != n:
        kind = "column" if axis == 0 else "row"
        raise ValueError(f"{op}: v of shape {v.shape} must have {n} elements to be a {kind} of a "
                         f"tensor of shape {M.shape}")
    return v.array.reshape((n, 1) if axis == 0 else (1, n))


def copy_data_to_from(dst: Tensor, src: Tensor, size: int, dst_offset: int = 0,
                      src_offset: int = 0) -> None:
    """Copy ``size`` elements of ``src`` (from flat position ``src_offset``) into ``dst`` (from
    ``dst_offset``); the tensors may be on different devices."""
    op = "copy_data_to_from"
    check_tensor(op, "dst", dst)
    check_tensor(op, "src", src)
    if (builtins.min(size, dst_offset, src_offset) < 0 or src_offset + size > src.size()
            or dst_offset + size > dst.size()):
        raise ValueError(f"{op}: cannot copy {size} elements from offset {src_offset} of a tensor "
                         f"of shape {src.shape} to offset {dst_offset} of a tensor of shape "
                         f"{dst.shape}")
    values = src.array.reshape(-1)[src_offset:src_offset + size].astype(dst.dtype)
    dst.array = write_flat(dst.array, dst_offset, dst.device.put(values))


def mult(A: Tensor, B: Tensor, C: Optional[Tensor] = None, alpha: float = 1.0,
         beta: float = 0.0) -> Tensor:
    """``alpha * A @ B`` (matrix-matrix, matrix-vector or batched), or in place
    ``C = alpha * A @ B + beta * C`` when ``C`` is given (then returned)."""
    check_tensor("mult", "A", A)
    check_tensor("mult", "B", B)
    same_device("mult", A, B)
    with shape_errors("mult", A, B):
        prod = jnp.matmul(A.array, B.array)
    if alpha != 1.0:
        prod = alpha * prod
    if C is None:
        return A._new(prod)
    same_device("mult", A, check_tensor("mult", "C", C))
    # BLAS ignores C when beta is 0, so NaNs in C do not leak in
    return _store("mult", C, prod if beta == 0 else prod + beta * C.array)
