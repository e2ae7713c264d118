"""Reading a file the user (or the package itself) names by path: only a regular file, and only up to a size bound.

Pure standard library (no torch, no widgets): the core imports it. Every place the package reads a path it was
given goes through :func:`read_regular_file` -- the ``--hf-config`` / ``--cluster-from`` JSON, the ``check`` CONFIG
and its ``--accelerate-config`` YAML (:mod:`zeroplanner.cli`), :func:`zeroplanner.catalog.hfconfig.load_hf_config`,
:func:`zeroplanner.probe.load_probe`, and the per-rank result JSON the calibration and probe workers write
(:mod:`zeroplanner.calibrate`, :mod:`zeroplanner.probe.benchmarks`). The command line reads every user path
(those above, ``diagnose``'s LOG and ``--config``) through :func:`zeroplanner.cli.common.read_input_file`, which
turns :class:`InputFileError` into its one-line usage error (exit status 2).

Why: ``open(path).read()`` on a FIFO with no writer blocks forever, on ``/dev/zero`` (or a symlink to it) reads
forever, and on a directory raises ``IsADirectoryError``, which surfaced as a traceback. Here a
path is refused with one line unless it is a regular file no larger than the caller's bound.
"""

from __future__ import annotations

import os
import stat

__all__ = ["MAX_RESULT_FILE_BYTES", "InputFileError", "file_kind", "read_regular_file"]

MAX_RESULT_FILE_BYTES = 16 * 2**20
"""Largest per-rank result JSON (``*.rank<r>.json``, ``*.error.json``, ``collectives.json``) the package reads back
from its own workers, 16 MiB: a real one holds timings and memory counters (or one traceback), a few KiB."""

_READ_CHUNK = 2**20


class InputFileError(ValueError):
    """A path that cannot be read as a regular file within its bound. ``str()`` is one line,
    ``"<what> '<path>': <problem>"``; ``what`` (the option or the file's role), ``path`` and ``problem`` (starting
    with "is ...") are attributes, so a caller can phrase its own line. A ``ValueError``, so code that turns
    ``ValueError`` into a bad-input message keeps working."""

    def __init__(self, what: str, path: str, problem: str):
        self.what, self.path, self.problem = what, path, problem
        super().__init__(f"{what} {path!r}: {problem}")


def file_kind(mode: int) -> str:
    """What a ``st_mode`` is, in words: "regular file", "directory", "FIFO (named pipe)", "character device",
    "block device", "socket", "symbolic link", else "special file"."""
    for test, name in ((stat.S_ISREG, "regular file"), (stat.S_ISDIR, "directory"),
                       (stat.S_ISFIFO, "FIFO (named pipe)"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"), (stat.S_ISLNK, "symbolic link")):
        if test(mode):
            return name
    return "special file"


def _refuse_unless_regular(what: str, path: str, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(what, path, f"is a {file_kind(st.st_mode)}, not a regular file")


def _too_large(what: str, path: str, size_text: str, max_bytes: int, limit_note: str) -> InputFileError:
    note = f" ({limit_note})" if limit_note else ""
    return InputFileError(what, path, f"is {size_text} bytes; the limit is {max_bytes} bytes{note}")


def _open_regular(p: str, what: str, *, max_bytes: int | None = None, limit_note: str = "") -> tuple[int, os.stat_result]:
    """(an open descriptor, its fstat) of the regular file ``p``: ``os.stat`` first and a non-regular path (or, with
    ``max_bytes``, one larger) refused before opening; opened ``O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC`` and
    checked again on the descriptor. The caller closes it. Raises :class:`InputFileError`."""
    try:
        st = os.stat(p)
    except OSError as exc:
        raise InputFileError(what, p, f"is not a readable file: cannot read it ({exc.strerror or exc})") from None
    _refuse_unless_regular(what, p, st)
    if max_bytes is not None and st.st_size > max_bytes:
        raise _too_large(what, p, str(st.st_size), max_bytes, limit_note)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:  # permission denied, removed since the stat, a socket (ENXIO), ...
        raise InputFileError(what, p, f"is not a readable file: cannot read it ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        _refuse_unless_regular(what, p, st)
        if max_bytes is not None and st.st_size > max_bytes:
            raise _too_large(what, p, str(st.st_size), max_bytes, limit_note)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_regular_file(path: str | os.PathLike[str], max_bytes: int, what: str, *, limit_note: str = "") -> bytes:
    """The bytes of the regular file at ``path`` (symlinks followed), at most ``max_bytes`` bytes.

    ``max_bytes``: the caller's bound in bytes (e.g. :data:`zeroplanner.catalog.hfconfig.MAX_CONFIG_BYTES`, 1 MB;
    :data:`zeroplanner.probe.MAX_PROBE_FILE_BYTES`, 10 MiB). ``what`` names the path in the message: the CLI option
    (``"--hf-config"``) or the file's role (``"HF config"``). ``limit_note`` is appended to the size message in
    parentheses (e.g. ``"1 MB"``).

    Order: ``os.stat`` the path and refuse anything that is not a regular file before opening it (opening a device
    can have side effects: a tape rewinds, a watchdog arms); refuse ``st_size > max_bytes`` without reading; open
    with ``O_RDONLY | O_NONBLOCK | O_NOCTTY``, ``os.fstat`` the open descriptor and check both again (the path may
    have been replaced in between); read at most ``max_bytes + 1`` bytes and refuse if more came (the file may have
    grown, or report size 0 like ``/proc`` files). ``O_NONBLOCK``: if the path became a FIFO after the ``stat``,
    opening it for reading without a writer returns at once instead of blocking forever (open(2), fifo(7));
    on a regular file the flag has no effect. ``O_NOCTTY``: a terminal opened by mistake never becomes the
    process's controlling terminal.

    Raises :class:`InputFileError` (one line naming ``what``, the path and what it is) for a missing, unreadable
    (permission) or non-regular path -- directory, FIFO, character or block device, socket -- and for one larger
    than ``max_bytes``. Never blocks on the path and never reads more than ``max_bytes + 1`` bytes.
    """
    p = os.fspath(path)
    if isinstance(p, bytes):  # pragma: no cover - the package passes str paths
        p = os.fsdecode(p)
    fd, _ = _open_regular(p, what, max_bytes=max_bytes, limit_note=limit_note)
    try:
        chunks: list[bytes] = []
        total = 0
        while total <= max_bytes:
            chunk = os.read(fd, min(_READ_CHUNK, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as exc:  # EIO, EISDIR on an odd filesystem, ...
        raise InputFileError(what, p, f"is not a readable file: cannot read it ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if total > max_bytes:
        raise _too_large(what, p, f"more than {max_bytes}", max_bytes, limit_note)
    return b"".join(chunks)


def read_regular_file_tail(path: str | os.PathLike[str], max_bytes: int, what: str) -> tuple[bytes, int]:
    """(the last ``max_bytes`` bytes of the regular file at ``path``, how many bytes before them were not read).

    For files whose end matters and whose size has no bound, such as a training log. The same refusals as
    :func:`read_regular_file` (``os.stat`` first, non-regular paths refused before opening, opened with
    ``O_NONBLOCK | O_NOCTTY`` and checked again with ``os.fstat``), then a seek to ``size - max_bytes``. Raises
    :class:`InputFileError` for a missing, unreadable or non-regular path. Never reads more than ``max_bytes``."""
    p = os.fspath(path)
    fd, st = _open_regular(p, what)
    try:
        start = max(0, st.st_size - max_bytes)
        os.lseek(fd, start, os.SEEK_SET)
        chunks: list[bytes] = []
        total = 0
        while total < max_bytes:
            chunk = os.read(fd, min(_READ_CHUNK, max_bytes - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as exc:
        raise InputFileError(what, p, f"is not a readable file: cannot read it ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    return b"".join(chunks), start


def nesting_over(text: str, limit: int) -> bool:
    """Whether the JSON text nests objects/arrays deeper than ``limit`` (brackets outside strings), found in one
    pass without parsing: ``json.loads`` recurses once per level and ``'[' * 10000`` raised RecursionError.
    The pre-check of every JSON reader of user text (an HF config.json, a DeepSpeed config)."""
    level = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            level += 1
            if level > limit:
                return True
        elif ch in "]}":
            level -= 1
    return False
