"""What the Makefile does on a newcomer's machine, read from `make -n` (nothing is run).

From the first-hour report: `make clean` left `.hypothesis/` and the
`*.egg-info` directories behind, and `PYTHON ?= python3.11` failed where only
Python 3.12 or 3.13 is installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness import ROOT


def dry_run(*arguments: str, env: dict[str, str] | None = None) -> str:
    finished = subprocess.run(
        ["make", "--no-print-directory", "-n", *arguments],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return finished.stdout


def test_make_clean_removes_every_generated_directory() -> None:
    commands = dry_run("clean")
    for generated in (".hypothesis", "*.egg-info", "clients/python/*.egg-info", ".venv", "data"):
        assert generated in commands.split(), (generated, commands)


def test_the_venv_is_made_with_a_newer_python_when_3_11_is_missing(tmp_path: Path) -> None:
    """With only `python3.12` on PATH (no python3.11), `make` still creates the venv."""
    only = tmp_path / "bin"
    only.mkdir()
    (only / "python3.12").symlink_to(sys.executable)
    make_dir = Path(
        subprocess.run(["which", "make"], capture_output=True, text=True).stdout.strip()
    )
    (only / "make").symlink_to(make_dir)
    for tool in ("sh", "test", "touch"):
        found = subprocess.run(["which", tool], capture_output=True, text=True).stdout.strip()
        if found:
            (only / tool).symlink_to(found)
    commands = dry_run(
        "-B",
        f"VENV={tmp_path / 'venv'}",
        f"{tmp_path / 'venv'}/.installed",
        env={"PATH": str(only)},
    )
    assert f"{only / 'python3.12'} -m venv" in commands, commands


def test_make_run_installs_what_serving_needs_and_no_dev_tools(tmp_path: Path) -> None:
    """`make run` on a fresh clone: the gateway and the client, not pytest, mypy or hadolint."""
    venv = tmp_path / "venv"
    commands = dry_run("-B", f"VENV={venv}", "run")
    installs = [line for line in commands.splitlines() if " install " in line]
    assert installs, commands
    for line in installs:
        assert "[dev]" not in line, line
    # The demo's example MCP server needs the MCP SDK (the client's mcp extra).
    assert any("-e . -e 'clients/python[mcp]'" in line for line in installs), installs
    assert "examples.run_demo" in commands
    # `make test` adds the dev extra on top.
    tests = dry_run("-B", f"VENV={venv}", f"{venv}/.installed")
    assert "-e '.[dev]'" in tests, tests


def test_installing_prints_no_setuptools_deprecation_banner() -> None:
    """SPDX license strings: setuptools' `project.license` table warning is gone."""
    for pyproject in (ROOT / "pyproject.toml", ROOT / "clients/python/pyproject.toml"):
        text = pyproject.read_text()
        assert 'license = "Apache-2.0"' in text, pyproject
        assert "license = {" not in text, pyproject
