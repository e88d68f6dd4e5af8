"""deploy/: the generated dashboard, rules and PrometheusRule are current; promtool accepts the rules, their unit
tests (deploy/prometheus/rules_test.yml) and the fleet scrape config; every dashboard query is valid PromQL;
every alert has a severity and a runbook in docs/deploy.md; the collector config's pipelines only name defined
components. promtool: Debian's prometheus package, see tests/support/prometheus_tools.py (skips where it cannot be had)."""

from __future__ import annotations

import json
import os
import re

import pytest
import yaml
from opentelemetry.sdk.metrics.export import Gauge, Histogram, Sum

from opentelemetry_instrumentation_vllm_ascend import catalogue, recording, targets
from opentelemetry_instrumentation_vllm_ascend.cli import dashboards
from tests.support import prometheus_naming as naming
from tests.support import prometheus_tools
from tests.support.prometheus_tools import promtool

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROM = os.path.join(ROOT, "deploy", "prometheus")


def read(*parts: str) -> str:
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("path", sorted(dashboards.render()))
def test_generated_files_are_current(path):
    assert read(path) == dashboards.render()[path], (
        f"{path} is stale: run python -m opentelemetry_instrumentation_vllm_ascend.cli.dashboards"
    )


def test_kubernetes_rendering_holds_the_same_rules():
    rules = yaml.safe_load(read("deploy", "prometheus", "rules.yml"))
    k8s = yaml.safe_load(read("deploy", "kubernetes", "prometheusrule.yaml"))
    assert k8s["kind"] == "PrometheusRule" and k8s["apiVersion"] == "monitoring.coreos.com/v1"
    assert k8s["spec"] == rules


def test_dashboard_queries_name_catalogue_metrics_only():
    """Every vllm_profiling_ name a panel queries is a catalogue metric's exposition name (or its
    _bucket/_sum/_count); every variable a query uses is defined."""
    board = json.loads(read("deploy", "grafana", "vllm-ascend.json"))
    names = set()
    for s in catalogue.CATALOGUE:
        names.add(s.prometheus_name)
        if s.kind == catalogue.HISTOGRAM:
            names |= {s.prometheus_name + x for x in ("_bucket", "_sum", "_count")}
    variables = {v["name"] for v in board["templating"]["list"]} | {"__rate_interval"}
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert len(exprs) > 50
    for expr in exprs:
        for name in re.findall(r"vllm_profiling_[\w:]+", expr):
            assert name in names or name == "vllm_profiling_engine:memory:", (name, expr)
        assert set(re.findall(r"\$(\w+)", expr)) <= variables, expr
    ascend = [p["title"] for p in board["panels"] if "[Ascend only]" in p["title"]]
    assert ascend and all(t.startswith(("Expert", "Imbalance", "Busiest")) for t in ascend), ascend


def test_dashboard_queries_are_valid_promql(tmp_path):
    """promtool parses every panel query (variables at "All"), as a recording rule each."""
    rules = []
    for _, panels in dashboards.sections():
        for panel in panels:
            for _, expr in panel.targets:
                expr = re.sub(r"\$(\w+)", ".*", expr.replace("$__rate_interval", "5m"))
                rules.append({"record": f"dashboard:query_{len(rules)}", "expr": expr})
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_check_rules():
    result = promtool("check", "rules", "rules.yml", cwd=PROM)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(dashboards.recording_rules()) + len(dashboards.alert_rules())} rules found" in result.stdout


def test_promtool_test_rules():
    result = promtool("test", "rules", "rules_test.yml", cwd=PROM)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_is_unit_tested():
    tested = set(re.findall(r"alertname: (\w+)", read("deploy", "prometheus", "rules_test.yml")))
    assert tested == {a["alert"] for a in dashboards.alert_rules()}


def test_promtool_check_config():
    result = promtool("check", "config", "prometheus.yml", cwd=PROM)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_severity_and_runbook():
    docs = read("docs", "deploy.md")
    anchors = {re.sub(r"[^\w-]", "", h.strip().lower().replace(" ", "-")) for h in re.findall(r"^#+ (.+)$", docs, re.M)}
    for alert in dashboards.alert_rules():
        assert alert["labels"]["severity"] in ("warning", "critical"), alert
        anchor = alert["annotations"]["runbook"].split("#", 1)[1]
        assert anchor in anchors, f"docs/deploy.md has no section for {alert['alert']}"


COLLECTOR = ("deploy", "otel-collector")


def merged(base: dict, overlay: dict) -> dict:
    """The collector's merge of ``--config`` files in order: maps key by key, anything else (lists) replaced."""
    out = dict(base)
    for key, value in overlay.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def collector_configs() -> dict[str, dict]:
    base = yaml.safe_load(read(*COLLECTOR, "config.yaml"))
    return {
        "config.yaml": base,
        "config.yaml + kubernetes.yaml": merged(base, yaml.safe_load(read(*COLLECTOR, "kubernetes.yaml"))),
    }


@pytest.mark.parametrize("which", sorted(collector_configs()))
def test_collector_pipelines_use_defined_components(which):
    config = collector_configs()[which]
    pipelines = config["service"]["pipelines"]
    assert any(name.split("/")[0] == "metrics" for name in pipelines)
    # Traces (issue 40): OTLP in, on to the trace store.
    traces = [name for name in pipelines if name.split("/")[0] == "traces"]
    assert traces and all(pipelines[name]["receivers"] == ["otlp"] for name in traces)
    for name, pipeline in pipelines.items():
        assert pipeline.get("receivers") and pipeline.get("exporters"), name
        for section in ("receivers", "processors", "exporters"):
            for component in pipeline.get(section, []):
                assert component in (config.get(section) or {}), f"{name}: {section[:-1]} {component} undefined"
    for extension in config["service"].get("extensions", []):
        assert extension in config["extensions"], extension
    assert set(config["receivers"]["otlp"]["protocols"]) == {"grpc", "http"}
    assert all("batch" in p["processors"] for p in pipelines.values())
    # k8sattributes needs a pod's in-cluster config: only the Kubernetes rendering has it, in every pipeline.
    kubernetes = which.endswith("kubernetes.yaml")
    assert ("k8sattributes" in config["processors"]) == kubernetes
    assert all(("k8sattributes" in p["processors"]) == kubernetes for p in pipelines.values())
    # The remote-write pipeline renames; the OTLP one forwards the OTel names and units untouched.
    [prw] = [p for p in pipelines.values() if "prometheusremotewrite" in p["exporters"]]
    assert prw["processors"].index("transform/prometheus_names") < prw["processors"].index("batch")
    assert all("transform/prometheus_names" not in p["processors"] for p in pipelines.values() if p is not prw)


# -- the collector path: what prometheusremotewrite writes equals what /metrics shows ------------------------------
def exported_otlp(metrics) -> dict[str, dict]:
    """One value of every catalogue metric through this process's real pipeline, as its OTLP export carries it:
    {name: {name, unit, type (the OTTL enum), is_monotonic, kind (the translator's)}}."""
    for spec in catalogue.CATALOGUE:
        labels = tuple("x" for _ in spec.labels)
        if spec.kind == catalogue.COUNTER:
            recording.add(spec, 1, labels)
        elif spec.kind == catalogue.HISTOGRAM:
            recording.record(spec, 1.0, labels)
        else:
            recording.set_gauge(spec, 1.0, labels)
    out = {}
    for rm in metrics.reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                data = metric.data
                if isinstance(data, Sum):
                    otlp_type = "METRIC_DATA_TYPE_SUM"
                    kind = naming.MONOTONIC_COUNTER if data.is_monotonic else naming.NON_MONOTONIC_COUNTER
                elif isinstance(data, Histogram):
                    otlp_type, kind = "METRIC_DATA_TYPE_HISTOGRAM", naming.HISTOGRAM
                else:
                    assert isinstance(data, Gauge), metric
                    otlp_type, kind = "METRIC_DATA_TYPE_GAUGE", naming.GAUGE
                monotonic = isinstance(data, Sum) and data.is_monotonic
                out[metric.name] = dict(name=metric.name, unit=metric.unit, type=otlp_type, is_monotonic=monotonic)
                out[metric.name]["kind"] = kind
    return out


def ottl_apply(statements: list[str], metric: dict) -> None:
    """The transform processor's statements, for the few OTTL forms the config uses (metric context): ``set(P,
    V) where C and C ...`` with P ``metric.name``/``metric.unit``, V a string or ``Concat([metric.name, "s"], "d")``,
    C ``IsMatch(metric.name, "re")``, ``metric.type == ENUM`` or ``metric.is_monotonic == true|false``. Any other
    form fails the test (extend this, do not guess)."""
    for statement in statements:
        m = re.fullmatch(r"set\(metric\.(name|unit), (.+?)\)(?: where (.+))?", statement)
        assert m, f"unsupported OTTL statement: {statement}"
        path, value, where = m.groups()
        ok = True
        for condition in (where or "").split(" and ") if where else []:
            if c := re.fullmatch(r'IsMatch\(metric\.name, "(.+)"\)', condition):
                ok &= re.search(c.group(1), metric["name"]) is not None
            elif c := re.fullmatch(r"metric\.type == (METRIC_DATA_TYPE_\w+)", condition):
                ok &= metric["type"] == c.group(1)
            elif c := re.fullmatch(r"metric\.is_monotonic == (true|false)", condition):
                ok &= metric["is_monotonic"] == (c.group(1) == "true")
            else:
                raise AssertionError(f"unsupported OTTL condition: {condition}")
        if not ok:
            continue
        if s := re.fullmatch(r'"(.*)"', value):
            metric[path] = s.group(1)
        elif c := re.fullmatch(r'Concat\(\[metric\.name, "(.*)"\], "(.*)"\)', value):
            metric[path] = metric["name"] + c.group(2) + c.group(1)
        else:
            raise AssertionError(f"unsupported OTTL value: {value}")


def exposed_series(spec: catalogue.MetricSpec) -> tuple[str, ...]:
    name = spec.prometheus_name
    return tuple(name + x for x in ("_bucket", "_sum", "_count")) if spec.kind == catalogue.HISTOGRAM else (name,)


def test_translator_reimplementation_matches_upstream_examples():
    """The re-implementation gives the results otlptranslator v1.0.0's own tests expect (metric_namer_test.go)."""
    m, c, g = naming.metric_name, naming.MONOTONIC_COUNTER, naming.GAUGE
    assert m("requests", "", c) == "requests_total"
    assert m("cpu_usage", "1", g) == "cpu_usage_ratio"
    assert m("items", "1", c) == "items_total"
    assert m("response_time", "ms", g) == "response_time_milliseconds"
    assert m("memory_usage", "By", g) == "memory_usage_bytes"
    assert m("requests", "1/s", g) == "requests_per_second"
    assert m("throughput", "By/s", g) == "throughput_bytes_per_second"
    assert m("custom_metric", "{custom}", g) == "custom_metric"
    assert m("custom_metric", "By/{custom}", g) == "custom_metric_bytes"
    assert m("requests_total", "", c) == "requests_total"
    assert m("cpu_seconds_total", "s", c) == "cpu_seconds_total"
    assert m("metric__with__multiple__underscores", "unit__multiple__underscores", g) == (
        "metric_with_multiple_underscores_unit_multiple_underscores"
    )
    assert m("custom_metric", "unit@with#special/chars", g) == "custom_metric_unit_with_special_per_chars"
    assert m("metric@with#special$chars", "", g, with_suffixes=False) == "metric_with_special_chars"
    assert m("123metric", "", g, with_suffixes=False) == "_123metric"


def test_collector_writes_the_names_metrics_shows(metrics):
    """Every catalogue metric, as this package's OTLP export carries it (name, unit, type), through the config's
    transform/prometheus_names and the exporter's default translation, lands in Prometheus under the sample names
    /metrics shows for it: the names the dashboard and rules query."""
    config = collector_configs()["config.yaml"]
    statements = config["processors"]["transform/prometheus_names"]["metric_statements"]
    exporter = config["exporters"]["prometheusremotewrite"]
    # The transform is written for the default translation (suffixes on, underscore escaping).
    assert not {"add_metric_suffixes", "translation_strategy", "namespace"} & set(exporter), exporter
    otlp = exported_otlp(metrics)
    untransformed, checked = {}, 0
    for spec in catalogue.CATALOGUE:
        metric = dict(otlp[spec.exposed_name])
        kind = metric.pop("kind")
        assert metric["unit"] == spec.unit, spec.seed
        plain = naming.series_names(metric["name"], metric["unit"], kind)
        ottl_apply(statements, metric)
        assert naming.series_names(metric["name"], metric["unit"], kind) == exposed_series(spec), spec.seed
        if plain != exposed_series(spec):
            untransformed[spec.exposed_name] = plain[0]
        checked += 1
    assert checked == len(catalogue.CATALOGUE) > 80
    # Without the transform the translation would not match: units and _total appended (colons kept).
    assert untransformed["vllm_profiling_scheduler:duration"] == "vllm_profiling_scheduler:duration_seconds_bucket"
    assert untransformed["vllm_profiling_engine:memory:total_gb"] == "vllm_profiling_engine:memory:total_gb_gibibytes"
    assert untransformed["vllm_profiling_kv_transfer:bytes"] == "vllm_profiling_kv_transfer:bytes_bytes_total"
    assert not any(name.startswith("gen_ai") for name in untransformed)  # they match as they are
    # Releases before v0.131.0 (contrib's own translator) dropped the colons as well.
    assert naming.legacy_contrib_name("vllm_profiling_scheduler:duration", "", naming.HISTOGRAM) == (
        "vllm_profiling_scheduler_duration"
    )


@pytest.mark.parametrize(("ci", "outcome"), [(None, pytest.skip.Exception), ("true", pytest.fail.Exception)])
def test_missing_tools_skip_outside_ci_and_fail_in_ci(monkeypatch, tmp_path, ci, outcome):
    """Without prometheus/promtool on PATH and no installation allowed: a skip on a developer's machine, a
    failure where CI is set (tox passes CI through), never a silent pass."""
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: neither tool is found
    monkeypatch.setenv("OTEL_VLLM_ASCEND_NO_APT", "1")
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    prometheus_tools._provision.cache_clear()
    try:
        with pytest.raises(outcome, match="prometheus/promtool missing"):
            prometheus_tools.tool("promtool")
    finally:
        prometheus_tools._provision.cache_clear()


# -- every panel query asks for series that exist: names with their kind's suffix, labels the metric carries -------
#: Labels every series has in Prometheus without the catalogue: the target's (job, instance) and what the scrape
#: config adds (model).
TARGET_LABELS = set(dashboards.SCRAPE_LABELS)
KIND_SUFFIXES = {catalogue.HISTOGRAM: ("_bucket", "_sum", "_count"), catalogue.COUNTER: ("",), catalogue.GAUGE: ("",)}
SELECTOR = re.compile(r"([A-Za-z_:][\w:]*)?\{([^{}]*)\}")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
AGGREGATION = re.compile(r"\b(sum|max|min|avg|count) by \(([^)]*)\) \(")


def queried(name: str, matchers: list) -> list[tuple[catalogue.MetricSpec, str]]:
    """The catalogue metrics (and the sample suffix each) a selector reads: by exact sample name, or by a
    ``__name__`` regex. Every one of a counter's samples ends in _total; a histogram's in _bucket/_sum/_count."""
    out = []
    for spec in catalogue.CATALOGUE:
        if spec.kind == catalogue.COUNTER:
            assert spec.prometheus_name.endswith("_total"), spec.seed
        for suffix in KIND_SUFFIXES[spec.kind]:
            sample = spec.prometheus_name + suffix
            by_regex = [re.fullmatch(v, sample) for k, op, v in matchers if k == "__name__" and op == "=~"]
            if sample == name or (not name and by_regex and all(by_regex)):
                out.append((spec, suffix))
    return out


def carried(spec: catalogue.MetricSpec, suffix: str) -> set[str]:
    return TARGET_LABELS | set(targets.all_labels(spec)) | ({"le"} if suffix == "_bucket" else set())


def balanced(expr: str, start: int) -> str:
    """The text inside the parenthesis opening at ``start``."""
    depth = 0
    for i in range(start, len(expr)):
        depth += {"(": 1, ")": -1}.get(expr[i], 0)
        if depth == 0:
            return expr[start + 1 : i]
    raise AssertionError(f"unbalanced: {expr}")


def selectors(expr: str) -> list[tuple[catalogue.MetricSpec, str, list]]:
    out = []
    for name, body in SELECTOR.findall(expr):
        matchers = MATCHER.findall(body)
        metrics = queried(name, matchers)
        assert metrics, f"{name or body} is no catalogue sample name (with its kind's suffix): {expr}"
        out += [(spec, suffix, matchers) for spec, suffix in metrics]
    return out


def panel_targets():
    return [
        (p.title, legend, expr) for _, panels in dashboards.sections() for p in panels for legend, expr in p.targets
    ]


@pytest.mark.parametrize(("title", "legend", "expr"), panel_targets(), ids=lambda v: str(v)[:60])
def test_panel_queries_read_existing_series(title, legend, expr):
    """Every metric a panel reads is a catalogue metric under its exact /metrics name with the suffix its kind gives
    (_total for counters; _bucket only inside histogram_quantile, grouped by le); every label it filters on, groups
    by or shows in its legend is one that metric carries (the catalogue's labels, the worker's rank where recorded
    in workers, job/instance/model from the scrape). Together with the real-Prometheus run (tests/
    tests/e2e/test_prometheus.py) this covers the panels that run cannot fill (dashboards.EVENT_ONLY)."""
    unquoted = re.sub(r'"[^"]*"', '""', expr)
    bare = re.findall(r"\b(?:vllm_profiling_|gen_ai_)[\w:]*(?![\w:{])", unquoted)
    assert not bare, f"metric names without a selector (the checks below read selectors): {bare}"
    reads = selectors(expr)
    for spec, suffix, matchers in reads:
        filtered = {k for k, _, _ in matchers if k != "__name__"}
        assert filtered <= carried(spec, suffix), (spec.seed, filtered - carried(spec, suffix))
        if suffix == "_bucket":
            assert expr.startswith("histogram_quantile("), expr
    groupings = []
    for m in AGGREGATION.finditer(expr):
        labels = {x.strip() for x in m.group(2).split(",")}
        inside = selectors(balanced(expr, m.end() - 1))
        for spec, suffix, _ in inside:
            assert labels <= carried(spec, suffix), (title, spec.seed, labels - carried(spec, suffix))
        if any(suffix == "_bucket" for _, suffix, _ in inside):
            assert "le" in labels, expr
        groupings.append(labels - {"le"})
    shown = set(re.findall(r"\{\{(\w+)\}\}", legend))
    if groupings:
        for labels in groupings:
            assert shown <= labels, (title, legend, shown - labels)
    else:
        for spec, suffix, _ in reads:
            assert shown <= carried(spec, suffix) | {"__name__"}, (title, legend)
