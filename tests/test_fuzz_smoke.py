"""The request-path fuzz target runs and holds its invariants, so `make fuzz` cannot rot."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from fuzz_request_path import ROOT, main


def test_fuzz_main_runs_for_three_seconds_with_hypothesis(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Three seconds of seeded hypothesis fuzzing find no broken invariant."""
    assert main(["--seconds", "3", "--engine", "hypothesis", "--seed", "8"]) == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    match = re.search(r": (\d+) requests, invariants held: .*well-formed (\d+)", summary)
    assert match, summary
    assert int(match[1]) >= 50
    assert int(match[2]) >= 1


def test_make_fuzz_command_line_runs() -> None:
    """`python tests/fuzz_request_path.py --seconds N` (atheris if installed) exits 0."""
    finished = subprocess.run(
        [sys.executable, "tests/fuzz_request_path.py", "--seconds", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert finished.returncode == 0, finished.stdout[-2000:] + finished.stderr[-4000:]
    assert "invariants held" in finished.stdout
