"""python -m opentelemetry_instrumentation_vllm_ascend.cli.demo — see the package docstring."""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time

from ... import environment
from ..summary import summarize
from . import tiny_model
from .server import Server, samples, total

#: The ``steps`` command the demo runs over its server's step records (docs/steps.md) at the end.
STEPS_COMMAND = "python -m opentelemetry_instrumentation_vllm_ascend steps --once --file {path}"


def summary(text: str) -> list[str]:
    """One line per vllm_profiling_ series: counters and gauges with their value, histograms with
    their count and mean."""
    lines: list[str] = []
    histograms: dict[tuple[str, str], dict[str, float]] = {}
    for name, labels, value in samples(text):
        if not name.startswith("vllm_profiling_") or name.endswith("_bucket"):
            continue
        label_text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for suffix in ("_count", "_sum"):
            if name.endswith(suffix):
                histograms.setdefault((name[: -len(suffix)], label_text), {})[suffix] = value
                break
        else:
            lines.append(f"{name}{{{label_text}}} {value:g}")
    for (name, label_text), parts in histograms.items():
        count = parts.get("_count", 0)
        mean = parts.get("_sum", 0) / count if count else 0
        lines.append(f"{name}{{{label_text}}} count={count:g} mean={mean:.6g}")
    return sorted(lines)


def steps_table(path: str) -> list[str]:
    """The ``steps --once --file PATH`` table (cli/steps.py, the real subcommand's parser) over one file."""
    from ..steps import add_parser, run_steps

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    out = io.StringIO()
    run_steps(parser.parse_args(["steps", "--once", "--file", path]), out)
    return out.getvalue().splitlines()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", default=os.path.join(tempfile.gettempdir(), "otel-vllm-ascend-tiny-llama"))
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=150)
    parser.add_argument("--keep-running", action="store_true", help="leave the server up until Ctrl-C")
    parser.add_argument(
        "--no-steps",
        dest="steps",
        action="store_false",
        help="do not write the per-step records (docs/steps.md) to a file nor show the steps table",
    )
    args = parser.parse_args(argv)

    print(f"building the tiny model in {args.model_dir} …", flush=True)
    tiny_model.build(args.model_dir)
    log = os.path.join(tempfile.gettempdir(), "otel-vllm-ascend-demo-server.log")
    env = {"OTEL_VLLM_ASCEND_PROMETHEUS_INTERVAL_MS": "1000"}
    steps_path = None
    if args.steps:
        # The one EngineCore's step records, a fresh file each run (the sink appends).
        steps_path = os.path.join(tempfile.gettempdir(), "otel-vllm-ascend-demo-steps-0.jsonl")
        if os.path.exists(steps_path):
            os.remove(steps_path)
        env[environment.STEPS_FILE] = steps_path.replace("-0.jsonl", "-{dp}.jsonl")
    server = Server(args.model_dir, log_path=log, env=env)
    print("starting: " + " ".join(server.command()), flush=True)
    print(f"(server log: {log}; start-up takes about a minute on 2 CPU cores)", flush=True)
    server.start()
    try:
        print(f"serving; /metrics endpoint: {server.url}/metrics", flush=True)
        print(f"sending {args.requests} {args.max_tokens}-token completions in one request …", flush=True)
        t = time.monotonic()
        server.batch([tiny_model.prompt(i) for i in range(args.requests)], args.max_tokens)
        print(f"done in {time.monotonic() - t:.1f} s; waiting for the per-process export interval …", flush=True)
        time.sleep(3)
        text = server.scrape()
        print()
        print(f"Summary (python -m opentelemetry_instrumentation_vllm_ascend summary --url {server.url}):")
        for line in summarize(text):
            print("  " + line)
        print()
        print(f"vllm_profiling_ series on {server.url}/metrics (histograms as count and mean; buckets left out):")
        for line in summary(text):
            print("  " + line)
        print()
        print(f"vLLM's own vllm:num_preemptions_total = {total(text, 'vllm:num_preemptions_total'):g}")
        if steps_path is not None:
            print()
            print(f"One record per engine step of that load ({STEPS_COMMAND.format(path=steps_path)}):")
            for line in steps_table(steps_path):
                print("  " + line)
        if args.keep_running:
            print("server left running; Ctrl-C to stop", flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
