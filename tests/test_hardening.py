"""A gateway that holds secrets keeps them out of core files and tells of a shared config file.

Security review, finding 8: no core-dump protection while secrets are held, and
no warning for a world-readable config with secrets. A gateway started as in
production with an admin token runs with core files off and is not dumpable
(no ptrace by other users); a config file that other users can read and that
holds a secret written out is named at start.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from harness import ADMIN_ENV, GatewayProcess, spawn

from gateway.web.hardening import warn_if_shared

CLOSED_UPSTREAM = "http://127.0.0.1:9"


def _core_limit(pid: int) -> str:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max core file size"):
            return " ".join(line.split()[4:6])
    raise AssertionError("no core limit line")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl are Linux's")
def test_a_gateway_with_secrets_writes_no_core_file(
    processes: list[GatewayProcess], tmp_path: Path
) -> None:
    gateway = spawn(processes, tmp_path, CLOSED_UPSTREAM, env=ADMIN_ENV)
    assert gateway.process is not None
    assert _core_limit(gateway.process.pid) == "0 0"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_protecting_secrets_makes_the_process_non_dumpable() -> None:
    """PR_GET_DUMPABLE after `protect_secrets` with an admin token: 0 (no ptrace by other
    users, no core file whatever the limit)."""
    code = (
        "import ctypes\n"
        "from gateway.config import Settings\n"
        "from gateway.web.hardening import protect_secrets\n"
        "protect_secrets(Settings(admin={'token': 'Zq4-7hL2pW9xR1vT8mK3nB6c'}))\n"
        "print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "0"


@pytest.mark.parametrize(
    ("text", "mode", "warned"),
    [
        ('[admin]\ntoken = "Zq4-7hL2pW9xR1vT8mK3nB6c"\n', 0o644, True),
        ('[admin]\ntoken = "Zq4-7hL2pW9xR1vT8mK3nB6c"\n', 0o600, False),
        ('[admin]\ntoken = ""\n', 0o644, False),
        (
            '[[routes]]\nname = "t"\nprefix = "/t"\nupstream = "http://127.0.0.1:9"\n'
            '[routes.upstream_headers]\nAuthorization = "Bearer ${TICKETS_API_TOKEN}"\n',
            0o644,
            False,
        ),
        ('[store]\nurl = "postgresql://gw:pw@db/gw"\n', 0o604, True),
    ],
)
def test_a_config_file_others_can_read_is_named_when_it_holds_a_secret(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str, mode: int, warned: bool
) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    path.chmod(mode)
    with caplog.at_level(logging.WARNING, logger="gateway.serve"):
        warn_if_shared(path)
    found = [r for r in caplog.records if getattr(r, "event", None) == "config_readable_by_others"]
    assert bool(found) is warned
    for record in found:
        assert "Zq4" not in record.getMessage()
        assert "pw@" not in record.getMessage()
