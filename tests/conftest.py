"""Shared fixtures. Scenarios are built with the public builder so tests exercise the same path as users."""

from __future__ import annotations

import pytest

from .helpers import make_scenario


@pytest.fixture
def cli_main():
    """The ``zeroplanner`` command in this process: ``cli_main(argv) -> exit status`` (output through capsys)."""
    from zeroplanner import cli

    return cli.main


@pytest.fixture
def scenario_factory():
    return make_scenario
