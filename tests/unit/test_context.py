"""The process identity's labels (context.py): ``dp`` and ``role`` read from vLLM's configuration objects."""

from types import SimpleNamespace as NS

import pytest

from opentelemetry_instrumentation_vllm_ascend import context


@pytest.mark.parametrize(
    "parallel, model, expected",
    [
        (NS(data_parallel_index=3, data_parallel_rank=0, data_parallel_size=4), None, "3"),
        (NS(data_parallel_size=1, data_parallel_rank=0), None, "0"),
        (NS(data_parallel_size=2, data_parallel_rank=1), NS(is_moe=True), "1"),
        (NS(data_parallel_size=2, data_parallel_rank=0), NS(is_moe=False), "unknown"),
        (None, None, "unknown"),
    ],
)
def test_dp_label(parallel, model, expected):
    assert context.dp_of(NS(parallel_config=parallel, model_config=model)) == expected


@pytest.mark.parametrize(
    "kv, expected",
    [
        (NS(kv_role="kv_producer"), "prefill"),
        (NS(kv_role="kv_consumer"), "decode"),
        (NS(kv_role="kv_both"), "mixed"),
        (NS(kv_role=None), "mixed"),
        (None, "mixed"),
    ],
)
def test_role_label(kv, expected):
    assert context.role_of(NS(kv_transfer_config=kv)) == expected
