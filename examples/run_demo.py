"""`make run`: the example ticket API on :9000 and the gateway in front of it on :8080.

The tool API runs as a child process (it is a separate service in real life);
the gateway runs in this process with the given config, exactly as
`idempotency-gateway serve` would. Ctrl-C stops both.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence

from gateway.config import load_settings
from gateway.engine.errors import ConfigError
from gateway.web.serve import run


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="config/gateway.toml")
    parser.add_argument("--tool-port", type=int, default=9000)
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"invalid configuration:\n{exc.detail}", file=sys.stderr)
        return 2
    tool_api = subprocess.Popen(
        [sys.executable, "-m", "examples.tool_api", "--port", str(args.tool_port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert tool_api.stdout is not None
        print(tool_api.stdout.readline().strip(), flush=True)
        return run(settings)
    finally:
        tool_api.terminate()
        tool_api.wait(10)


if __name__ == "__main__":
    sys.exit(main())
