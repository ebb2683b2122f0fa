"""The examples in the gateway's docstrings run and print what they show.

They are documentation a reader trusts; one had drifted from the code
(`ServerSettings`' repr gained fields). Examples written as comments
(`>>> # ...`) illustrate without running.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import gateway

MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(gateway.__path__, prefix="gateway.")
    # Importing `python -m gateway`'s module runs the CLI.
    if info.name != "gateway.__main__"
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
