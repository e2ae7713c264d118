"""``zeroplanner probe [--benchmarks] [--json]``: what this machine has and does, for ``--cluster-from``.

CLI plugin (see ``PLUGINS`` in :mod:`zeroplanner.cli`). The probe runs in this process (a short-lived command, so
its CUDA context goes with it); torch is imported only when the command runs. Without CUDA it prints the clear
"no CUDA device: ..." result and exits 0 (a result, not an error); ``--benchmarks`` then measures the collectives on
CPU ranks with gloo. A bad option exits 2 with one line naming it.

Typical use::

    zeroplanner probe --benchmarks --json > probe.json
    zeroplanner recommend --model llama-2-13b --cluster-from probe.json --json
"""

from __future__ import annotations

import json
import sys

from .probe import add_probe_arguments, format_text, probe_from_args


def register(subparsers, add_scenario_options=None) -> None:
    """Add ``probe`` to the ``zeroplanner`` command (plugin protocol of :mod:`zeroplanner.cli`)."""
    parser = subparsers.add_parser(
        "probe",
        help="inventory this machine's GPUs, host RAM and disk; --benchmarks measures matmul, PCIe and collectives",
        description="Probe this machine: GPUs (memory free and total, compute capability, catalog match, peer "
        "access / NVLink), host RAM, free disk; with --benchmarks bf16 matmul TFLOP/s, host<->device GB/s and "
        "all-reduce / all-gather / reduce-scatter busbw with an alpha-beta fit. Save the --json output and pass it "
        "to any scenario command with --cluster-from.",
    )
    add_probe_arguments(parser)
    parser.add_argument("-o", "--output", default=None, help="also write the JSON result to this file")
    parser.set_defaults(func=run)


def run(args) -> int:
    """Handler: exit 0 with a result (with or without CUDA), 2 for a bad option."""
    try:
        result = probe_from_args(args)
    except ValueError as exc:
        print(f"zeroplanner probe: error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(result, indent=1)
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
        except OSError as exc:
            print(f"zeroplanner probe: error: --output {args.output!r}: {exc.strerror}", file=sys.stderr)
            return 2
    print(text if args.json else format_text(result))
    return 0
