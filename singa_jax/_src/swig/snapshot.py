"""SINGA's ``snapshot.Snapshot`` (public in :mod:`singa_jax.snapshot`) over the binary format
of :mod:`.io`."""
from __future__ import annotations

from typing import Dict, Union
from singa_jax._src.swig import io as _io
from singa_jax._src.tensor.tensor import Tensor
from singa_jax._src.tensor.creation import from_raw_tensor
from singa_jax._src.runtime.ctensor import as_array


__all__ = ["Snapshot"]


class Snapshot:
    """A snapshot file opened for reading or writing.

    Args:
        f: the file prefix (``f.bin`` and ``f.desc`` are written; ``f.bin``, or SINGA 1.0.0's
            ``f.model``, is read).
        mode: True to write, False to read.
        buffer_size: SINGA's buffer in MB; one parameter record may not exceed it when writing.
    """

    def __init__(self, f: str, mode: Union[bool, int], buffer_size: int = 10):
        self.snapshot = _io.Snapshot(f, mode, buffer_size)

    def write(self, param_name: str, param_val: Tensor) -> None:
        """Append the Tensor ``param_val`` under ``param_name``."""
        if not isinstance(param_val, Tensor):
            raise TypeError(f"Snapshot.write: param_val must be a Tensor, got "
                            f"{type(param_val).__name__}")
        self.snapshot.Write(param_name, param_val.data)

    def read(self) -> Dict[str, Tensor]:
        """Every parameter of the snapshot as ``{name: Tensor}`` (on the default device)."""
        return {name: from_raw_tensor(as_array(value))
                for name, value in self.snapshot.Read()}

    def close(self) -> None:
        """Release the files (they are complete after every ``write`` already)."""
        self.snapshot.close()
