"""The ``Model`` class (public as :class:`singa_jax.model.Model`, whose module docstring shows
its use): compile, train/eval, the call that runs a step eagerly or as graph mode's program,
its declared state, checkpoints and the functional view."""
from __future__ import annotations

import contextlib
from functools import partial, wraps
from types import MethodType
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import jax

from singa_jax._src.model import checkpoint
from singa_jax._src.base import checks, interrupts, modes, observe
from singa_jax._src.eager import replay
from singa_jax._src.autodiff.autocast import compute_dtype
from singa_jax._src.graph.runner import NOT_CACHED, GraphModeError, GraphRunner, ProgramNotKept
from singa_jax._src.graph import errors as graph_errors
from singa_jax._src.graph.layout import tensors_in
from singa_jax._src.backend.tiers import tiered_compilation
from singa_jax._src.layers.base import Layer, LayerMeta, layer_tree
from singa_jax._src.layers.remat import checked_policy
from singa_jax._src.model.functional import functional
from singa_jax._src.model.initialization import initialize
from singa_jax._src.model.step import checked_step, plain_optimizers, with_wrapped
from singa_jax._src.model import state_ahead
from singa_jax._src.dist.dist import spmd_of
from singa_jax._src.dist.spmd import bring_state_home, state_entered_mesh
from singa_jax._src.graph.transaction import StepTransaction
from singa_jax._src.tensor.tensor import Tensor
from singa_jax._src.tensor.creation import from_numpy
from singa_jax._src.optim.optimizers import Optimizer
from singa_jax._src.dist.dist import DistOpt

__all__ = ["ModelMeta", "Model", "GraphModeError", "tiered_compilation"]


_NO_SCOPE = contextlib.nullcontext()


def _is_tensor(x: Any) -> bool:
    return isinstance(x, Tensor)


def _leads_with_tensor(args: Sequence[Any]) -> bool:
    """Whether the first argument is a Tensor or a list/tuple whose first item is one: SINGA's
    condition for running a call in graph mode."""
    first = args[0] if args else None
    if isinstance(first, (list, tuple)) and first:
        first = first[0]
    return isinstance(first, Tensor)


class ModelMeta(LayerMeta):
    """Like SINGA's: wraps every subclass's ``train_one_batch`` so that in graph mode a training
    call runs as one compiled program (see :mod:`singa_jax._src.graph.runner`)."""

    @staticmethod
    def buffer_operation(func):
        @wraps(func)
        def wrapper(self, *args, **kwargs):
            if self._graph_runner.active:  # inside a trace (this model's or another's): inline
                return func(self, *args, **kwargs)
            graph = self.graph_mode and self.training
            if graph and not _leads_with_tensor(args):
                raise ValueError(f"{type(self).__name__}.train_one_batch: graph mode expects "
                                 f"a Tensor (or a list of Tensors) as first argument, got "
                                 f"{type(args[0]).__name__ if args else 'no arguments'}")
            return self._step(MethodType(func, self), "train_one_batch", args, kwargs, graph)

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
    _scope_is_model = True  # a root model adds no scope to its layers' names in traces

    def __init__(self):
        super().__init__()
        self.training = True
        self.graph_mode = True
        self.sequential = False
        self._buffered = False
        self._results = None
        self._graph_runner = GraphRunner(type(self).__name__)
        self._autocast = None  # the compute dtype of compile(autocast=...)

    # --- set-up --------------------------------------------------------------------------------
    def compile(self, inputs: Sequence[Tensor], is_train: bool = True, use_graph: bool = False,
                sequential: bool = False, autocast: Any = None, remat: Any = None) -> None:
        """Initialise every layer from the placeholder ``inputs`` and choose the mode.

        Args:
            inputs: a list of input Tensors (placeholders) of the shapes ``forward`` takes.
            is_train: enter training (True) or evaluation mode.
            use_graph: compile each ``train_one_batch`` / evaluation call into one XLA program.
            sequential: accepted for SINGA compatibility (XLA schedules the operators).
            autocast: ``'bfloat16'`` or ``'float16'``: every call of the model (training and
                evaluation, eager and graph mode) runs inside ``autograd.autocast`` of that
                dtype -- products in half precision, parameters and optimizer slots float32,
                float16 with dynamic loss scaling (see docs/mixed_precision.md). None (the
                default): the dtypes of the inputs and parameters, as in SINGA.
            remat: beyond SINGA: rematerialise each of the model's direct sublayers that has
                parameters (its blocks; see :meth:`Layer.rematerialize`): ``"nothing"`` (or
                True) keeps only each block's inputs for the backward and recomputes the rest
                there, ``"dots"`` keeps products' results too, ``"offload"`` keeps them in
                host memory (GPUs, TPUs). None (the default) leaves every layer as it is.

        The placeholders run through ``forward`` once in evaluation mode, which creates every
        parameter (as SINGA's buffered-and-discarded forward does) without touching batch-norm
        statistics. That forward is traced on shapes only and the parameters are filled on the
        host: no program is compiled per layer (see :func:`~.initialization.initialize`). With
        ``is_train=False`` and ``use_graph=True`` the evaluation step -- ``forward`` on inputs
        like the placeholders -- is compiled here too (:meth:`compile_step`), so the first
        ``model(x)`` runs at once; a training step takes arguments compile() is not given (the
        labels, ...): :meth:`compile_step` compiles it ahead when asked.
        """
        if not isinstance(inputs, (list, tuple)) or not inputs:
            raise TypeError(f"{type(self).__name__}.compile: expects a non-empty list of input "
                            f"Tensors (placeholders), got {type(inputs).__name__}")
        for i, x in enumerate(inputs):
            if not isinstance(x, Tensor):
                raise TypeError(f"{type(self).__name__}.compile: input {i} must be a Tensor, got "
                                f"{type(x).__name__}")
        compute = compute_dtype(autocast, f"{type(self).__name__}.compile")
        policy = checked_policy(f"{type(self).__name__}.compile", remat)
        self._autocast = compute
        prev = modes.is_training()
        modes.set_training(False)
        try:
            with modes.autocast_mode(compute) if compute is not None else _NO_SCOPE:
                initialize(self, inputs)
        finally:
            modes.set_training(prev)
        if policy is not None:
            for sublayer in self._layers.values():
                if sublayer.get_params():
                    sublayer.rematerialize(policy)
        self.train(is_train)
        self.graph(use_graph, sequential)
        if use_graph and not is_train:
            # the evaluation step is known: forward on inputs like the placeholders
            try:
                self.compile_step(*inputs)
            except GraphModeError:
                pass  # a forward that branches on values: its first call says so, as before

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
        modes.set_training(bool(mode))

    def eval(self) -> None:
        """Enter evaluation mode."""
        self.train(False)

    def graph(self, mode: bool = True, sequential: bool = False) -> None:
        """Turn whole-step compilation on or off; ``sequential`` is accepted and ignored (XLA
        orders the operators)."""
        self.graph_mode = bool(mode)
        self.sequential = bool(sequential)

    def graph_stats(self) -> Dict[str, float]:
        """What graph mode has done for this model so far, as a new dict (reading it changes
        nothing): ``traces`` (calls traced), ``compiles`` (XLA compilations of whole steps),
        ``tiered`` (steps of them compiled in two tiers, see :class:`tiered_compilation`),
        ``programs`` (compiled programs kept) and ``last_compile_seconds``."""
        runner = self._graph_runner
        return {"traces": runner.trace_count, "compiles": runner.compile_count,
                "tiered": runner.tiered_count, "programs": len(runner.programs),
                "last_compile_seconds": runner.last_compile_seconds}

    def finish_compiling(self) -> None:
        """Wait until every step of this model compiling in the background (tiered
        compilation) is compiled: each call from then on runs its optimised program."""
        self._graph_runner.finish_compiling()

    def export_step(self, platforms: Sequence[str] = ("cuda", "tpu"), training: bool = True
                    ) -> jax.export.Exported:
        """The graph-mode program of this model's last compiled training step
        (``training=False``: evaluation forward) lowered for ``platforms`` with
        :func:`jax.export.export`; the platforms need not be present, so a CPU machine can check
        that the step lowers for GPU and TPU. The model must have run that call once in graph
        mode (see docs/model.md); a DistOpt step is not supported."""
        return self._graph_runner.export("train_one_batch" if training else "forward",
                                         platforms)

    def __get_name__(self) -> str:
        return type(self).__name__

    def __call__(self, *input, **kwargs):
        if self.training:
            return self.train_one_batch(*input, **kwargs)
        if self._graph_runner.active:
            return self.forward(*input, **kwargs)
        return self._step(self.forward, "forward", input, kwargs,
                          self.graph_mode and _leads_with_tensor(input))

    def compile_step(self, *args: Any, **kwargs: Any) -> bool:
        """Compile now, without running it, the graph-mode program of the call
        ``model(*args, **kwargs)`` -- ``train_one_batch`` in training mode, ``forward`` in
        evaluation mode --, so that the first such call (arguments of the same shapes, dtypes,
        devices and non-tensor values) runs at the speed of every later one. Nothing the step
        would change is changed: parameters, optimizer state and device keys keep their values,
        and the step's Python code runs only as a trace (its Python side effects happen, as in
        the first call's trace). Returns True when the program is compiled; False when the step
        meets state that only running it can make (a layer first built inside
        ``train_one_batch``): then the first call compiles it, as without ``compile_step``.

        ``compile()`` cannot do this for a training step by itself: it is given the inputs of
        ``forward``, not the labels or other arguments of ``train_one_batch`` (see
        docs/model.md). In evaluation mode with ``use_graph=True`` it compiles ``forward`` for
        its placeholders itself."""
        owner = f"{type(self).__name__}.compile_step"
        if not self.graph_mode:
            raise RuntimeError(f"{owner}: the model is not in graph mode (compile it with "
                               f"use_graph=True, or call model.graph(True)); an eager call "
                               f"compiles each operator's kernel as it first meets it")
        if not _leads_with_tensor(args):
            raise ValueError(f"{owner}: graph mode expects a Tensor (or a list of Tensors) as "
                             f"first argument, got "
                             f"{type(args[0]).__name__ if args else 'no arguments'}")
        if self.training:
            wrapper = getattr(type(self), "train_one_batch", None)
            func = getattr(wrapper, "__wrapped_step__", None)
            if func is None:
                raise NotImplementedError(f"{owner}: {type(self).__name__}.train_one_batch is "
                                          f"not implemented")
            fn, name = MethodType(func, self), "train_one_batch"
        else:
            fn, name = self.forward, "forward"
        # the trace may add layers and attributes (a layer built inside the step): if its
        # program is not kept, every layer's attributes are put back as they were
        layers = [(lay, dict(vars(lay)), dict(lay.__dict__.get("_layers", {})))
                  for lay in layer_tree(self)]
        try:
            self._step(fn, name, args, kwargs, True, compile_only=True)
        except ProgramNotKept:
            for lay, attrs, sublayers in layers:
                vars(lay).clear()
                vars(lay).update(attrs)
                vars(lay)["_layers"] = sublayers
            return False
        return True

    def _step(self, fn: Callable, name: str, args: tuple, kwargs: dict, graph: bool,
              compile_only: bool = False) -> Any:
        """One call of ``train_one_batch`` or ``forward``: in this model's own training mode
        (whatever other threads set), compiled when ``graph``, and as a transaction -- if it
        raises, every parameter, buffer, optimizer state and device key is what it was before
        (see the graph package's transaction). ``compile_only``: see :meth:`compile_step`."""
        if observe.on and not compile_only and not observe.inside("step"):
            graph = graph and not observe.eager_steps()  # (anomaly detection checks each op)
            return observe.step_call(self, name, args,
                                     partial(self._step, fn, name, args, kwargs, graph))
        observe.steps += 1  # (a loop that compiles on every step is told, see debug)
        if self._autocast is not None:  # the whole call, graph mode's key included
            with modes.autocast_mode(self._autocast):
                return self._run_step(fn, name, args, kwargs, graph, compile_only)
        return self._run_step(fn, name, args, kwargs, graph, compile_only)

    def _run_step(self, fn: Callable, name: str, args: tuple, kwargs: dict, graph: bool,
                  compile_only: bool = False) -> Any:
        try:
            return self._call_step(fn, name, args, kwargs, graph, compile_only)
        except jax.errors.JaxRuntimeError as e:
            # out of device memory compiling (graph mode) or running (eagerly) the step: the
            # transaction has put every state back (a graph-mode run that fails raises
            # DeviceMemoryError itself, see graph.errors)
            if not graph_errors.is_out_of_memory(e):
                raise
            batch = [x._data if isinstance(x, Tensor) else x
                     for x in jax.tree_util.tree_leaves((args, kwargs), is_leaf=_is_tensor)
                     if isinstance(x, (Tensor, jax.Array))]
            raise graph_errors.out_of_memory(
                f"{type(self).__name__}.{name}", "graph mode" if graph else "eager mode",
                "compiling" if graph else "running", batch, e) from e

    def _call_step(self, fn: Callable, name: str, args: tuple, kwargs: dict, graph: bool,
                   compile_only: bool = False) -> Any:
        replay.flush()  # every state Tensor holds an array when the step starts
        declared, static, optimizers = self._declared_state()
        if graph and spmd_of(static) is not None:  # DistOpt's step: the state goes on the mesh
            state_entered_mesh(self)
        else:  # other calls compute on the rank's device: state on the mesh is brought there
            bring_state_home(self, declared, self.training)
        if not graph:
            arrays = [t._data for t in declared]  # (the transaction's too: read once)
            # (a recurring step's program may start on them before its recording ends)
            replay.call_arguments([a._data for a in (*args, *kwargs.values())
                                   if isinstance(a, Tensor)] + arrays)
            with self._transaction(declared, optimizers, arrays=arrays):
                try:
                    result = fn(*args, **kwargs)
                finally:
                    replay.call_arguments(())
                # an eager call's recorded kernels run now, as one program once the call recurs
                # (asynchronously: nothing here waits for them); inside the transaction, so
                # that their failure (out of memory, Ctrl-C) leaves the state as before
                replay.flush()
            return result
        runner = self._graph_runner
        runner.spmd = spmd_of(static)  # a DistOpt's step runs as one SPMD program
        if compile_only:
            with self._transaction(declared, optimizers, arrays=False):
                self._trace_step(fn, name, args, kwargs, compile_only=True)
            self._settle_state_ahead(optimizers)
            return None
        # Report the skipped updates of earlier steps whose report has reached the host
        # (nothing waits: see Optimizer._expect_skip_report)
        for optimizer in optimizers:
            optimizer._before_compiled_step()
        # A cached program runs no Python op code (no mode to set) and changes nothing unless it
        # runs to the end: only a call that traces needs the transaction. A Ctrl-C from the
        # compiled run on (the runner defers it) is raised when the step is whole, at the end
        # of its deferrable scope; one before (tracing, compiling) at once. (Two scopes: a
        # cached program that no longer fits its state is traced again outside the first.)
        with interrupts.deferrable():
            ran = runner.run_cached(name, args, kwargs, declared, self.training, static)
            if ran is not NOT_CACHED:
                self._expect_skip_reports(optimizers, ran[2])
        if ran is NOT_CACHED:
            with interrupts.deferrable():
                with self._transaction(declared, optimizers, arrays=False):
                    ran = self._trace_step(fn, name, args, kwargs)
                self._settle_state_ahead(optimizers)
                self._expect_skip_reports(optimizers, ran[2])
        result, failed, _ = ran
        checks.raise_first_failure(failed)  # the step applied nothing (see _checked)
        return result

    @staticmethod
    def _expect_skip_reports(optimizers: List[Any], reports: Sequence[Any]) -> None:
        for optimizer, report in zip(optimizers, reports):
            optimizer._expect_skip_report(report)

    def _trace_step(self, fn: Callable, name: str, args: tuple, kwargs: dict,
                    compile_only: bool = False) -> Any:
        """Trace the call in graph mode (inside its transaction) and run it -- or, with
        ``compile_only``, only compile it. A training step's optimizer state is made first
        (:meth:`_make_state_ahead`), so that the trace meets no new state: one trace, one XLA
        compilation."""
        provisional = self._make_state_ahead()
        declared, static, optimizers = self._declared_state()  # with what was just made
        runner = self._graph_runner
        run = runner.prepare if compile_only else runner.run
        try:
            return run(checked_step(fn, optimizers), name, args, kwargs, declared, self.training,
                       static, provisional)
        finally:
            if provisional:
                unused = runner.unused_provisional
                for optimizer in plain_optimizers(optimizers):
                    state_ahead.drop(optimizer, unused)

    @staticmethod
    def _settle_state_ahead(optimizers: List[Any]) -> None:
        """After a traced call that did not fail: the state made ahead for it is the
        optimizers' own now (see :mod:`.opt.state_ahead`)."""
        for optimizer in plain_optimizers(optimizers):
            state_ahead.settle(optimizer)

    def _make_state_ahead(self) -> List[Tensor]:
        """Before graph mode first traces a training step: every optimizer's state for this
        model's trainable parameters (step counter, guard state, slots, float16 loss scale),
        made now rather than by the step's first update, so that the trace takes it as input.
        Returns the Tensors made (those the step then does not use are dropped again). A
        DistOpt's SPMD step places its state on the mesh itself and is left as it is."""
        if not self.training:
            return []
        _, static, optimizers = self._declared_state()
        if spmd_of(static) is not None:
            return []
        params = [p for p in self.get_params().values() if p.stores_grad]
        made: List[Tensor] = []
        for optimizer in plain_optimizers(optimizers):
            made += state_ahead.make(optimizer, params)
        return made

    @contextlib.contextmanager
    def _transaction(self, declared: Sequence[Tensor], optimizers: List[Any], arrays: Any
                     ) -> Iterator[None]:
        """The block in this model's training mode, undone if it raises (``arrays=False`` in
        graph mode, whose failed trace restores the state arrays itself; eagerly, the arrays
        ``declared`` holds)."""
        undo = StepTransaction(declared, with_wrapped(optimizers), self._uninitialised_layers(),
                               arrays=arrays)
        with modes.training_mode(self.training), undo:
            yield

    def _uninitialised_layers(self) -> List[Layer]:
        """Layers of this model not yet initialised (a first call initialises them). The
        layers are walked again only when the model's structure has changed since (which a
        layer's initialisation does): an evaluation that never calls the model's loss layer
        does not walk them on every call."""
        version = self._structure_version
        known = self.__dict__.get("_uninitialised_at")
        if known is not None and known[0] == version:
            return list(known[1])
        pending = [layer for layer in layer_tree(self)
                   if not layer.__dict__.get("_initialized", False)]
        self.__dict__["_uninitialised_at"] = (version, tuple(pending))
        return pending

    # --- graph mode ------------------------------------------------------------------------------
    def _optimizers(self) -> List[Any]:
        """Optimizers held by the model's attributes (their Tensors are part of a step's state)."""
        kinds = (Optimizer, DistOpt)
        return [v for v in vars(self).values() if isinstance(v, kinds)]

    def _state_tensors(self) -> List[Tensor]:
        """The Tensors of ``get_states()``: the layers alone say what their state is (a layer
        that overrides ``get_params``/``get_states`` is asked through its override). Walked
        only when the structure changed (see :meth:`_declared_state`), so the name dict costs
        nothing per step."""
        if not self.__dict__.get("_initialized", False):
            # before the model's first forward, a get_states override may read attributes its
            # initialize() creates (SINGA's char_rnn example adds its LSTM states) -- SINGA
            # never asks then; the generic walk sees every layer initialised so far
            return list(Layer.get_states(self).values())
        return list(self.get_states().values())

    def _declared_state(self) -> Tuple[Tuple[Tensor, ...], Tuple, List[Any]]:
        """The step's declared state -- the layers' tensors and, in training, every optimizer's
        --, what the optimizers bake into a compiled step (their ``_static_key``) and the
        optimizers (none in evaluation).

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
            # ones) must be declared so that a replacement retraces; those it only rebinds
            # (the guard state, lr_value, ...) are declared too, so that the first trace takes
            # them as inputs (found by the trace instead, they would make it trace again)
            declared += tensors_in(optimizer.get_states())
            for inner in plain_optimizers([optimizer]):
                declared += inner._rebound_state()
        static = tuple(o._static_key() for o in optimizers)
        opt_versions = [(o, o.states_version) for o in optimizers]
        # stored without __setattr__, which would bump the structure version
        self.__dict__["_declared_cache"] = (version, self.training, opt_versions,
                                            (tuple(declared), static, optimizers))
        return self.__dict__["_declared_cache"][3]

    # --- checkpoints -----------------------------------------------------------------------------
    def save_states(self, fpath: str, aux_states: Dict[str, Any] = {},  # noqa: B006 (SINGA's)
                    overwrite: bool = False) -> None:
        """Save the model's states (parameters and buffers) and ``aux_states`` (e.g. the epoch or
        ``optimizer.get_states()``; Tensors, arrays or numbers) to the zip ``fpath`` in SINGA's
        format (see :mod:`singa_jax._src.model.checkpoint`). An existing file is replaced only with
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

    # --- JAX interop: the model as a pure function (see docs/jax_interop.md) ---------------------
    def functional(self) -> Tuple[Callable[..., Tuple[Any, Dict[str, Any]]],
                                  Dict[str, jax.Array], Dict[str, jax.Array]]:
        """``apply, params, state = m.functional()``: this model as a pure JAX function.

        ``params`` (trainable parameters) and ``state`` (buffers such as batch-norm running
        statistics) are dicts of the current ``jax.Array``s keyed by SINGA's names (those of
        :meth:`get_params` / :meth:`get_states`). ``apply(params, state, *inputs,
        training=False, key=None) -> (outputs, new_state)`` runs :meth:`forward` on the given
        values (the model's own tensors are untouched) and returns its outputs as arrays and
        the state it leaves; ``key`` is the PRNG key of dropout and other random draws (an error
        names it when a call needs one). ``jax.jit``, ``jax.grad``, ``jax.vmap``,
        ``jax.checkpoint`` and sharded inputs work over it; :meth:`load_functional` writes
        trained values back. The model must be initialised (called once, or compiled).
        """
        return functional(self)

    def load_functional(self, params: Dict[str, Any], state: Optional[Dict[str, Any]] = None
                        ) -> None:
        """Write ``params`` (and ``state``) -- arrays keyed by SINGA's names, as
        :meth:`functional` gives them -- into this model's tensors; every name and shape is
        checked before anything changes."""
        self.set_states({**params, **(state or {})})


