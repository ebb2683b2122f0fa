"""The Apache-2.0 licence both manifests name ships in the repository and in every package.

From the first-hour report: no LICENSE file anywhere, though `pyproject.toml`
and `package.json` say Apache-2.0. The repository keeps the text once at its
top; each package directory holds a copy (a package is built from its own
directory and cannot reach outside it), which must stay the same text.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from harness import ROOT

PACKAGES = (ROOT, ROOT / "clients" / "python", ROOT / "clients" / "typescript")


def test_every_package_directory_holds_the_apache_license() -> None:
    """LICENSE at the top is Apache-2.0's text; each package's copy is the same bytes."""
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License")
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    for package in PACKAGES:
        assert (package / "LICENSE").read_text() == text, package


def test_the_python_client_wheel_carries_the_license(tmp_path: Path) -> None:
    """`pip wheel` of the client puts LICENSE in the wheel's metadata."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp_path),
         str(ROOT / "clients" / "python")],
        check=True,
        timeout=600,
        capture_output=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("idempotency_gateway_client-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names), names


def test_the_typescript_package_carries_the_license() -> None:
    """`npm pack --dry-run` lists LICENSE among the tarball's files."""
    npm = shutil.which("npm")
    if npm is None:
        if os.environ.get("CI") == "true":
            pytest.fail("npm is not installed: CI machines have Node 20 and npm")
        pytest.skip("npm is not installed")
    packed = subprocess.run(
        [npm, "pack", "--dry-run", "--json", "--ignore-scripts"],
        cwd=ROOT / "clients" / "typescript",
        check=True,
        timeout=300,
        capture_output=True,
        text=True,
    )
    files = {entry["path"] for entry in json.loads(packed.stdout)[0]["files"]}
    assert "LICENSE" in files, files
