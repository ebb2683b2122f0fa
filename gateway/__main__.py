"""`python -m gateway`: the same CLI as the `idempotency-gateway` script."""

from __future__ import annotations

import sys

from gateway.cli import main

sys.exit(main())
