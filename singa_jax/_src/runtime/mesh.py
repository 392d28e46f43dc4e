"""Arrays laid out over DistOpt's mesh, seen from one process: the whole value of an array
split over several processes' devices (:func:`host_value`, a collective every rank runs), and
one device's copy of a replicated array (:func:`on_device`)."""
from __future__ import annotations

from typing import Any, Callable, Dict, List

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from singa_jax._src.runtime.cluster import CLUSTER, agree

__all__ = ["host_value", "on_device", "gathered"]


def host_value(a: jax.Array) -> np.ndarray:
    """The whole value of ``a`` as a NumPy array (``tensor.to_numpy``): a value sharded over
    several processes' devices (a ZeRO slot or an FSDP parameter of a multi-process run) is
    all-gathered, a collective that every rank must run, in the same order -- as every rank
    calls ``save_states`` or ``to_numpy`` of the same Tensors. The ranks first agree through
    the coordination service, so a rank reading alone gets a TimeoutError naming the ranks
    that did not (after ``SINGA_JAX_DIST_TIMEOUT`` seconds) instead of hanging."""
    if a.is_fully_addressable or a.is_fully_replicated:
        return np.array(a)
    return np.array(gathered([a], f"reading a value {tuple(a.shape)} {a.dtype} split over "
                                   f"the processes' devices (to_numpy, save_states): every rank "
                                   f"must read it")[0].addressable_data(0))


def on_device(a: jax.Array, device: jax.Device) -> jax.Array:
    """A fully replicated ``a`` as a single-device array on ``device`` (its shard there)."""
    for shard in a.addressable_shards:
        if shard.device == device:
            return shard.data
    return jax.device_put(a.addressable_data(0), device)


_REPLICATED: Dict[Any, Callable] = {}  # (mesh, count) -> jitted identity to replicated outputs


def gathered(arrays: List[jax.Array], what: str) -> List[jax.Array]:
    """``arrays`` (NamedSharding over DistOpt's mesh) replicated over their mesh: one program,
    a collective over every process after the ranks agreed on it (``cluster.agree``)."""
    cluster = CLUSTER[0]
    if cluster is not None:
        agree(cluster, what, repr([(tuple(a.shape), str(a.dtype)) for a in arrays]))
    mesh = arrays[0].sharding.mesh
    key = (mesh, len(arrays))
    program = _REPLICATED.get(key)
    if program is None:
        program = _REPLICATED[key] = jax.jit(
            lambda xs: xs, out_shardings=[NamedSharding(mesh, P())] * len(arrays))
    return program(list(arrays))
