"""The last checkpoint this process wrote completely, for messages that tell a user where to
resume from (a lost peer, an interrupted run). Written by the checkpoint writers, read by
whoever reports a stop; a plain record, no I/O."""
from __future__ import annotations

import threading
from typing import Optional

__all__ = ["record", "latest"]

_lock = threading.Lock()
_latest: Optional[str] = None


def record(path: str) -> None:
    """Remember ``path`` as the newest complete checkpoint of this process."""
    global _latest
    with _lock:
        _latest = str(path)


def latest() -> Optional[str]:
    """The newest complete checkpoint this process wrote (None: none yet)."""
    with _lock:
        return _latest
