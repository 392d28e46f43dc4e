"""SINGA's ``model`` module: :class:`Model`, a Layer that trains itself.

Usage is SINGA's::

    class MLP(model.Model):
        def __init__(self):
            super().__init__()
            self.fc1, self.relu, self.fc2 = layer.Linear(256), layer.ReLU(), layer.Linear(10)
            self.loss = layer.SoftMaxCrossEntropy()

        def forward(self, x):
            return self.fc2(self.relu(self.fc1(x)))

        def train_one_batch(self, x, y):
            out = self.forward(x)
            loss = self.loss(out, y)
            self.optimizer(loss)
            return out, loss

    m = MLP()
    m.set_optimizer(opt.SGD(lr=0.05, momentum=0.9))
    m.compile([placeholder_x], is_train=True, use_graph=True)
    out, loss = m(x, y)          # training: train_one_batch, one compiled XLA program per step
    m.eval(); out = m(x)          # evaluation: forward, compiled too

With ``use_graph=True`` (:meth:`compile` or :meth:`graph`) :mod:`singa_jax.graph` compiles a call
into one ``jax.jit`` program; otherwise every operator runs eagerly. Both give the same numbers.
"""
from __future__ import annotations

from functools import wraps
from types import MethodType
from typing import Any, Dict, List, Sequence, Tuple

from . import autograd, checkpoint, opt
from .graph import GraphRunner, tensors_in
from .layer.base import Layer, LayerMeta
from .opt.dist import spmd_of
from .tensor import Tensor, from_numpy

__all__ = ["ModelMeta", "Model"]


def _leads_with_tensor(args: Sequence[Any]) -> bool:
    """Whether the first argument is a Tensor or a list/tuple whose first item is one: SINGA's
    condition for running a call in graph mode."""
    first = args[0] if args else None
    if isinstance(first, (list, tuple)) and first:
        first = first[0]
    return isinstance(first, Tensor)


class ModelMeta(LayerMeta):
    """Like SINGA's: wraps every subclass's ``train_one_batch`` so that in graph mode a training
    call runs as one compiled program (see :mod:`singa_jax.graph`)."""

    @staticmethod
    def buffer_operation(func):
        @wraps(func)
        def wrapper(self, *args, **kwargs):
            if self.graph_mode and self.training and not self._graph_runner.active:
                if not _leads_with_tensor(args):
                    raise ValueError(f"{type(self).__name__}.train_one_batch: graph mode expects "
                                     f"a Tensor (or a list of Tensors) as first argument, got "
                                     f"{type(args[0]).__name__ if args else 'no arguments'}")
                return self._run_graph(MethodType(func, self), "train_one_batch", args, kwargs)
            return func(self, *args, **kwargs)

        wrapper.__wrapped_step__ = func
        return wrapper

    def __new__(mcs, name, bases, attrs):
        if "train_one_batch" in attrs:
            attrs["train_one_batch"] = ModelMeta.buffer_operation(attrs["train_one_batch"])
        return super().__new__(mcs, name, bases, attrs)


class Model(Layer, metaclass=ModelMeta):
    """Base class of a trainable network (SINGA's ``model.Model``).

    Subclasses define ``forward`` and ``train_one_batch``. Calling the model runs
    ``train_one_batch`` in training mode and ``forward`` in evaluation mode.
    """

    # SINGA's constants for its checkpoint format (paths inside the zip, state types)
    TENSOR_DICT_FILENAME = "/" + checkpoint.TENSOR_DICT_FILENAME
    STATES_ATTR_FILENAME = "/" + checkpoint.STATES_ATTR_FILENAME
    MODEL_STATE_TYPE = checkpoint.MODEL_STATE_TYPE
    AUX_STATE_TYPE = checkpoint.AUX_STATE_TYPE

    def __init__(self):
        super().__init__()
        self.training = True
        self.graph_mode = True
        self.sequential = False
        self._buffered = False
        self._results = None
        self._graph_runner = GraphRunner(type(self).__name__)

    # --- set-up --------------------------------------------------------------------------------
    def compile(self, inputs: Sequence[Tensor], is_train: bool = True, use_graph: bool = False,
                sequential: bool = False) -> None:
        """Initialise every layer from the placeholder ``inputs`` and choose the mode.

        Args:
            inputs: a list of input Tensors (placeholders) of the shapes ``forward`` takes.
            is_train: enter training (True) or evaluation mode.
            use_graph: compile each ``train_one_batch`` / evaluation call into one XLA program.
            sequential: accepted for SINGA compatibility (XLA schedules the operators).

        The placeholders run through ``forward`` once in evaluation mode, which creates every
        parameter (as SINGA's buffered-and-discarded forward does) without touching batch-norm
        statistics.
        """
        if not isinstance(inputs, (list, tuple)) or not inputs:
            raise TypeError(f"{type(self).__name__}.compile: expects a non-empty list of input "
                            f"Tensors (placeholders), got {type(inputs).__name__}")
        for i, x in enumerate(inputs):
            if not isinstance(x, Tensor):
                raise TypeError(f"{type(self).__name__}.compile: input {i} must be a Tensor, got "
                                f"{type(x).__name__}")
        prev = autograd.training
        autograd.training = False
        try:
            self.forward(*inputs)
        finally:
            autograd.training = prev
        self.train(is_train)
        self.graph(use_graph, sequential)

    def set_optimizer(self, optimizer: Any) -> None:
        """Use ``optimizer`` (SINGA's examples call it as ``self.optimizer(loss)``)."""
        self.optimizer = optimizer

    # --- the two methods subclasses implement -----------------------------------------------------
    def forward(self, *input):
        """The forward pass; subclasses implement it."""
        raise NotImplementedError(f"{type(self).__name__}.forward is not implemented")

    def train_one_batch(self, *input, **kwargs):
        """One training iteration (forward, loss, optimizer); subclasses implement it."""
        raise NotImplementedError(f"{type(self).__name__}.train_one_batch is not implemented")

    # --- modes -----------------------------------------------------------------------------------
    def train(self, mode: bool = True) -> None:
        """Enter training mode (``mode=True``) or evaluation mode; sets ``autograd.training``."""
        self.training = bool(mode)
        autograd.training = bool(mode)

    def eval(self) -> None:
        """Enter evaluation mode."""
        self.train(False)

    def graph(self, mode: bool = True, sequential: bool = False) -> None:
        """Turn whole-step compilation on or off; ``sequential`` is accepted and ignored (XLA
        orders the operators)."""
        self.graph_mode = bool(mode)
        self.sequential = bool(sequential)

    def __get_name__(self) -> str:
        return type(self).__name__

    def __call__(self, *input, **kwargs):
        if self.training:
            return self.train_one_batch(*input, **kwargs)
        if self.graph_mode and not self._graph_runner.active and \
                _leads_with_tensor(input):
            return self._run_graph(self.forward, "forward", input, kwargs)
        return self.forward(*input, **kwargs)

    # --- graph mode ------------------------------------------------------------------------------
    def _optimizers(self) -> List[Any]:
        """Optimizers held by the model's attributes (their Tensors are part of a step's state)."""
        kinds = (opt.Optimizer, opt.DistOpt)
        return [v for v in vars(self).values() if isinstance(v, kinds)]

    def _state_tensors(self) -> List[Tensor]:
        """The Tensors of ``get_states()``: the layers alone say what their state is (a layer
        that overrides ``get_params``/``get_states`` is asked through its override). Walked
        only when the structure changed (see :meth:`_declared_state`), so the name dict costs
        nothing per step."""
        return list(self.get_states().values())

    def _declared_state(self) -> Tuple[Tuple[Tensor, ...], Tuple]:
        """The step's declared state -- the layers' tensors and, in training, every optimizer's
        -- and what the optimizers bake into a compiled step (their ``_static_key``).

        Cached until an attribute of this model or of any layer in its tree is assigned (the
        model's own ``structure_version``, which every such assignment bumps) or an optimizer's
        attributes or state set change (its ``states_version``); a compiled step runs no layer
        or optimizer code, so in steady state the cache always holds, no tree is walked and the
        same tuple is returned (the graph runner keys on its identity)."""
        cached = self.__dict__.get("_declared_cache")
        if cached is not None and cached[0] == self._structure_version and \
                cached[1] == self.training:
            for optimizer, version in cached[2]:
                if optimizer.states_version != version:
                    break
            else:
                return cached[3]
        version = self._structure_version  # before anything below assigns
        declared = self._state_tensors()
        optimizers = self._optimizers() if self.training else []
        for optimizer in optimizers:
            # the Tensors an optimizer may REPLACE (slots, step counter; set_states makes new
            # ones) must be declared so that a replacement retraces; the ones it only rebinds
            # (lr_value, ...) are found by the first, recorded call
            declared += tensors_in(optimizer.get_states())
        static = tuple(o._static_key() for o in optimizers)
        opt_versions = [(o, o.states_version) for o in optimizers]
        # stored without __setattr__, which would bump the structure version
        self.__dict__["_declared_cache"] = (version, self.training, opt_versions,
                                            (tuple(declared), static))
        return self.__dict__["_declared_cache"][3]

    def _run_graph(self, fn, name: str, args: tuple, kwargs: dict) -> Any:
        declared, static = self._declared_state()
        # a DistOpt's training step runs as one SPMD program over all ranks' devices
        self._graph_runner.spmd = spmd_of(static)
        return self._graph_runner.run(fn, name, args, kwargs, declared, self.training, static)

    # --- checkpoints -----------------------------------------------------------------------------
    def save_states(self, fpath: str, aux_states: Dict[str, Any] = {},  # noqa: B006 (SINGA's)
                    overwrite: bool = False) -> None:
        """Save the model's states (parameters and buffers) and ``aux_states`` (e.g. the epoch or
        ``optimizer.get_states()``; Tensors, arrays or numbers) to the zip ``fpath`` in SINGA's
        format (see :mod:`singa_jax.checkpoint`). An existing file is replaced only with
        ``overwrite=True``; the write is atomic."""
        checkpoint.save_states(fpath, self.get_states(), aux_states, overwrite=overwrite)

    def load_states(self, fpath: str) -> Dict[str, Tensor]:
        """Load states saved by :meth:`save_states` (here or in SINGA) and return the auxiliary
        states as ``{name: Tensor}``. The file must hold exactly this model's state names and
        shapes; otherwise ValueError and nothing changes."""
        model_states, aux = checkpoint.read_states(fpath)
        checkpoint.check_against(type(self).__name__, self.get_states(), model_states, fpath)
        self.set_states(model_states)
        return {k: from_numpy(v) for k, v in aux.items()}
