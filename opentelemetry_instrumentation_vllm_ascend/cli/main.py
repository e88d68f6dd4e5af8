"""``python -m opentelemetry_instrumentation_vllm_ascend check [--json]``

Prints, for the installed vLLM / vllm-ascend, each hook target as resolved, gated off by version,
dormant (vllm-ascend not installed) or missing, with the metrics it feeds; then, for the execution
paths a server started here takes (scheduling, model runner, executor, API servers, scheduler class: detected where this
environment decides them, else given with the options below), whether each metric will be fed and
what it measures on that path (docs/metrics.md, "By execution path"). Exits 1 when a target that
should be hooked with these versions is missing.

``check --vllm VERSION|PATH [--vllm-ascend VERSION|PATH]`` does the same before an upgrade, for a release
that is not installed (no vLLM needed at all): its source is parsed (``source.py``), each target resolved
there, and the paths ``paths.detect`` answers for that version decide which targets are expected. Exits 0
when every expected target resolves, 1 naming each missing one and the metrics it costs, 2 when the release
cannot be found, fetched or read (or the options are wrong)."""

from __future__ import annotations

import argparse
import json
import sys


def add_summary_parser(sub) -> None:
    summary_parser = sub.add_parser("summary", help="a short human summary of a running server's /metrics")
    summary_parser.add_argument("--url", required=True, help="the server (http://host:port) or its /metrics URL")


def summary_command(args) -> int:
    from .summary import fetch, summarize

    try:
        text = fetch(args.url)
    except OSError as exc:
        print(f"cannot read {args.url}: {exc}", file=sys.stderr)
        return 2
    print("\n".join(summarize(text)))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m opentelemetry_instrumentation_vllm_ascend",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    check_parser = sub.add_parser("check", help="which hook targets resolve in this environment")
    check_parser.add_argument("--json", action="store_true", help="machine-readable output")
    check_parser.add_argument(
        "--async-scheduling", choices=("on", "off"), help="whether the server runs async scheduling (the batch queue)"
    )
    check_parser.add_argument(
        "--model-runner",
        choices=("v1", "v2", "npu", "npu-v2"),
        help="the worker's model runner (npu: vllm-ascend's V1 NPU runner; npu-v2: its V2 NPU runner)",
    )
    check_parser.add_argument(
        "--executor",
        choices=("uni", "mp"),
        help="the engine's executor (--distributed-executor-backend; uni: one in-process worker)",
    )
    check_parser.add_argument("--api-server-count", type=int, help="API server processes of the server")
    from ..paths import PATHS

    check_parser.add_argument(
        "--scheduler",
        choices=tuple(p.key for p in PATHS if p.axis == "scheduler"),
        help="the scheduler class (vllm-ascend: its additional_config scheduler_config; default balance)",
    )
    check_parser.add_argument(
        "--vllm",
        metavar="VERSION|PATH",
        help="check a vLLM release that is not installed: a version (fetched from the index pip is configured "
        "with, cached in OTEL_VLLM_ASCEND_SOURCE_CACHE), or a wheel, an sdist or a source directory; its source "
        "is parsed, never imported (no vLLM needed here)",
    )
    check_parser.add_argument(
        "--vllm-ascend",
        metavar="VERSION|PATH",
        help="with it, a vllm-ascend release (as --vllm); without --vllm, over the vLLM release it runs on",
    )
    check_parser.add_argument(
        "--config",
        action="append",
        metavar="FILE",
        help="also check this hook file (OTEL_VLLM_ASCEND_CONFIG format; repeatable): each entry loaded, "
        "mapped, gated or rejected, and why",
    )
    from .control import add_parser, run_control

    add_parser(sub)
    add_summary_parser(sub)
    from .steps import add_parser as add_steps_parser

    add_steps_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "summary":
        return summary_command(args)
    if args.command == "steps":
        from .steps import run_steps

        return run_steps(args)
    if args.command == "control":
        return run_control(args)

    from ..version import __version__
    from ..wiring import installer

    overrides = {}
    if args.async_scheduling:
        overrides["scheduling"] = "batch_queue" if args.async_scheduling == "on" else "sync"
    if args.model_runner:
        overrides["worker"] = {"v1": "mrv1", "v2": "mrv2", "npu": "npu", "npu-v2": "npu_v2"}[args.model_runner]
    if args.executor:
        overrides["executor"] = {"uni": "uniproc", "mp": "multiproc"}[args.executor]
    if args.api_server_count:
        overrides["frontend"] = "multi_api" if args.api_server_count > 1 else "single_api"
    if args.scheduler:
        overrides["scheduler"] = args.scheduler
    if args.vllm or args.vllm_ascend:
        from .release import release_check

        return release_check(args, overrides)
    hook_files = None
    if args.config:
        from ..wiring import userfile
        from .control import print_entries

        entries = userfile.load(args.config, log=False)
        installed = installer.vllm_distribution() is not None
        entries = userfile.resolve_entries(entries) if installed else userfile.unresolved(entries)
        hook_files = [e.as_row() for e in entries]
        if not args.json:
            print_entries(hook_files)  # the verdicts first: what the user asked about
        if not installed:
            return _offline_config_check(args, hook_files)
    rows = installer.check()
    config = installer.configuration(overrides)
    metrics = installer.metric_status(rows, config)
    overrides_found = installer.uncovered_overrides()
    vllm, ascend = installer.vllm_version(), installer.vllm_ascend_version()
    missing = [r for r in rows if r["status"] == installer.MISSING]
    if args.json:
        print(
            json.dumps(
                {
                    "package": __version__,
                    "vllm": str(vllm) if vllm else None,
                    "vllm_ascend": str(ascend) if ascend else None,
                    "targets": rows,
                    "configuration": {
                        axis: {"path": config.paths[axis], "reason": config.reasons[axis]} for axis in config.paths
                    },
                    "metrics": metrics,
                    "uncovered_overrides": overrides_found,
                    "hook_files": hook_files,
                    "ok": not missing and not any(e["status"] == "rejected" for e in hook_files or ()),
                },
                indent=2,
            )
        )
    else:
        print(
            f"opentelemetry-instrumentation-vllm-ascend {__version__}; vLLM {vllm or 'not installed'}; "
            f"vllm-ascend {ascend or 'not installed'}"
        )
        width = max(len(r["symbol"]) for r in rows)
        for r in rows:
            feeds = ", ".join(r["feeds"]) or "(context)"
            detail = f" — {r['detail']}" if r["detail"] else ""
            print(f"  {r['symbol']:<{width}}  {r['status']:<32} {feeds}{detail}")
        print(f"{len(rows) - len(missing)} of {len(rows)} targets fine; {len(missing)} missing")
        from .release import print_metric_verdicts

        print_metric_verdicts(config, metrics)
        for o in overrides_found:
            absent = ", ".join(o["absent"]) or "no metric"
            print(f"Wherever {o['symbol']} runs (it bypasses {o['bypasses']}), absent: {absent} — {o['reason']}")
    rejected = any(e["status"] == "rejected" for e in hook_files or ())
    return 1 if missing or rejected else 0


def _offline_config_check(args, hook_files: list[dict]) -> int:
    """``check --config`` where vLLM is not installed (a laptop, a config repository's CI): each entry's syntax,
    expressions and shape are checked, its symbol is not resolved, and the target table is not checked (it needs
    vLLM, or ``check --vllm VERSION``). Exit 1 when an entry is rejected, else 0."""
    from ..version import __version__

    rejected = any(e["status"] == "rejected" for e in hook_files)
    if args.json:
        print(
            json.dumps({"package": __version__, "vllm": None, "hook_files": hook_files, "ok": not rejected}, indent=2)
        )
    else:
        print(
            "vLLM is not installed here: each entry's syntax, expressions and shape are checked, not its symbol "
            "(check resolves symbols where vLLM is installed; check --vllm VERSION checks the target table)."
        )
    return 1 if rejected else 0


if __name__ == "__main__":
    sys.exit(main())
