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

from .common import UsageError, _Parser, add_scenario_options, fail, scenario_from_args

COMMAND_MODULES = ("plan", "config", "diagnose", "app", "probe", "calibrate", "launch")
"""The subcommand modules (``zeroplanner.cli.<name>``), in the order ``--help`` lists them."""

SUBCOMMANDS = {
    **dict.fromkeys(("estimate", "recommend", "deepspeed-estimate", "models", "gpus", "networks"), "plan"),
    **dict.fromkeys(("config", "check"), "config"),
    "diagnose": "diagnose", "app": "app", "probe": "probe", "calibrate": "calibrate", "launch-script": "launch",
}
"""Subcommand -> the module that registers it. A command line naming one builds the parser of that module alone, so
``zeroplanner estimate`` imports neither the config checker nor the probes (benchmarks/bench_cli.py;
tests/core/test_cli.py checks this table against the modules' own ``register``)."""

__all__ = ["COMMANDS", "COMMAND_MODULES", "SUBCOMMANDS", "UsageError", "add_scenario_options", "build_parser", "fail",
           "main", "scenario_from_args"]


def _module(name: str):
    """The subcommand module ``name`` (one of :data:`COMMAND_MODULES`), imported by an import statement: nothing is
    imported by a computed name (docs/security.md section 3)."""
    if name == "plan":
        from . import plan as module
    elif name == "config":
        from . import config as module
    elif name == "diagnose":
        from . import diagnose as module
    elif name == "app":
        from . import app as module
    elif name == "probe":
        from . import probe as module
    elif name == "calibrate":
        from . import calibrate as module
    elif name == "launch":
        from . import launch as module
    else:
        raise ValueError(f"no subcommand module {name!r}; one of {COMMAND_MODULES}")
    return module


def __getattr__(name: str):
    if name == "COMMANDS":  # every subcommand module, imported
        return tuple(_module(m) for m in COMMAND_MODULES)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_parser(argv: list[str] | None = None):
    """The ``zeroplanner`` argument parser: every subcommand, or, when ``argv`` (without the program name) starts
    with a subcommand of :data:`SUBCOMMANDS`, the subcommands of that one module (the same parser for that command
    line: the top level has no option but ``--help`` and ``--version``, so the first word is the command)."""
    from .. import __version__

    parser = _Parser(prog="zeroplanner", description="Plan DeepSpeed ZeRO runs: memory, speed, config.")
    parser.add_argument("--version", action="version", version=f"zeroplanner {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    first = argv[0] if argv else None
    names = (SUBCOMMANDS[first],) if first in SUBCOMMANDS else COMMAND_MODULES
    for name in names:
        _module(name).register(sub, add_scenario_options)
    return parser


def entry() -> None:
    """The ``zeroplanner`` console command (and ``python -m zeroplanner.cli``): :func:`main` on ``sys.argv``, then
    exit with its status. Before exiting, ``gc.freeze()`` moves every object to the collector's permanent
    generation, so the interpreter's final collection does not walk the hundreds of thousands of objects torch,
    DeepSpeed and transformers leave (``check`` with the library check: 0.25-0.3 s of a 2.7 s run, measured on the
    2-core development machine with benchmarks/bench_cli.py). Output is flushed by the interpreter as usual; the
    command holds no other open file by then. Not done in :func:`main`, which tests and scripts call in-process."""
    import gc

    status = main(whole_process=True)
    gc.freeze()
    sys.exit(status)


def main(argv: list[str] | None = None, *, whole_process: bool = False) -> int:
    """Run one ``zeroplanner`` command (``argv`` without the program name; ``sys.argv[1:]`` when None) and return
    its exit status. ``whole_process``: this process exists only for the command (:func:`entry`), so ``check
    --hf-trainer`` loads transformers in a child process alongside DeepSpeed in this one
    (:class:`zeroplanner.deepspeed.hf_fill.FillChild`); in-process callers (tests, scripts, the app) fill in their
    own process, where the libraries stay loaded for the next call. The output is the same either way."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    args.whole_process = whole_process
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        sys.stderr.write(f"zeroplanner: error: {exc}\n")
        return 2
    except BrokenPipeError:  # pragma: no cover - `| head`
        return 0
