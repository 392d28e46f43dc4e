"""Seeing what a run does (a singa_jax module; SINGA has none).

* :func:`trace` records Model calls into a ``jax.profiler`` trace folder (TensorBoard,
  Perfetto) with each Layer call, operator, backward and update named as in the model.
* :class:`explain_compiles` (or ``SINGA_JAX_EXPLAIN_COMPILES=1``) logs every compilation with
  its cause, the user's line and Layer; :func:`compile_log` returns them. A loop compiling on
  every step is warned about without it (:class:`RecompilationWarning`).
* :func:`stats` / :func:`print_stats`: compilations by kind, eager replay's hits and misses,
  host reads per step, memory.
* :class:`detect_anomaly` names the first operator and Layer whose output or gradient is not
  finite (also in :mod:`singa_jax.autograd`).

SINGA's own time profiling is ``Device.SetVerbosity``/``SetSkipIteration``/
``PrintTimeProfiling`` (:mod:`singa_jax.device`).
"""
from singa_jax._src.base.public import publish as _publish
from singa_jax._src.debug.anomaly import AnomalyError as AnomalyError
from singa_jax._src.debug.anomaly import detect_anomaly as detect_anomaly
from singa_jax._src.debug.anomaly import is_anomaly_enabled as is_anomaly_enabled
from singa_jax._src.debug.capture import trace as trace
from singa_jax._src.debug.compiles import RecompilationWarning as RecompilationWarning
from singa_jax._src.debug.compiles import compile_log as compile_log
from singa_jax._src.debug.compiles import explain_compiles as explain_compiles
from singa_jax._src.debug.compiles import explaining as explaining
from singa_jax._src.debug.stats import print_stats as print_stats
from singa_jax._src.debug.stats import reset_stats as reset_stats
from singa_jax._src.debug.stats import stats as stats

__all__ = ["trace", "explain_compiles", "explaining", "compile_log", "RecompilationWarning",
           "stats", "print_stats", "reset_stats", "detect_anomaly", "is_anomaly_enabled",
           "AnomalyError"]

_publish(__name__, __all__)
