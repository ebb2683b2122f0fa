"""`make run`: the example tools and the gateway in front of them.

The ticket API (plain HTTP, :9000) and the MCP server (Streamable HTTP,
:9100/mcp) run as child processes (they are separate services in real life);
the gateway runs in this process with the given config, exactly as
`idempotency-gateway serve` would. Ctrl-C stops all three. A tool that cannot
start (its port taken) stops the demo with one line instead of leaving the
gateway in front of whatever holds that port.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import TextIO

from gateway.config import load_settings
from gateway.engine.errors import ConfigError
from gateway.web.serve import run


class ToolDidNotStart(Exception):
    """A child tool server exited or said something else than where it listens."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="config/gateway.toml")
    parser.add_argument("--tool-port", type=int, default=9000)
    parser.add_argument("--mcp-port", type=int, default=9100)
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"invalid configuration:\n{exc.detail}", file=sys.stderr)
        return 2
    try:
        with (
            _child("examples.tool_api", args.tool_port),
            _child("examples.mcp_server", args.mcp_port),
        ):
            return run(settings)
    except ToolDidNotStart as exc:
        print(f"make run: {exc}", file=sys.stderr)
        return 1


@contextlib.contextmanager
def _child(module: str, port: int) -> Iterator[None]:
    process = subprocess.Popen(
        [sys.executable, "-m", module, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stderr is not None
        line = process.stdout.readline().strip()
        if "listening" not in line:
            process.wait(10)
            reason = process.stderr.read().strip().splitlines()
            raise ToolDidNotStart(
                f"{module} did not start on port {port}: {reason[-1] if reason else line}"
            )
        print(line, flush=True)
        # From here on the child's output is passed on as it comes: a pipe nobody
        # reads fills up and stops the child.
        for pipe, sink in ((process.stdout, sys.stdout), (process.stderr, sys.stderr)):
            threading.Thread(target=_pass_on, args=(pipe, sink), daemon=True).start()
        yield
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(10)


def _pass_on(pipe: TextIO, sink: TextIO) -> None:
    for text in pipe:
        sink.write(text)
        sink.flush()


if __name__ == "__main__":
    sys.exit(main())
