"""Section F3 of ``tox -e bench`` (benchmarks/_step.py ``call_count_rows``): what each process's hooks add to a
simulated engine step, counted in calls rather than timed, so that a code change's effect reads the same on any
machine. The counts must be exact to be worth printing."""

from benchmarks import _step


def test_python_call_counts_are_exact_and_the_default_set_adds_no_more_than_every_metric():
    first, second = _step.call_count_rows(batch=16, steps=32), _step.call_count_rows(batch=16, steps=32)
    assert [(label, python, every, distinct) for label, python, _c, every, distinct in first] == [
        (label, python, every, distinct) for label, python, _c, every, distinct in second
    ]
    by_label = {label: python for label, python, *_ in first}
    assert len(by_label) == 6
    for process in ("EngineCore", "worker", "API server"):
        default = by_label[f"batch 16, {process} hooks, default set"]
        assert 0 < default <= by_label[f"batch 16, {process} hooks, every metric"]


def _calls_of_ours(step, steps: int = 32) -> dict:
    """Python calls a step makes into this package's code and its generated wrappers, per step."""

    def ours(event, frame, arg):
        if event == "call":
            name = frame.f_code.co_filename
            if "opentelemetry_instrumentation_vllm_ascend" in name or name.startswith("<otel-vllm-ascend wrapper"):
                return frame.f_code.co_qualname
        return None

    return {name: n / steps for name, n in _step.count_calls(step, steps, ours).items()}


def test_section_f2b_switches_off_each_hook_by_the_method_it_wraps_and_leaves_the_wrappers_alone():
    """F2b (``cold_hook_rows``) names each switchable hook by the method it wraps, and a step with every handler
    switched off runs our wrappers and what stays installed (the scope factory, the future class's completion) and
    nothing else of ours."""
    from tests.support.process import set_process

    set_process("engine_core", "0", "mixed")
    expected = {
        "engine_core": [
            "Scheduler.schedule",
            "Scheduler.get_grammar_bitmask",
            "Scheduler.update_from_output",
            "KVCacheManager.allocate_slots",
            "EngineCore._process_input_queue",
            "Executor.collective_rpc",
            "EngineCore.step",
        ],
        "worker": ["Worker.execute_model", "Runner.execute_model", "Runner.sample_tokens", "Runner._prepare_inputs"],
        "api_server": [
            "IterationStats.update_from_output",
            "OutputProcessor.process_outputs",
            "StatLoggerManager.record",
        ],
    }
    for process, hooks in expected.items():
        with _step.metric_set(""):
            step = _step.build(16, (process,), phased=True)
            assert list(step.hooks) == hooks
            for _ in range(64):
                step()
            on = _calls_of_ours(step)
            for hook in step.hooks.values():
                hook.handler = None
            ours = _calls_of_ours(step)
        # One wrapper call per wrapped call (the allocate_slots copy runs under the stand-in's own name); the
        # worker's forward / post-processing / sample scopes still mark its timeline through the scope factory, and
        # the EngineCore's non-blocking RPC future completes through the future class's own set_result. The scheduler's
        # per-request scopes and the worker's other scopes, untimed in the default set, are looked up in the factory's
        # table: no Python call.
        wrappers = {"engine_core": 7.0, "worker": 4.0, "api_server": 18.0}[process]
        assert sum(ours.values()) < sum(on.values())
        assert ours.pop("_otel_vllm_ascend_wrapper") == wrappers
        factory = ours.pop("ProfilerScopes.install.<locals>.factory", 0)
        assert factory == {"engine_core": 0, "worker": 3.0, "api_server": 0}[process]
        assert set(ours) <= {"_Scope.__enter__", "_TimelineScope.__exit__", "hook_future_class.<locals>.completed"}
