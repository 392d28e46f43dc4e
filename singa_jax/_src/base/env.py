"""The environment variables that switch singa_jax's mechanisms, read one way."""
from __future__ import annotations

import os

__all__ = ["switched_off", "flag"]


def switched_off(setting: str) -> bool:
    """Whether an environment setting's value says off (``0``, ``false``, ``no``, ``off``; any
    case, surrounding spaces ignored): the words every singa_jax switch accepts."""
    return setting.strip().lower() in ("0", "false", "no", "off")


def flag(name: str) -> bool:
    """Whether the switch ``name`` (an environment variable, on unless it says off) is on."""
    return not switched_off(os.environ.get(name, ""))
