"""Files are read only when they are regular files, within a size bound (:mod:`zeroplanner.files`).

Reproduces issue 33 item 2: before the fix ``zeroplanner check <FIFO>`` and ``zeroplanner estimate --hf-config
<FIFO>`` blocked in ``open()`` until killed, ``--hf-config`` on a symlink to ``/dev/zero`` read (and grew memory)
until killed, and a directory given to ``--hf-config`` or ``--cluster-from`` ended in a 23-line traceback (exit 1).
Each hostile path below runs the real command line in a subprocess with a 20 s timeout (so a regression fails
instead of hanging the suite) and an address-space cap (so a regression reading /dev/zero fails with MemoryError
instead of eating the machine's RAM); it must exit 2 with exactly one line on stderr naming the option, the path
and what the path is, no traceback, within 1 s of the same command line's start-up on a valid input.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from zeroplanner.files import MAX_RESULT_FILE_BYTES, InputFileError, file_kind, read_regular_file

TIMEOUT_S = 20.0
"""Subprocess timeout: the old code hung on a FIFO until killed; this turns that into a failure."""

SLACK_S = 1.0
"""A hostile path may take at most this much longer than the command line's start-up on a valid input."""

ADDRESS_SPACE_CAP = 4 * 2**30
"""RLIMIT_AS of each subprocess: the old code read /dev/zero into memory without end."""

LLAMA2_7B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000, "tie_word_embeddings": False}
"""Llama-2-7B's shape keys (6,738,415,616 parameters, docs/references.md s.3), as in tests/core/test_cli.py."""

PROBE = {"format": "zeroplanner-probe/1", "cuda_available": False}
"""The smallest probe result ``--cluster-from`` accepts (a host without GPUs)."""

DS_CONFIG = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}


def _cap_memory() -> None:  # runs in the child before exec
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_CAP, ADDRESS_SPACE_CAP))


def _cli(*argv: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "zeroplanner.cli", *argv], capture_output=True, text=True,
                          timeout=TIMEOUT_S, preexec_fn=_cap_memory, stdin=subprocess.DEVNULL)
    return proc, time.perf_counter() - started


# ----------------------------------------------------------------------------------------------------------------
# Hostile paths
# ----------------------------------------------------------------------------------------------------------------

def _fifo(tmp: Path) -> Path:
    path = tmp / "config.fifo"
    os.mkfifo(path)
    return path


def _symlink_to_dev_zero(tmp: Path) -> Path:
    path = tmp / "config.json"
    path.symlink_to("/dev/zero")
    return path


def _dev_zero(_tmp: Path) -> Path:
    return Path("/dev/zero")


def _directory(tmp: Path) -> Path:
    path = tmp / "a-directory"
    path.mkdir()
    return path


def _socket(tmp: Path) -> Path:
    path = tmp / "s.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))  # stays bound: the socket file is left in tmp_path (closed when collected)
    _SOCKETS.append(sock)
    return path


def _too_large(tmp: Path) -> Path:
    path = tmp / "huge.json"
    with open(path, "wb") as fh:
        fh.truncate(2_000_000)  # sparse: over every 1 MB limit without writing 2 MB
    return path


def _missing(tmp: Path) -> Path:
    return tmp / "no-such-file.json"


_SOCKETS: list[socket.socket] = []

HOSTILE = {
    "fifo": (_fifo, "is a FIFO (named pipe), not a regular file"),
    "symlink-to-dev-zero": (_symlink_to_dev_zero, "is a character device, not a regular file"),
    "dev-zero": (_dev_zero, "is a character device, not a regular file"),
    "directory": (_directory, "is a directory, not a regular file"),
    "socket": (_socket, "is a socket, not a regular file"),
    "too-large": (_too_large, "the limit is 1000000 bytes"),
    "missing": (_missing, "cannot read it (No such file or directory)"),
}


@pytest.fixture(autouse=True)
def _close_sockets():
    yield
    while _SOCKETS:
        _SOCKETS.pop().close()


@pytest.fixture(scope="module")
def valid_files(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("valid")
    files = {"config.json": LLAMA2_7B, "probe.json": PROBE, "ds.json": DS_CONFIG}
    for name, obj in files.items():
        (tmp / name).write_text(json.dumps(obj), encoding="utf-8")
    (tmp / "accelerate.yaml").write_text("num_machines: 1\nnum_processes: 8\n", encoding="utf-8")
    return {name: tmp / name for name in (*files, "accelerate.yaml")}


# (option named in the message, argv with PATH for the hostile path, argv of the same command on valid files)
COMMANDS = {
    "check": ("CONFIG", ["check", "PATH"], ["check", "{ds.json}"]),
    "estimate --hf-config": ("--hf-config", ["estimate", "--hf-config", "PATH"],
                             ["estimate", "--hf-config", "{config.json}"]),
    "recommend --cluster-from": ("--cluster-from", ["recommend", "--cluster-from", "PATH"],
                                 ["recommend", "--cluster-from", "{probe.json}"]),
    "estimate --cluster-from": ("--cluster-from", ["estimate", "--cluster-from", "PATH"],
                                ["estimate", "--cluster-from", "{probe.json}"]),
    "check --accelerate-config": ("--accelerate-config", ["check", "{ds.json}", "--accelerate-config", "PATH"],
                                  ["check", "{ds.json}", "--accelerate-config", "{accelerate.yaml}"]),
}


def _fill(argv: list[str], valid: dict[str, Path], path: Path | None = None) -> list[str]:
    out = []
    for a in argv:
        if a == "PATH":
            out.append(str(path))
        elif a.startswith("{"):
            out.append(str(valid[a[1:-1]]))
        else:
            out.append(a)
    return out


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_path_that_is_not_a_small_regular_file_is_one_line_exit_2(tmp_path, valid_files, command, kind):
    option, hostile_argv, valid_argv = COMMANDS[command]
    make, what = HOSTILE[kind]
    path = make(tmp_path)
    proc, wall = _cli(*_fill(hostile_argv, valid_files, path))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and proc.stderr.endswith("\n"), proc.stderr
    line = lines[0]
    assert line.startswith("zeroplanner: error: ") and option in line and repr(str(path)) in line, line
    assert what in line, line
    if wall > SLACK_S:  # compare with the start-up of the same command on valid files, measured now (same load)
        ok, startup = _cli(*_fill(valid_argv, valid_files))
        assert ok.returncode in (0, 1), ok.stderr
        assert wall < startup + SLACK_S, f"{wall:.2f} s on {kind} vs {startup:.2f} s on valid input"


def test_the_valid_inputs_still_work(valid_files):
    """The happy paths the hostile test compares against: a real config.json, probe result, DeepSpeed config and
    accelerate YAML, through the same command lines."""
    proc, _ = _cli("estimate", "--hf-config", str(valid_files["config.json"]), "--json")
    assert proc.returncode in (0, 1), proc.stderr
    assert json.loads(proc.stdout)["parameters"] == 6_738_415_616
    proc, _ = _cli("estimate", "--cluster-from", str(valid_files["probe.json"]), "--json")
    assert proc.returncode in (0, 1), proc.stderr
    assert json.loads(proc.stdout)["parameters"] > 0
    proc, _ = _cli("check", str(valid_files["ds.json"]), "--accelerate-config", str(valid_files["accelerate.yaml"]),
                   "--json")
    assert proc.returncode in (0, 1), proc.stderr
    obj = json.loads(proc.stdout)
    assert obj["scenario"]["zero"]["stage"] == 2 and obj["priced"]["gpus_per_node"] == 8


def test_a_symlink_to_a_regular_file_is_read(tmp_path, cli_main, capsys):
    target = tmp_path / "real.json"
    target.write_text(json.dumps(LLAMA2_7B), encoding="utf-8")
    link = tmp_path / "config.json"
    link.symlink_to(target)
    assert cli_main(["estimate", "--hf-config", str(link), "--json"]) in (0, 1)
    assert json.loads(capsys.readouterr().out)["parameters"] == 6_738_415_616


def test_a_deeply_nested_cluster_from_file_is_refused_before_parsing(tmp_path, cli_main, capsys):
    """'[' x 10,000 made json.loads recurse until RecursionError; the nesting pre-check (files.nesting_over, as for
    the HF config.json and DeepSpeed config readers) refuses it in one line, exit 2, without parsing."""
    path = tmp_path / "probe.json"
    path.write_text("[" * 10_000 + "]" * 10_000, encoding="utf-8")
    assert cli_main(["estimate", "--cluster-from", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "nested deeper than 20 levels" in err and "--cluster-from" in err


# ----------------------------------------------------------------------------------------------------------------
# The helper itself
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", [k for k in HOSTILE if k != "too-large"])
def test_read_regular_file_refuses(tmp_path, kind):
    make, what = HOSTILE[kind]
    path = make(tmp_path)
    started = time.perf_counter()
    with pytest.raises(InputFileError) as err:
        read_regular_file(path, 1_000_000, "--opt")
    assert time.perf_counter() - started < 1.0
    message = str(err.value)
    assert message == f"--opt {str(path)!r}: {err.value.problem}" and "\n" not in message
    assert what in message and err.value.what == "--opt" and err.value.path == str(path)
    assert isinstance(err.value, ValueError)  # callers that catch ValueError keep working


def test_read_regular_file_bounds(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 100)
    assert read_regular_file(path, 100, "f") == b"x" * 100  # exactly at the bound
    assert read_regular_file(str(path), 10**6, "f") == b"x" * 100
    with pytest.raises(InputFileError, match=r"is 100 bytes; the limit is 99 bytes \(note\)$"):
        read_regular_file(path, 99, "f", limit_note="note")
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert read_regular_file(empty, 0, "f") == b""


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux /proc")
def test_read_regular_file_stops_at_the_bound_when_st_size_lies():
    # /proc files are regular with st_size 0 but hold more: as a file that grew after the stat, at most
    # max_bytes + 1 bytes are read and it is refused
    assert os.stat("/proc/self/maps").st_size == 0
    with pytest.raises(InputFileError, match="is more than 10 bytes; the limit is 10 bytes"):
        read_regular_file("/proc/self/maps", 10, "maps")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_read_regular_file_refuses_an_unreadable_file(tmp_path):
    path = tmp_path / "secret.json"
    path.write_text("{}")
    path.chmod(0)
    with pytest.raises(InputFileError, match=r"cannot read it \(Permission denied\)"):
        read_regular_file(path, 100, "--hf-config")


def test_a_fifo_swapped_in_after_the_stat_does_not_block(tmp_path, monkeypatch):
    """The path checked by ``os.stat`` may be replaced before ``os.open``: with O_NONBLOCK opening a FIFO without
    a writer returns at once, and ``os.fstat`` of the open descriptor refuses it."""
    import zeroplanner.files as files

    regular = tmp_path / "regular"
    regular.write_text("{}")
    fifo = _fifo(tmp_path)
    real_stat = os.stat
    monkeypatch.setattr(files.os, "stat", lambda p, *a, **k: real_stat(regular) if str(p) == str(fifo)
                        else real_stat(p, *a, **k))
    outcome: list[BaseException | bytes] = []

    def call():
        try:
            outcome.append(read_regular_file(fifo, 100, "--opt"))
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome.append(exc)

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(5.0)
    if worker.is_alive():  # regression: blocked in open(); a writer unblocks it so the thread can end
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("read_regular_file blocked opening a FIFO")
    assert isinstance(outcome[0], InputFileError) and "FIFO" in str(outcome[0])


def test_file_kind_names():
    assert file_kind(stat.S_IFREG) == "regular file"
    assert file_kind(stat.S_IFDIR) == "directory"
    assert file_kind(stat.S_IFIFO) == "FIFO (named pipe)"
    assert file_kind(stat.S_IFCHR) == "character device"
    assert file_kind(stat.S_IFBLK) == "block device"
    assert file_kind(stat.S_IFSOCK) == "socket"
    assert file_kind(stat.S_IFLNK) == "symbolic link"


# ----------------------------------------------------------------------------------------------------------------
# The library readers behind the CLI
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["fifo", "symlink-to-dev-zero", "socket", "missing"])
def test_load_hf_config_and_load_probe_refuse(tmp_path, kind):
    from zeroplanner.catalog.hfconfig import load_hf_config
    from zeroplanner.probe import load_probe

    make, what = HOSTILE[kind]
    path = make(tmp_path)
    with pytest.raises(ValueError, match="not a readable file" if kind == "missing" else "not a regular file") as err:
        load_hf_config(path)
    assert what in str(err.value) and "HF config" in str(err.value)
    with pytest.raises(ValueError, match="cannot read" if kind == "missing" else "not a regular file") as err:
        load_probe(path)
    assert what in str(err.value) and "--cluster-from" in str(err.value)


def test_load_hf_config_still_reads_a_directory_holding_config_json(tmp_path):
    from zeroplanner.catalog.hfconfig import load_hf_config

    (tmp_path / "config.json").write_text(json.dumps(LLAMA2_7B), encoding="utf-8")
    assert load_hf_config(tmp_path)["hidden_size"] == 4096
    with pytest.raises(InputFileError, match="is a directory, not a regular file"):
        load_hf_config(_config_json_dir(tmp_path))  # a model folder whose config.json is itself a directory


def _config_json_dir(tmp: Path) -> Path:
    model = tmp / "model"
    (model / "config.json").mkdir(parents=True)
    return model


def test_rank_results_reads_bounded_regular_files(tmp_path):
    from zeroplanner.calibrate import rank_results

    (tmp_path / "run.rank0.json").write_text('{"step_seconds": 1.5}')
    (tmp_path / "run.rank1.error.json").write_text('{"error": "boom"}')
    assert rank_results(tmp_path, "run", 3, "error") == ([{"step_seconds": 1.5}], [(1, "boom"), (2, None)])
    (tmp_path / "run.rank2.json").mkdir()
    with pytest.raises(InputFileError, match="is a directory"):
        rank_results(tmp_path, "run", 3, "error")
    assert MAX_RESULT_FILE_BYTES == 16 * 2**20
