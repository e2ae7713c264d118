"""``zeroplanner app``: serve the planner page (``notebooks/planner.ipynb``) with Voilà on 127.0.0.1.

Subcommand module of :mod:`zeroplanner.cli`: :func:`register` adds the ``app`` subcommand. Voilà is
imported only when the command runs, so the rest of the CLI works without the ``app`` extra; without it the command
prints an install hint and exits with status 2. Server settings (loopback address, kernel culling, the kernel cap
and its "planner is full" page) live in :mod:`zeroplanner.server` and :mod:`zeroplanner.server.voila_app`.

Also runnable directly: ``python -m zeroplanner.cli.app --port 8866 --no-browser``.
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
from pathlib import Path

import os

from ..server import (
    CULL_SETTINGS,
    DEFAULT_CONNECT_TIMEOUT_SECONDS,
    DEFAULT_MAX_KERNELS,
    DEFAULT_POOL_SIZE,
    DEFAULT_PORT,
    MAX_PENDING_PER_CLIENT_DEFAULT,
    MAX_POOL_SIZE,
    PLANNER_NOTEBOOK_CELLS,
    repo_notebook,
    voila_argv,
    voila_env,
)

INSTALL_HINT = "the app needs the 'app' extra: pip install 'zeroplanner[app]'"


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--port must be an integer between 1 and 65535, got {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"--port must be between 1 and 65535, got {port}")
    return port


def _bounded_int(option: str, low: int, high: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{option} must be an integer between {low} and {high}, "
                                             f"got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{option} must be between {low} and {high}, got {value}")
        return value
    return parse


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=_port, default=DEFAULT_PORT,
                        help=f"TCP port on 127.0.0.1 (default {DEFAULT_PORT})")
    parser.add_argument("--no-browser", action="store_true", help="do not open a web browser")
    parser.add_argument("--page", choices=("planner", "tutorial"), default="planner",
                        help="planner (default) or the ZeRO workshop tutorial (notebooks/zero_tutorial.ipynb)")
    parser.add_argument("--max-kernels", type=_bounded_int("--max-kernels", 1, 10000), default=DEFAULT_MAX_KERNELS,
                        help=f"most planner sessions (kernels) at once; more visitors get a 'planner is full' page "
                             f"(default {DEFAULT_MAX_KERNELS})")
    parser.add_argument("--cull-idle-seconds", type=_bounded_int("--cull-idle-seconds", 1, 86400),
                        default=int(CULL_SETTINGS["MappingKernelManager"]["cull_idle_timeout"]),
                        help="shut down a session's kernel after this many idle seconds with no page connected "
                             "(default %(default)s)")
    parser.add_argument("--pool", type=_bounded_int("--pool", 0, MAX_POOL_SIZE), default=DEFAULT_POOL_SIZE,
                        help="pre-executed kernels kept ready (default %(default)s; at most --max-kernels). Each "
                             "costs about 130 MiB at rest; for a room, set it to the number of people who open the "
                             "page in the same minute, so each gets a page that has already run its first plan "
                             "(docs/reliability.md)")
    parser.add_argument("--connect-timeout-seconds", type=_bounded_int("--connect-timeout-seconds", 1, 86400),
                        default=DEFAULT_CONNECT_TIMEOUT_SECONDS,
                        help="shut down a visitor's kernel when no page has connected to it this many seconds after "
                             "its page was sent, e.g. a request without a browser (default %(default)s)")
    parser.add_argument("--max-pending-per-client", type=_bounded_int("--max-pending-per-client", 0, 10000),
                        default=MAX_PENDING_PER_CLIENT_DEFAULT,
                        help="most sessions whose page has not connected yet for one client address; more get a "
                             "'too many pages opening' page that retries (default 0: half of --max-kernels). "
                             "Visitors behind one NAT or proxy share an address: raise it to the room's size")
    parser.add_argument("--log-timings", action="store_true",
                        help="log, per page, the server's seconds from the widget-state request to the first "
                             "widget state sent and from the page sent to its websocket (benchmarks/load_voila.py "
                             "reads them)")


def register(subparsers, add_scenario_options=None) -> None:
    """Add ``app`` to the ``zeroplanner`` command (:mod:`zeroplanner.cli` registers each module)."""
    parser = subparsers.add_parser(
        "app",
        help="open the interactive planner (Voilà page on 127.0.0.1)",
        description="Serve the planner page with Voilà on 127.0.0.1; idle kernels are culled and the number of "
                    "sessions is capped (--max-kernels); --pool kernels are kept pre-executed for "
                    "visitors arriving together.",
    )
    _add_options(parser)
    parser.set_defaults(func=run_app)


def page_path(page: str = "planner") -> Path:
    """The notebook behind ``--page``: the planner (:func:`notebook_path`) or the workshop tutorial, which ships
    with the repository (``notebooks/zero_tutorial.ipynb``). Raises FileNotFoundError when it is absent."""
    if page == "planner":
        return notebook_path()
    path = repo_notebook().parent / "zero_tutorial.ipynb"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: the tutorial ships with the repository checkout")
    return path


def notebook_path() -> Path:
    """The page to serve: the repository's ``notebooks/planner.ipynb`` when present, otherwise a copy written to a
    temporary folder from :data:`zeroplanner.server.PLANNER_NOTEBOOK_CELLS` (wheel installs)."""
    path = repo_notebook()
    if path.is_file():
        return path
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell(src) if kind == "markdown" else nbformat.v4.new_code_cell(src)
        for kind, src in PLANNER_NOTEBOOK_CELLS
    ]
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    folder = Path(tempfile.mkdtemp(prefix="zeroplanner-app-"))
    out = folder / "planner.ipynb"
    nbformat.write(nb, str(out))
    return out


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when ``host:port`` can be bound now (Voilà is told not to fall back to another port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def run_app(args: argparse.Namespace) -> int:
    """Run Voilà until interrupted. Returns the exit code (2 when the app extra is missing)."""
    try:
        from ..server.voila_app import ZeroplannerVoila
    except ImportError:
        print(f"zeroplanner app: error: {INSTALL_HINT}", file=sys.stderr)
        return 2
    max_kernels = getattr(args, "max_kernels", DEFAULT_MAX_KERNELS)
    pool = getattr(args, "pool", DEFAULT_POOL_SIZE)
    if pool > max_kernels:
        print(f"zeroplanner app: error: --pool {pool}: must be at most --max-kernels ({max_kernels}): pooled "
              "kernels count against the cap", file=sys.stderr)
        return 2
    if not port_is_free(args.port):
        print(f"zeroplanner app: error: --port {args.port}: already in use on 127.0.0.1; choose another with --port",
              file=sys.stderr)
        return 2
    cull_idle = getattr(args, "cull_idle_seconds", None)
    try:
        page = page_path(getattr(args, "page", "planner"))
    except FileNotFoundError as exc:
        print(f"zeroplanner app: error: --page: {exc}", file=sys.stderr)
        return 2
    argv = voila_argv(page, port=args.port, open_browser=not args.no_browser, max_kernels=max_kernels,
                      cull_idle_seconds=cull_idle, pool_size=pool, log_timings=getattr(args, "log_timings", False),
                      connect_timeout_seconds=getattr(args, "connect_timeout_seconds", None),
                      max_pending_per_client=getattr(args, "max_pending_per_client", None))
    print(f"zeroplanner app: serving http://127.0.0.1:{args.port}/ (Ctrl-C to stop)", file=sys.stderr, flush=True)
    os.environ.update(voila_env())
    ZeroplannerVoila.launch_instance(argv=argv)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zeroplanner app", description="Serve the planner page with Voilà.")
    _add_options(parser)
    return run_app(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
