"""`python -m tests.simulation`: see `tests.simulation.runner`."""

from __future__ import annotations

import sys

from tests.simulation.runner import main

sys.exit(main())
