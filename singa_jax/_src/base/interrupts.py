"""Ctrl-C held back over a critical section.

A compiled graph-mode step donates the state's buffers when it is called (XLA reuses them for
the new values, and the old arrays are deleted) and the Python side binds the new arrays to the
Tensors after the call returns. A KeyboardInterrupt raised in between would leave Tensors over
deleted arrays: a model that can neither train on nor be saved. :func:`deferred` holds SIGINT's
KeyboardInterrupt back while such a section runs; it is raised when the outermost scope
(:func:`deferred` or :func:`deferrable`) exits, where the caller's state is whole again.

Only the main thread receives SIGINT, and only Python's default handler raises
KeyboardInterrupt: elsewhere, or under a handler someone installed, the scopes do nothing.
A scope that defers costs two handler swaps (under 2 us with its enclosing scope: it runs once
per compiled step); one that does not, a counter.
"""
from __future__ import annotations

import os
import signal
import threading
from typing import Any, Optional

try:  # the C module under ``signal``: its wrappers convert handlers to enums (~2 us a call)
    import _signal
except ImportError:  # pragma: no cover (another Python implementation)
    _signal = signal  # type: ignore[assignment]

__all__ = ["deferred", "deferrable", "deferring"]

_depth = 0  # scopes open in the main thread, of both kinds
_deferring = False  # whether our handler holds SIGINT back now
_pending = False  # a SIGINT arrived while held back


def _hold(signum: int, frame: Any) -> None:
    global _pending
    _pending = True


_SIGINT = int(signal.SIGINT)
_DEFAULT = signal.default_int_handler


def _start() -> None:
    global _deferring, _pending
    if _signal.getsignal(_SIGINT) is not _DEFAULT:
        return  # a handler someone installed decides what SIGINT does: leave it
    _pending = False  # (one left by a stop that a second Ctrl-C cut short is raised already)
    # (CPython runs a SIGINT that arrived but is not yet handled before it changes the
    # handler: that one is raised here, before the section starts)
    _signal.signal(_SIGINT, _hold)
    _deferring = True


def _stop() -> None:
    global _deferring, _pending
    _deferring = False
    if _signal.getsignal(_SIGINT) is _hold:  # (unless someone replaced it meanwhile)
        # a SIGINT not yet handled runs through _hold first (see _start)
        _signal.signal(_SIGINT, _DEFAULT)
    if _pending:
        _pending = False
        raise KeyboardInterrupt


class _Scope:
    """A nestable scope (module-level singletons: entering one allocates nothing)."""

    __slots__ = ("_starts",)

    def __init__(self, starts: bool):
        self._starts = starts

    def __enter__(self) -> "_Scope":
        global _depth
        if _get_ident() != _main:
            return self
        _depth += 1
        if self._starts and not _deferring:
            try:
                _start()
            except BaseException:  # a SIGINT that had arrived: the scope never opened
                _depth -= 1
                raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Optional[bool]:
        global _depth
        if _get_ident() != _main:
            return None
        _depth -= 1
        if _depth == 0 and _deferring:
            _stop()  # raises the KeyboardInterrupt held back (chained to a propagating error)
        return None


_get_ident = threading.get_ident
_main = threading.main_thread().ident


def _after_fork() -> None:
    # A child forked by another thread runs on in that thread, its main thread from then on,
    # which is in no scope: Ctrl-C interrupts it as usual. (Forked by the main thread, the
    # child goes on through the same scopes, which it exits as the parent would.)
    global _main, _depth, _deferring, _pending
    if _get_ident() == _main:
        return
    if _deferring and _signal.getsignal(_SIGINT) is _hold:
        _signal.signal(_SIGINT, _DEFAULT)
    _main, _depth, _deferring, _pending = _get_ident(), 0, False, False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)

_DEFERRED = _Scope(True)
_DEFERRABLE = _Scope(False)


def deferred() -> _Scope:
    """``with deferred():`` -- a KeyboardInterrupt from SIGINT (Ctrl-C) arriving from here on is
    held back until the outermost open scope exits, and raised there."""
    return _DEFERRED


def deferrable() -> _Scope:
    """``with deferrable():`` -- a scope that holds nothing back itself, but a :func:`deferred`
    scope entered inside it defers until this one exits (the caller's state is whole only
    then)."""
    return _DEFERRABLE


def deferring() -> bool:
    """Whether a SIGINT arriving now would be held back."""
    return _deferring
