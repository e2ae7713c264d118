"""Command line: ``zeroplanner SUBCOMMAND ... [--json]``.

Contract for scripts: with ``--json`` each command prints exactly one JSON object on stdout, with ``inputs`` (the
resolved inputs it used, :func:`.common.inputs_json`) for estimate, recommend, config and check. Exit statuses
(:data:`.common.EXIT_FITS`, ``EXIT_DOES_NOT_FIT``, ``EXIT_BAD_INPUT``): 0 fits, 1 does not fit (check: or the
config has error findings), 2 bad input: one line ``zeroplanner: error: --option: message`` on stderr, never a
traceback.

One module per group of subcommands, each with ``register(subparsers, add_scenario_options)``; its handler
(``set_defaults(func=...)``) takes the parsed args and returns an exit status: :mod:`.plan` (estimate, recommend,
deepspeed-estimate, the catalog), :mod:`.config` (config, check), :mod:`.diagnose`, :mod:`.app`, :mod:`.probe`, :mod:`.calibrate`,
:mod:`.launch` (launch-script). What they share is in :mod:`.common`. Heavy dependencies (voila, torch,
deepspeed) are imported only when their command runs.
"""

from __future__ import annotations

import sys

from . import app, calibrate, config, diagnose, launch, plan, probe
from .common import UsageError, _Parser, add_scenario_options, fail, scenario_from_args

COMMANDS = (plan, config, diagnose, app, probe, calibrate, launch)
"""The subcommand modules, in the order ``--help`` lists them."""

__all__ = ["COMMANDS", "UsageError", "add_scenario_options", "build_parser", "fail", "main", "scenario_from_args"]


def build_parser():
    """The ``zeroplanner`` argument parser with every subcommand."""
    from .. import __version__

    parser = _Parser(prog="zeroplanner", description="Plan DeepSpeed ZeRO runs: memory, speed, config.")
    parser.add_argument("--version", action="version", version=f"zeroplanner {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for module in COMMANDS:
        module.register(sub, add_scenario_options)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        sys.stderr.write(f"zeroplanner: error: {exc}\n")
        return 2
    except BrokenPipeError:  # pragma: no cover - `| head`
        return 0
