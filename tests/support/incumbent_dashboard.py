"""The incumbent's Grafana dashboard, as test data: every query of ms-service-metric's public dashboard that reads a
``vllm_profiling_`` series, reproduced from ms_service_metric/example/MsServiceMetric-grafana-Dashboard.json of
gitcode Ascend/msserviceprofiler (GitHub mirror Cztk5380/msserviceprofiler, the file as of commit
eea22e1d244c36a48718171c7fb2dc7dc3f4ea6e, 2026-03-23, unchanged since): (panel title, PromQL expr, why a CPU run of
vLLM cannot feed it, or None). The dashboard's template variables are Grafana's ``$instance`` / ``$role`` (multi-value,
"All") and ``$__rate_interval``. tests/e2e/test_prometheus.py runs each query on a real Prometheus scraping a real
server with the migration profile (OTEL_VLLM_ASCEND_ENABLED_METRICS=ms-service-metric)."""

#: vllm-ascend's model runner names this profiling scope (vllm_ascend/worker/model_runner_v1.py, 0.23.0.post1 and
#: 0.30.0rc2: ``record_function_or_nullcontext("prepare input")``); vLLM's own (CPU/GPU) runner names the same step
#: "gpu_model_runner: preprocess". NPU only.
ASCEND_SCOPE = "vllm-ascend's scope name 'prepare input': NPU only"
#: No profiling scope of vLLM 0.23-0.34 or vllm-ascend 0.23.0-0.30.0rc2 has this name (vllm-ascend writes
#: "sample_token" / "draft_token", vLLM "gpu_model_runner: sample" / "gpu_model_runner: draft"); "Draft" and
#: "mtp_forward" also need speculative decoding (MTP). Empty on a CPU run (and on current vllm-ascend).
NO_SUCH_SCOPE = "a scope name no current vLLM / vllm-ascend writes (speculative decoding for Draft / mtp_forward)"

#: Async scheduling only: the async model runner output's get_output (docs/metrics.md "By execution path"), which
#: vLLM's CPU build does not run (its CPU runner returns its output from sample_tokens). Fed on NPU with async
#: scheduling (vllm-ascend's runner reuses AsyncGPUModelRunnerOutput).
ASYNC_ONLY = "async scheduling only (AsyncGPUModelRunnerOutput.get_output): not on vLLM's CPU build"

QUERIES = (
    (
        "Second Token Latency",
        'histogram_quantile(0.99, sum by(le) (rate(vllm_profiling_second_token_latency_bucket{instance=~"$instance", role!~"prefill"}[$__rate_interval])))',
        None,
    ),
    (
        "Second Token Latency",
        'histogram_quantile(0.9, sum by(le) (rate(vllm_profiling_second_token_latency_bucket{instance=~"$instance", role!~"prefill"}[$__rate_interval])))',
        None,
    ),
    (
        "Second Token Latency",
        'histogram_quantile(0.5, sum by(le) (rate(vllm_profiling_second_token_latency_bucket{instance=~"$instance"}[$__rate_interval])))',
        None,
    ),
    (
        "Second Token Latency",
        'sum(rate(vllm_profiling_second_token_latency_sum{instance=~"$instance"}[$__rate_interval])) / (sum(rate(vllm_profiling_second_token_latency_count{instance=~"$instance", role!~"prefill"}[$__rate_interval])))',
        None,
    ),
    (
        "Async CPU时间拆解",
        'rate(vllm_profiling_worker:model_runner_get_output:duration_sum{instance=~"$instance", role=~"$role"}[$__rate_interval]) / rate(vllm_profiling_worker:model_runner_get_output:duration_count{instance=~"$instance", role=~"$role"}[$__rate_interval])',
        ASYNC_ONLY,
    ),
    (
        "Async CPU时间拆解",
        'rate(vllm_profiling_record_function_or_nullcontext_sum{instance=~"$instance", role=~"$role",name="prepare input"}[$__rate_interval]) / rate(vllm_profiling_record_function_or_nullcontext_count{instance=~"$instance", role=~"$role",name="prepare input"}[$__rate_interval])',
        ASCEND_SCOPE,
    ),
    (
        "Async CPU时间拆解",
        'rate(vllm_profiling_npu:kernel_launch_sum{instance=~"$instance", role=~"$role"}[$__rate_interval]) / rate(vllm_profiling_npu:kernel_launch_count{instance=~"$instance", role=~"$role"}[$__rate_interval])',
        None,
    ),
    (
        "Async CPU时间拆解",
        'rate(vllm_profiling_record_function_or_nullcontext_sum{instance=~"$instance", role=~"$role",name="Sample"}[$__rate_interval]) / rate(vllm_profiling_record_function_or_nullcontext_count{instance=~"$instance", role=~"$role",name="Sample"}[$__rate_interval])',
        NO_SUCH_SCOPE,
    ),
    (
        "Async CPU时间拆解",
        'rate(vllm_profiling_npu:forward_duration_sum{instance=~"$instance", role=~"$role"}[$__rate_interval]) / rate(vllm_profiling_npu:forward_duration_count{instance=~"$instance", role=~"$role"}[$__rate_interval])',
        None,
    ),
    (
        "Async CPU时间拆解",
        'rate(vllm_profiling_record_function_or_nullcontext_sum{instance=~"$instance", role=~"$role",name="Draft"}[$__rate_interval]) / rate(vllm_profiling_record_function_or_nullcontext_count{instance=~"$instance", role=~"$role",name="Draft"}[$__rate_interval])',
        NO_SUCH_SCOPE,
    ),
    (
        "Async CPU时间拆解",
        'rate(vllm_profiling_record_function_or_nullcontext_sum{instance=~"$instance", role=~"$role",name="mtp_forward"}[$__rate_interval]) / rate(vllm_profiling_record_function_or_nullcontext_count{instance=~"$instance", role=~"$role",name="mtp_forward"}[$__rate_interval])',
        NO_SUCH_SCOPE,
    ),
    (
        "engine_core:process_input_queue",
        'histogram_quantile(0.5, sum by(le) (rate(vllm_profiling_engine_core:process_input_queue:duration_bucket{instance=~"$instance", role=~"$role"}[$__rate_interval])))',
        None,
    ),
    (
        "executor:prepare_inputs",
        'histogram_quantile(0.5, sum by(le) (rate(vllm_profiling_executor:prepare_inputs:duration_bucket{instance=~"$instance", role=~"$role"}[$__rate_interval])))',
        None,
    ),
    (
        "scheduler:scheduler",
        'histogram_quantile(0.5, sum by(le) (rate(vllm_profiling_scheduler:duration_bucket{instance=~"$instance", role=~"$role"}[$__rate_interval])))',
        None,
    ),
    (
        "scheduler:update_from_output",
        'histogram_quantile(0.5, sum by(le) (rate(vllm_profiling_scheduler:update_from_output:duration_bucket{instance=~"$instance", role=~"$role"}[$__rate_interval])))',
        None,
    ),
    (
        "executor:model_runner_execute_model",
        'histogram_quantile(0.5, sum by(le) (rate(vllm_profiling_executor:model_runner_execute_model:duration_bucket{instance=~"$instance", role=~"$role"}[$__rate_interval])))',
        None,
    ),
    (
        "Batch Size / DP（AVG）",
        'sum by (dp) (rate(vllm_profiling_batch_size_sum{instance=~"$instance", role=~"$role"}[$__rate_interval]))  /  sum by (dp) (rate(vllm_profiling_batch_size_count{instance=~"$instance", role=~"$role"}[$__rate_interval]))',
        None,
    ),
    (
        "Batch Size / DP（AVG）",
        'histogram_quantile(   0.99,    sum by(le, dp) (     rate(vllm_profiling_batch_size_bucket{instance=~"$instance", role=~"$role"}[$__rate_interval])   ) )',
        None,
    ),
    (
        "Batch Size / DP（AVG）",
        'sum by (dp) (rate(vllm_profiling_waiting_batch_size_sum{instance=~"$instance", role=~"$role"}[$__rate_interval]))  /  sum by (dp) (rate(vllm_profiling_waiting_batch_size_count{instance=~"$instance", role=~"$role"}[$__rate_interval]))',
        None,
    ),
    (
        "Batch Size / DP（AVG）",
        'histogram_quantile(   0.99,    sum by(le, dp) (     rate(vllm_profiling_waiting_batch_size_bucket{instance=~"$instance", role=~"$role"}[$__rate_interval])   ) )',
        None,
    ),
    (
        "Batch Size / DP（AVG）",
        'sum by (dp) (rate(vllm_profiling_batch_size_sum{instance=~"$instance", role=~"$role"}[$__rate_interval]))  /  sum by (dp) (rate(vllm_profiling_batch_size_count{instance=~"$instance", role=~"$role"}[$__rate_interval]))',
        None,
    ),
    (
        "Batch Size / DP（AVG）",
        'histogram_quantile(0.99, sum by(le, dp) (rate(vllm_profiling_batch_size_bucket{instance=~"$instance", role=~"$role"}[$__rate_interval])))',
        None,
    ),
    (
        "Batch Size / DP（AVG）",
        'sum by (dp) (rate(vllm_profiling_waiting_batch_size_sum{instance=~"$instance", role=~"$role"}[$__rate_interval]))  /  sum by (dp) (rate(vllm_profiling_waiting_batch_size_count{instance=~"$instance", role=~"$role"}[$__rate_interval]))',
        None,
    ),
    (
        "Batch Size / DP（AVG）",
        'histogram_quantile(0.99, sum by(le, dp) (rate(vllm_profiling_waiting_batch_size_bucket{instance=~"$instance", role=~"$role"}[$__rate_interval])))',
        None,
    ),
    ("Seqlen / DP", 'sum by(dp) (vllm_profiling_scheduler:seqlen:sum{instance=~"$instance", role=~"$role"})', None),
    ("Seqlen / DP", 'sum by(dp) (vllm_profiling_scheduler:seqlen:avg{instance=~"$instance", role=~"$role"})', None),
)

#: The dashboard's template variables that query ``vllm_profiling_`` series (``label_values(…)``, as series
#: selectors): they list the instances of a prefill / decode role, which a PD-disaggregated deployment has (the role
#: is its KV transfer config's kv_role); one CPU server is "mixed", so both are empty there.
VARIABLES = (
    ("prefill_instances", 'vllm_profiling_batch_size_sum{role="prefill"}'),
    ("decode_instances", 'vllm_profiling_batch_size_sum{role="decode"}'),
)
