"""``python -m zeroplanner.probe [--json] [--benchmarks]``: the probe in a process of its own (what
:func:`zeroplanner.probe.probe_in_subprocess` runs, so no CUDA context stays in the Voila kernel)."""

from __future__ import annotations

import argparse
import json
import sys

from ..cli.probe import add_probe_arguments, format_text, probe_from_args


def main(argv: list[str] | None = None) -> int:
    """``python -m zeroplanner.probe [--json] [--benchmarks]``: exit 0 with a result (also without CUDA), 2 for a
    bad option."""
    parser = argparse.ArgumentParser(prog="python -m zeroplanner.probe", description="Probe this machine's GPUs, "
                                     "host RAM, disk and (with --benchmarks) their measured throughput.")
    add_probe_arguments(parser)
    args = parser.parse_args(argv)
    if args.distributed:
        print("zeroplanner probe: error: --distributed: use 'zeroplanner probe --distributed -o REPORT' "
              "(python -m zeroplanner.cli probe ...), which writes the report", file=sys.stderr)
        return 2
    try:
        result = probe_from_args(args)
    except ValueError as exc:
        print(f"zeroplanner probe: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1) if args.json else format_text(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
