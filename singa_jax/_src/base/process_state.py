"""What the engine learns from earlier calls to run later ones faster -- eager replay's tree of
recorded sequences and their programs, fused walks' plans, the per-kind recipes -- and each
Device's random key: process-global state, forgotten together by :func:`reset` (a cold start:
the test suite starts every test from it). Each owner registers how to forget its own part."""
from __future__ import annotations

from typing import Callable, List

__all__ = ["register", "reset"]

_RESETS: List[Callable[[], None]] = []


def register(forget: Callable[[], None]) -> Callable[[], None]:
    """Add ``forget`` (no arguments) to what :func:`reset` calls; returns it (a decorator)."""
    _RESETS.append(forget)
    return forget


def reset() -> None:
    """Forget every registered part of the process's learnt state (not thread-safe: call it
    while no other thread runs singa_jax)."""
    for forget in _RESETS:
        forget()
