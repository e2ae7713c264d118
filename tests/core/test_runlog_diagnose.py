"""`zeroplanner diagnose`: the log reader on hostile input and each PyTorch OOM wording, the diagnosis of an OOM (its
phase against the timeline's, a change the planner says fits), and --write-calibration read back by --cluster-from.

The OOM lines are PyTorch's message formats (c10/cuda/CUDACachingAllocator.cpp of torch >= 2.1, 1.x-2.0 and <= 1.4,
as quoted in public threads: tests/data/run_logs/public); the comms rows are DeepSpeed 0.19.8's log_summary format
(deepspeed/utils/comms_logging.py). The figures in them are this test's inputs, not measurements.
"""

from __future__ import annotations

import json

import pytest

from zeroplanner.cli import main
from zeroplanner.runlog import MAX_LOG_BYTES, read_log

NEW = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB "
       "of which 1.23 GiB is free. Including non-PyTorch memory, this process has 77.91 GiB memory in use. Of the "
       "allocated memory 75.01 GiB is allocated by PyTorch, and 1.45 GiB is reserved by PyTorch but unallocated.")
OLD = ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.56 GiB "
       "already allocated; 3.44 MiB free; 14.63 GiB reserved in total by PyTorch)")
CACHED = ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 1; 11.17 GiB total capacity; 10.24 GiB "
          "already allocated; 11.81 MiB free; 426.00 KiB cached)")
BACKWARD = ['Traceback (most recent call last):', '  File "train.py", line 10, in <module>',
            '    engine.backward(loss)', '  File "deepspeed/runtime/engine.py", line 2100, in backward']
COMMS = """Comm. Op            Message Size        Count               Total Latency(ms)   Avg Latency(ms)     tput_avg (Gbps)     busbw_avg (Gbps)    
all_reduce
                    64.0 MB             40                  2000.00             50.00               10.74               18.79               
                    1.0 MB              40                  80.00               2.00                4.19                7.34                
"""


@pytest.mark.parametrize("line,wording,tried,total,alloc,unalloc", [
    (NEW, "new", 2 * 2**30, 79.15 * 2**30, 75.01 * 2**30, 1.45 * 2**30),
    (OLD, "1.x", 20 * 2**20, 15.78 * 2**30, 14.56 * 2**30, (14.63 - 14.56) * 2**30),
    (CACHED, "cached", 20 * 2**20, 11.17 * 2**30, 10.24 * 2**30, 426 * 2**10),
])
def test_three_pytorch_oom_wordings(line, wording, tried, total, alloc, unalloc):
    [o] = read_log("\n".join(BACKWARD + [line])).ooms
    assert o.wording == wording and o.phase == "backward"
    assert o.tried_bytes == tried and o.total_bytes == pytest.approx(total, abs=1)
    assert o.allocated_bytes == pytest.approx(alloc, abs=1)
    assert o.reserved_unallocated_bytes == pytest.approx(unalloc, abs=2**20 * 0.01 + 1)


def test_hostile_input_gives_a_partial_reading():
    junk = bytes(range(256)) * 64
    ansi = "\x1b[31m[rank0]: " + NEW + "\x1b[0m"
    interleaved = "\n".join([f"[rank{r}]: time (ms) | fwd: {10 + r}.00 | bwd: 20.00 | step: 5.00" for r in (0, 1)])
    text = (junk + b"\n" + ansi.encode() + b"\n" + interleaved.encode() + b"\n").decode("latin-1")
    r = read_log(text.encode("latin-1"))
    assert len(r.ooms) == 1 and r.ooms[0].total_bytes == int(round(79.15 * 2**30))
    assert [t.value["fwd"] for t in r.timers] == [10.0, 11.0]
    assert any("binary" in s for s in r.skipped)
    # a huge log: only its tail is read, and the reading says so
    big = ("x" * 100 + "\n") * (MAX_LOG_BYTES // 101 + 10) + NEW
    assert read_log(big).ooms and "only the last" in read_log(big).skipped[0]
    # two runs in one file: the last is read
    two = ("DeepSpeed info: version=0.19.8\n" + NEW + "\n" + "\n" * 60 + "DeepSpeed info: version=0.19.8\n"
           "time (ms) | fwd: 1.00 | bwd: 2.00 | step: 3.00\n")
    r = read_log(two)
    assert not r.ooms and r.timers and "earlier run" in r.skipped[0]
    with pytest.raises(TypeError):
        read_log(12)


def test_diagnose_an_oom_names_its_phase_and_a_change_that_fits(tmp_path, capsys):
    log = tmp_path / "oom.log"
    log.write_text("\n".join(BACKWARD + [NEW]))
    rc = main(["diagnose", str(log), "--model", "llama-2-13b", "--gpus-per-node", "8", "--stage", "2",
               "--checkpointing", "none", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and not out["healthy"]
    assert out["oom_phase"] == "backward" and out["predicted_peak_phase"] == "loss backward"
    assert "the same phase" in out["problems"][0]
    # one change, the faster of the two single changes that fit (optimizer offload at one CPU-Adam thread per rank,
    # or recomputing every layer)
    flags = {"offload_optimizer none -> cpu": ["--checkpointing", "none", "--offload-optimizer", "cpu"],
             "checkpointing none -> full": ["--checkpointing", "full"]}
    [change] = out["remedy"]["changes"]
    assert change in flags
    speeds = {}
    for name, extra in flags.items():
        rc = main(["estimate", "--model", "llama-2-13b", "--gpus-per-node", "8", "--stage", "2", *extra, "--json"])
        est = json.loads(capsys.readouterr().out)
        assert est["fits"] and rc == 0  # the planner says each change fits
        speeds[name] = est["tokens_per_second"]
    assert change == max(speeds, key=speeds.get)


def test_unreadable_logs_exit_2(tmp_path, capsys):
    empty = tmp_path / "empty.log"
    empty.write_text("nothing here\n")
    assert main(["diagnose", str(empty)]) == 2
    assert main(["diagnose", str(tmp_path)]) == 2  # a directory
    assert main(["diagnose", str(tmp_path / "missing.log")]) == 2
    err = capsys.readouterr().err
    assert err.count("zeroplanner: error:") == 3 and "Traceback" not in err


def test_write_calibration_is_read_by_cluster_from(tmp_path, capsys):
    log = tmp_path / "run.log"
    log.write_text("time (ms) | fwd: 400.00 | bwd: 800.00 | step: 100.00\n" * 3 + COMMS)
    cal = tmp_path / "cal.json"
    args = ["--model", "llama-2-7b", "--gpus-per-node", "8", "--stage", "2", "--json"]
    main(["diagnose", str(log), "--write-calibration", str(cal), *args])
    out = json.loads(capsys.readouterr().out)
    assert out["calibration_written"] == str(cal) and json.loads(cal.read_text())["world"]
    main(["estimate", *args])
    plain = json.loads(capsys.readouterr().out)
    main(["estimate", "--cluster-from", str(cal), *args])
    calibrated = json.loads(capsys.readouterr().out)
    # the log's all-reduce busbw (18.8 Gbit/s at 64 MB, 2.3 GB/s) is far below the catalog's NVLink figure
    assert calibrated["step_seconds"] > plain["step_seconds"]
    main(["recommend", *args])
    before = json.loads(capsys.readouterr().out)
    main(["recommend", "--cluster-from", str(cal), *args])
    after = json.loads(capsys.readouterr().out)
    assert after["estimate"]["tokens_per_second"] < before["estimate"]["tokens_per_second"]


def test_readme_shows_the_real_diagnose_output(capsys):
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "guide.md").read_text(encoding="utf-8")
    block = text.split("**Read your run's log.**", 1)[1].split("```text", 1)[1].split("```", 1)[0].strip("\n")
    command, *lines = block.splitlines()
    assert command.startswith("$ zeroplanner diagnose ")
    argv = command.split()[2:]
    argv[1] = str(root / argv[1])
    main(argv)
    assert capsys.readouterr().out.splitlines() == lines


def test_diagnose_without_a_model_says_it_compares_with_the_default(tmp_path, capsys):
    """A log does not say which model trained: with no --model / --hf-config / --params the comparison is with the
    default model, and the output says so up front and in a note (as `check` does), in text and JSON; naming the
    model drops both (a new user's trial read "outside the model's error" for a model they never named)."""
    from zeroplanner.inputs import DEFAULT_MODEL

    log = tmp_path / "oom.log"
    log.write_text("\n".join(BACKWARD + [NEW]))
    main(["diagnose", str(log), "--gpus-per-node", "8"])
    text = capsys.readouterr().out
    assert text.splitlines()[0].startswith(f"Diagnosed against: {DEFAULT_MODEL} (the default: no model named), ")
    assert f"note: no model named: a training log does not say which model it trained, so it is compared with the " \
           f"default {DEFAULT_MODEL}" in text
    main(["diagnose", str(log), "--gpus-per-node", "8", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["scenario"]["model_from"] == "default" and out["notes"][0].startswith("no model named")
    main(["diagnose", str(log), "--gpus-per-node", "8", "--model", "llama-2-13b", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["scenario"]["model_from"] == "--model" and not any("no model named" in n for n in out["notes"])
    main(["diagnose", str(log), "--gpus-per-node", "8", "--model", "llama-2-13b"])
    assert "(the default" not in capsys.readouterr().out.splitlines()[0]
