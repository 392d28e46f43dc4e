"""Checkpoints of a training run (a singa_jax module; SINGA has ``Model.save_states`` only).

:class:`CheckpointManager` saves everything a run needs to continue bit for bit -- the model's
states (in SINGA's format, which SINGA's ``Model.load_states`` reads), the optimizer's states,
every Device's random key, a ``DeviceLoader``'s position, the global random generators -- in
one call, writes it on a background thread, keeps the newest N, and restores it in one call
(:class:`Restored` says where the run stood). With :class:`~singa_jax.autograd.reproducible`
on, a resumed run computes the same bits as the uninterrupted one. See ``docs/long_runs.md``.
"""
from singa_jax._src.base.public import publish as _publish
from singa_jax._src.persist.manager import CheckpointManager as CheckpointManager
from singa_jax._src.persist.run_state import Restored as Restored

__all__ = ["CheckpointManager", "Restored"]

_publish(__name__, __all__)
