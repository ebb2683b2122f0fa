"""What a user's tools see of the installed packages.

From the first-hour report: after `pip install -e clients/python`, a user's
`mypy --strict` failed on `import idempotency_gateway_client`, because
setuptools' editable finder is an import hook that type checkers cannot follow.
Both projects now install editable as a plain path entry.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness import ROOT


def site_packages() -> Path:
    return Path(next(p for p in sys.path if p.endswith("site-packages")))


def test_editable_installs_are_plain_path_entries() -> None:
    """The `.pth` files name directories, not an import-hook module mypy cannot read."""
    entries = {
        pth.name: pth.read_text().strip()
        for pth in site_packages().glob("__editable__*idempotency_gateway*.pth")
    }
    assert len(entries) == 2, entries
    for name, text in entries.items():
        assert not text.startswith("import "), (name, text)
        assert Path(text).is_dir(), (name, text)


def test_a_users_mypy_strict_sees_the_clients_types(tmp_path: Path) -> None:
    """Outside the repository (so only the installed packages are found), strict mypy passes
    and sees real types, not `Any`."""
    user = tmp_path / "agent.py"
    user.write_text(
        "from idempotency_gateway_client import GatewayClient, derive_key\n"
        "\n"
        "key: str = derive_key('run-1', 0, 'c1')\n"
        "reveal_type(GatewayClient.lookup)\n"
    )
    finished = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--cache-dir",
            str(tmp_path / "cache"),
            "agent.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "import-not-found" not in finished.stdout
    # Followed into the package: the method's real signature, not `Any`.
    assert "idempotency_gateway_client._models.Operation | None" in finished.stdout
    assert str(ROOT) not in str(tmp_path)
