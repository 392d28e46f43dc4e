"""SINGA's ``snapshot`` module: save and load named parameters in SINGA's (pre-3.0) binary
snapshot format.

SINGA marks this module deprecated in favour of ``Model.save_states``/``load_states``; it is
here so that snapshots written by older SINGA programs load, and so that those programs run.
The byte layout is described in :mod:`singa_jax.singa_wrap.io`.

Example::

    from singa_jax import snapshot
    sn = snapshot.Snapshot('param', True)      # True: write (param.bin + param.desc)
    sn.write('w', w)
    params = snapshot.Snapshot('param', False).read()   # {'w': Tensor}
"""
from __future__ import annotations

from typing import Dict, Union

from . import singa_wrap as singa
from . import tensor

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
        self.snapshot = singa.Snapshot(f, mode, buffer_size)

    def write(self, param_name: str, param_val: tensor.Tensor) -> None:
        """Append the Tensor ``param_val`` under ``param_name``."""
        if not isinstance(param_val, tensor.Tensor):
            raise TypeError(f"Snapshot.write: param_val must be a Tensor, got "
                            f"{type(param_val).__name__}")
        self.snapshot.Write(param_name, param_val.data)

    def read(self) -> Dict[str, tensor.Tensor]:
        """Every parameter of the snapshot as ``{name: Tensor}`` (on the default device)."""
        return {name: tensor.from_raw_tensor(singa.as_array(value))
                for name, value in self.snapshot.Read()}

    def close(self) -> None:
        """Release the files (they are complete after every ``write`` already)."""
        self.snapshot.close()
