"""vllm-ascend's NPU model runner and schedulers.

NPU runner: ``NPUModelRunner`` overrides ``execute_model`` / ``_prepare_inputs`` / ``sample_tokens``
without reaching GPUModelRunner's, so it has its own rows with the model-runner handlers. Phase: the
step's phase carried on the SchedulerOutput (exact: computed by the EngineCore's scheduler hook) wins;
without it (EngineCore not instrumented) the runner's own ``attn_state``, set by ``_prepare_inputs``,
decides: PrefillNoCache / PrefillCacheHit → prefill, DecodeOnly / SpecDecoding → decode,
ChunkedPrefill (vllm-ascend's "splitfuse": any batch with prefill work that is not all new) → mixed.
Scopes entered before ``_prepare_inputs`` returns (its own "prepare input" scope ends after it) get
that phase too.

Ascend schedulers re-implement ``schedule()`` without calling the base, so each gets the scheduler
hook itself (a nested call through ``super().schedule()`` is measured once, by the outermost hook).
``RecomputeScheduler`` on PD decode nodes also drops running requests back to the proxy for
recomputation without ``_preempt_request`` (``recomputed_reqs`` of its output): each is one
``scheduler:recompute_events``.
"""

from __future__ import annotations

from types import MappingProxyType

from ..catalogue import M
from ..hooks.handler import report
from ..state import STATE, UNKNOWN
from .common import StepTimer
from .model_runner import ExecuteModel, begin_step
from .steps import PHASE_ATTRIBUTE

#: AscendAttentionState names → step phase.
ATTN_STATE_PHASES = MappingProxyType(
    {
        "PrefillNoCache": "prefill",
        "PrefillCacheHit": "prefill",
        "DecodeOnly": "decode",
        "SpecDecoding": "decode",
        "ChunkedPrefill": "mixed",
    }
)
_PENDING = "pending"  # the step's phase is not known until _prepare_inputs ran


def phase_of_attn_state(state) -> str | None:
    name = getattr(state, "name", None)
    return ATTN_STATE_PHASES.get(name if isinstance(name, str) else str(state).rsplit(".", 1)[-1])


class NPUExecuteModel(ExecuteModel):
    """``NPUModelRunner.execute_model(scheduler_output, intermediate_tensors=None)``."""

    def before(self, args, kwargs):
        phase = getattr(args[1], PHASE_ATTRIBUTE, None)
        STATE.last_step_phase = phase or UNKNOWN
        return begin_step(phase or _PENDING)

    def after(self, step, args, kwargs, result):
        if step.phase == _PENDING:
            step.phase = UNKNOWN
        super().after(step, args, kwargs, result)


class NPUPrepareInputs(StepTimer):
    """``NPUModelRunner._prepare_inputs``: timed as the model runner's input preparation (the step's
    phase); when the step's phase did not come with its SchedulerOutput, it is read from the
    ``attn_state`` this call just set."""

    reads_args = 1  # self

    def __init__(self) -> None:
        super().__init__(M["executor:prepare_inputs:duration"])

    def timed(self, seconds, args, kwargs, result):
        step = STATE.worker_step
        if step is not None and step.phase == _PENDING:
            try:  # the phase only: the duration is recorded whatever attn_state has become
                phase = phase_of_attn_state(getattr(args[0], "attn_state", None)) or UNKNOWN
            except Exception:
                report(self, "attn_state")
                phase = UNKNOWN
            step.phase = STATE.last_step_phase = phase
        super().timed(seconds, args, kwargs, result)
