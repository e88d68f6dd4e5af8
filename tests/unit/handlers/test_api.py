"""API-server handlers on plain objects shaped like vLLM's, driven through the real wrappers and
recorded through the real OTel SDK. Durations come from an injected clock, so they are exact."""

import asyncio
from types import SimpleNamespace as NS

import pytest

from opentelemetry_instrumentation_vllm_ascend import catalogue
from opentelemetry_instrumentation_vllm_ascend.handlers import api, common, traces
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import (
    ASYNC_GENERATOR,
    COROUTINE,
    COROUTINE_STREAM,
    COROUTINE_TIMER,
    SYNC,
    SYNC_TIMER,
    wrap,
)
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from tests.support.fakes import handler_of, patch_clock
from tests.support.process import set_process

P = catalogue.PREFIX


def name(seed):
    return P + seed


def counts(bounds, **hits):
    """Bucket counts of a histogram with ``bounds`` (len(bounds) + 1 buckets): ``b3=2`` puts 2 in
    bucket 3, i.e. (bounds[2], bounds[3]]."""
    out = [0] * (len(bounds) + 1)
    for key, n in hits.items():
        out[int(key[1:])] = n
    return tuple(out)


GENERATE_SYMBOL = "vllm.v1.engine.async_llm:AsyncLLM.generate"
CHAT_SYMBOL = "vllm.entrypoints.openai.chat_completion.serving:OpenAIServingChat.create_chat_completion"


@pytest.fixture
def clock(monkeypatch):
    return patch_clock(monkeypatch, api, common)  # the API handlers and the stream timers read the clock themselves


@pytest.fixture
def api_process(metrics):
    set_process("api_server", "0", "decode")
    return metrics


# -- vLLM-shaped stats --------------------------------------------------------------------------


class PromptTokenStats:
    def __init__(self, total=0):
        self.total = total


class IterationStats:
    """As vllm.v1.metrics.stats.IterationStats (0.23 – 0.33): prompt tokens behind a property."""

    def __init__(self, prompt=0, generated=0, ttfts=(), itls=(), finished=()):
        self.prompt_token_stats = PromptTokenStats(prompt)
        self.num_generation_tokens = generated
        self.time_to_first_tokens_iter = list(ttfts)
        self.inter_token_latencies_iter = list(itls)
        self.finished_requests = list(finished)

    @property
    def num_prompt_tokens(self):
        return self.prompt_token_stats.total


def finished(tokens, decode_time):
    return NS(
        num_generation_tokens=tokens,
        decode_time=decode_time,
        mean_time_per_output_token=decode_time / (tokens - 1) if tokens > 1 else 0,
    )


def scheduler_stats(running=0, waiting=0, skipped=0, spec=None):
    return NS(
        num_running_reqs=running, num_waiting_reqs=waiting, num_skipped_waiting_reqs=skipped, spec_decoding_stats=spec
    )


class StatLoggerManager:
    def __init__(self, clock, cost=0.125):
        self.clock = clock
        self.cost = cost
        self.calls = 0

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=None):
        self.calls += 1
        self.clock.t += self.cost


def record_fn():
    return wrap(StatLoggerManager.record, api.RecordStats(), SYNC_TIMER)[0]


# -- StatLoggerManager.record --------------------------------------------------------------------


def test_record_stats_one_engine_update(api_process, clock):
    m = api_process
    mgr = StatLoggerManager(clock)
    it = IterationStats(
        prompt=100,
        generated=7,
        ttfts=[0.5, 6.0, 25.0],  # three requests completed prefill (3 of the 7 tokens are first tokens)
        itls=[0.25, 1.5, 0.5, 2.0],
        finished=[finished(5, 1.0), finished(1, 0.0), finished(2, 0.5)],
    )
    # As AsyncLLM's output handler calls it: all by keyword.
    record_fn()(
        mgr,
        engine_idx=2,
        scheduler_stats=scheduler_stats(5, 3, 1, NS(num_draft_tokens=12)),
        iteration_stats=it,
        mm_cache_stats=None,
    )
    assert mgr.calls == 1
    step = {"dp": "2", "engine": "2", "role": "decode", "phase": "mixed"}  # first tokens and further tokens
    req = {"dp": "2", "engine": "2", "role": "decode", "phase": "all"}
    R, T = catalogue.REQUESTS, catalogue.TOKENS
    assert m.value(name("batch_size"), **step) == (1, 5, counts(R, b3=1))  # (4, 16]
    assert m.value(name("waiting_batch_size"), **step) == (1, 4, counts(R, b2=1))  # 3 + 1 deferred: (1, 4]
    assert m.value(name("num_spec_tokens"), **step) == (1, 12, counts(T, b3=1))  # (8, 32]
    assert m.value(name("input"), **step) == (1, 100, counts(T, b4=1))  # (32, 128]
    assert m.value(name("output"), **step) == (1, 7, counts(T, b2=1))  # (1, 8]
    assert m.value(name("total_tokens"), **step) == (1, 107, counts(T, b4=1))
    S = catalogue.REQUEST_SECONDS
    # 0.5 in (0.25, 0.5], 6.0 in (5, 10], 25.0 in (20, 30]
    assert m.value(name("fine_grained_ttft"), **req) == (3, 31.5, counts(S, b5=1, b9=1, b11=1))
    # finished: 1.0 / 4 = 0.25 and 0.5 / 1 = 0.5; the one-token request is skipped
    K = catalogue.TOKEN_SECONDS
    assert m.value(name("fine_grained_tpot"), **req) == (2, 0.75, counts(K, b11=1, b12=1))
    assert m.value(name("decode_over_1s_count"), **req) == 2
    over = name("prefill_over_threshold_count")
    assert m.value(over, threshold="5s", **req) == 2
    assert m.value(over, threshold="10s", **req) == 1
    assert m.value(over, threshold="20s", **req) == 1
    # the call's duration, with the iteration's phase: 0.125 in (0.1, 0.25]
    assert m.value(name("async_llm:record_stats:duration"), **step) == (1, 0.125, counts(catalogue.STEP_SECONDS, b8=1))


def test_record_stats_without_stats_objects_records_only_what_is_there(api_process, clock):
    m = api_process
    mgr = StatLoggerManager(clock, cost=0.5)
    rec = record_fn()
    rec(mgr, None, None)  # engine_idx defaults to None: engine 0, as vLLM does
    rec(mgr, scheduler_stats(running=2), None, engine_idx=1)  # no spec decoding: no num_spec_tokens
    idle0 = {"dp": "0", "engine": "0", "role": "decode", "phase": "idle"}
    idle1 = {"dp": "1", "engine": "1", "role": "decode", "phase": "idle"}
    points = m.points()
    for seed in (
        "input",
        "output",
        "total_tokens",
        "num_spec_tokens",
        "fine_grained_ttft",
        "fine_grained_tpot",
        "decode_over_1s_count",
        "prefill_over_threshold_count",
    ):
        assert name(seed) not in points
    assert set(points[name("batch_size")]) == {tuple(sorted(idle1.items()))}
    assert m.value(name("batch_size"), **idle1) == (1, 2, counts(catalogue.REQUESTS, b2=1))
    assert m.value(name("waiting_batch_size"), **idle1) == (1, 0, counts(catalogue.REQUESTS, b0=1))
    STEP = catalogue.STEP_SECONDS
    assert m.value(name("async_llm:record_stats:duration"), **idle0) == (1, 0.5, counts(STEP, b9=1))
    assert m.value(name("async_llm:record_stats:duration"), **idle1) == (1, 0.5, counts(STEP, b9=1))


def test_one_slow_itl_in_a_256_request_iteration_counts_once(api_process, clock):
    """The incumbent re-counted the whole ITL list once per request (256 × for one slow token)."""
    m = api_process
    mgr = StatLoggerManager(clock)
    rec = record_fn()
    itls = [0.02] * 255 + [1.5]
    rec(mgr, None, IterationStats(generated=256, itls=itls, finished=[finished(10, 0.9)] * 256), engine_idx=0)
    req = {"dp": "0", "engine": "0", "role": "decode", "phase": "all"}
    assert m.value(name("decode_over_1s_count"), **req) == 1
    # Exactly 1.0 s is not over 1 s; a later update without slow tokens adds nothing (no +1 for 0).
    rec(mgr, None, IterationStats(generated=3, itls=[1.0, 0.5, 0.25]), engine_idx=0)
    assert m.value(name("decode_over_1s_count"), **req) == 1
    assert m.value(name("fine_grained_tpot"), **req)[0] == 256  # 0.9 / 9 per finished request
    # An update with no slow token on another engine creates no series at all.
    rec(mgr, None, IterationStats(generated=1, itls=[0.5]), engine_idx=3)
    assert set(m.points()[name("decode_over_1s_count")]) == {tuple(sorted(req.items()))}


def test_ttft_under_every_threshold_adds_nothing(api_process, clock):
    m = api_process
    record_fn()(StatLoggerManager(clock), None, IterationStats(prompt=10, generated=2, ttfts=[0.5, 5.0]))
    assert name("prefill_over_threshold_count") not in m.points()  # 5.0 is not over 5 s
    assert m.value(name("fine_grained_ttft"), dp="0", engine="0", role="decode", phase="all")[:2] == (2, 5.5)


@pytest.mark.parametrize(
    "stats, expected",
    [
        (IterationStats(prompt=300, generated=2, ttfts=[0.1, 0.2]), "prefill"),  # first tokens only
        (IterationStats(prompt=0, generated=4, itls=[0.1] * 4), "decode"),
        (IterationStats(prompt=30, generated=5, ttfts=[0.1], itls=[0.1] * 4), "mixed"),
        (IterationStats(), "idle"),
        (None, "idle"),
        (NS(num_prompt_tokens=12, num_generation_tokens=1, time_to_first_tokens_iter=[0.3]), "prefill"),  # int field
        (NS(prompt_token_stats=PromptTokenStats(8), num_generation_tokens=3), "mixed"),  # no property
    ],
)
def test_iteration_phase(stats, expected):
    assert api.iteration_phase(stats) == expected


def test_record_stats_survives_objects_missing_attributes(api_process, clock):
    m = api_process
    mgr = StatLoggerManager(clock)
    record_fn()(mgr, NS(), NS(), engine_idx=0)  # nothing vLLM-shaped: no exception
    assert mgr.calls == 1
    labels = {"dp": "0", "engine": "0", "role": "decode", "phase": "idle"}
    # SchedulerStats' queue fields (in every supported vLLM) missing: absent and reported, never a plausible 0
    assert m.value(name("batch_size"), **labels) is None and m.value(name("waiting_batch_size"), **labels) is None
    assert sorted(STATE.failures) == [("RecordStats", "scheduler_stats queues")]
    assert m.value(name("total_tokens"), **labels)[:2] == (1, 0)  # IterationStats' counters start at 0
    assert m.value(name("async_llm:record_stats:duration"), **labels)[0] == 1


# -- second token latency ------------------------------------------------------------------------


class FakeIterationStats:
    """The parts of IterationStats.update_from_output that second_token_latency depends on."""

    def update_from_output(self, output, engine_core_timestamp, is_prefilling, req_stats, lora_states, lora_name):
        req_stats.num_generation_tokens += len(output.new_token_ids)
        if is_prefilling:
            req_stats.first_token_ts = engine_core_timestamp
        req_stats.last_token_ts = engine_core_timestamp


def test_second_token_latency(api_process):
    m = api_process
    update = wrap(FakeIterationStats.update_from_output, api.SecondTokenLatency(), SYNC)[0]
    it = FakeIterationStats()
    a = NS(num_generation_tokens=0, first_token_ts=0.0, last_token_ts=0.0)
    b = NS(num_generation_tokens=0, first_token_ts=0.0, last_token_ts=0.0)
    update(it, NS(new_token_ids=[1]), 10.0, True, a, None, None)  # a: first token at 10.0
    update(it, NS(new_token_ids=[7]), 20.0, True, b, None, None)  # b: first token at 20.0
    update(it, NS(new_token_ids=[]), 10.125, False, a, None, None)  # no token: not the second
    update(it, NS(new_token_ids=[2]), 10.25, False, a, None, None)  # a: second token, 0.25 s
    update(it, NS(new_token_ids=[3]), 10.5, False, a, None, None)  # a: third: nothing
    update(it, NS(new_token_ids=[8, 9, 10]), 20.5, False, b, lora_states=None, lora_name=None)  # b: 3 at once
    assert (a.num_generation_tokens, b.num_generation_tokens) == (3, 4)
    K = catalogue.TOKEN_SECONDS
    # 0.25 in (0.2, 0.3], 0.5 in (0.3, 0.5]; this process's dp as dp and engine
    assert m.value(name("second_token_latency"), dp="0", engine="0", role="decode", phase="all") == (
        2,
        0.75,
        counts(K, b11=1, b12=1),
    )


def test_second_token_latency_on_real_vllm_iteration_stats(api_process):
    pytest.importorskip("vllm")
    from vllm.v1.engine import EngineCoreOutput
    from vllm.v1.metrics.stats import IterationStats as RealIterationStats
    from vllm.v1.metrics.stats import LoRARequestStates, RequestStateStats

    update = wrap(RealIterationStats.update_from_output, api.SecondTokenLatency(), SYNC)[0]
    lora = LoRARequestStates(log_stats=False)
    req = RequestStateStats(arrival_time=0.0)
    for ts, prefilling in ((5.0, True), (5.0625, False), (5.125, False)):
        update(
            RealIterationStats(), EngineCoreOutput(request_id="r", new_token_ids=[1]), ts, prefilling, req, lora, None
        )
    assert req.num_generation_tokens == 3
    value = api_process.value(name("second_token_latency"), dp="0", engine="0", role="decode", phase="all")
    assert value[:2] == (1, 0.0625)


# -- AsyncLLM / engine client / serving -----------------------------------------------------------


def run(coro):
    return asyncio.run(coro)


class FakeAsyncLLM:
    def __init__(self, clock):
        self.clock = clock
        self.dead = False

    async def check_health(self):
        if self.dead:
            raise RuntimeError("EngineCore is dead")

    async def add_request(
        self,
        request_id,
        prompt,
        params,
        arrival_time=None,
        lora_request=None,
        tokenization_kwargs=None,
        trace_headers=None,
        priority=0,
    ):
        await asyncio.sleep(0)
        self.clock.t += 0.25
        self.inbound = traces.INBOUND.get()  # what OutputProcessor.add_request, called in here, would see
        return "collector"

    async def generate(self, prompt, sampling_params, request_id, *, priority=0):
        for i in range(3):
            self.clock.t += 1.0
            await asyncio.sleep(0)
            if i == 1 and sampling_params == "fail":
                raise ValueError("engine error")
            yield i


def test_health_check_failures_count(api_process, clock):
    m = api_process
    check = wrap(FakeAsyncLLM.check_health, api.CheckHealth(), COROUTINE)[0]
    llm = FakeAsyncLLM(clock)
    run(check(llm))
    assert name("health_check_failed") not in m.points()  # healthy: nothing (no zero series)
    llm.dead = True
    for _ in range(2):
        with pytest.raises(RuntimeError, match="dead"):
            run(check(llm))
    assert m.value(name("health_check_failed"), dp="0", role="decode", phase="all") == 2

    async def cancelled(self):
        raise asyncio.CancelledError()

    with pytest.raises(asyncio.CancelledError):
        run(wrap(cancelled, api.CheckHealth(), COROUTINE)[0](llm))
    assert m.value(name("health_check_failed"), dp="0", role="decode", phase="all") == 2


def test_add_request_and_abort_are_timed_awaited(api_process, clock):
    m = api_process
    add = wrap(FakeAsyncLLM.add_request, handler_of("vllm.v1.engine.async_llm:AsyncLLM.add_request"), COROUTINE)[0]

    class Client:
        async def abort_requests_async(self, request_ids):
            await asyncio.sleep(0)
            clock.t += 0.0078125 * len(request_ids)

    abort = wrap(
        Client.abort_requests_async,
        handler_of("vllm.v1.engine.core_client:AsyncMPClient.abort_requests_async"),
        COROUTINE_TIMER,
    )[0]
    assert run(add(FakeAsyncLLM(clock), "id-1", "prompt", "params", priority=1)) == "collector"
    run(abort(Client(), ["a", "b"]))
    labels = {"dp": "0", "role": "decode", "phase": "all"}
    STEP = catalogue.STEP_SECONDS
    assert m.value(name("engine:async_add_request:duration"), **labels) == (1, 0.25, counts(STEP, b8=1))
    assert m.value(name("async_llm:abort_requests:duration"), **labels) == (
        1,
        0.015625,
        counts(catalogue.FINE_SECONDS, b10=1),
    )  # (0.01, 0.025]


def test_add_request_hands_the_inbound_trace_headers_to_the_registration_in_its_own_task(
    api_process, clock, monkeypatch
):
    """vLLM drops ``trace_headers`` in AsyncLLM.add_request when its own tracing is off; with request traces on, the
    hook keeps them for OutputProcessor.add_request, in the task that runs add_request (a stream's body runs in
    another task than its OpenAI handler, whose context variables it does not see). A failed call is not timed."""
    from opentelemetry_instrumentation_vllm_ascend.handlers.traces import TRACKER

    m = api_process
    add = wrap(FakeAsyncLLM.add_request, handler_of("vllm.v1.engine.async_llm:AsyncLLM.add_request"), COROUTINE)[0]
    headers = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    llm = FakeAsyncLLM(clock)

    async def in_a_fresh_task(**kwargs):  # a task of its own: nothing inherited from the handler's task
        return await asyncio.create_task(add(llm, "id-1", "prompt", "params", **kwargs))

    monkeypatch.setattr(TRACKER, "on", True)
    assert run(in_a_fresh_task(trace_headers=headers)) == "collector"
    assert llm.inbound is headers
    assert run(in_a_fresh_task()) == "collector" and llm.inbound is None  # no headers: nothing kept
    monkeypatch.setattr(TRACKER, "on", False)
    assert run(in_a_fresh_task(trace_headers=headers)) == "collector" and llm.inbound is None  # traces off
    labels = {"dp": "0", "role": "decode", "phase": "all"}
    assert m.value(name("engine:async_add_request:duration"), **labels) == (
        3,
        0.75,
        counts(catalogue.STEP_SECONDS, b8=3),
    )


def test_generate_is_timed_to_exhaustion_not_creation(api_process, clock):
    m = api_process
    gen = wrap(FakeAsyncLLM.generate, handler_of(GENERATE_SYMBOL), ASYNC_GENERATOR)[0]
    llm = FakeAsyncLLM(clock)
    labels = {"dp": "0", "role": "decode", "phase": "all"}
    series = name("engine:generate:duration")

    async def consume(stream):
        return [x async for x in stream]

    stream = gen(llm, "prompt", "ok", "id-1", priority=0)
    assert m.points().get(series) is None  # created, not ended: nothing yet
    assert run(consume(stream)) == [0, 1, 2]
    S = catalogue.REQUEST_SECONDS
    assert m.value(series, **labels) == (1, 3.0, counts(S, b8=1))  # 3 s in (2.5, 5]

    # A stream that fails after 2 s, and one closed by its consumer after 1 s, are recorded too.
    with pytest.raises(ValueError):
        run(consume(gen(llm, "prompt", "fail", "id-2")))

    async def first_then_close(stream):
        item = await stream.__anext__()
        await stream.aclose()
        return item

    assert run(first_then_close(gen(llm, "prompt", "ok", "id-3"))) == 0
    assert m.value(series, **labels) == (3, 6.0, counts(S, b6=1, b7=1, b8=1))


class Chat:
    def __init__(self, clock):
        self.clock = clock

    async def create_chat_completion(self, request, raw_request=None):
        self.clock.t += 0.5  # rendering, adding the request
        if not request.stream:
            self.clock.t += 1.5
            return {"choices": ["done"]}

        async def chunks():
            for i in range(4):
                self.clock.t += 2.0
                yield f"data: {i}\n\n"
            yield "data: [DONE]\n\n"

        return chunks()


def test_streaming_chat_is_timed_to_stream_end(api_process, clock):
    m = api_process
    create = wrap(Chat.create_chat_completion, handler_of(CHAT_SYMBOL), COROUTINE_STREAM)[0]
    chat = Chat(clock)
    labels = {"dp": "0", "role": "decode", "phase": "all"}
    series = name("server:create_chat_completion:duration")
    S = catalogue.REQUEST_SECONDS

    assert run(create(chat, NS(stream=False))) == {"choices": ["done"]}
    assert m.value(series, **labels) == (1, 2.0, counts(S, b7=1))  # the awaited call: 2 s in (1, 2.5]

    async def stream_all():
        response = await create(chat, NS(stream=True), raw_request=None)
        assert m.value(series, **labels)[0] == 1  # the coroutine returned; the stream has not ended
        return [c async for c in response]

    assert len(run(stream_all())) == 5
    # 0.5 s before the stream, 8 s streaming: 8.5 in (5, 10]
    assert m.value(series, **labels) == (2, 10.5, counts(S, b7=1, b9=1))


def test_process_inputs_is_timed(api_process, clock):
    m = api_process

    class InputProcessor:
        def process_inputs(self, request_id, prompt, params, supported_tasks, arrival_time=None, priority=0):
            clock.t += 0.001953125
            return "engine core request"

    process = wrap(
        InputProcessor.process_inputs,
        handler_of("vllm.v1.engine.input_processor:InputProcessor.process_inputs"),
        SYNC_TIMER,
    )[0]
    assert process(InputProcessor(), "id", "prompt", "params", supported_tasks=("generate",)) == "engine core request"
    assert m.value(name("engine:tokenizer_encode"), dp="0", role="decode", phase="all") == (
        1,
        0.001953125,
        counts(catalogue.STEP_SECONDS, b2=1),
    )  # (0.001, 0.0025]


class OutputProcessor:
    """IterationStats changes as vLLM's process_outputs makes them, one output per request."""

    def __init__(self, clock):
        self.clock = clock

    def process_outputs(
        self, engine_core_outputs, engine_core_timestamp=None, iteration_stats=None, weight_version=None
    ):
        self.clock.t += 0.0625
        if iteration_stats is not None:
            for out in engine_core_outputs:
                iteration_stats.num_generation_tokens += len(out.new_token_ids)
                if out.prefilling:
                    iteration_stats.prompt_token_stats.total += out.prompt_len
                    iteration_stats.time_to_first_tokens_iter.append(0.1)
        return NS(request_outputs=[], reqs_to_abort=[])


def test_process_outputs_unreadable_stats_cost_only_the_phase(api_process, clock):
    """IterationStats whose counters cannot be read (first-token latencies that are not a list): the chunk's
    duration and its outputs' length are still recorded, exactly, under phase ``unknown``; the read is counted.
    (Before, the failed read in ``before`` lost both, and left the output loop's budget in its process stage.)"""
    m = api_process
    process = wrap(OutputProcessor.process_outputs, api.ProcessOutputs(), SYNC)[0]
    broken = NS(num_prompt_tokens=0, num_generation_tokens=0, time_to_first_tokens_iter=5)  # a count, not a list
    decodes = [NS(new_token_ids=[1], prefilling=False)] * 3
    process(OutputProcessor(clock), decodes, 7.0, broken)
    base = {"dp": "0", "engine": "0", "role": "decode", "phase": "unknown"}
    assert m.value(name("output_processor_duration"), **base) == (1, 0.0625, counts(catalogue.STEP_SECONDS, b7=1))
    assert m.value(name("engine_core_outputs_len"), **base) == (1, 3, counts(catalogue.REQUESTS, b2=1))
    assert STATE.failures == {("ProcessOutputs", "iteration_stats"): 1}


def test_process_outputs_phase_of_each_chunk(api_process, clock):
    m = api_process
    process = wrap(OutputProcessor.process_outputs, api.ProcessOutputs(), SYNC)[0]
    op = OutputProcessor(clock)
    it = IterationStats()
    decodes = [NS(new_token_ids=[1], prefilling=False)] * 3
    prefills = [NS(new_token_ids=[1], prefilling=True, prompt_len=40)] * 2
    process(op, decodes, 7.0, it)  # first chunk of an update: decodes only
    process(op, prefills, 7.0, it, weight_version=None)  # second chunk, same IterationStats: prefills only
    process(op, [], engine_core_timestamp=7.0, iteration_stats=None)  # stats off
    assert (it.num_generation_tokens, it.num_prompt_tokens) == (5, 80)
    STEP, R = catalogue.STEP_SECONDS, catalogue.REQUESTS
    base = {"dp": "0", "engine": "0", "role": "decode"}
    one = counts(STEP, b7=1)  # 0.0625 in (0.05, 0.1]
    assert m.value(name("output_processor_duration"), phase="decode", **base) == (1, 0.0625, one)
    assert m.value(name("output_processor_duration"), phase="prefill", **base) == (1, 0.0625, one)
    assert m.value(name("output_processor_duration"), phase="all", **base) == (1, 0.0625, one)
    assert m.value(name("engine_core_outputs_len"), phase="decode", **base) == (1, 3, counts(R, b2=1))
    assert m.value(name("engine_core_outputs_len"), phase="prefill", **base) == (1, 2, counts(R, b2=1))
    assert m.value(name("engine_core_outputs_len"), phase="all", **base) == (1, 0, counts(R, b0=1))


# -- the wrappers keep vLLM's signatures -----------------------------------------------------------


@pytest.mark.parametrize(
    "fn, handler, kind",
    [
        (StatLoggerManager.record, api.RecordStats(), SYNC_TIMER),
        (FakeIterationStats.update_from_output, api.SecondTokenLatency(), SYNC),
        (OutputProcessor.process_outputs, api.ProcessOutputs(), SYNC),
        (FakeAsyncLLM.generate, handler_of(GENERATE_SYMBOL), ASYNC_GENERATOR),
        (Chat.create_chat_completion, handler_of(CHAT_SYMBOL), COROUTINE_STREAM),
        (FakeAsyncLLM.add_request, handler_of("vllm.v1.engine.async_llm:AsyncLLM.add_request"), COROUTINE),
    ],
)
def test_handlers_get_signature_preserving_wrappers(fn, handler, kind):
    import inspect

    wrapper = wrap(fn, handler, kind)[0]
    assert "_otel_a" not in wrapper.__code__.co_varnames  # not the generic (*args, **kwargs) form
    assert str(inspect.signature(wrapper)) == str(inspect.signature(fn))


def test_output_loop_values_carry_the_engine_whose_outputs_are_processed(metrics):
    """With several DP engines the API server's output loop labels output processing with the engine
    index of the EngineCoreOutputs it received (not the process's own dp)."""
    import asyncio
    from types import SimpleNamespace as NS

    from opentelemetry_instrumentation_vllm_ascend.handlers import api as api_handlers
    from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import COROUTINE, SYNC, wrap

    class Client:
        def __init__(self, batches):
            self.batches = list(batches)

        async def get_output_async(self):
            return self.batches.pop(0)

    class OutputProcessor:
        def process_outputs(
            self, engine_core_outputs, engine_core_timestamp=None, iteration_stats=None, weight_version=None
        ):
            return None

    Client.get_output_async = wrap(Client.get_output_async, api_handlers.GetOutput(), COROUTINE)[0]
    OutputProcessor.process_outputs = wrap(OutputProcessor.process_outputs, api_handlers.ProcessOutputs(), SYNC)[0]
    client = Client([NS(engine_index=1, outputs=[1, 2, 3]), NS(engine_index=0, outputs=[4])])
    processor = OutputProcessor()

    async def loop():
        for _ in range(2):
            outputs = await client.get_output_async()
            processor.process_outputs(outputs.outputs, 1.0, None)

    asyncio.run(loop())
    series = metrics.points()["vllm_profiling_engine_core_outputs_len"]
    by_engine = {dict(k)["engine"]: (dict(k)["dp"], v[0], v[1]) for k, v in series.items()}
    assert by_engine == {"1": ("1", 1, 3), "0": ("0", 1, 1)}


def test_a_slow_multi_token_output_counts_once(api_process, clock):
    """vLLM appends one inter-token latency per request output, and a speculative-decoding output
    carries several tokens: a slow 3-token output adds 1 to decode_over_1s_count, whose unit is
    outputs (real IterationStats.update_from_output)."""
    stats = pytest.importorskip("vllm.v1.metrics.stats")
    from vllm.v1.engine import EngineCoreOutput

    it = stats.IterationStats()
    req_stats = stats.RequestStateStats(first_token_ts=100.0, last_token_ts=100.0)
    it.update_from_output(
        EngineCoreOutput(request_id="r", new_token_ids=[11, 12, 13]),
        101.5,
        False,
        req_stats,
        stats.LoRARequestStates(),
        None,
    )
    assert it.num_generation_tokens == 3 and it.inter_token_latencies_iter == [1.5]
    record_fn()(StatLoggerManager(clock), None, it, engine_idx=0)
    req = {"dp": "0", "engine": "0", "role": "decode", "phase": "all"}
    assert api_process.value(name("decode_over_1s_count"), **req) == 1
    assert catalogue.M["decode_over_1s_count"].unit == "{output}"


# -- narrow degradation: a read that fails costs only its own metrics ---------------------------------------------

#: The update of test_record_stats_one_engine_update, each metric's exact value: (metric, labels kind, value).
_STEP = {"dp": "2", "engine": "2", "role": "decode", "phase": "mixed"}
_REQ = {"dp": "2", "engine": "2", "role": "decode", "phase": "all"}
_R, _T, _K = catalogue.REQUESTS, catalogue.TOKENS, catalogue.TOKEN_SECONDS
_FULL = {
    ("batch_size", ()): (1, 5, counts(_R, b3=1)),
    ("waiting_batch_size", ()): (1, 4, counts(_R, b2=1)),
    ("num_spec_tokens", ()): (1, 12, counts(_T, b3=1)),
    ("input", ()): (1, 100, counts(_T, b4=1)),
    ("output", ()): (1, 7, counts(_T, b2=1)),
    ("total_tokens", ()): (1, 107, counts(_T, b4=1)),
    ("async_llm:record_stats:duration", ()): (1, 0.125, counts(catalogue.STEP_SECONDS, b8=1)),
    ("fine_grained_ttft", ("req",)): (3, 31.5, counts(catalogue.REQUEST_SECONDS, b5=1, b9=1, b11=1)),
    ("fine_grained_tpot", ("req",)): (2, 0.75, counts(_K, b11=1, b12=1)),
    ("decode_over_1s_count", ("req",)): 2,
    ("prefill_over_threshold_count", ("req", "5s")): 2,
    ("prefill_over_threshold_count", ("req", "10s")): 1,
    ("prefill_over_threshold_count", ("req", "20s")): 1,
}


@pytest.mark.parametrize(
    "fault, where, lost",
    [
        ("decode_time", "finished_requests", {"fine_grained_tpot"}),
        ("ttft", "time_to_first_tokens_iter", {"fine_grained_ttft", "prefill_over_threshold_count"}),
        ("draft_tokens", "spec_decoding_stats", {"num_spec_tokens"}),
        ("queues", "scheduler_stats queues", {"batch_size", "waiting_batch_size"}),
    ],
)
def test_record_stats_a_failing_read_loses_only_its_metrics(api_process, clock, fault, where, lost):
    """One field of vLLM's stats renamed or retyped (a finished request without decode_time, a TTFT that is not a
    number, spec-decoding stats without num_draft_tokens, scheduler stats without their queue fields): the metrics
    read from it are absent, the failure is counted once per update (hook_errors), every other metric of the update
    records the exact value it records without the fault."""
    m = api_process
    done = [finished(5, 1.0), finished(1, 0.0), finished(2, 0.5)]
    if fault == "decode_time":
        done[2] = NS(num_generation_tokens=2)  # FinishedRequestStats.decode_time moved
    ttfts = [0.5, 6.0, 25.0] if fault != "ttft" else [0.5, "6.0", 25.0]
    spec = NS(num_draft_tokens=12) if fault != "draft_tokens" else NS(draft_tokens=12)
    stats = scheduler_stats(5, 3, 1, spec) if fault != "queues" else NS(running=5, spec_decoding_stats=spec)
    it = IterationStats(prompt=100, generated=7, ttfts=ttfts, itls=[0.25, 1.5, 0.5, 2.0], finished=done)
    record_fn()(StatLoggerManager(clock), engine_idx=2, scheduler_stats=stats, iteration_stats=it)
    got = {}
    for metric, kind in _FULL:
        labels = dict(_STEP) if not kind else dict(_REQ, **({"threshold": kind[1]} if len(kind) > 1 else {}))
        got[(metric, kind)] = m.value(name(metric), **labels)
    assert got == {k: (None if k[0] in lost else v) for k, v in _FULL.items()}
    assert STATE.failures == {("RecordStats", where): 1}


def test_finished_request_without_e2e_latency_keeps_ttft_and_tpot(metrics):
    """``gen_ai.server.request.duration`` cannot be read (FinishedRequestStats.e2e_latency moved): the request's TTFT
    and TPOT, read from other fields, are still recorded exactly."""
    handler = api.FinishedRequest()
    stats = NS(finished_requests=[NS(num_generation_tokens=5, decode_time=1.0)])
    req_stats = NS(first_token_latency=0.25)
    handler.after(None, (stats, "stop", "chatcmpl-1", 3, 16, req_stats), None, None)
    labels = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "vllm"}
    points = metrics.points()
    assert "gen_ai.server.request.duration" not in points
    assert points["gen_ai.server.time_to_first_token"] == {
        tuple(sorted(labels.items())): (1, 0.25, counts(catalogue.GENAI_TTFT_SECONDS, b8=1))
    }  # (0.1, 0.25]
    assert points["gen_ai.server.time_per_output_token"] == {
        tuple(sorted(labels.items())): (1, 0.25, counts(catalogue.GENAI_TPOT_SECONDS, b7=1))
    }  # 1.0 / 4 in (0.2, 0.3]
    assert STATE.failures == {("FinishedRequest", "e2e_latency"): 1}
