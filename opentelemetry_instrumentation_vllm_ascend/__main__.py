"""``python -m opentelemetry_instrumentation_vllm_ascend <command>``: the commands are in ``cli/``."""

import sys

from .cli.main import main

if __name__ == "__main__":
    sys.exit(main())
