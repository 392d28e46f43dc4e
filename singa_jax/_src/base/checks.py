"""Value checks that work eagerly and inside graph mode's compiled step.

An op that must reject bad VALUES (a class label outside ``[0, classes)``, an embedding index
outside the vocabulary) calls :func:`check` with a scalar boolean array ``ok`` and a message:

* **Eager** (``ok`` is a concrete array): when ``ok`` is false, :func:`check` raises
  ``ValueError(message)`` at once, before the op's kernel runs, so nothing has changed yet.
* **Traced** (``ok`` is a JAX tracer: graph mode is tracing the step): the value is unknown
  until the program runs, so :func:`check` appends a :class:`Check` to the list of the
  innermost active :func:`collecting` block of this thread (and asyncio task) and returns.
  The collector's owner (graph mode) adds the flags to the program's outputs and raises after
  the program ran, before writing any new state back: an error at the end of the step, with
  nothing applied and no host sync per op.
* **Traced with no collector** (a user's own ``jax.jit`` around singa_jax code): the check is
  skipped; nobody could act on the flag.
* **A check of a compiled step's input as it was passed** (class labels handed straight to the
  loss -- the usual case): while graph mode traces a step it names the step's traced inputs
  (:func:`input_checks`); an index check of one of them is not compiled into the program at
  all. It is recorded as ``(position, check)`` and graph mode runs it on the concrete argument
  before each run of the program, exactly as eager mode checks: an error before the step, and
  no flag, no gating of the new state and no device sync in the program. (Reading the labels
  waits for them only, which a batch fed from the host never makes anyone do.)

Contract for the collector (graph mode):

    with checks.collecting() as found:          # around the trace of the step
        ... trace ...                           # ops append Check(ok, message, values)
    # make ``[c.ok for c in found]`` and ``[c.values for c in found]`` outputs of the program;
    # after running it, for the first check whose ok is False:
    #     raise ValueError(found[i].format(concrete_values_i))
    # and write no new state back (the step did not happen).

The list is per thread (a :class:`contextvars.ContextVar`), so two threads tracing at once never
see each other's checks; nested ``collecting()`` blocks each get their own list.
"""
from __future__ import annotations

import contextlib
import contextvars
import weakref
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Check", "check", "collecting", "check_indices", "all_passed", "outputs",
           "raise_first_failure", "input_checks", "run_input_checks"]

Message = Union[str, Callable[[], str]]


@dataclass(frozen=True)
class Check:
    """One deferred check recorded while tracing.

    Attributes:
        ok: scalar bool tracer; False means the input was bad.
        message: the error message, a ``str.format`` template filled with ``values``.
        values: scalar tracers reported in the message (e.g. the smallest and largest label).
    """

    ok: Any
    message: str
    values: Tuple[Any, ...] = ()

    def format(self, values: Sequence[Any]) -> str:
        """The message with the concrete ``values`` (same order as :attr:`values`) filled in."""
        return _format(self.message, values)


_COLLECTOR: contextvars.ContextVar[Optional[List[Check]]] = contextvars.ContextVar(
    "singa_jax._src.base.checks", default=None)


@contextlib.contextmanager
def collecting() -> Iterator[List[Check]]:
    """Collect the checks of the traced code run inside the block (this thread only); yields the
    list they are appended to. The previous collector (if any) is restored on exit."""
    found: List[Check] = []
    token = _COLLECTOR.set(found)
    try:
        yield found
    finally:
        _COLLECTOR.reset(token)


# (id of each traced input of the step -> its position, the list of input checks found)
InputCheck = Tuple[int, Callable[[Any], None]]
_INPUTS: contextvars.ContextVar[Optional[Tuple[dict, List[InputCheck]]]] = \
    contextvars.ContextVar("singa_jax._src.base.checks.inputs", default=None)


@contextlib.contextmanager
def input_checks(traced_inputs: Sequence[Any]) -> Iterator[List[InputCheck]]:
    """While a compiled step is traced over ``traced_inputs`` (its batch arrays): an index check
    of one of them as it stands is recorded in the yielded list as ``(position, check)`` instead
    of being compiled in; :func:`run_input_checks` runs them on the concrete arguments."""
    found: List[InputCheck] = []
    token = _INPUTS.set(({id(a): i for i, a in enumerate(traced_inputs)}, found))
    try:
        yield found
    finally:
        _INPUTS.reset(token)


def run_input_checks(found: Sequence[InputCheck], arrays: Sequence[Any]) -> None:
    """Run the input checks of a compiled step on its concrete inputs ``arrays`` (raises the
    eager error of the first that fails)."""
    for position, run in found:
        run(arrays[position])


def all_passed(found: Sequence[Check]) -> Any:
    """One scalar: whether every recorded check holds (traced, like the checks)."""
    ok = found[0].ok
    for c in found[1:]:
        ok = ok & c.ok
    return ok


def outputs(found: Sequence[Check]) -> Tuple[Tuple[Any, Tuple[Any, ...], str], ...]:
    """What a compiled step returns for its checks: ``(ok, values, message)`` per check; the
    message strings are static (a graph-mode program bakes them into its result)."""
    return tuple((c.ok, tuple(c.values), c.message) for c in found)


def raise_first_failure(results: Sequence[Tuple[Any, Sequence[Any], str]]) -> None:
    """After a compiled step ran: ``ValueError`` with the message of the first check in
    ``results`` (as :func:`outputs` made them, now concrete) that failed. Reads one scalar per
    check from the device, and only for steps that have checks."""
    for ok, values, message in results:
        if not bool(ok):
            raise ValueError(_format(message, values))


def _is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def _scalar(v: Any) -> Any:
    """A concrete scalar array as a Python number, for the message ("?" if still traced)."""
    return "?" if _is_tracer(v) else np.asarray(v).item()


def _format(message: str, values: Sequence[Any]) -> str:
    return message.format(*[_scalar(v) for v in values]) if values else message


def check(ok: Any, message: Message, *values: Any) -> None:
    """Raise ``ValueError`` (eager) or record a deferred check (traced) unless ``ok`` holds.

    Args:
        ok: a scalar boolean (a jax array, a tracer, or a Python/NumPy bool).
        message: the error message; a ``str.format`` template when ``values`` are given, or a
            zero-argument callable returning the message (built only when needed).
        values: scalar arrays filled into ``message`` (concrete values in the error).
    """
    if _is_tracer(ok):
        found = _COLLECTOR.get()
        if found is not None:
            text = message() if callable(message) else message
            found.append(Check(ok, text, tuple(values)))
        return
    if not bool(ok):  # concrete: one host read of a scalar
        text = message() if callable(message) else message
        raise ValueError(_format(text, values))


# --- the shared index check: class labels, embedding indices ---------------------------------
@partial(jax.jit, static_argnums=(1, 2))
def _index_stats(idx: jax.Array, size: int, require_integers: bool):
    """``(ok, smallest, largest, all integers)`` of the indices ``idx`` for a table of ``size``
    rows: one small kernel. Float indices count by their truncation (as the ops use them),
    unless ``require_integers``; NaN is never in range."""
    if jnp.issubdtype(idx.dtype, jnp.integer):
        used, whole = idx, jnp.array(True)
    else:
        used = jnp.trunc(idx)
        whole = jnp.all(idx == used)
    ok = jnp.all(used >= 0) & jnp.all(used < size)
    if require_integers:
        ok = ok & whole
    return ok, jnp.min(idx), jnp.max(idx), whole


def _host_index_stats(idx: np.ndarray, size: int, require_integers: bool):
    """:func:`_index_stats` on the host (NumPy), for concrete indices."""
    if np.issubdtype(idx.dtype, np.integer):
        used, whole = idx, True
    else:
        with np.errstate(invalid="ignore"):
            used = np.trunc(idx)
        whole = bool(np.all(idx == used))
    with np.errstate(invalid="ignore"):  # NaN compares False: out of range
        ok = bool(np.all(used >= 0) and np.all(used < size))
    return ok and (whole or not require_integers), idx.min(), idx.max(), whole


@lru_cache(maxsize=None)
def _unsigned_view(dtype: np.dtype, size: int) -> Optional[np.dtype]:
    """The dtype to view integer indices of ``dtype`` as, so that one max checks them against
    ``[0, size)``: a signed index viewed as unsigned is at least 2**(bits-1) > size when
    negative. None when one max cannot decide (floats, or a size the dtype cannot hold)."""
    if dtype.kind in "iu" and size <= np.iinfo(dtype).max:
        return np.dtype(dtype.str.replace("i", "u"))
    return None


def _all_in_range(host: np.ndarray, size: int) -> bool:
    """True when every index of ``host`` is surely in ``[0, size)`` by one max (the check of
    every step); False means: take the general check, which decides and builds the error."""
    unsigned = _unsigned_view(host.dtype, size)
    return unsigned is not None and (host.size == 0 or host.view(unsigned).max() < size)


# jax Arrays of indices found in range: id -> (a weak reference to the array, the table sizes it
# passed for). A jax Array never changes, so indices fed again (a dataset's label batches held
# on the device, epoch after epoch) are not read again: right after a step, reading 64 labels
# back and taking their max costs ~20 us of a small model's call. An entry goes with its array.
_IN_RANGE: Dict[int, Tuple[weakref.ref, Set[int]]] = {}


def _in_range(idx: Any, size: int) -> bool:
    """:func:`_all_in_range` of a concrete index array (NumPy, or a jax Array read back),
    remembered for a jax Array that passes."""
    key = id(idx)
    entry = _IN_RANGE.get(key)
    if entry is not None and entry[0]() is not idx:
        entry = None  # another (dead) array's
    if entry is not None and size in entry[1]:
        return True
    if not _all_in_range(np.asarray(idx), size):
        return False
    if isinstance(idx, jax.Array):  # a NumPy array may change: never remembered
        if entry is None:
            entry = _IN_RANGE[key] = (
                weakref.ref(idx, lambda _, key=key: _IN_RANGE.pop(key, None)), set())
        entry[1].add(size)
    return True


def _host_index_check(op: str, what: str, size: int, context: str,
                      require_integers: bool) -> Callable[[Any], None]:
    """The per-run host check of a compiled step's index input: one max when it passes (it
    runs before every step, where each microsecond shows on a small model), none for indices
    that passed before, else the general check with its error."""
    def run(concrete: Any) -> None:
        if not _in_range(concrete, size):
            check_indices(op, what, concrete, size, context, require_integers)
    return run


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def check_indices(op: str, what: str, idx: jax.Array, size: int, context: str,
                  require_integers: bool = False) -> None:
    """:func:`check` that every value of ``idx`` is an index in ``[0, size)``.

    ``op`` and ``what`` name the op and its argument (``"Embedding"``, ``"indices x"``),
    ``context`` says where ``size`` comes from (``"vocabulary of w with shape (5, 2)"``). With
    ``require_integers`` float values must be exact integers (class labels); otherwise they
    are truncated, as the ops do (embedding indices). An empty ``idx`` passes.
    """
    if idx.size == 0:
        return
    if not (jnp.issubdtype(idx.dtype, jnp.integer) or jnp.issubdtype(idx.dtype, jnp.floating)):
        raise TypeError(f"{op}: {what} must be integers or floats, got dtype {idx.dtype}")
    if _is_tracer(idx):
        inputs = _INPUTS.get()
        position = None if inputs is None else inputs[0].get(id(idx))
        if position is not None:  # a compiled step's input: checked on the host before each run
            inputs[1].append((position, _host_index_check(op, what, size, context,
                                                          require_integers)))
            return
        # a value computed inside a compiled step: a small kernel in it, checked at its end
        ok, lo, hi, whole = _index_stats(idx, int(size), bool(require_integers))
    else:  # eager: indices are few, and reading them avoids a kernel launch and a device sync
        if _in_range(idx, size):  # the usual case, checked on every step
            return
        ok, lo, hi, whole = _host_index_stats(np.asarray(idx), int(size), require_integers)
    kind = "integers in" if require_integers else "in"
    message = (_escape(f"{op}: {what} must be {kind} [0, {size}) ({context}); got {what} of "
                       f"shape {tuple(idx.shape)}, dtype {idx.dtype}, with values in ")
               + "[{}, {}]" + (", all integers: {}" if require_integers else ""))
    values = (lo, hi, whole) if require_integers else (lo, hi)
    check(ok, message, *values)
