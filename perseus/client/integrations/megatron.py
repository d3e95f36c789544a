"""perseus for megatron-core: one call per rank.

::

    rank = perseus.client.connect()
    perseus.client.integrations.megatron.instrument(rank)          # after initialize_model_parallel
    for step in range(steps):
        forward_backward_func = get_forward_backward_func()
        forward_backward_func(forward_step_func=..., model=..., num_microbatches=..., ...)
        optimizer.step()

Every call of the function ``get_forward_backward_func()`` returns is one perseus iteration;
nothing else changes in the training script (Megatron-LM's ``train_step`` calls
``get_forward_backward_func()`` every step, so it needs no other line either).

How. ``megatron.core.pipeline_parallel.schedules`` looks up its own module attributes at call
time: ``get_forward_backward_func`` returns ``forward_backward_pipelining_with_interleaving``,
``forward_backward_pipelining_without_interleaving`` or ``forward_backward_no_pipelining``,
and all three call ``forward_step`` and ``backward_step`` by global name. :func:`instrument`
replaces those five module attributes with wrappers (a forward-backward function obtained
*before* :func:`instrument` is the unwrapped original: get it afterwards).

- A forward gets its microbatch from ``current_microbatch`` and, when interleaved, its model
  chunk from ``vp_stage`` (Megatron's placement: chunk ``c`` of pipeline rank ``g`` is virtual
  stage ``c * P + g``, the one the planner assumes).
- A backward gets no ids. Its ``output_tensor`` is the object its forward returned, so the
  forward's output identifies it (:class:`ForwardOutputs`).
- Stage, pipeline size and virtual pipeline size come from ``parallel_state``, the
  microbatch count from Megatron's microbatch calculator or the call, the schedule name
  from the function that runs; all are checked against the job on the server
  (:meth:`perseus.client.Rank.bind`), so a mismatch is reported at the start.
- Calls with ``forward_only=True`` (evaluation) pass through unplanned and are no iteration.

Not planned, refused with :class:`~perseus.core.errors.ScheduleError` (at :func:`instrument` when
the config is given or the parallel state shows it, else at the first call of the
forward-backward function, before it runs anything): the combined 1F1B schedule
(``overlap_moe_expert_parallel_comm``, also behind ``delay_wgrad_compute``), which fuses the
forward and backward of different microbatches into one step; the hybrid context-parallel
schedule (``hybrid_context_parallel``); interleaving with a microbatch group other than the
pipeline size (``microbatch_group_size_per_vp_stage``) or a microbatch count that is not a
multiple of it, or with a single model chunk; full-iteration CUDA graphs (a replay runs no
Python, so no clock can change between instructions). megatron-core 0.16 has no split-backward
(zero-bubble) schedule; a forward or backward step that runs outside the three instrumented
functions (a schedule added later, or a function fetched before :func:`instrument`) is logged
as an error once and runs unplanned.

Online profiling reruns each local model chunk's forward on the arguments of its first real
call (captured, detached) and its backward with ``torch.autograd.grad``, so no gradient
reaches the parameters (nor Megatron's gradient-accumulation hooks), with the random-number
states (CPU, CUDA and Megatron's model-parallel tracker) and the chunks' buffers restored:
training computes exactly what it would have without perseus. Profiling loops are timed per
rank, so ranks of one tensor-, context- or expert-parallel group would run different numbers
of the model's collectives and hang: with any of those sizes above 1 no workload is bound and
the rank needs a saved profile (``PERSEUS_PROFILE``).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any

from megatron.core import parallel_state
from megatron.core.pipeline_parallel import schedules
from megatron.core.utils import get_model_config

from perseus.client.integrations.megatron_outputs import ForwardOutputs
from perseus.client.integrations.megatron_workload import ChunkWorkload
from perseus.client.rank import Rank
from perseus.core.errors import ScheduleError
from perseus.core.pipeline import InstructionKind

__all__ = [
    "ChunkWorkload",
    "ForwardOutputs",
    "Instrumentation",
    "check_config",
    "installed",
    "instrument",
    "schedule_of",
]

_log = logging.getLogger("perseus.client")

# The forward-backward functions get_forward_backward_func returns: perseus's schedule name,
# and whether the function runs a pipeline (no_pipelining is one stage).
_FORWARD_BACKWARD = {
    "forward_backward_no_pipelining": ("1f1b", False),
    "forward_backward_pipelining_without_interleaving": ("1f1b", True),
    "forward_backward_pipelining_with_interleaving": ("interleaved-1f1b", True),
}


def schedule_of(pipeline_size: int, virtual_size: int | None) -> tuple[str, int | None]:
    """perseus's schedule name and virtual stages for Megatron's parallel sizes.

    Mirrors ``get_forward_backward_func``: interleaved when a virtual pipeline size is set
    and the pipeline has more than one stage, 1F1B otherwise (one stage runs forward,
    backward, forward, ..., which is 1F1B of one stage).

    Raises:
        ScheduleError: An interleaved schedule with one model chunk (its warmup is not 1F1B's).
    """
    if pipeline_size > 1 and virtual_size is not None:
        if virtual_size < 2:
            raise ScheduleError(
                "perseus does not plan Megatron's interleaved schedule with one model chunk "
                "(virtual pipeline size 1): leave the virtual pipeline size unset"
            )
        return "interleaved-1f1b", virtual_size
    return "1f1b", None


def check_config(config: object, *, pipeline_size: int, interleaved: bool) -> None:
    """Refuse the Megatron features whose execution order perseus does not plan.

    Args:
        config: Megatron's ``ModelParallelConfig`` (or ``TransformerConfig``).
        pipeline_size: Pipeline-parallel size.
        interleaved: Whether the interleaved schedule runs.

    Raises:
        ScheduleError: Naming every unsupported feature that is on.
    """
    problems = []
    if getattr(config, "overlap_moe_expert_parallel_comm", False):
        problems.append(
            "the combined 1F1B schedule (overlap_moe_expert_parallel_comm, delay_wgrad_compute) "
            "fuses the forward and backward of different microbatches"
        )
    if getattr(config, "hybrid_context_parallel", False):
        problems.append("the hybrid context-parallel schedule (hybrid_context_parallel)")
    group = getattr(config, "microbatch_group_size_per_vp_stage", None)
    if interleaved and group is not None and group != pipeline_size:
        problems.append(
            f"interleaving in microbatch groups of {group} (microbatch_group_size_per_vp_stage); "
            f"perseus plans groups of the pipeline size, {pipeline_size} (Megatron's default)"
        )
    if getattr(config, "cuda_graph_impl", None) == "local":
        scopes = getattr(config, "cuda_graph_scope", None) or []
        scopes = scopes if isinstance(scopes, (list, tuple)) else [scopes]
        if any(getattr(s, "name", s) == "full_iteration" for s in scopes):
            problems.append(
                "full-iteration CUDA graphs (a replay runs no Python: no clock can change "
                "between instructions)"
            )
    if problems:
        raise ScheduleError("perseus does not plan " + "; ".join(problems))


class Instrumentation:
    """The wrappers :func:`instrument` installed; :meth:`remove` puts the originals back.

    Attributes:
        rank: The rank the instructions go to.
        outputs: Forward outputs awaiting their backward in the running iteration.
        workload: What online profiling reruns (None when profiling online is not possible).
    """

    def __init__(self, rank: Rank, workload: ChunkWorkload | None) -> None:
        self.rank = rank
        self.outputs = ForwardOutputs()
        self.workload = workload
        self._state = "idle"  # "training" inside an iteration, "passthrough" in forward_only
        self._interleaved = False
        self._bound: tuple[str, int | None, int | None, int | None, int | None] | None = None
        self._config_seen: object | None = None
        self._complained: set[str] = set()
        self._originals: dict[str, Any] = {}
        forward = schedules.forward_step
        self._mb_at = _position(forward, "current_microbatch")
        self._vp_at = _position(forward, "vp_stage")
        self._model_at = _position(forward, "model")
        self._input_at = _position(forward, "input_tensor")
        self._output_at = _position(schedules.backward_step, "output_tensor")

    # ------------------------------------------------------------------ install

    def install(self) -> None:
        wrappers: dict[str, Callable[..., Any]] = {
            "forward_step": self._wrap_forward(schedules.forward_step),
            "backward_step": self._wrap_backward(schedules.backward_step),
        }
        for name, (schedule, pipelined) in _FORWARD_BACKWARD.items():
            wrappers[name] = self._wrap_forward_backward(
                getattr(schedules, name), schedule, pipelined
            )
        for name, wrapper in wrappers.items():
            self._originals[name] = getattr(schedules, name)
            wrapper.__perseus__ = self  # type: ignore[attr-defined]
            setattr(schedules, name, wrapper)

    def remove(self) -> None:
        """Put Megatron's functions back (where nobody replaced them since)."""
        global _installed
        for name, original in self._originals.items():
            if getattr(getattr(schedules, name), "__perseus__", None) is self:
                setattr(schedules, name, original)
        self._originals.clear()
        if _installed is self:
            _installed = None

    # ------------------------------------------------------------------ binding

    def bind_position(self, microbatches: int | None, config: object | None) -> None:
        """What ``parallel_state`` knows now (raises ScheduleError for unsupported setups)."""
        if not parallel_state.model_parallel_is_initialized():
            if microbatches is not None:
                self.rank.bind(microbatches=microbatches)
            return
        size = parallel_state.get_pipeline_model_parallel_world_size()
        virtual = parallel_state.get_virtual_pipeline_model_parallel_world_size()
        name, virtual_stages = schedule_of(size, virtual)
        if config is not None:
            check_config(config, pipeline_size=size, interleaved=virtual_stages is not None)
        self._bind(
            name,
            size,
            microbatches,
            virtual_stages,
            stage=parallel_state.get_pipeline_model_parallel_rank(),
        )

    def _bind(
        self,
        schedule: str,
        stages: int | None,
        microbatches: int | None,
        virtual_stages: int | None,
        *,
        stage: int | None = None,
    ) -> None:
        key = (schedule, stages, microbatches, virtual_stages, stage)
        if key == self._bound:
            return
        self._bound = key
        self.rank.bind(
            stage=stage,
            stages=stages,
            schedule=schedule,
            microbatches=microbatches,
            virtual_stages=virtual_stages,
            workload=None if self.workload is None else self.workload.ready,
        )

    def _before_call(self, schedule: str, pipelined: bool, kwargs: dict[str, Any]) -> None:
        """Check and bind what this call of a forward-backward function runs."""
        model = kwargs.get("model")
        chunks = model if isinstance(model, list) else [model]
        interleaved = schedule == "interleaved-1f1b"
        self._interleaved = interleaved
        p2p = kwargs.get("p2p_communicator")
        stage: int | None = None
        if not pipelined:
            size = 1
        elif p2p is not None:  # custom process groups: the call knows the pipeline
            size, stage = p2p.pp_group.size(), p2p.pp_group.rank()
        else:
            size = parallel_state.get_pipeline_model_parallel_world_size()
        config = get_model_config(chunks[0])
        if config is not self._config_seen:
            check_config(config, pipeline_size=size, interleaved=interleaved)
            self._config_seen = config
        microbatches = int(kwargs["num_microbatches"])
        if interleaved:
            if len(chunks) < 2:
                raise ScheduleError(
                    "perseus does not plan Megatron's interleaved schedule with one model chunk"
                )
            if microbatches % size:
                raise ScheduleError(
                    f"perseus plans interleaved 1F1B with a microbatch count that is a multiple "
                    f"of the pipeline size ({microbatches} is not a multiple of {size})"
                )
        if self.workload is not None:
            self.workload.chunks = len(chunks)
        self._bind(schedule, size, microbatches, len(chunks) if interleaved else None, stage=stage)

    # ------------------------------------------------------------------ wrappers

    def _wrap_forward_backward(
        self, original: Callable[..., Any], schedule: str, pipelined: bool
    ) -> Callable[..., Any]:
        rank = self.rank

        @functools.wraps(original)
        def forward_backward(*args: Any, **kwargs: Any) -> Any:
            # Nested: the outer call is the iteration. Removed: a function fetched before
            # remove() runs as Megatron's own.
            if self._state != "idle" or not self._originals:
                return original(*args, **kwargs)
            if kwargs.get("forward_only", False):
                self._state = "passthrough"
                try:
                    return original(*args, **kwargs)
                finally:
                    self._state = "idle"
            self._before_call(schedule, pipelined, kwargs)
            self.outputs.clear()
            with rank.iteration():
                self._state = "training"
                try:
                    return original(*args, **kwargs)
                finally:
                    self._state = "idle"

        return forward_backward

    def _wrap_forward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        rank = self.rank
        mb_at, vp_at = self._mb_at, self._vp_at
        model_at, input_at = self._model_at, self._input_at

        @functools.wraps(original)
        def forward_step(*args: Any, **kwargs: Any) -> Any:
            if self._state != "training":
                if self._state == "idle":
                    self._complain_outside()
                return original(*args, **kwargs)
            microbatch = _argument(args, kwargs, mb_at, "current_microbatch")
            chunk = _argument(args, kwargs, vp_at, "vp_stage") if self._interleaved else None
            if microbatch is None or (self._interleaved and chunk is None):
                self._complain(
                    "ids",
                    "forward_step was called without current_microbatch (or vp_stage when "
                    "interleaved); this instruction runs unplanned",
                )
                return original(*args, **kwargs)
            watch = None
            workload = self.workload
            if workload is not None and workload.wants(chunk or 0):
                model = _argument(args, kwargs, model_at, "model")
                watch = workload.watch(
                    chunk or 0, model, _argument(args, kwargs, input_at, "input_tensor")
                )
            try:
                with rank.instruction(InstructionKind.FORWARD, microbatch, chunk):
                    result = original(*args, **kwargs)
            finally:
                if watch is not None:
                    watch.remove()
            self.outputs.record(result[0], microbatch, chunk)
            return result

        return forward_step

    def _wrap_backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        rank = self.rank
        output_at = self._output_at

        @functools.wraps(original)
        def backward_step(*args: Any, **kwargs: Any) -> Any:
            if self._state != "training":
                return original(*args, **kwargs)
            found = self.outputs.match(_argument(args, kwargs, output_at, "output_tensor"))
            if found is None:
                self._complain(
                    "backward",
                    "a backward_step whose forward output perseus did not see; this "
                    "instruction runs unplanned",
                )
                return original(*args, **kwargs)
            with rank.instruction(InstructionKind.BACKWARD, found[0], found[1]):
                return original(*args, **kwargs)

        return backward_step

    def _complain_outside(self) -> None:
        self._complain(
            "outside",
            "megatron's forward_step runs outside the forward-backward functions perseus "
            "instrumented (an unsupported schedule, or get_forward_backward_func() called "
            "before perseus.client.integrations.megatron.instrument()); perseus does not plan it",
        )

    def _complain(self, what: str, message: str) -> None:
        if what not in self._complained:
            self._complained.add(what)
            _log.error("perseus: %s", message)


_installed: Instrumentation | None = None


def installed() -> Instrumentation | None:
    """The instrumentation in place in this process (None before :func:`instrument`)."""
    return _installed


def instrument(
    rank: Rank,
    *,
    config: object | None = None,
    microbatches: int | None = None,
    profile_online: bool | None = None,
) -> Instrumentation | None:
    """Make every training call of Megatron's forward-backward functions a perseus iteration.

    Call once per process, after ``initialize_model_parallel`` (so the pipeline position is
    known) and before the first ``get_forward_backward_func()``. Calling it again with the
    same rank returns the same instrumentation (Megatron-LM's ``model_provider`` runs once
    per model chunk).

    Args:
        rank: From :func:`perseus.client.connect`; a rank that is off changes nothing.
        config: The model's ``TransformerConfig``/``ModelParallelConfig``, checked now for
            features perseus does not plan (otherwise at the first forward-backward call).
        microbatches: Microbatches per iteration; by default Megatron's microbatch
            calculator's count when it is set up, else the first call's ``num_microbatches``.
        profile_online: Bind the model chunks for online profiling. By default only when
            tensor, context and expert parallel sizes are 1 (see the module docstring).

    Returns:
        The installed wrappers (``remove()`` restores Megatron), or None when the rank is off.

    Raises:
        ScheduleError: The parallel setup or config is one perseus does not plan, or another
            rank's instrumentation is installed.
    """
    global _installed
    if microbatches is None:
        microbatches = _calculator_microbatches()
    if not rank.active:
        if config is not None and parallel_state.model_parallel_is_initialized():
            size = parallel_state.get_pipeline_model_parallel_world_size()
            virtual = parallel_state.get_virtual_pipeline_model_parallel_world_size()
            _, virtual_stages = schedule_of(size, virtual)
            check_config(config, pipeline_size=size, interleaved=virtual_stages is not None)
        return None
    if _installed is not None:
        if _installed.rank is rank:
            return _installed
        raise ScheduleError("megatron is already instrumented for another perseus rank")
    if profile_online is None:
        profile_online = _model_parallel_sizes() == 1
        if not profile_online and rank.settings.profile_path is None:
            _log.warning(
                "perseus: online profiling needs tensor, context and expert parallel sizes of "
                "1 (profiling loops are timed per rank, the model's collectives would hang); "
                "set PERSEUS_PROFILE to a saved profile"
            )
    instrumentation = Instrumentation(rank, ChunkWorkload() if profile_online else None)
    instrumentation.bind_position(microbatches, config)
    instrumentation.install()
    _installed = instrumentation
    return instrumentation


def _model_parallel_sizes() -> int:
    if not parallel_state.model_parallel_is_initialized():
        return 1
    return max(
        int(parallel_state.get_tensor_model_parallel_world_size()),
        int(parallel_state.get_context_parallel_world_size()),
        int(parallel_state.get_expert_model_parallel_world_size()),
    )


def _calculator_microbatches() -> int | None:
    from megatron.core import num_microbatches_calculator

    try:
        return int(num_microbatches_calculator.get_num_microbatches())
    except (AttributeError, TypeError):  # the calculator is not set up (megatron-core alone)
        return None


def _position(function: Callable[..., Any], name: str) -> int:
    """Index of parameter ``name`` of ``function`` (checked once against the installed version)."""
    names = list(inspect.signature(function).parameters)
    if name not in names:
        raise ScheduleError(
            f"megatron's {function.__name__} has no parameter {name!r}: this megatron-core "
            "version is not one perseus knows"
        )
    return names.index(name)


def _argument(args: Sequence[Any], kwargs: dict[str, Any], at: int, name: str) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[at] if at < len(args) else None
