"""The non-finite-step guard's reports: an optimizer that skipped updates whose gradients (or
loss) held NaN or inf warns about them (:class:`NonFiniteStepWarning`), without ever waiting for
a device -- eager updates keep the guard's state array and read it once it is ready, a compiled
step returns a copy of it as an output of its own whose host copy the next call reads."""
from __future__ import annotations

import sys
import warnings
from typing import Optional, Sequence

import jax
import numpy as np

from singa_jax._src.base.modes import current_trace_hook
from singa_jax._src.eager.replay import Deferred

__all__ = ["NonFiniteStepWarning", "SkipReports", "SKIP_FIELDS", "caller_outside_singa_jax"]


class NonFiniteStepWarning(RuntimeWarning):
    """An optimizer skipped a step whose gradients (or loss) held NaN or inf."""


# The non-finite guard's state: one float32 Tensor ``_skip_state`` of these three fields (one
# Tensor, so a compiled step carries one more small array, not three): how many updates were
# skipped, 1 while an update since the last step() was skipped (step() then keeps the counter),
# and the step_counter value of the last skipped update (for the warning). Float32 counts are
# exact up to 2**24 skipped steps.
SKIP_FIELDS = ("skipped", "pending", "last_skipped_step")


# graph mode's guard reports kept until read (see Optimizer._expect_skip_report): a host that runs
# this many steps ahead of the device drops the oldest
_PENDING_REPORTS = 4


def caller_outside_singa_jax() -> int:
    """The ``stacklevel`` that makes a warning issued by this function's caller point at the
    first frame outside singa_jax (the user's call, however deep the library's path to it)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("singa_jax"):
        frame, level = frame.f_back, level + 1
    return level


class SkipReports:
    """The reporting half of :class:`~singa_jax.opt.Optimizer`'s guard (the guard's state
    ``_skip_state`` and ``_guarded``/``_scaling`` are the optimizer's)."""

    def _report_skipped_steps(self) -> None:
        """Warn about updates skipped since the last report, without ever waiting for a device.

        The guard's state array written by a step is kept and read only once the program
        that wrote it has finished (``is_ready``), so the report comes a step or a few late but
        costs no host sync. Eager updates do this themselves; graph mode (whose compiled step
        runs no optimizer code) calls this after each step. Does nothing while a step is traced.
        """
        self._warn_skipped_steps()
        self._watch_skipped_steps()

    def _warn_skipped_steps(self) -> None:
        """The reading half of :meth:`_report_skipped_steps`: warn if the kept array is ready
        and counts new skips, then drop it."""
        if current_trace_hook() is not None:
            return
        watched = self.__dict__.get("_skip_watch")
        if type(watched) is Deferred:  # a recorded update's: ready once its segment ran
            watched = watched.value
        if watched is not None and watched.is_ready():
            self._warn_skip_count(np.asarray(watched).tolist())
            self.__dict__["_skip_watch"] = None

    def _watch_skipped_steps(self) -> None:
        """Keep the current guard state array for :meth:`_report_skipped_steps`, unless an
        earlier one is still waiting to be read."""
        if self.__dict__.get("_skip_watch") is not None or current_trace_hook() is not None \
                or "_skip_state" not in self.__dict__ or self._scaling():
            return  # (a loss-scaled update's skips are not warned about: see the class doc)
        # (a recorded update's pending value is kept as it is: reading it would run its segment)
        array = self._skip_state._data
        # only concrete arrays are kept: inside a user's jax.jit they are tracers
        if not isinstance(array, jax.core.Tracer):
            self.__dict__["_skip_watch"] = array

    # graph mode: the compiled step returns a copy of the guard's state (its own small buffer,
    # never donated), whose host copy starts at once; the next call reads it if it has arrived
    def _skip_report_output(self) -> Optional[jax.Array]:
        """Inside a traced step, after the update: the guard's state as an extra output of the
        program (None when nothing is guarded, or loss-scaled: see the class doc)."""
        if "_skip_state" not in self.__dict__ or not self._guarded() or self._scaling():
            return None
        return self._skip_state.array + 0.0  # a program output of its own, not the state's

    def _expect_skip_report(self, report: Optional[jax.Array]) -> None:
        """After a compiled step: start copying its guard state to the host (asynchronously)
        and keep it for :meth:`_read_skip_reports`."""
        if report is None:
            return
        report.copy_to_host_async()
        pending = self.__dict__.setdefault("_skip_reports", [])
        pending.append(report)
        del pending[:-_PENDING_REPORTS]  # the newest suffice: the counts are cumulative

    def _before_compiled_step(self) -> None:
        """Graph mode, before a step: report what has arrived, and let go of an eager update's
        kept guard state (held across the step, its buffer would be copied, not donated)."""
        self._read_skip_reports()
        self._warn_skipped_steps()
        self.__dict__["_skip_watch"] = None

    def _read_skip_reports(self) -> None:
        """Before a compiled step: warn about skips counted by the newest finished step's
        report (its host copy is there: no wait), then drop it and every older one."""
        pending = self.__dict__.get("_skip_reports")
        if not pending:
            return
        for i in range(len(pending) - 1, -1, -1):
            if pending[i].is_ready():
                self._warn_skip_count(np.asarray(pending[i]).tolist())
                del pending[:i + 1]
                return

    def _warn_skip_count(self, values: Sequence[float]) -> None:
        """Warn if the guard state ``values`` (fields ``SKIP_FIELDS``) counts skips not yet
        reported, at the user's line that made the call."""
        fields = dict(zip(SKIP_FIELDS, values))
        count = int(fields["skipped"])
        reported = self.__dict__.get("_skips_reported", 0)
        if count > reported:
            at = fields["last_skipped_step"]
            new = count - reported
            warnings.warn(
                f"{type(self).__name__}: skipped the update at step {at:g} (step_counter) "
                f"because its gradients or loss held NaN or inf"
                + (f", and {new - 1} earlier update(s) since the last report" if new > 1
                   else "")
                + f"; parameters and optimizer state were left unchanged ({count} skipped "
                f"in all, see skipped_steps; skip_nonfinite=False restores SINGA's "
                f"behaviour)", NonFiniteStepWarning, stacklevel=caller_outside_singa_jax())
        self.__dict__["_skips_reported"] = count  # a reset counter restarts the tally
