"""The trace hook graph mode installs while it traces a step: which Tensors outside the declared
state the step touches, and which it creates (with their values at birth)."""
from __future__ import annotations

import weakref
from typing import Any, Dict, List, Sequence

from singa_jax._src.base.modes import TraceHook
from singa_jax._src.tensor.tensor import Tensor

__all__ = ["Recorder"]


class Recorder(TraceHook):
    """Learns, during one trace, which Tensors outside the declared inputs the step touches and
    which Tensors it creates: for each created one its value at birth (the array it was built
    over) and whether the step first read or first wrote it after that; for each undeclared one
    it writes, the value it had before the step."""

    def __init__(self, known: Sequence[Tensor]):
        self.known_ids = {id(t) for t in known}
        self.created_refs: List[weakref.ref] = []
        self.created_ids: set = set()
        self.births: Dict[int, Any] = {}         # id -> array the created Tensor was built over
        self.first_access: Dict[int, str] = {}   # id -> "read" | "write", for created Tensors
        self.undeclared_read: Dict[int, Tensor] = {}
        self.undeclared_written: Dict[int, Tensor] = {}
        self.written_originals: Dict[int, Any] = {}  # id -> array before the step's first write

    def read(self, t: Tensor) -> None:
        i = id(t)
        if i in self.created_ids:
            self.first_access.setdefault(i, "read")
        elif i not in self.known_ids:
            self.undeclared_read[i] = t

    def write(self, t: Tensor) -> None:
        i = id(t)
        if i in self.created_ids:
            self.first_access.setdefault(i, "write")
        elif i not in self.known_ids:
            self.undeclared_written[i] = t
            self.written_originals.setdefault(i, t._data)  # called before the rebinding

    def put_back_written(self, tensors: Sequence[Tensor]) -> None:
        """Give each of ``tensors`` that the step wrote without declaring it the value it had
        before the step's first write (the others are left as they are)."""
        for t in tensors:
            original = self.written_originals.get(id(t))
            if original is not None:
                t._data = original

    def created(self, t: Tensor) -> None:
        i = id(t)  # may be the id of a freed temporary: the newest Tensor owns it now
        self.created_refs.append(weakref.ref(t))
        self.created_ids.add(i)
        self.births[i] = t._data
        self.first_access.pop(i, None)

    def alive_created(self, exclude_ids: set) -> List[Tensor]:
        """Tensors created while recording that something still references (not ``exclude_ids``)."""
        out, seen = [], set()
        for ref in self.created_refs:
            t = ref()
            if t is not None and id(t) not in exclude_ids and id(t) not in seen:
                seen.add(id(t))
                out.append(t)
        return out
