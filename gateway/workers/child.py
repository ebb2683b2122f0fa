"""A worker process: `python -m gateway.workers.child`, started only by the supervisor.

It reads its settings and role (pickled, from the supervisor, which already
validated the settings) on stdin, so a config file edited since the gateway
started cannot make one worker differ from the others, and no secret appears
on a command line. Then it serves exactly as a single-process gateway does,
on the shared port, until SIGTERM.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys

from gateway.config import Settings
from gateway.workers.role import WorkerRole

_PR_SET_PDEATHSIG = 1


def die_with_supervisor(supervisor_pid: int) -> None:
    """Get SIGTERM (and drain) when the supervisor dies, even by SIGKILL.

    Otherwise an orphaned worker would keep serving, and keep the SQLite lock
    it shares, with no supervisor to stop it.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != supervisor_pid:  # it died before the call above
        os.kill(os.getpid(), signal.SIGTERM)


def main() -> int:
    settings, role = pickle.load(sys.stdin.buffer)
    sys.stdin.close()
    if not isinstance(settings, Settings) or not isinstance(role, WorkerRole):
        print("gateway worker: started without settings and a role", file=sys.stderr)
        return 2
    die_with_supervisor(role.supervisor_pid)
    from gateway.web.serve import run

    return run(settings, worker=role)


if __name__ == "__main__":
    sys.exit(main())
