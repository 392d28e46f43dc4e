"""SINGA's ``snapshot`` module: save and load named parameters in SINGA's (pre-3.0) binary
snapshot format.

SINGA marks this module deprecated in favour of ``Model.save_states``/``load_states``; it is
here so that snapshots written by older SINGA programs load, and so that those programs run.
The byte layout is SINGA's: see docs/porting.md.

Example::

    from singa_jax import snapshot
    sn = snapshot.Snapshot('param', True)      # True: write (param.bin + param.desc)
    sn.write('w', w)
    params = snapshot.Snapshot('param', False).read()   # {'w': Tensor}
"""
from singa_jax._src.swig.snapshot import Snapshot as Snapshot
from singa_jax._src.base.public import publish as _publish

__all__ = [
    "Snapshot"]

_publish(__name__, __all__)
