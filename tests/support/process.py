"""The process identity set directly, as tests and benchmarks need it (the package's hooks ``claim`` it)."""

from opentelemetry_instrumentation_vllm_ascend import context, state


def set_process(process: str, dp: str, role: str, rank: str | None = None) -> None:
    """Set the process context directly; ``context.claim()`` is what hooks use. ``rank``: the hosted worker's
    rank (None: no worker)."""
    ctx = context.PROCESS
    ctx.process, ctx.dp, ctx.role = process, dp, role
    ctx.labels = {} if rank is None else {"rank": rank}
    state.clear_label_caches()
