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


_SESSION_START = __import__("time").time()


def pytest_sessionfinish(session, exitstatus):
    """Remove the DeepSpeed CPU all-reduce segments this session's engine launches left in /dev/shm: DeepSpeed
    never unlinks them (deepspeed/ops/csrc/cpu/comm/shm.cpp; see zeroplanner.calibrate._worker._unlink_shm_buffer,
    which the zeroplanner workers call themselves), ~66 MiB per rank per launch. Only files of this user created
    since the session started."""
    import glob
    import os

    from zeroplanner.calibrate._worker import SHM_BUFFER_PREFIX

    for path in glob.glob(f"{SHM_BUFFER_PREFIX}{os.getuid()}_*"):
        try:
            if os.stat(path).st_mtime >= _SESSION_START - 1:
                os.unlink(path)
        except OSError:
            pass
