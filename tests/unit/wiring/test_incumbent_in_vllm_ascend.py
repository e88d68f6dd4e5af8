"""The incumbent that ships inside vllm-ascend 0.30.0rc2: the two hook files its ``ms_service_metric.providers``
entry point hands ms-service-metric, read straight from the release's sdist (tests/support/source_archives.py), as a
migrating user points ``check --config`` at them. Every entry maps to the built-in metric(s) named below, none is
rejected, without vLLM and with it; nothing the files name is imported.

The handler modules the files name: ``ms_service_metric.provider_handlers`` (ms-service-metric master,
github.com/Ascend/msserviceprofiler 4439a0e4: ``_HANDLER_TARGETS`` re-exports five handlers of
``adapters.vllm.handlers.{meta,metric}_handlers`` by the same name; the 26.0.0 wheel has no such module) and
``vllm_ascend.observability.handlers`` (the sdist's own EPLB hotness handler)."""

import ast
import json
import os
import sys
import zipfile

import pytest
import yaml
from packaging.version import Version

from opentelemetry_instrumentation_vllm_ascend import environment
from opentelemetry_instrumentation_vllm_ascend.cli import main as cli
from opentelemetry_instrumentation_vllm_ascend.wiring import incumbent, installer, userfile
from tests.support import source_archives

M, MD = "mapped", "mapped with differences"
PROVIDER = "ms_service_metric.provider_handlers:"
#: What provider_handlers re-exports (its ``_HANDLER_TARGETS``), and from where in ms-service-metric.
PROVIDER_EXPORTS = {
    "init_data_parallel_worker": "ms_service_metric.adapters.vllm.handlers.meta_handlers:init_data_parallel_worker",
    "engine_memory_phase_handler": "ms_service_metric.adapters.vllm.handlers.metric_handlers:engine_memory_phase_handler",
    "model_runner_phase_handler": "ms_service_metric.adapters.vllm.handlers.metric_handlers:model_runner_phase_handler",
    "phase_all_handler": "ms_service_metric.adapters.vllm.handlers.metric_handlers:phase_all_handler",
    "scheduler_scheduler_hooker": "ms_service_metric.adapters.vllm.handlers.metric_handlers:scheduler_scheduler_hooker",
}
SCHEDULER = (
    "scheduler:duration",
    "scheduler:batch_size",
    "scheduler:running_queue_size",
    "scheduler:seqlen:avg",
    "scheduler:seqlen:sum",
    "scheduler:phase_batch_size",
    "scheduler:phase_scheduled_tokens",
    "scheduler:phase_scheduled_token_counter",
    "request_prefill_pending_nums",
)
MEMORY = tuple(
    f"engine:memory:{m}"
    for m in (
        "total_gb",
        "utilization_ratio",
        "reserved_gb",
        "weights_gb",
        "kvcache_gb",
        "non_torch_gb",
        "activation_gb",
        "graph_gb",
    )
)
HOTNESS = (
    "eplb:expert_hotness:current_mean",
    "eplb:expert_hotness:current_max",
    "eplb:expert_hotness:update_mean",
    "eplb:expert_hotness:update_max",
    "eplb:expert_hotness:imbalance",
)
RUNNER = "vllm_ascend.worker.model_runner_v1:NPUModelRunner."
ADAPTOR = "vllm_ascend.eplb.adaptor.vllm_adaptor:VllmEplbAdaptor."
#: (file, entry) -> (symbol, verdict, the handler's fate here, the built-in metrics that record it).
VERDICTS = {
    ("base_metrics.yaml", 1): (
        "vllm_ascend.core.scheduler_profiling_chunk:ProfilingChunkScheduler.schedule",
        MD,  # scheduler:running_queue_size is opt-in
        incumbent.BUILT_IN,
        SCHEDULER,
    ),
    ("base_metrics.yaml", 2): (
        "vllm_ascend.core.recompute_scheduler:RecomputeScheduler.schedule",
        MD,
        incumbent.BUILT_IN,
        SCHEDULER,
    ),
    ("base_metrics.yaml", 3): (
        "vllm_ascend.patch.platform.patch_balance_schedule:BalanceScheduler.schedule",
        MD,
        incumbent.BUILT_IN,
        SCHEDULER,
    ),
    ("base_metrics.yaml", 4): (RUNNER + "execute_model", M, incumbent.IDENTITY, ()),
    ("base_metrics.yaml", 5): (
        RUNNER + "execute_model",
        M,
        incumbent.METRICS,
        ("executor:model_runner_execute_model:duration",),
    ),
    ("base_metrics.yaml", 6): (
        RUNNER + "_prepare_inputs",
        MD,  # the phase label
        incumbent.METRICS,
        ("executor:prepare_inputs:duration",),
    ),
    ("base_metrics.yaml", 7): (
        "vllm_ascend.worker.worker:NPUWorker.compile_or_warm_up_model",
        MD,
        incumbent.SELECT,
        MEMORY,
    ),
    ("eplb_metrics.yaml", 1): (
        "vllm_ascend.eplb.core.eplb_worker:EplbWorker.do_update",
        MD,
        incumbent.BUILT_IN,
        HOTNESS,
    ),
    ("eplb_metrics.yaml", 2): (
        "vllm_ascend.eplb.core.eplb_device_transfer_loader:D2DExpertWeightLoader.update_expert_map_and_weight",
        M,
        incumbent.METRICS,
        ("eplb:expert_weight_update:duration",),
    ),
    ("eplb_metrics.yaml", 3): (
        ADAPTOR + "do_update_expert_map",
        M,
        incumbent.METRICS,
        ("eplb:expert_map_update:duration",),
    ),
    ("eplb_metrics.yaml", 4): (
        ADAPTOR + "do_update_log2phy_map",
        M,
        incumbent.METRICS,
        ("eplb:log2phy_map_update:duration",),
    ),
    ("eplb_metrics.yaml", 5): (
        ADAPTOR + "do_update_expert_weight",
        M,
        incumbent.METRICS,
        ("eplb:expert_weight_replace:duration",),
    ),
}


@pytest.fixture(scope="module")
def sources():
    return source_archives.ascend_provider_sources()


@pytest.fixture(scope="module")
def files(tmp_path_factory, sources):
    return source_archives.ascend_provider_hook_files(str(tmp_path_factory.mktemp("vllm-ascend-provider")), sources)


@pytest.fixture(autouse=True)
def _default_metrics(monkeypatch):
    monkeypatch.delenv(environment.ENABLED_METRICS, raising=False)  # the default set: opt-in metrics off
    monkeypatch.delenv(environment.CONFIG_MODULES, raising=False)


def test_the_release_registers_its_provider_with_these_two_files(sources, files):
    assert '"vllm-ascend = vllm_ascend.observability:get_metric_provider"' in sources["setup.py"].decode()
    provider = sources["vllm_ascend/observability/provider.py"].decode()
    assert 'config_dir.glob("*.yaml")' in provider  # every YAML file of the config directory, sorted
    assert [os.path.basename(f) for f in files] == ["base_metrics.yaml", "eplb_metrics.yaml"]
    # Every handler either file names: the five re-exports, and vllm-ascend's own.
    handlers = {e["handler"] for f in files for e in yaml.safe_load(open(f, encoding="utf-8"))}
    assert handlers == {PROVIDER + n for n in PROVIDER_EXPORTS} | {
        "vllm_ascend.observability.handlers:eplb_do_update_hotness_handler"
    }
    assert "def eplb_do_update_hotness_handler(" in sources["vllm_ascend/observability/handlers.py"].decode()


def test_each_entrys_symbol_is_defined_in_the_release_where_the_built_in_hooks_it(sources, files):
    """Mapped means our built-in hooks the same method: the method is the class's own in 0.30.0rc2's source."""
    for raw in (e for f in files for e in yaml.safe_load(open(f, encoding="utf-8"))):
        module, qualname = raw["symbol"].split(":")
        owner, method = qualname.split(".")
        tree = ast.parse(sources[module.replace(".", "/") + ".py"])
        (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner]
        assert method in {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}, raw["symbol"]


def test_the_26_0_0_wheel_has_no_provider_handlers_module():
    with zipfile.ZipFile(source_archives.wheel(*source_archives.INCUMBENT)) as archive:
        names = archive.namelist()
    assert "ms_service_metric/metrics/metrics_manager.py" in names
    assert not [n for n in names if "provider" in n]  # no provider_handlers, provider_api or provider discovery


@pytest.mark.parametrize("name", sorted(PROVIDER_EXPORTS))
def test_each_re_export_of_provider_handlers_has_the_fate_of_the_handler_it_re_exports(name):
    assert incumbent.find(PROVIDER + name) is incumbent.find(PROVIDER_EXPORTS[name]) is not None


def test_a_handler_provider_handlers_does_not_export_is_rejected(tmp_path):
    path = tmp_path / "hooks.yaml"
    path.write_text(f"- symbol: vllm.v1.core.sched.scheduler:Scheduler.schedule\n  handler: {PROVIDER}make_stats\n")
    (entry,) = userfile.load([str(path)], Version("0.30.0"), None, log=False)
    assert entry.status == userfile.REJECTED and "is not one of ms-service-metric's handlers" in entry.reason


@pytest.mark.parametrize(
    ("vllm", "ascend"),
    [(None, None), ("0.30.0", "0.30.0rc2"), ("0.32.0", None)],
    ids=["no-vllm", "vllm-0.30.0+ascend-0.30.0rc2", "vllm-0.32.0"],
)
def test_every_entry_of_both_files_maps_to_the_built_in_that_measures_it(files, vllm, ascend, monkeypatch):
    monkeypatch.setattr(userfile, "vllm_version", lambda: Version(vllm) if vllm else None)  # None: not installed
    monkeypatch.setattr(userfile, "vllm_ascend_version", lambda: Version(ascend) if ascend else None)
    entries = userfile.load(files, log=False)
    verdicts = {
        (os.path.basename(e.file), e.index): (e.symbol, e.verdict, incumbent.find(raw["handler"]).fate)
        for e, raw in zip(entries, [r for f in files for r in yaml.safe_load(open(f, encoding="utf-8"))])
    }
    assert verdicts == {key: value[:3] for key, value in VERDICTS.items()}
    feeds = userfile._builtin_feeds()
    by_key = {(os.path.basename(e.file), e.index): e for e in entries}
    for key, (symbol, _, fate, seeds) in VERDICTS.items():
        entry = by_key[key]
        assert entry.measures == (), key  # nothing new is installed: a built-in hook of ours records each
        for seed in seeds:
            assert symbol in feeds[seed], (key, seed)  # at the entry's own symbol: no hook-point difference
        # The reason names exactly those metrics, in order.
        if fate == incumbent.BUILT_IN:
            assert entry.reason.endswith(" -> built-in " + _here(key) + ": records " + ", ".join(seeds)), entry.reason
        elif fate == incumbent.IDENTITY:
            assert entry.reason == (
                "handler init_data_parallel_worker -> built-in the process identity (dp, role, rank) every hook "
                "takes from vLLM's config (docs/labels.md)"
            )
        else:
            said = "built-in metric recorded: " + "; ".join(f"{seed} by this symbol" for seed in seeds)
            assert entry.reason.endswith(said), entry.reason
    assert "ms_service_metric" not in sys.modules and "vllm_ascend.observability" not in sys.modules


def _here(key):
    if key[0] == "eplb_metrics.yaml":
        return "EplbWorker.do_update"
    return "Scheduler.schedule (scheduler duration, batch, sequence length and phase metrics per step)"


def test_each_entry_says_what_differs(files):
    by_key = {(os.path.basename(e.file), e.index): e for e in userfile.load(files, None, None, log=False)}
    for n in (1, 2, 3):
        assert by_key["base_metrics.yaml", n].differences == (
            "scheduler:running_queue_size is opt-in and off: name it in OTEL_VLLM_ASCEND_ENABLED_METRICS to record it",
        )
    assert by_key["base_metrics.yaml", 6].differences == (
        "executor:prepare_inputs:duration: phase: ms-service-metric's model_runner_phase_handler labels it with the "
        "phase of the worker's batch (else the PD role); here the phase of the step most recently scheduled in its "
        "process (unknown where none is)",
    )
    assert by_key["base_metrics.yaml", 7].differences == ("recorded without switching the metrics on before start-up",)
    assert by_key["eplb_metrics.yaml", 1].differences == (
        "the incumbent reads latest_expert_hotness of EP rank 0 after the call and records nothing where it is "
        "missing; here rank 0 records vllm-ascend's lists where the call set them, else the same arithmetic on the "
        "gathered load and the old / new placements",
        "a MoE layer without load: eplb:expert_hotness:imbalance 1.0 here (and so counted in the means and maxima); "
        "the incumbent records vllm-ascend's NaN",
        'a layer whose computed placement EplbWorker refuses: eplb:expert_hotness:imbalance{phase="update"} and the '
        "update summaries are of the placement kept; the incumbent records vllm-ascend's value for the refused one",
        "dp and role are on every series too (vllm-ascend's handler: rank and phase, layer on the imbalance)",
    )
    for key in (("base_metrics.yaml", 4), ("base_metrics.yaml", 5), *(("eplb_metrics.yaml", n) for n in (2, 3, 4, 5))):
        assert by_key[key].differences == (), key
    # With the migration profile the opt-in scheduler metric records: that difference is gone.
    os.environ[environment.ENABLED_METRICS] = "ms-service-metric"
    try:
        assert userfile.load(files, None, None, log=False)[0].verdict == M
    finally:
        del os.environ[environment.ENABLED_METRICS]


def test_check_config_on_both_files_without_vllm_exits_0_with_12_mapped(files, monkeypatch, capsys):
    monkeypatch.setattr(installer, "vllm_distribution", lambda: None)
    monkeypatch.setattr(installer, "vllm_version", lambda: None)
    monkeypatch.setattr(userfile, "vllm_version", lambda: None)
    monkeypatch.setattr(userfile, "vllm_ascend_version", lambda: None)
    argv = ["check", "--config", files[0], "--config", files[1]]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "entries: 12 mapped\n" in out and "rejected" not in out
    assert (
        f"  {files[1]}:1  vllm_ascend.eplb.core.eplb_worker:EplbWorker.do_update  mapped with differences: handler "
        "eplb_do_update_hotness_handler -> built-in EplbWorker.do_update: records " + ", ".join(HOTNESS) + "\n"
    ) in out
    assert cli.main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True
    assert [(row["entry"], row["status"]) for row in report["hook_files"]] == [(n, M) for n in range(1, 8)] + [
        (n, M) for n in range(1, 6)
    ]


def test_the_generated_handler_table_names_the_re_exports_and_vllm_ascends_handler():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "configuration.md")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for name in PROVIDER_EXPORTS:
        assert f"also `{PROVIDER}{name}`" in text
    assert "`handlers:eplb_do_update_hotness_handler` | `vllm_ascend.observability.`" in text
