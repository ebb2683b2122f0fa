"""mypy caches for the tests that run mypy as a user would (on the docs' blocks, on a
program that imports the installed client).

A cold strict run spends most of its time on the standard library's stubs and the
dependencies' types: about 13 s of CPU for a four-line program. Each check keeps its own
cache in pytest's cache directory, and a cache that is still empty (a fresh clone) starts
from the one `make typecheck` (which `make test` runs first) left in the checkout: for that
four-line program the run then takes under a second. mypy checks each entry against its
module's file and the options before using it, so a seed can only save time, never hide
an error.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from harness import ROOT

TYPECHECK_CACHE = ROOT / ".mypy_cache"
"""What `make typecheck` leaves: strict, Python 3.11, as every check here."""


def kept_mypy_cache(request: pytest.FixtureRequest, name: str, tmp_path: Path) -> Path:
    """The cache directory of the check `name`, seeded when empty; under
    `-p no:cacheprovider`, a seeded one in `tmp_path`."""
    kept = getattr(request.config, "cache", None)
    cache = kept.mkdir(name) if kept is not None else tmp_path / name
    if (cache.exists() and any(cache.iterdir())) or not TYPECHECK_CACHE.is_dir():
        return cache
    shutil.copytree(TYPECHECK_CACHE, cache, dirs_exist_ok=True)
    return cache
