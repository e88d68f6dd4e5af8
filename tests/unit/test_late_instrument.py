"""``instrument()`` after vLLM's modules were imported and its objects built (in-process, real vLLM
modules and a real Scheduler): the scopes vLLM's callers imported by name and the step timers of
objects that already exist are still measured."""

import pytest

pytest.importorskip("vllm")

from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402

from opentelemetry_instrumentation_vllm_ascend import VllmAscendInstrumentor, environment  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.cli.demo import tiny_model  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.handlers import steps
from tests.conftest import Metrics  # noqa: E402
from tests.support.process import set_process

SCOPES = "vllm_profiling_record_function_or_nullcontext"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model.build(str(tmp_path_factory.mktemp("tiny-llama")))


def test_scopes_and_step_timers_are_measured_when_instrumenting_late(model, monkeypatch):
    for name in (
        environment.ENABLED,
        environment.PROMETHEUS_MULTIPROC_DIR,
        environment.FILES_DIR,
        environment.METRICS_EXPORTER,
    ):
        monkeypatch.delenv(name, raising=False)
    # vLLM first: its modules imported (callers bind record_function_or_nullcontext by name), its
    # scope factory chosen, a scheduler built and requests added — all before instrument().
    import vllm.v1.worker.gpu_model_runner as runner_module
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    with runner_module.record_function_or_nullcontext("before instrument"):
        pass
    from tests.support.async_load_connector import build_scheduler

    scheduler = build_scheduler(model, connector=False)  # 20 KV blocks of 16 tokens, a 64-token step budget
    for i in range(3):
        scheduler.add_request(
            Request(
                request_id=f"r{i}",
                prompt_token_ids=list(range(40)),
                sampling_params=SamplingParams(max_tokens=3),
                pooling_params=None,
            )
        )

    reader = InMemoryMetricReader()
    instrumentor = VllmAscendInstrumentor()
    instrumentor.instrument(metric_readers=[reader])
    try:
        set_process("engine_core", "0", "mixed")
        output = scheduler.schedule()  # r0: 40 tokens, r1: its first 24 (the budget is 64)
        assert output.total_num_scheduled_tokens == 64
        assert getattr(output, steps.PHASE_ATTRIBUTE) == "prefill"
        from vllm.v1.outputs import ModelRunnerOutput

        # r0 finished its prompt and sampled a token; r1 is mid-prompt.
        scheduler.update_from_output(
            output,
            ModelRunnerOutput(req_ids=["r0", "r1"], req_id_to_index={"r0": 0, "r1": 1}, sampled_token_ids=[[7], []]),
        )
        # A scope entered through the name the runner module imported long ago.
        with runner_module.record_function_or_nullcontext("gpu_model_runner: forward"):
            pass
    finally:
        instrumentor.uninstrument()
    points = Metrics(reader).points()
    step = (("dp", "0"), ("phase", "prefill"), ("role", "mixed"))
    assert points["vllm_profiling_scheduler:duration"][step][0] == 1
    assert points["vllm_profiling_scheduler:update_from_output:duration"][step][0] == 1
    assert points["vllm_profiling_scheduler:batch_size"][step][0] == 1
    assert points["vllm_profiling_scheduler:batch_size"][step][1] == 2  # r0 and r1
    tokens = points["vllm_profiling_scheduler:phase_scheduled_token_counter"]
    assert tokens[tuple(sorted(step + (("req_phase", "prefill"),)))] == 64
    scopes = points[SCOPES]
    # schedule()'s own scopes, recorded with the phase of the step they belong to …
    for name in ("schedule: make_cached_request_data", "schedule: update_after_schedule"):
        assert scopes[tuple(sorted(step + (("name", name),)))][0] == 1
    # … and the runner's scope, reached although its module imported the function before instrument().
    assert scopes[tuple(sorted(step + (("name", "gpu_model_runner: forward"),)))][0] == 1
    assert not any(dict(key)["name"] == "before instrument" for key in scopes)
