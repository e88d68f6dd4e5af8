"""``python -m opentelemetry_instrumentation_vllm_ascend check [--json]``

Prints, for the installed vLLM / vllm-ascend, each hook target as resolved, gated off by version,
dormant (vllm-ascend not installed) or missing, with the metrics it feeds. Exits 1 when a target that
should be hooked with these versions is missing."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opentelemetry_instrumentation_vllm_ascend", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    check_parser = sub.add_parser("check", help="which hook targets resolve in this environment")
    check_parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)

    from . import installer
    from .version import __version__

    rows = installer.check()
    vllm, ascend = installer.vllm_version(), installer.vllm_ascend_version()
    missing = [r for r in rows if r["status"] == installer.MISSING]
    if args.json:
        print(json.dumps({"package": __version__, "vllm": str(vllm) if vllm else None,
                          "vllm_ascend": str(ascend) if ascend else None, "targets": rows,
                          "ok": not missing}, indent=2))
    else:
        print(f"opentelemetry-instrumentation-vllm-ascend {__version__}; vLLM {vllm or 'not installed'}; "
              f"vllm-ascend {ascend or 'not installed'}")
        width = max(len(r["symbol"]) for r in rows)
        for r in rows:
            feeds = ", ".join(r["feeds"]) or "(context)"
            detail = f" — {r['detail']}" if r["detail"] else ""
            print(f"  {r['symbol']:<{width}}  {r['status']:<32} {feeds}{detail}")
        print(f"{len(rows) - len(missing)} of {len(rows)} targets fine; {len(missing)} missing")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
