"""The session's check for processes left running (tests/process_leaks.py), on pytest runs
of its own: a run that leaves one fails and names it, and nothing it left survives."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from process_leaks import _still_running

TESTS = Path(__file__).resolve().parent

PREAMBLE = """\
import subprocess
import process_leaks

process_leaks.GRACE_SECONDS = 0.5  # what is left here does not exit on its own
"""

LEAVES_A_CHILD = """
def test_leaves_a_child(tmp_path):
    child = subprocess.Popen(["sleep", "61"])
    open(PIDS, "a").write(f"{child.pid}\\n")
"""

LEAVES_AN_ORPHAN = """
def test_leaves_an_orphan():
    # The shell exits at once: its sleep is nobody's child in this run any more.
    started = subprocess.run(
        ["sh", "-c", "sleep 62 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True
    )
    open(PIDS, "a").write(started.stdout)
"""

ENDS_ITS_CHILD = """
def test_ends_its_child():
    child = subprocess.Popen(["sleep", "63"])
    child.terminate()
    child.wait()
"""


INNER_PLUGINS = ("-p", "process_leaks", "-p", "xdist.plugin", "-p", "no:cacheprovider")
"""The inner runs load the plugin under test and pytest-xdist, nothing else: the venv's
other plugins (hypothesis, schemathesis, langsmith, ...) have no part in what is checked
here and cost seconds of start-up in every run and every xdist worker."""


def run_pytest(tmp_path: Path, body: str, *options: str) -> tuple[int, str, list[int]]:
    """Run pytest with the plugin on a test file of `body`; its exit status, output and the
    pids its tests wrote down. In a process group of its own, ended whatever happens."""
    pids = tmp_path / "pids"
    pids.touch()
    source = PREAMBLE + f"PIDS = {str(pids)!r}\n" + body
    (tmp_path / "test_inner.py").write_text(source)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the rootdir: not this repository's
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest", *INNER_PLUGINS, *options],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(TESTS), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return process.returncode, output, [int(line) for line in pids.read_text().split()]


@pytest.mark.parametrize(
    ("body", "command", "why"),
    [(LEAVES_A_CHILD, "sleep 61", "descendant"), (LEAVES_AN_ORPHAN, "sleep 62", "orphan")],
    ids=["child", "orphan"],
)
def test_a_process_left_running_fails_the_run_and_is_killed(
    tmp_path: Path, body: str, command: str, why: str
) -> None:
    """A passing test that leaves a process running fails the run, which names and kills it."""
    status, output, pids = run_pytest(tmp_path, body)
    assert status == pytest.ExitCode.TESTS_FAILED, output
    assert "1 passed" in output, output
    assert "process(es) the tests started were still running; killed" in output, output
    assert f"pid {pids[0]} ({why}): {command}" in output, output
    assert not _still_running(pids), output


def test_an_xdist_workers_leftover_fails_the_run_at_the_controller(tmp_path: Path) -> None:
    """Under pytest-xdist, a worker's leftover is named by the controller and fails the run."""
    status, output, pids = run_pytest(tmp_path, LEAVES_A_CHILD, "-n", "1")
    assert status == pytest.ExitCode.TESTS_FAILED, output
    assert f"[gw0] pid {pids[0]} (descendant): sleep 61" in output, output
    assert not _still_running(pids), output


@pytest.mark.parametrize("options", [(), ("-n", "1")], ids=["alone", "xdist"])
def test_a_run_that_ends_its_processes_passes(tmp_path: Path, options: tuple[str, ...]) -> None:
    """A run whose tests end every process they start passes, xdist's workers included."""
    status, output, _ = run_pytest(tmp_path, ENDS_ITS_CHILD, *options)
    assert status == pytest.ExitCode.OK, output
    assert "still running" not in output, output
