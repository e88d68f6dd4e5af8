"""The target table: every vLLM / vllm-ascend symbol this package wraps, with the versions it is
known to exist in (vLLM and vllm-ascend gated separately), the wrapper kind, the process it runs in,
the handler (or, for a plain timer / counter / value-of-an-argument hook, its ``measures``) and the
metrics it feeds. The one place that says which symbol feeds which metric and in which process: the
catalogue's "hooked" and "recorded in" (``hooked_symbols``, ``recorded_in``), ``docs/metrics.md``,
``check`` and the installer are derived from it.

Adding a plain timer takes two edits: its ``MetricSpec`` in ``catalogue.CATALOGUE`` and one row here,
``Target(module, "Class.method", SYNC_TIMER, measures=(Measure(seed, TIMER),), process=ENGINE_CORE)``
(CONTRIBUTING.md's worked example, which a test runs).

A table of facts, like the catalogue: it names handlers as strings and imports nothing above the
catalogue, so the recording pipeline (rank labels), the docs and ``check`` read it without loading a
hook or a handler; ``wiring/`` builds and installs what the rows say."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import catalogue as c
from .kinds import (  # noqa: F401  (kinds used in rows)
    ASYNC_GENERATOR,
    COROUTINE,
    COROUTINE_STREAM,
    COROUTINE_TIMER,
    FUTURE,
    FUTURE_CLASS,
    SCOPE_FACTORY,
    SYNC,
    SYNC_TIMER,
)

TIMER = "timer"
COUNTER = "counter"
HISTOGRAM = "histogram"
GAUGE = "gauge"
MEASURE_KINDS = (TIMER, COUNTER, HISTOGRAM, GAUGE)

#: How a measure's ``phase`` label is chosen (the labels are always dp, role, phase):
#: - ``all``: the catalogue's ``ALL`` (work not tied to one step: between steps, request level);
#: - ``step``: the phase of the step most recently scheduled in this process (``STATE.last_step_phase``);
#: - ``engine_step`` (timers only): the phase of the step scheduled during the call, ``idle`` when no
#:   ``schedule()`` ran inside it (``handlers/engine.py:EngineStepTimer``).
PHASE_ALL = "all"
PHASE_STEP = "step"
PHASE_ENGINE_STEP = "engine_step"
MEASURE_PHASES = (PHASE_ALL, PHASE_STEP, PHASE_ENGINE_STEP)


@dataclass(frozen=True)
class Measure:
    """One metric a declarative hook records on each call that returned (a call that raised records
    nothing; on a stream row, a timer records however the stream ended).

    ``metric``: the seed. ``kind``: ``timer`` (the call's duration, or ``value``; needs a timer or
    stream wrapper kind), ``counter`` (adds ``value``, 1 without one), ``histogram`` (observes
    ``value``) or ``gauge`` (sets ``value``). ``value``: None, the name of one parameter of the target
    (it must be in the row's ``params``, which the contract test checks against vLLM's source), or an
    ``Expression`` over the target's parameters, ``self``, ``result`` and ``duration``, whose failures
    and non-numbers skip the sample and count in ``HOOK_ERRORS``. ``phase``: how the phase label is
    chosen (``MEASURE_PHASES``). ``labels``: ``((name, Expression), …)``, labels after dp, role,
    phase (at most ``MAX_LABEL_VALUES`` values each). ``spec``: the metric's definition when it is not
    the catalogue's (a hook file's own metric). ``incumbent``: values as ms-service-metric records them
    (OTEL_VLLM_ASCEND_HOOK_SEMANTICS=ms-service-metric, hook files only): 1 where the expression raises (the
    failure still counts in ``HOOK_ERRORS``) and for a histogram or gauge without a value, a counter's
    increment <= 0 is 1."""

    metric: str
    kind: str
    value: Any = None  # None, a parameter's name, or a wiring.expressions.Expression
    phase: str = PHASE_ALL
    labels: tuple[tuple[str, Any], ...] = ()  # (name, Expression)
    spec: c.MetricSpec | None = None
    incumbent: bool = False


@dataclass(frozen=True)
class Target:
    module: str
    qualname: str  # "Class.method"
    kind: str
    #: "module:Class" under opentelemetry_instrumentation_vllm_ascend.handlers, where real logic lives;
    #: "" for a declarative row (``measures``) and for rows that need no handler.
    handler: str = ""
    vllm: str = ">=0.23.0"  # PEP 440 specifier on the installed vLLM version
    vllm_ascend: str | None = None  # a specifier when this symbol comes from vllm-ascend
    #: Catalogue seeds of the metrics this hook's absence would lose (it records them, or records what
    #: they are computed from); () for context-only hooks. A declarative row's come from its measures.
    feeds: tuple[str, ...] = ()
    #: A declarative row's (or a hook file's) parameters, after self, that its measures read by position, in
    #: order; a handler names its own (``Handler.params``, ``wiring.declarative.params_of``). The contract test
    #: checks them against the source of every supported version.
    params: tuple[str, ...] = ()
    #: Other hooks depend on what this one keeps (the step's phase, the process identity, requests
    #: recomputing after preemption): installed even when every metric it feeds is disabled.
    provides_context: bool = False
    #: What a declarative row records per call (``Measure``); ``wiring.declarative`` builds its handler from them.
    measures: tuple[Measure, ...] = ()
    #: The process kind (``catalogue.PROCESS_KINDS``) whose series this row's handler records.
    process: str = ""
    #: The execution path (a ``paths.PATHS`` key, e.g. "mrv1", "mrv2", "npu") on which this symbol is
    #: expected to resolve; "" for every path. A target the detected path expects that never resolves is
    #: reported (``check``, and once at runtime).
    path: str = ""
    #: A request-trace hook (handlers/traces.py): installed only when OTEL_VLLM_ASCEND_TRACES is true.
    traces: bool = False
    #: A metrics hook request traces also need (the output loop's; the scheduler's init, which watches a KV
    #: connector's loads): installed while traces are on, even when every metric it feeds is disabled.
    feeds_traces: bool = False

    def __post_init__(self) -> None:
        if self.measures and not self.feeds:
            object.__setattr__(self, "feeds", tuple(dict.fromkeys(m.metric for m in self.measures)))

    @property
    def symbol(self) -> str:
        return f"{self.module}:{self.qualname}"

    @property
    def owner_qualname(self) -> str | None:
        """The class whose attribute is wrapped (None for a module-level SCOPE_FACTORY or function)."""
        if self.kind == FUTURE_CLASS:
            return self.qualname
        if self.kind == SCOPE_FACTORY or "." not in self.qualname:
            return None
        return self.qualname.rsplit(".", 1)[0]

    @property
    def attribute(self) -> str | None:
        if self.kind == FUTURE_CLASS:
            return None
        return self.qualname.rsplit(".", 1)[-1]


_SCHED = "vllm.v1.core.sched.scheduler"
_CORE = "vllm.v1.engine.core"
_MP = "vllm.v1.executor.multiproc_executor"
_MRV1 = "vllm.v1.worker.gpu_model_runner"
_MRV2 = "vllm.v1.worker.gpu.model_runner"
_ALLM, _CC = "vllm.v1.engine.async_llm", "vllm.v1.engine.core_client"
#: Process kinds (``catalogue.PROCESS_KINDS``) of the rows.
API_SERVER, ENGINE_CORE, WORKER, EPLB = "api_server", "engine_core", "worker", "eplb"

_SCHEDULE_FEEDS = (
    c.STEP_RECORD_DROPPED.seed,
    c.RUNNING_TO_WAITING.seed,
    c.RECOMPUTE_EVENTS.seed,
    c.RECOMPUTED_TOKENS.seed,
    c.BLOCK_ALLOCATE_FAILURES.seed,
    "scheduler:duration",
    "scheduler:batch_size",
    "scheduler:running_queue_size",
    "scheduler:seqlen:sum",
    "scheduler:seqlen:avg",
    "scheduler:phase_batch_size",
    "scheduler:phase_scheduled_tokens",
    "scheduler:phase_scheduled_token_counter",
    "running_phase_batch_size",
    "waiting_phase_batch_size",
    "total_kvcache_blocks",
    "free_kvcache_blocks",
    "allocated_kvcache_blocks",
    "request_prefill_pending_nums",
    "record_function_or_nullcontext",
    "kv_cache:write_bytes",  # the step's scheduled tokens (kv_transfer.kv_writes)
    "engine_core:stage_seconds",  # the schedule stage's boundaries
)
_RPC_FEEDS = (c.RPC_ERRORS.seed, "executor:execute_model:duration", "executor:sample_tokens:duration")
_KV_TRANSFER_FEEDS = ("kv_transfer:bytes", "kv_transfer:count", "kv_transfer:duration", "kv_transfer:blocking:duration")
_KV_FAILURES = ("kv_transfer:failures",)
_MEMORY = tuple(spec.seed for spec in c.CATALOGUE if spec.seed.startswith("engine:memory:"))
#: What the end of a worker step records (sample_tokens ends it): the inference time and the timeline.
_STEP_END_FEEDS = (
    "worker:model_inference:duration",
    "npu:forward_duration",
    "npu:kernel_launch",
    "npu:non_forward_duration",
)
_RUNNER_FEEDS = (
    "executor:model_runner_execute_model:duration",
    "worker:model_inference:duration",
    "npu:forward_duration",
    "npu:kernel_launch",
    "npu:non_forward_duration",
)
#: The worker budget's boundaries (handlers/budget.py): model runner V1, the NPU runner and V2 from vLLM 0.32
#: (whose forward StepTimingCollector.forward_start marks).
_WORKER_BUDGET = ("worker:stage_seconds", "worker:stage_start_time")
#: Model runner V2 computes the logits in ``sample``: no post-processing mark, so no npu:kernel_launch (paths.py).
_V2_STEP_END_FEEDS = tuple(seed for seed in _STEP_END_FEEDS if seed != "npu:kernel_launch")
_V2_RUNNER_FEEDS = tuple(seed for seed in _RUNNER_FEEDS if seed != "npu:kernel_launch")
#: vLLM 0.34 removed model runner V1 (``v1/worker/gpu_model_runner.py``; ``gpu_worker.py`` builds V2 only and the
#: platform refuses ``VLLM_USE_V2_MODEL_RUNNER=0``): its rows are gated to the releases that have it.
_MRV1_VLLM = ">=0.23.0,<0.34.0"


def _timer(seed: str, phase: str = PHASE_ALL) -> tuple[Measure, ...]:
    """The measures of a plain timer row (phase ``all`` unless said)."""
    return (Measure(seed, TIMER, phase=phase),)


TARGETS: tuple[Target, ...] = (
    # -- scheduler (EngineCore) -----------------------------------------------------------------------
    Target(
        _SCHED,
        "Scheduler.schedule",
        SYNC,
        "scheduler:Schedule",
        feeds=_SCHEDULE_FEEDS,
        provides_context=True,
        process=ENGINE_CORE,
    ),
    Target(
        _SCHED,
        "Scheduler._preempt_request",
        SYNC,
        "scheduler:PreemptRequest",
        feeds=(c.RUNNING_TO_WAITING.seed, c.RECOMPUTE_EVENTS.seed, c.RECOMPUTED_TOKENS.seed),
        provides_context=True,
        process=ENGINE_CORE,
    ),
    Target(_SCHED, "Scheduler.reset_prefix_cache", SYNC, "scheduler:ResetPrefixCache", process=ENGINE_CORE),
    # Right after the step's execute_model RPC was sent: the scheduler hook's deferred records run here.
    Target(
        _SCHED,
        "Scheduler.get_grammar_bitmask",
        SYNC,
        "scheduler:GrammarBitmask",
        feeds=("engine_core:stage_seconds",),  # the telemetry and wait_workers stages' boundaries
        provides_context=True,
        process=ENGINE_CORE,
    ),
    Target(
        _SCHED,
        "Scheduler.update_from_output",
        SYNC,
        "scheduler:UpdateFromOutput",
        feeds=("scheduler:update_from_output:duration", "engine_core:stage_seconds", "step_record_dropped"),
        process=ENGINE_CORE,
    ),
    Target(
        _SCHED,
        "Scheduler.add_request",
        SYNC_TIMER,
        measures=_timer("scheduler:add_request:duration"),
        process=ENGINE_CORE,
    ),
    Target(
        "vllm.v1.core.kv_cache_manager",
        "KVCacheManager.allocate_slots",
        SYNC,
        "kv_cache:AllocateSlots",
        feeds=(c.BLOCK_ALLOCATE_FAILURES.seed,),
        process=ENGINE_CORE,
    ),
    # -- engine core loop -----------------------------------------------------------------------------
    Target(
        _CORE,
        "EngineCore.step",
        SYNC_TIMER,
        measures=_timer("engine_core:engine_core_step:duration", PHASE_ENGINE_STEP),
        process=ENGINE_CORE,
    ),
    Target(
        _CORE,
        "EngineCore.step_with_batch_queue",
        SYNC_TIMER,
        measures=_timer("engine_core:engine_core_step:duration", PHASE_ENGINE_STEP),
        process=ENGINE_CORE,
    ),
    Target(
        _CORE,
        "EngineCoreProc._process_engine_step",
        SYNC_TIMER,
        measures=_timer("engine_core:process_engine_step:duration", PHASE_ENGINE_STEP),
        process=ENGINE_CORE,
    ),
    Target(
        _CORE,
        "EngineCoreProc._process_input_queue",
        SYNC,
        "engine:ProcessInputQueue",
        feeds=("engine_core:process_input_queue:duration", "engine_core:stage_seconds", "engine_core:stage_start_time"),
        process=ENGINE_CORE,
    ),
    # The stage budget's wait_workers begins where step / step_with_batch_queue open this context manager,
    # right before future.result(); output ends where _process_engine_step calls post_step.
    *(
        Target(
            _CORE,
            qualname,
            SYNC,
            handler,
            vllm=versions,
            feeds=("engine_core:stage_seconds",),
            process=ENGINE_CORE,
        )
        for qualname, handler, versions in (
            # vLLM 0.30 renamed log_iteration_details (0.23) to capture_iteration_details: one of the two.
            ("EngineCore.capture_iteration_details", "engine:WaitForWorkers", ">=0.30.0"),
            ("EngineCore.log_iteration_details", "engine:WaitForWorkers", "<0.30.0"),
            ("EngineCore.post_step", "engine:PostStep", ">=0.23.0"),
        )
    ),
    # The requests handled while the engine has no work: what _process_input_queue's duration counts.
    Target(
        _CORE,
        "EngineCoreProc._handle_client_request",
        SYNC,
        "engine:HandleClientRequest",
        feeds=("engine_core:process_input_queue:duration", "engine_core:stage_seconds"),
        process=ENGINE_CORE,
    ),
    # -- executor RPC ---------------------------------------------------------------------------------
    Target(
        _MP,
        "MultiprocExecutor.collective_rpc",
        FUTURE,
        "executor:CollectiveRpc",
        feeds=_RPC_FEEDS,
        process=ENGINE_CORE,
    ),
    # The futures non-blocking RPCs return report their own completion (cheaper than a callback each).
    Target(_MP, "FutureWrapper", FUTURE_CLASS, process=ENGINE_CORE),
    # Single-device GPU/NPU engines run their worker in-process (no message queues), same contract.
    Target(
        "vllm.v1.executor.uniproc_executor",
        "UniProcExecutor.collective_rpc",
        FUTURE,
        "executor:CollectiveRpc",
        feeds=_RPC_FEEDS,
        process=ENGINE_CORE,
    ),
    # -- worker: model runner V1 (GPU, CPU subclass; removed in vLLM 0.34) and V2 (default on CUDA from vLLM
    # 0.32, the only runner from 0.34) ---------------------------------------------------------------------
    Target(
        _MRV1,
        "GPUModelRunner.execute_model",
        SYNC,
        "model_runner:ExecuteModel",
        vllm=_MRV1_VLLM,
        feeds=_RUNNER_FEEDS + _WORKER_BUDGET,
        provides_context=True,
        process=WORKER,
        path="mrv1",
    ),
    Target(
        _MRV1,
        "GPUModelRunner.sample_tokens",
        SYNC,
        "model_runner:SampleTokens",
        vllm=_MRV1_VLLM,
        feeds=_STEP_END_FEEDS + _WORKER_BUDGET,
        process=WORKER,
        path="mrv1",
    ),
    Target(
        _MRV1,
        "GPUModelRunner._prepare_inputs",
        SYNC_TIMER,
        vllm=_MRV1_VLLM,
        measures=_timer("executor:prepare_inputs:duration", PHASE_STEP),
        process=WORKER,
        path="mrv1",
    ),
    Target(
        _MRV1,
        "AsyncGPUModelRunnerOutput.get_output",
        SYNC_TIMER,
        "model_runner:GetOutput",
        vllm=_MRV1_VLLM,  # in MRV1's module (vllm-ascend's NPU runner imports it from there)
        feeds=("worker:model_runner_get_output:duration",),
        process=WORKER,
        path="mrv1",
    ),
    Target(
        _MRV2,
        "GPUModelRunner.execute_model",
        SYNC,
        "model_runner:ExecuteModelV2",
        feeds=_V2_RUNNER_FEEDS + _WORKER_BUDGET,
        provides_context=True,
        process=WORKER,
        path="mrv2",
    ),
    Target(
        _MRV2,
        "GPUModelRunner.sample_tokens",
        SYNC,
        "model_runner:SampleTokens",
        feeds=_V2_STEP_END_FEEDS + _WORKER_BUDGET,
        process=WORKER,
        path="mrv2",
    ),
    # MRV2 enters no profiling scopes: its forward starts at StepTimingCollector.forward_start(), which
    # execute_model calls right before the model (vLLM 0.30+; tests/contract/test_mrv2.py checks the order), and
    # ends at execute_model's return; its sample() (logits, grammar bitmask, sampler) is the budget's sample stage.
    Target(
        "vllm.v1.worker.gpu.async_utils",
        "StepTimingCollector.forward_start",
        SYNC,
        "model_runner:ForwardStartV2",
        vllm=">=0.30.0",
        feeds=("npu:forward_duration", "npu:non_forward_duration") + _WORKER_BUDGET,
        process=WORKER,
        path="mrv2",
    ),
    Target(
        _MRV2,
        "GPUModelRunner.sample",
        SYNC,
        "model_runner:SampleV2",
        vllm=">=0.30.0",
        feeds=("worker:stage_seconds",),
        process=WORKER,
        path="mrv2",
    ),
    Target(
        _MRV2,
        "GPUModelRunner.prepare_inputs",
        SYNC_TIMER,
        measures=_timer("executor:prepare_inputs:duration", PHASE_STEP),
        process=WORKER,
        path="mrv2",
    ),
    # vLLM 0.34's CPU runner without Triton on non-x86 CPUs (cpu_worker.py builds it when the platform's
    # uses_standalone_cpu_model_runner()): model runner V2's shape, but not a subclass of its GPUModelRunner, and no
    # forward mark (paths.py, "cpu_standalone").
    *(
        Target(
            "vllm.v1.worker.cpu.standalone_model_runner",
            f"StandaloneCPUModelRunner.{method}",
            kind,
            handler,
            vllm=">=0.34.0",
            feeds=feeds,
            provides_context=method == "execute_model",
            measures=measures,
            process=WORKER,
            path="cpu_standalone",
        )
        for method, kind, handler, feeds, measures in (
            (
                "execute_model",
                SYNC,
                "model_runner:ExecuteModelStandalone",
                ("executor:model_runner_execute_model:duration", "worker:model_inference:duration"),
                (),
            ),
            ("sample_tokens", SYNC, "model_runner:SampleTokens", ("worker:model_inference:duration",), ()),
            ("prepare_inputs", SYNC_TIMER, "", (), _timer("executor:prepare_inputs:duration", PHASE_STEP)),
        )
    ),
    # MRV2's own async output (vllm/v1/worker/gpu/async_utils.py, the same get_output in 0.23-0.33).
    Target(
        "vllm.v1.worker.gpu.async_utils",
        "AsyncOutput.get_output",
        SYNC_TIMER,
        "model_runner:GetOutput",
        feeds=("worker:model_runner_get_output:duration",),
        process=WORKER,
    ),
    # vLLM's profiling scopes, wherever record_function_or_nullcontext was imported (see scopes.py).
    # The scheduler's scopes (in the EngineCore) are recorded by the Scheduler.schedule rows.
    Target(
        "vllm.v1.utils",
        "_PROFILER_FUNC",
        SCOPE_FACTORY,
        "scopes:ProfilerScopes",
        feeds=(
            "record_function_or_nullcontext",
            "npu:forward_duration",
            "npu:kernel_launch",
            "npu:non_forward_duration",
            "worker:stage_seconds",  # the forward and sample stages' boundaries
        ),
        process=WORKER,
    ),
    # -- API server -----------------------------------------------------------------------------------
    Target(
        "vllm.v1.metrics.loggers",
        "StatLoggerManager.record",
        SYNC_TIMER,
        "api:RecordStats",
        feeds=(
            "batch_size",
            "waiting_batch_size",
            "num_spec_tokens",
            "total_tokens",
            "input",
            "output",
            "fine_grained_ttft",
            "fine_grained_tpot",
            "decode_over_1s_count",
            "prefill_over_threshold_count",
            "async_llm:record_stats:duration",
        ),
        process=API_SERVER,
    ),
    Target(
        "vllm.v1.metrics.stats",
        "IterationStats.update_from_output",
        SYNC,
        "api:SecondTokenLatency",
        feeds=("second_token_latency",),
        process=API_SERVER,
    ),
    Target(
        "vllm.v1.metrics.stats",
        "IterationStats.update_from_finished_request",
        SYNC,
        "api:FinishedRequest",
        feeds=tuple(spec.seed for spec in c.GENAI_SERVER),
        process=API_SERVER,
    ),
    Target(
        _ALLM,
        "AsyncLLM.check_health",
        COROUTINE,
        "api:CheckHealth",
        feeds=("health_check_failed",),
        process=API_SERVER,
    ),
    # The engine whose outputs the output loop processes next: the dp of output_processor_duration & co.
    Target(
        _CC,
        "AsyncMPClient.get_output_async",
        COROUTINE,
        "api:GetOutput",
        feeds=(
            "api_server:output_loop_stage_seconds",
            "api_server:output_loop_stage_start_time",
        ),  # its wait_engine stage
        provides_context=True,  # the engine index output_processor_duration & co. are labelled with
        process=API_SERVER,
    ),
    # DPLBAsyncMPClient's override does not call super(): the two rows never count one abort twice.
    Target(
        _CC,
        "AsyncMPClient.abort_requests_async",
        COROUTINE_TIMER,
        measures=_timer("async_llm:abort_requests:duration"),
        process=API_SERVER,
    ),
    Target(
        _CC,
        "DPLBAsyncMPClient.abort_requests_async",
        COROUTINE_TIMER,
        measures=_timer("async_llm:abort_requests:duration"),
        process=API_SERVER,
    ),
    # A timer, and the request's inbound trace headers for request traces (vLLM drops them here when its own
    # tracing is off; this runs in the task that registers the request, a stream's body included).
    Target(
        _ALLM,
        "AsyncLLM.add_request",
        COROUTINE,
        "api:AsyncAddRequest",
        feeds=("engine:async_add_request:duration",),
        process=API_SERVER,
        feeds_traces=True,
    ),
    # From the call until its stream ended: exhausted, failed, or closed / cancelled early.
    Target(
        _ALLM,
        "AsyncLLM.generate",
        ASYNC_GENERATOR,
        measures=_timer("engine:generate:duration"),
        process=API_SERVER,
    ),
    # A non-streaming request until its awaited response; a streaming one until its stream of chunks ended.
    Target(
        "vllm.entrypoints.openai.chat_completion.serving",
        "OpenAIServingChat.create_chat_completion",
        COROUTINE_STREAM,
        measures=_timer("server:create_chat_completion:duration"),
        process=API_SERVER,
    ),
    # Also when run in the renderer's executor through process_inputs_async, if the hook was installed
    # before the InputProcessor was made.
    Target(
        "vllm.v1.engine.input_processor",
        "InputProcessor.process_inputs",
        SYNC_TIMER,
        measures=_timer("engine:tokenizer_encode"),
        process=API_SERVER,
    ),
    Target(
        "vllm.v1.engine.output_processor",
        "OutputProcessor.process_outputs",
        SYNC,
        "api:ProcessOutputs",
        feeds=("output_processor_duration", "engine_core_outputs_len", "api_server:output_loop_stage_seconds"),
        process=API_SERVER,
        feeds_traces=True,  # each request's engine events and output timestamps (handlers/traces.py)
    ),
    # -- request traces (docs/traces.md): installed only when OTEL_VLLM_ASCEND_TRACES is true; the journey's
    # outputs come through OutputProcessor.process_outputs above. Rejections: a request an OpenAI handler
    # (create_chat_completion, create_completion, create_responses: each awaits its work through that helper)
    # answers with an error before registering it: one span; so does one whose body never parsed (Unparsed) and
    # one the admission limits refuse after its handler returned (Admission: a stream's body). vLLM 0.23 defines
    # the two serving helpers on OpenAIServing (vllm.entrypoints.openai.engine.serving), 0.32+ on BaseServing /
    # GenerateBaseServing; it has no admission limits. vLLM 0.30 has 0.32's layout, except that BaseServing has no
    # _get_trace_headers: GenerateBaseServing, PoolingBaseServing and the generative scoring server each define one.
    *(
        Target(
            module,
            qualname,
            kind,
            f"traces:{handler}",
            vllm=versions,
            feeds=("traces_dropped",),
            provides_context=True,
            process=API_SERVER,
            traces=True,
        )
        for module, qualname, kind, handler, versions in (
            (
                "vllm.entrypoints.serve.engine.serving",
                "BaseServing._get_trace_headers",
                COROUTINE,
                "TraceHeaders",
                ">=0.32.0",
            ),
            *(
                (f"vllm.entrypoints.{module}.base.serving", f"{cls}._get_trace_headers", COROUTINE, "TraceHeaders", v)
                for module, cls, v in (
                    ("generate", "GenerateBaseServing", ">=0.30.0,<0.32.0"),
                    ("pooling", "PoolingBaseServing", ">=0.30.0,<0.32.0"),
                )
            ),
            (
                "vllm.entrypoints.openai.engine.serving",
                "OpenAIServing._get_trace_headers",
                COROUTINE,
                "TraceHeaders",
                "<0.30.0",
            ),
            (  # 0.23's and 0.30's generative scoring endpoint has its own (no call of the base's)
                "vllm.entrypoints.generate.generative_scoring.serving",
                "ServingGenerativeScoring._get_trace_headers",
                COROUTINE,
                "TraceHeaders",
                "<0.32.0",
            ),
            (
                "vllm.entrypoints.generate.base.serving",
                "GenerateBaseServing._with_kv_transfer_rejection_cleanup",
                COROUTINE,
                "Rejections",
                ">=0.30.0",
            ),
            (
                "vllm.entrypoints.openai.engine.serving",
                "OpenAIServing._with_kv_transfer_rejection_cleanup",
                COROUTINE,
                "Rejections",
                "<0.30.0",
            ),
            ("vllm.v1.engine.output_processor", "OutputProcessor.add_request", SYNC, "AddRequest", ">=0.23.0"),
            ("vllm.v1.engine.output_processor", "OutputProcessor._finish_request", SYNC, "FinishRequest", ">=0.23.0"),
            ("vllm.v1.engine.output_processor", "OutputProcessor.abort_requests", SYNC, "AbortRequests", ">=0.23.0"),
            # A body that never parsed (before any vLLM handler ran): the name register.py registers the
            # function under, read from its globals when the app is built.
            (
                "vllm.entrypoints.serve.exception_handling.register",
                "validation_exception_handler",
                COROUTINE,
                "Unparsed",
                ">=0.30.0",
            ),
            # vLLM 0.23: api_server.py imports it by name and registers it when build_app builds the app.
            ("vllm.entrypoints.openai.api_server", "validation_exception_handler", COROUTINE, "Unparsed", "<0.30.0"),
            # A request the admission limits refuse where vLLM registers it (a stream's body among others).
            ("vllm.v1.engine.async_llm", "AsyncLLM.check_admission", SYNC, "Admission", ">=0.30.0"),
        )
    ),
    # -- vllm-ascend: EPLB (gated by vllm-ascend's version) ----------------------------------------------
    # Runs in the EPLB process forked from each NPU worker; EP rank 0 records hotness and imbalance.
    Target(
        "vllm_ascend.eplb.core.eplb_worker",
        "EplbWorker.do_update",
        SYNC,
        "eplb:DoUpdate",
        vllm_ascend=">=0.23.0",
        feeds=c.EPLB_CYCLE_SEEDS + (c.INSTRUMENTED_PROCESSES.seed,),
        process=EPLB,
    ),
    # Worker side: timed only when a transfer was in flight (state TRANSFERRING before the call).
    Target(
        "vllm_ascend.eplb.core.eplb_device_transfer_loader",
        "D2DExpertWeightLoader.update_expert_map_and_weight",
        SYNC,
        "eplb:UpdateExpertMapAndWeight",
        vllm_ascend=">=0.23.0",
        feeds=("eplb:expert_weight_update:duration",),
        process=WORKER,
    ),
    *(
        Target(
            "vllm_ascend.eplb.adaptor.vllm_adaptor",
            f"VllmEplbAdaptor.{method}",
            SYNC_TIMER,
            vllm_ascend=">=0.23.0",
            measures=_timer(seed),
            process=WORKER,
        )
        for method, seed in (
            ("do_update_expert_map", "eplb:expert_map_update:duration"),
            ("do_update_log2phy_map", "eplb:log2phy_map_update:duration"),
            ("do_update_expert_weight", "eplb:expert_weight_replace:duration"),
        )
    ),
    # -- vllm-ascend: NPU model runner, Ascend schedulers, memory ------------------------------------------
    Target(
        "vllm_ascend.worker.model_runner_v1",
        "NPUModelRunner.execute_model",
        SYNC,
        "ascend:NPUExecuteModel",
        vllm_ascend=">=0.23.0",
        feeds=_RUNNER_FEEDS + _WORKER_BUDGET,
        provides_context=True,
        process=WORKER,
        path="npu",
    ),
    Target(
        "vllm_ascend.worker.model_runner_v1",
        "NPUModelRunner._prepare_inputs",
        SYNC_TIMER,
        "ascend:NPUPrepareInputs",
        vllm_ascend=">=0.23.0",
        feeds=("executor:prepare_inputs:duration",),
        process=WORKER,
        path="npu",
    ),
    Target(
        "vllm_ascend.worker.model_runner_v1",
        "NPUModelRunner.sample_tokens",
        SYNC,
        "model_runner:SampleTokens",
        vllm_ascend=">=0.23.0",
        feeds=_STEP_END_FEEDS + _WORKER_BUDGET,
        process=WORKER,
        path="npu",
    ),
    # 310P's runner and the NPU model runner V2 re-implement input preparation without the base's.
    Target(
        "vllm_ascend._310p.model_runner_310p",
        "NPUModelRunner310._prepare_inputs",
        SYNC_TIMER,
        "ascend:NPUPrepareInputs",
        vllm_ascend=">=0.23.0",
        feeds=("executor:prepare_inputs:duration",),
        process=WORKER,
    ),
    # vllm-ascend's V2 NPU runner (paths.py, "npu_v2"): a subclass of model runner V2, so V2's rows above feed its
    # timeline (its sample_tokens calls V2's; V2's execute_model marks the forward). From 0.30.0rc2 its own
    # execute_model wraps V2's with NPU work (the KV connector's preemption stores, DP coordination, drafting KV,
    # KVPP): hooked at its level, V2's row inside it is then not a second step (``ExecuteModelV2``). Its sample
    # computes the logits itself under LM-head TP: hooked for the budget's sample stage. Its prepare_inputs, and
    # the 310P V2 runner's prepare_inputs and sample, never call V2's. tests/contract/test_mrv2_npu.py.
    Target(
        "vllm_ascend.worker.v2.model_runner",
        "NPUModelRunner.prepare_inputs",
        SYNC_TIMER,
        vllm_ascend=">=0.23.0",
        measures=_timer("executor:prepare_inputs:duration", PHASE_STEP),
        process=WORKER,
        path="npu_v2",
    ),
    Target(
        "vllm_ascend.worker.v2.model_runner",
        "NPUModelRunner.execute_model",
        SYNC,
        "model_runner:ExecuteModelV2",
        vllm_ascend=">=0.30.0rc2",
        feeds=_V2_RUNNER_FEEDS + _WORKER_BUDGET,
        provides_context=True,
        process=WORKER,
        path="npu_v2",
    ),
    *(
        Target(
            module,
            f"{cls}.sample",
            SYNC,
            "model_runner:SampleV2",
            vllm_ascend=">=0.30.0rc2",
            feeds=("worker:stage_seconds",),
            process=WORKER,
            path="npu_v2",
        )
        for module, cls in (
            ("vllm_ascend.worker.v2.model_runner", "NPUModelRunner"),
            ("vllm_ascend._310p.worker.v2.model_runner", "NPUModelRunner310V2"),
        )
    ),
    Target(
        "vllm_ascend._310p.worker.v2.model_runner",
        "NPUModelRunner310V2.prepare_inputs",
        SYNC_TIMER,
        vllm_ascend=">=0.30.0rc2",
        measures=_timer("executor:prepare_inputs:duration", PHASE_STEP),
        process=WORKER,
        path="npu_v2",
    ),
    # Ascend schedulers re-implement schedule() (BalanceScheduler may call the base's: measured once). Each is
    # one path of the "scheduler" axis (paths.py). 0.30 removed SchedulerDynamicBatch; its short-request-first
    # scheduler is BalanceScheduler (or vLLM's AsyncScheduler) with another waiting queue, and its
    # BatchJobAwareScheduler calls the base's schedule(): vLLM's Scheduler row sees their steps.
    *(
        Target(
            module,
            f"{cls}.schedule",
            SYNC,
            "scheduler:Schedule",
            vllm_ascend=ascend,
            feeds=_SCHEDULE_FEEDS,
            provides_context=True,
            process=ENGINE_CORE,
            path=path,
        )
        for module, cls, ascend, path in (
            ("vllm_ascend.core.recompute_scheduler", "RecomputeScheduler", ">=0.23.0", "recompute"),
            # (its module is gone from 0.30.0rc2)
            ("vllm_ascend.core.scheduler_dynamic_batch", "SchedulerDynamicBatch", "<0.30.0", "dynamic_batch"),
            ("vllm_ascend.core.scheduler_profiling_chunk", "ProfilingChunkScheduler", ">=0.23.0", "profiling_chunk"),
            ("vllm_ascend.patch.platform.patch_balance_schedule", "BalanceScheduler", ">=0.23.0", ""),
            # PD decode nodes with DP > 1 (AsyncDyntraLBScheduler inherits it); its preemptions go through the
            # base's _preempt_request (DyntraLBPolicyMixin's calls it), whose row counts them.
            ("vllm_ascend.core.dyntra_lb_scheduler", "DyntraLBScheduler", ">=0.30.0rc2", "dyntra_lb"),
        )
    ),
    # RecomputeScheduler (PD decode nodes) re-implements these two without calling the base's in 0.23.0.post1;
    # 0.30's update_from_output calls the base's (a row here would time each call twice) and its add_request is
    # gone: vLLM's Scheduler rows time both there.
    Target(
        "vllm_ascend.core.recompute_scheduler",
        "RecomputeScheduler.update_from_output",
        SYNC,
        "scheduler:UpdateFromOutput",
        vllm_ascend="<0.30.0",
        feeds=("scheduler:update_from_output:duration",),
        process=ENGINE_CORE,
        path="recompute",
    ),
    Target(
        "vllm_ascend.core.recompute_scheduler",
        "RecomputeScheduler.add_request",
        SYNC_TIMER,
        vllm_ascend="<0.30.0",
        measures=_timer("scheduler:add_request:duration"),
        process=ENGINE_CORE,
        path="recompute",
    ),
    # Memory after warm-up (and, when instrumented late, at the first step), vLLM's workers and vllm-ascend's.
    *(
        Target(module, qualname, SYNC, handler, vllm_ascend=ascend, feeds=_MEMORY, process=WORKER)
        for module, qualname, handler, ascend in (
            ("vllm.v1.worker.gpu_worker", "Worker.compile_or_warm_up_model", "memory:WarmUp", None),
            ("vllm.v1.worker.cpu_worker", "CPUWorker.compile_or_warm_up_model", "memory:WarmUp", None),
            ("vllm.v1.worker.gpu_worker", "Worker.execute_model", "memory:LateCapture", None),
            ("vllm_ascend.worker.worker", "NPUWorker.compile_or_warm_up_model", "memory:WarmUp", ">=0.23.0"),
            ("vllm_ascend.worker.worker", "NPUWorker.execute_model", "memory:LateCapture", ">=0.23.0"),
        )
    ),
    # vLLM 0.34's extensible KV cache gets its final size after warm-up.
    Target(
        "vllm.v1.worker.gpu_worker",
        "Worker.extend_kv_cache",
        SYNC,
        "memory:ExtendKvCache",
        vllm=">=0.34.0",
        feeds=("engine:memory:kvcache_gb",),
        process=WORKER,
    ),
    # -- process identity -----------------------------------------------------------------------------
    Target(
        "vllm.v1.engine.async_llm",
        "AsyncLLM.__init__",
        SYNC,
        "process:ApiServerInit",
        feeds=(c.INSTRUMENTED_PROCESSES.seed,),
        provides_context=True,
        process=API_SERVER,
    ),
    Target(
        "vllm.v1.executor.abstract",
        "Executor.__init__",
        SYNC,
        "process:EngineCoreInit",
        feeds=(c.INSTRUMENTED_PROCESSES.seed,),
        provides_context=True,
        process=ENGINE_CORE,
    ),
    Target(
        "vllm.v1.worker.worker_base",
        "WorkerBase.__init__",
        SYNC,
        "process:WorkerInit",
        feeds=(c.INSTRUMENTED_PROCESSES.seed, "npu:utilization"),
        provides_context=True,
        process=WORKER,
    ),
    # -- shutdown: the processes about to be stopped export first (vLLM SIGKILLs them right after SIGTERM)
    Target("vllm.v1.engine.utils", "CoreEngineProcManager.shutdown", SYNC, "process:StopEngines", process=API_SERVER),
    Target(_MP, "MultiprocExecutor.shutdown", SYNC, "process:StopWorkers", process=ENGINE_CORE),
    *(  # -- KV transfers and KV-cache writes (handlers/kv_transfer.py) -----------------------------------
        Target(
            "vllm.distributed.kv_transfer.kv_connector.v1.example_connector",
            f"ExampleConnector.{method}",
            SYNC,
            f"kv_transfer:{handler}",
            feeds=_KV_TRANSFER_FEEDS,
            process=WORKER,
        )
        for method, handler in (("save_kv_layer", "ExampleSaveKvLayer"), ("start_load_kv", "ExampleStartLoadKv"))
    ),
    *(
        Target(
            "vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker",
            f"OffloadingConnectorWorker.{method}",
            SYNC,
            f"kv_transfer:{handler}",
            vllm=">=0.30.0",  # vLLM 0.23: OffloadingWorker rows below
            feeds=_KV_TRANSFER_FEEDS + (_KV_FAILURES if method == "get_finished" else ()),
            process=WORKER,
        )
        for method, handler in (
            ("handle_preemptions", "OffloadingHandlePreemptions"),
            ("start_kv_transfers", "OffloadingStartTransfers"),
            ("get_finished", "OffloadingGetFinished"),
        )
    ),
    *(
        Target(
            "vllm.v1.kv_offload.worker.worker",
            f"OffloadingWorker.{method}",
            SYNC,
            f"kv_transfer:{handler}",
            vllm="<0.30.0",
            feeds=_KV_TRANSFER_FEEDS,
            process=WORKER,
        )
        for method, handler in (
            ("transfer_async", "OffloadingTransferAsync"),
            ("get_finished", "OffloadingWorkerGetFinished"),
        )
    ),
    # Remote connectors' own stats containers (vLLM 0.23-0.33): what one transfer or one failure carries.
    *(
        Target(
            f"vllm.distributed.kv_transfer.kv_connector.v1.{module}.stats",
            qualname,
            SYNC,
            f"kv_transfer:{handler}",
            feeds=feeds,
            process=WORKER,
        )
        for module, qualname, handler, feeds in (
            ("nixl", "NixlKVConnectorStats.record_transfer", "NixlRecordTransfer", _KV_TRANSFER_FEEDS[:3]),
            ("mooncake", "MooncakeKVConnectorStats.record_transfer", "MooncakeRecordTransfer", _KV_TRANSFER_FEEDS[:3]),
            ("nixl", "NixlKVConnectorStats.record_failed_transfer", "NixlFailedTransfer", _KV_FAILURES),
            ("mooncake", "MooncakeKVConnectorStats.record_failed_transfer", "MooncakeFailedTransfer", _KV_FAILURES),
            ("mooncake", "MooncakeKVConnectorStats.record_failed_recv", "MooncakeFailedTransfer", _KV_FAILURES),
        )
    ),
    # vllm-ascend's Mooncake P2P / layerwise transfer threads (their engine is metered) and AscendStore backends.
    *(
        Target(
            f"vllm_ascend.distributed.kv_transfer.{module}",
            qualname,
            SYNC,
            f"kv_transfer:{handler}",
            vllm_ascend=">=0.23.0",
            feeds=_KV_TRANSFER_FEEDS[:3] + (() if handler.endswith("StorePut") else _KV_FAILURES),
            process=WORKER,
        )
        for module, qualname, handler in (
            ("kv_p2p.mooncake_connector", "KVCacheRecvingThread.__init__", "AscendMooncakeThreadInit"),
            ("kv_p2p.mooncake_hybrid_connector", "KVCacheRecvingThread.__init__", "AscendMooncakeThreadInit"),
            (
                "kv_p2p.mooncake_layerwise_connector",
                "KVCacheSendingLayerThread.__init__",
                "AscendMooncakeLayerwiseThreadInit",
            ),
            *(
                (f"kv_pool.ascend_store.backend.{module}", f"{cls}.{method}", f"{prefix}Store{method.title()}")
                for module, cls, prefix in (
                    ("mooncake_backend", "MooncakeBackend", "Ascend"),
                    ("memcache_backend", "MemcacheBackend", "Memcache"),
                    ("yuanrong_backend", "YuanrongBackend", "Ascend"),
                )
                for method in ("put", "get")
            ),
        )
    ),
    # Weight offloading: the resident offloaded bytes where vLLM / vllm-ascend decide them.
    *(
        Target(
            module,
            qualname,
            SYNC,
            handler,
            vllm_ascend=ascend,
            feeds=("memory:weight_offload_bytes",),
            process=WORKER,
        )
        for module, qualname, handler, ascend in (
            ("vllm.model_executor.offloader.uva", "UVAOffloader.wrap_modules", "weight_offload:UVAWrapModules", None),
            (
                "vllm.model_executor.offloader.prefetch",
                "PrefetchOffloader.post_init",
                "weight_offload:PrefetchPostInit",
                None,
            ),
            # 0.30's AscendPrefetchOffloader subclasses vLLM's PrefetchOffloader and calls its post_init: the row
            # above sees it (a row of its own would record each call twice).
            (
                "vllm_ascend.model_executor.offloader.prefetch",
                "NPUPrefetchOffloader.post_init",
                "weight_offload:PrefetchPostInit",
                "<0.30.0",
            ),
        )
    ),
    Target(
        _SCHED,
        "Scheduler.__init__",
        SYNC,
        "kv_transfer:SchedulerInit",
        feeds=("kv_cache:write_bytes",),
        process=ENGINE_CORE,
        # With request traces on, a scheduler with a KV connector gets the KV-load notes (handlers/traces.py:
        # watch_kv_loads, on that instance's Scheduler._set_kv_fetch_stage, vLLM >= 0.32).
        feeds_traces=True,
    ),
)


#: Hooked on one instance, not its class: a scheduler with a KV connector, when request traces are on (the
#: ``Scheduler.__init__`` row's handler calls ``handlers/traces.py:watch_kv_loads``). vLLM calls this method for
#: every request it schedules, connector or not: a class-level wrapper would cost every scheduled request of every
#: server. Not in ``TARGETS`` (nothing installs it by class); the contract test checks it like a row, and that the
#: method exists exactly in the releases ``vllm`` names.
KV_FETCH_STAGE = Target(
    _SCHED,
    "Scheduler._set_kv_fetch_stage",
    SYNC,
    "traces:KvFetchStage",
    vllm=">=0.32.0",
    process=ENGINE_CORE,
    traces=True,
)


#: The vLLM releases whose scheduler counts paused streaming sessions against ``max_num_running_reqs`` when it has
#: no ``max_num_active_reqs`` (the scheduler hook's admission limit, ``handlers/scheduler.py``; 0.23: not counted).
STREAMING_HOLDS_A_SLOT = ">=0.30.0"


@dataclass(frozen=True)
class UncoveredOverride:
    """A class that overrides a hooked method without calling the base's (so the hook on the base
    never sees its calls) and has no row of its own: the metrics the hooked row feeds are absent
    wherever this class runs. The override contract test finds every such class in the source of
    each supported version; each must have a row or an entry here."""

    symbol: str  # "module:Class.method" of the override
    hooked: str  # the target row's symbol it bypasses
    reason: str
    vllm: str = ">=0.23.0"  # versions whose source has the override
    vllm_ascend: str | None = None


UNCOVERED_OVERRIDES: tuple[UncoveredOverride, ...] = (
    UncoveredOverride(
        "vllm.v1.worker.mm_encoder_model_runner:MMEncoderModelRunner.execute_model",
        f"{_MRV2}:GPUModelRunner.execute_model",
        "Encoder-only instances of a disaggregated multimodal deployment (vllm_config.is_mm_encoder_only, "
        "model runner V2) run the multimodal encoder and no language-model step: there is no model step, "
        "sampling or forward scope to measure; the worker step metrics are absent there.",
        vllm=">=0.30.0",
    ),
    UncoveredOverride(
        "vllm.v1.executor.ray_executor_v2:RayExecutorV2.shutdown",
        f"{_MP}:MultiprocExecutor.shutdown",
        "vLLM's Ray executor (--distributed-executor-backend ray) stops its workers with ray.kill, on Ray's nodes: "
        "the shutdown hook does not ask them to export first (it feeds no metric; what those workers recorded "
        "since their last periodic export is lost at a clean stop, as at a crash).",
        vllm=">=0.23.0",
    ),
)


def bypassed_feeds(override: UncoveredOverride) -> tuple[str, ...]:
    """Seeds of the metrics the bypassed row feeds: absent wherever ``override`` runs."""
    return next((t.feeds for t in TARGETS if t.symbol == override.hooked), ())


def hooked_symbols(seed: str) -> tuple[str, ...]:
    """The symbols of the rows feeding ``seed``, in table order (the catalogue's "hooked symbol(s)")."""
    return tuple(dict.fromkeys(t.symbol for t in TARGETS if seed in t.feeds))


#: recorded_in's answer when every process kind that runs vLLM code records the metric.
EVERY_PROCESS = "every process"


def recorded_in(seed: str) -> str:
    """The process kinds whose rows feed ``seed`` ("engine_core, worker"; ``EVERY_PROCESS`` for all of
    them): where its series come from, for docs and for the rank label of worker-recorded metrics."""
    if seed in c.SELF_SEEDS:  # the package's own (hook_errors): wherever hooks run
        return EVERY_PROCESS
    kinds = {t.process for t in TARGETS if seed in t.feeds}
    real = [k for k in c.PROCESS_KINDS if k != "unknown"]
    if kinds and all(k in kinds for k in real):
        return EVERY_PROCESS
    return ", ".join(k for k in c.PROCESS_KINDS if k in kinds)


def process_labels(spec: c.MetricSpec) -> tuple[str, ...]:
    """Labels the pipeline adds from the recording process, after ``spec.labels``: the worker's rank
    (``catalogue.WORKER_LABELS``) on metrics recorded in workers (and on the package's own, ``SELF_SEEDS``).
    Derived from the table at each call (not for the hot path: a pipeline's instrument reads it once)."""
    in_worker = "worker" in recorded_in(spec.seed).split(", ") or spec.seed in c.SELF_SEEDS
    return c.WORKER_LABELS if in_worker else ()


def all_labels(spec: c.MetricSpec) -> tuple[str, ...]:
    """Every label a series of ``spec`` can carry: the handler's, then the process's."""
    return spec.labels + process_labels(spec)
