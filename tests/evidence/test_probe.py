"""Tests of zeroplanner.probe: the no-CUDA path for real (this machine has no CUDA; no mocks of torch), the
collective benchmark for real on 2 and 4 CPU ranks with gloo, the alpha-beta fit, cluster_from_probe feeding the
cost model, calibration, and ``gpu``-marked checks that run only on a CUDA machine (scripts/gpu_probe.sh)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from zeroplanner import probe  # noqa: E402
import zeroplanner.probe.hardware  # noqa: E402,F401  (probe.hardware._uuid_key)
from zeroplanner.probe import (  # noqa: E402
    benchmark_collectives,
    benchmark_host_transfer,
    benchmark_matmul,
    busbw_factor,
    cluster_changes,
    cluster_from_probe,
    fit_alpha_beta,
    inventory,
    load_probe,
    match_catalog,
    parse_nvlink_status,
    probe_in_subprocess,
)

CUDA = torch.cuda.is_available()
no_cuda_only = pytest.mark.skipif(CUDA, reason="tests the no-CUDA path; this machine has CUDA")
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")

# Small sizes and few iterations: the test machine has 2 shared cores (keep both runs well under 60 s).
TEST_MESSAGE_BYTES = (2**14, 2**17, 2**20, 2**22)


def _core():
    """(estimate, default_scenario, replace) or skip while the core is not in place."""
    try:
        from zeroplanner.costmodel import estimate
        from zeroplanner.scenarios import default_scenario
        from zeroplanner.specs import replace
    except ImportError as exc:  # pragma: no cover - before the core lands
        pytest.skip(f"core cost model not available yet: {exc}")
    return estimate, default_scenario, replace


# ------------------------------------------------------------------------------------------------------------
# Import hygiene
# ------------------------------------------------------------------------------------------------------------
def test_probe_modules_import_without_torch():
    code = (
        "import sys; import zeroplanner.probe, zeroplanner.cli.probe, zeroplanner.probe._worker; "
        "bad = [m for m in ('torch', 'ipywidgets', 'bqplot') if m in sys.modules]; print(bad); "
        "sys.exit(1 if bad else 0)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


# ------------------------------------------------------------------------------------------------------------
# The no-CUDA path, for real
# ------------------------------------------------------------------------------------------------------------
@no_cuda_only
def test_inventory_without_cuda_is_a_clear_result():
    result = inventory()
    assert result["cuda_available"] is False
    assert result["message"].startswith("no CUDA device: ")
    assert "torch.cuda.is_available() is False" in result["message"]
    assert result["gpu_count"] == 0 and result["gpus"] == [] and result["peer_access"] == []
    assert result["format"] == probe.PROBE_FORMAT
    json.dumps(result)  # serialisable as is


def test_host_inventory_matches_the_kernel():
    host = probe.host_inventory()
    # sysinfo(2).totalram, which os.sysconf's physical pages come from, is /proc/meminfo's MemTotal
    assert host["ram_total_bytes"] == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 < host["ram_available_bytes"] <= host["ram_total_bytes"]
    assert 0 < host["disk_free_bytes"] <= host["disk_total_bytes"]
    stat = os.statvfs(host["disk_path"])
    assert host["disk_total_bytes"] == stat.f_blocks * stat.f_frsize
    assert host["cpu_count"] == os.cpu_count()
    with pytest.raises(FileNotFoundError, match="nvme_path"):
        probe.host_inventory("/nonexistent/zeroplanner-probe")


@no_cuda_only
def test_gpu_benchmarks_without_cuda_say_so():
    for result in (benchmark_matmul(), benchmark_host_transfer()):
        assert result["ok"] is False
        assert result["message"].startswith("no CUDA device: ")
    nccl = benchmark_collectives(backend="nccl")
    assert nccl["ok"] is False and nccl["message"].startswith("no CUDA device: ")


@no_cuda_only
def test_probe_in_subprocess_without_cuda():
    result = probe_in_subprocess(timeout_seconds=60)
    assert result["cuda_available"] is False
    assert result["message"].startswith("no CUDA device: ")
    assert result["gpus"] == []
    assert result["host"]["ram_total_bytes"] == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@no_cuda_only
def test_run_probe_bounds_its_benchmarks():
    # a 14 s bound leaves the torchrun launch at most 14 - 5 = 9 s, under the 10 s minimum: the collective step
    # says it was skipped instead of outliving the bound (probe_in_subprocess passes its timeout less 3 s this way)
    result = probe.run_probe(benchmarks=True, timeout_seconds=14)
    assert result["cuda_available"] is False
    bench = result["benchmarks"]
    assert bench["matmul"][0]["message"].startswith("no CUDA device: ")
    assert bench["host_transfer"]["message"].startswith("no CUDA device: ")
    assert bench["collectives"] == {"ok": False,
                                    "message": "collective benchmark skipped: under 10 s of the 14 s timeout left"}


def test_probe_in_subprocess_timeout_is_a_result_not_an_exception():
    # 0.05 s is less than Python needs to import torch in the child, so this really times out
    result = probe_in_subprocess(timeout_seconds=0.05)
    assert result == {"cuda_available": False, "message": "probe timed out after 0.05 s"}


@no_cuda_only
def test_module_cli_json_without_cuda(tmp_path):
    run = subprocess.run([sys.executable, "-m", "zeroplanner.probe", "--json", "--nvme-path", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["cuda_available"] is False and result["message"].startswith("no CUDA device: ")
    assert result["host"]["disk_path"] == str(tmp_path)


@pytest.mark.parametrize(
    "argv, option",
    [(["--ranks", "1"], "--ranks"), (["--nvme-path", "/nonexistent/x"], "--nvme-path"),
     (["--budget-seconds", "0"], "--budget-seconds"), (["--timeout-seconds", "0.5"], "--timeout-seconds")],
)
def test_module_cli_bad_option_exits_2_with_one_line(argv, option):
    run = subprocess.run([sys.executable, "-m", "zeroplanner.probe", *argv], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 2
    assert run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and option in lines[0] and "Traceback" not in run.stderr


@no_cuda_only
def test_cli_plugin_without_cuda(tmp_path, capsys):
    import argparse

    from zeroplanner.cli import probe as cli_probe

    parser = argparse.ArgumentParser(prog="zeroplanner")
    cli_probe.register(parser.add_subparsers(dest="command"), None)
    out_file = tmp_path / "probe.json"
    args = parser.parse_args(["probe", "--json", "-o", str(out_file)])
    assert args.func(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["cuda_available"] is False
    assert json.loads(out_file.read_text()) == printed
    args = parser.parse_args(["probe"])  # text for people
    assert args.func(args) == 0
    assert capsys.readouterr().out.startswith("no CUDA device: ")


def test_console_command_runs_the_probe():
    run = subprocess.run([sys.executable, "-m", "zeroplanner.cli", "probe", "--json"], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["cuda_available"] is CUDA


def test_cluster_from_option_on_scenario_commands(tmp_path):
    try:
        from zeroplanner import cli
    except ImportError:
        pytest.skip("zeroplanner.cli not written yet")
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(inventory()))
    code = cli.main(["estimate", "--cluster-from", str(path), "--json"])
    assert code == 0
    bad = tmp_path / "bad.json"
    bad.write_text('{"a": 1}')
    run = subprocess.run([sys.executable, "-m", "zeroplanner.cli", "estimate", "--cluster-from", str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--cluster-from" in run.stderr and "not a probe result" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------------------------------------------------
# Collectives for real: gloo on 2 and 4 CPU ranks
# ------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=[2, 4], ids=["2-ranks", "4-ranks-as-2-nodes"])
def gloo_run(request):
    ranks = request.param
    # 4 ranks are split into 2 pretend nodes of 2 so the inter-node path (world vs intra-node groups) runs too
    result = benchmark_collectives(ranks=ranks, backend="gloo", message_bytes=TEST_MESSAGE_BYTES, iterations=3,
                                   budget_seconds=25, timeout_seconds=150, ranks_per_node=2 if ranks == 4 else 0)
    assert result["ok"], result["message"]
    return ranks, result


def _expected_factor(collective: str, n: int) -> float:
    # nccl-tests doc/PERFORMANCE.md (docs/references.md section 6), written out independently of the code under test
    return {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n}[collective]


@pytest.mark.engine
def test_gloo_collectives_busbw_follows_nccl_tests(gloo_run):
    ranks, result = gloo_run
    assert result["backend"] == "gloo" and result["device"] == "cpu"
    assert result["world_size"] == ranks and result["truncated"] is False
    groups = [("world", ranks)] + ([("intra_node", 2)] if ranks == 4 else [])
    assert result["nodes"] == (2 if ranks == 4 else 1)
    for key, n in groups:
        records = result[key]
        assert {(r["collective"]) for r in records} == {"all_reduce", "all_gather", "reduce_scatter"}
        for collective in ("all_reduce", "all_gather", "reduce_scatter"):
            rows = [r for r in records if r["collective"] == collective]
            sizes = [r["bytes"] for r in rows]
            assert len(rows) == len(TEST_MESSAGE_BYTES)
            assert sizes == sorted(set(sizes)), "bytes strictly increasing"
            for r, asked in zip(rows, TEST_MESSAGE_BYTES):
                assert r["ranks"] == n
                assert 0 < r["bytes"] <= asked and r["bytes"] % (4 * n) == 0  # n equal fp32 chunks
                assert r["seconds"] > 0 and r["busbw_gb_per_s"] > 0
                assert r["algbw_gb_per_s"] == pytest.approx(r["bytes"] / r["seconds"] / 1e9, rel=1e-12)
                assert r["busbw_gb_per_s"] == pytest.approx(
                    r["algbw_gb_per_s"] * _expected_factor(collective, n), rel=1e-12)


@pytest.mark.engine
def test_gloo_alpha_beta_fit(gloo_run):
    ranks, result = gloo_run
    for key, fits in result["fits"].items():
        n = ranks if key == "world" else 2
        for collective, fit in fits.items():
            assert fit["ranks"] == n and fit["points"] == len(TEST_MESSAGE_BYTES)
            if not fit["ok"]:  # noise can hide a collective's bandwidth on 2 shared cores; it must say so
                assert "not identifiable" in fit["message"]
                continue
            assert fit["alpha_seconds"] >= 0 and fit["beta_bytes_per_second"] > 0
            assert fit["busbw_gb_per_s"] == pytest.approx(
                fit["beta_bytes_per_second"] / 1e9 * _expected_factor(collective, n), rel=1e-12)
            # the asymptote bounds every measured point from above only if alpha >= 0: t >= m / beta
            rows = [r for r in result[key] if r["collective"] == collective]
            predicted = [fit["alpha_seconds"] + r["bytes"] / fit["beta_bytes_per_second"] for r in rows]
            worst = max(abs(p - r["seconds"]) / r["seconds"] for p, r in zip(predicted, rows))
            assert worst == pytest.approx(fit["max_relative_error"], rel=1e-9)
    # all-reduce is the collective the planner uses; it must be identifiable over 16 KiB .. 4 MiB when every rank
    # has a core (4 ranks on this 2-core machine timed sizes out of order in 2 of 3 full-suite runs: the loop
    # above then checks the fit says "not identifiable")
    if ranks <= (os.cpu_count() or 1):
        fit = result["fits"]["world"]["all_reduce"]
        if not fit["ok"]:  # one noisy run on shared cores (seen once in 4 full-suite runs): measure again, longer
            again = benchmark_collectives(ranks=ranks, backend="gloo", message_bytes=TEST_MESSAGE_BYTES,
                                          iterations=10, budget_seconds=40, timeout_seconds=150)
            fit = again["fits"]["world"]["all_reduce"]
        assert fit["ok"], fit["message"]


@pytest.mark.engine
def test_gloo_fit_is_accepted_by_the_planner(gloo_run):
    estimate, default_scenario, replace = _core()
    ranks, result = gloo_run
    scenario = default_scenario()
    probe_result = {"cuda_available": False, "message": "no CUDA device: test", "gpus": [],
                    "host": probe.host_inventory(), "benchmarks": {"collectives": result}}
    cluster = cluster_from_probe(probe_result, scenario.cluster)
    where = "intra_node" if ranks == 4 else "world"
    fit = result["fits"][where]["all_reduce"]
    n = fit["ranks"]
    if not fit["ok"]:  # noise hid the bandwidth on shared cores (test_gloo_alpha_beta_fit): the catalog's is kept
        pytest.skip(f"{where} all-reduce not identifiable in this run: {fit['message']}")
    assert cluster.gpu.intra_node_busbw_gb_per_s == pytest.approx(fit["busbw_gb_per_s"])
    if fit["alpha_seconds"] > 0:
        assert cluster.gpu.intra_node_latency_seconds == pytest.approx(fit["alpha_seconds"] / (2 * (n - 1)))
    assert cluster.cpu_memory_bytes == probe_result["host"]["ram_available_bytes"]
    if ranks == 4:  # the world ring across the two pretend nodes sets the network
        # cluster_from_probe's rule: efficiency = busbw / nominal, and above the nominal rate the link rate is
        # raised to the measured one, so the node busbw the planner prices is the measured busbw either way
        # (a fast loopback on another host measured 479 GB/s, well above the catalog's 25 GB/s network)
        wfit = result["fits"]["world"]["all_reduce"]
        if not wfit["ok"]:  # noise hid the world bandwidth (test_gloo_alpha_beta_fit reports it): network kept
            assert cluster.network == scenario.cluster.network
        else:
            nominal = scenario.cluster.network.link_gbps * 1e9 / 8 * scenario.cluster.network.nics_per_node
            measured = wfit["busbw_gb_per_s"] * 1e9
            assert cluster.network.node_busbw_bytes_per_second == pytest.approx(measured)
            assert cluster.network.efficiency == pytest.approx(min(1.0, measured / nominal))
    calibrated = estimate(replace(scenario, cluster=cluster))
    catalog_estimate = estimate(scenario)
    assert math.isfinite(calibrated.step_seconds) and calibrated.step_seconds > 0
    # loopback gloo (about 1 GB/s here) is far below the catalog's NVLink busbw, so communication takes longer
    assert cluster.gpu.intra_node_busbw_gb_per_s < scenario.cluster.gpu.intra_node_busbw_gb_per_s
    assert calibrated.communication.seconds_per_step > catalog_estimate.communication.seconds_per_step


def test_collectives_need_two_ranks():
    result = benchmark_collectives(ranks=1, backend="gloo")
    assert result["ok"] is False and "at least 2 ranks" in result["message"]
    with pytest.raises(ValueError, match="backend"):
        benchmark_collectives(backend="mpi")


# ------------------------------------------------------------------------------------------------------------
# Pure pieces
# ------------------------------------------------------------------------------------------------------------
def test_busbw_factor_nccl_tests():
    # nccl-tests PERFORMANCE.md: 8 ranks -> all-reduce 2*7/8, all-gather / reduce-scatter 7/8
    assert busbw_factor("all_reduce", 8) == 1.75
    assert busbw_factor("all_gather", 8) == 0.875
    assert busbw_factor("reduce_scatter", 8) == 0.875
    assert busbw_factor("all_reduce", 1) == 0.0
    with pytest.raises(ValueError, match="collective"):
        busbw_factor("broadcast", 8)
    with pytest.raises(ValueError, match="ranks"):
        busbw_factor("all_reduce", 0)


def test_alpha_beta_fit_recovers_a_noise_free_model():
    alpha, beta, n = 25e-6, 90e9, 8
    sizes = [2**k for k in range(12, 31, 2)]
    rows = [{"collective": "all_reduce", "ranks": n, "bytes": m, "seconds": alpha + m / beta} for m in sizes]
    fit = fit_alpha_beta(rows)["all_reduce"]
    assert fit["ok"]
    assert fit["alpha_seconds"] == pytest.approx(alpha, rel=1e-9)
    assert fit["beta_bytes_per_second"] == pytest.approx(beta, rel=1e-9)
    assert fit["busbw_gb_per_s"] == pytest.approx(beta / 1e9 * 1.75, rel=1e-9)
    assert fit["max_relative_error"] < 1e-9


def test_alpha_beta_fit_constrains_alpha_and_reports_flat_times():
    # times proportional to size minus a constant: the unconstrained intercept is negative -> alpha refitted to 0
    rows = [{"collective": "all_gather", "ranks": 2, "bytes": m, "seconds": m / 1e9 - 1e-7} for m in (1e3, 1e5, 1e7)]
    fit = fit_alpha_beta(rows)["all_gather"]
    assert fit["ok"] and fit["alpha_seconds"] == 0.0 and fit["beta_bytes_per_second"] > 0
    flat = [{"collective": "all_reduce", "ranks": 2, "bytes": m, "seconds": t}
            for m, t in ((1e3, 2e-3), (1e6, 1e-3))]
    fit = fit_alpha_beta(flat)["all_reduce"]
    assert not fit["ok"] and "not identifiable" in fit["message"] and fit["busbw_gb_per_s"] is None
    single = fit_alpha_beta([{"collective": "all_reduce", "ranks": 2, "bytes": 8, "seconds": 1.0}])
    assert not single["all_reduce"]["ok"]


# Public CUDA device names (as torch.cuda.get_device_properties(i).name prints them) against a small catalog
TOY_CATALOG = [("A10", 24 * 2**30), ("A100-40GB", 40 * 2**30), ("A100-80GB", 80 * 2**30),
               ("RTX-4090", 24 * 2**30), ("L40S", 48 * 2**30), ("H100-80GB", 80 * 2**30)]


@pytest.mark.parametrize(
    "device, memory_gib, expected, memory_matches",
    [
        ("NVIDIA A10", 22.1, "A10", True),
        ("NVIDIA A100-SXM4-40GB", 39.4, "A100-40GB", True),
        ("NVIDIA A100-SXM4-80GB", 79.1, "A100-80GB", True),
        ("NVIDIA A100 80GB PCIe", 79.1, "A100-80GB", True),
        ("NVIDIA GeForce RTX 4090", 23.6, "RTX-4090", True),
        ("NVIDIA H100 80GB HBM3", 79.1, "H100-80GB", True),
        ("NVIDIA L40", 44.4, None, None),          # an L40 is not an L40S
        ("Tesla V100-SXM2-32GB", 31.7, None, None),  # not in this catalog
        ("NVIDIA H100 NVL", 93.0, "H100-80GB", False),  # same chip, more memory: measured memory is used
    ],
)
def test_match_catalog(device, memory_gib, expected, memory_matches):
    got = match_catalog(device, int(memory_gib * 2**30), TOY_CATALOG)
    if expected is None:
        assert got is None
    else:
        assert got == {"name": expected, "memory_matches": memory_matches}


def test_match_catalog_uses_the_real_catalog():
    from zeroplanner import catalog

    for name in catalog.gpu_names():
        spec = catalog.gpu(name)
        # a device called by its catalog name, with 1% less memory than nominal (CUDA reserves some), matches it
        got = match_catalog(f"NVIDIA {name}", int(spec.memory_bytes * 0.99))
        assert got is not None and got["memory_matches"], name
        assert catalog.gpu(got["name"]).memory_bytes == spec.memory_bytes


def test_parse_nvlink_status():
    # format of `nvidia-smi nvlink --status` on an H100 PCIe pair (public output: links at 26.562 GB/s,
    # unused links "<inactive>"); "0 GB/s" is how a down link prints
    text = (
        "GPU 0: NVIDIA H100 PCIe (UUID: GPU-6968dfc2-d444-d92c-c36b-6abe53445cb9)\n"
        "\t Link 0: 26.562 GB/s\n\t Link 1: 26.562 GB/s\n\t Link 2: <inactive>\n\t Link 3: 26.562 GB/s\n"
        "GPU 1: NVIDIA H100 PCIe (UUID: GPU-00000000-0000-0000-0000-000000000001)\n"
        "\t Link 0: 26.562 GB/s\n\t Link 1: 0 GB/s\n"
    )
    got = parse_nvlink_status(text)
    assert got[0]["active_links"] == 3 and got[0]["gb_per_s"] == pytest.approx(3 * 26.562)
    assert got[1]["active_links"] == 1 and got[1]["gb_per_s"] == pytest.approx(26.562)
    # keyed for matching with torch's props.uuid (no "GPU-" prefix), since NVML and CUDA order GPUs differently
    assert got[0]["uuid"] == "6968dfc2-d444-d92c-c36b-6abe53445cb9"
    assert parse_nvlink_status("GPU 3: NVIDIA A100-SXM4-80GB\n\t Link 0: 25 GB/s\n")[3] == {
        "uuid": "", "active_links": 1, "gb_per_s": 25.0}
    assert parse_nvlink_status("NVML: Unable to find NVLink") == {}


# ------------------------------------------------------------------------------------------------------------
# cluster_from_probe
# ------------------------------------------------------------------------------------------------------------
def test_cluster_from_a_real_no_cuda_probe_changes_host_only():
    estimate, default_scenario, replace = _core()
    base = default_scenario().cluster
    result = inventory()
    cluster = cluster_from_probe(result, base)
    assert cluster.cpu_memory_bytes == result["host"]["ram_available_bytes"]
    assert cluster.nvme_bytes == result["host"]["disk_free_bytes"]
    if not result["cuda_available"]:
        assert cluster.gpu == base.gpu and cluster.gpus_per_node == base.gpus_per_node
    estimate(replace(default_scenario(), cluster=cluster))


def test_cpu_adam_benchmark_runs_deepspeeds_op_and_sets_the_clusters_rate():
    # DeepSpeedCPUAdam for real on this host (the offload_optimizer step's op); its rate becomes the cluster's
    # cpu_adam_params_per_second, which the offload step time divides by (costmodel/compute.py)
    pytest.importorskip("deepspeed")
    estimate, default_scenario, replace = _core()
    from zeroplanner.probe import benchmark_cpu_adam

    r = benchmark_cpu_adam(params=4_000_000, repeats=3, threads=1, timeout_seconds=300)
    assert r["ok"], r["message"]
    assert r["threads"] == 1 and r["best_seconds"] <= r["median_seconds"]
    assert r["params_per_second"] == pytest.approx(4_000_000 / r["best_seconds"])
    base = default_scenario().cluster
    result = {**inventory(), "benchmarks": {"cpu_adam": r}}
    changes, notes = cluster_changes(result, base)
    assert changes["cpu_adam_params_per_second"] == r["params_per_second"]
    assert any(n.startswith("CPU-Adam: ") for n in notes)
    s = replace(default_scenario(), cluster=cluster_from_probe(result, base))
    fast = replace(s, cluster=replace(s.cluster, cpu_adam_params_per_second=2 * r["params_per_second"]))
    off = dict(zero=replace(s.zero, stage=2, offload_optimizer=replace(s.zero.offload_optimizer, device="cpu")))
    # the host's CPU-Adam time is each rank's parameters / its share of the node's rate (the host's fp32 -> 16-bit
    # conversion after it is priced apart, costmodel/offload.py): twice the rate, half the CPU-Adam time
    slow_e, fast_e = estimate(replace(s, **off)), estimate(replace(fast, **off))
    adam = slow_e.trainable_parameters / slow_e.data_parallel_degree / (r["params_per_second"] / s.cluster.gpus_per_node)
    assert slow_e.optimizer_seconds_per_step - fast_e.optimizer_seconds_per_step == pytest.approx(adam / 2)
    with pytest.raises(ValueError, match="benchmarks.cpu_adam.params_per_second"):
        cluster_changes({**result, "benchmarks": {"cpu_adam": {**r, "params_per_second": -1}}}, base)


def test_a_timed_out_cpu_adam_benchmark_leaves_no_build_lock(tmp_path, monkeypatch):
    """A CPU-Adam benchmark that runs out of time in DeepSpeed's first JIT build of the op is interrupted, not
    killed: torch removes the build's lock file in a ``finally`` (torch/utils/cpp_extension.py ``_jit_compile``),
    where a killed build left it and every later load of the op, a training run's included, waited on it for
    ever (seen on this build machine: the probe test's 14 s bound killed a cold build, and the CPU-Adam test after
    it hung). A lock left by someone else is kept and named in the message."""
    pytest.importorskip("deepspeed")
    from zeroplanner.probe import benchmark_cpu_adam

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # an empty build root: this run must build the op
    # 20 s: interrupted at 15 s, about 7-9 s into a build that takes 47 s here (imports take the first 6-8 s)
    r = benchmark_cpu_adam(params=1000, repeats=1, threads=1, timeout_seconds=20)
    assert not r["ok"] and r["message"].startswith("CPU-Adam benchmark timed out after 20 s"), r
    build = tmp_path / "cpu_adam"
    assert (build / "build.ninja").is_file(), "the build had not started: nothing here was interrupted"
    assert not (build / "lock").exists() and "is left from a build" not in r["message"]
    (build / "lock").touch()  # another process's build, or one killed outright: the next load waits on it
    r = benchmark_cpu_adam(params=1000, repeats=1, threads=1, timeout_seconds=12)
    assert not r["ok"] and f"{build / 'lock'} is left from a build that did not finish" in r["message"], r
    assert (build / "lock").exists()


def test_cluster_from_a_cuda_probe_file(tmp_path):
    """A probe written on a CUDA machine: the pure mapping (no torch), from its JSON file."""
    _estimate, default_scenario, _replace = _core()
    from zeroplanner import catalog

    base = default_scenario().cluster
    known = catalog.gpu_names()[0]
    spec = catalog.gpu(known)
    gib = 2**30
    gpus = [{"index": i, "name": f"NVIDIA {known}", "total_memory_bytes": int(spec.memory_bytes * 0.99),
             "free_memory_bytes": int(spec.memory_bytes * 0.99) - i * 3 * gib, "other_processes_bytes": None,
             "compute_capability": "8.0", "multi_processor_count": 108,
             "catalog": {"name": "a catalog entry of another version", "memory_matches": True}} for i in range(4)]
    data = {"format": probe.PROBE_FORMAT, "cuda_available": True, "message": "4 GPUs", "gpu_count": 4,
            "gpus": gpus, "host": {"ram_total_bytes": 512 * gib, "ram_available_bytes": 500 * gib,
                                   "disk_free_bytes": 3 * 2**40, "disk_path": "/nvme"},
            "nvlink": {"source": "nvidia-smi nvlink --status", "active_links_per_gpu": [0] * 4, "detected": False},
            "benchmarks": {"host_transfer": {"ok": True, "h2d_pinned_gb_per_s": 22.5}}}
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(data))
    changes, notes = cluster_changes(load_probe(path), base)
    cluster = cluster_from_probe(load_probe(path), base)
    assert cluster.gpu.name == spec.name and cluster.gpus_per_node == 4
    assert cluster.gpu.pcie_gb_per_s == 22.5
    assert cluster.cpu_memory_bytes == 500 * gib and cluster.nvme_bytes == 3 * 2**40
    # the fullest GPU (index 3: 9 GiB used by others) decides; the probe's own context is given back
    from zeroplanner.specs import Assumptions

    fullest_free = gpus[3]["free_memory_bytes"]
    assert cluster.gpu_memory_bytes == min(gpus[3]["total_memory_bytes"],
                                           fullest_free + Assumptions().cuda_context_bytes)
    assert any("catalog" in n for n in notes) and len(notes) == len(set(notes))
    assert any(n.startswith("no active NVLink found") for n in notes)  # no collectives measured to say otherwise
    # an unknown GPU keeps the base's compute figures under its own name and measured memory
    data["gpus"] = [dict(g, name="Mystery Accelerator 9000") for g in gpus]
    data["benchmarks"]["matmul"] = [{"ok": True, "tflops": 123.0}]
    data["gpus"][1] = dict(data["gpus"][1], name="Mystery Accelerator 8000")
    _changes, notes = cluster_changes(data, base)
    assert any(n.startswith("mixed GPUs") for n in notes)
    unknown = cluster_from_probe(data, base)
    assert unknown.gpu.name == "Mystery Accelerator 9000"
    assert unknown.gpu.memory_bytes == gpus[0]["total_memory_bytes"]
    assert unknown.gpu.peak_bf16_tflops == 123.0
    assert unknown.gpu.hbm_bandwidth_gb_per_s == base.gpu.hbm_bandwidth_gb_per_s


@pytest.mark.parametrize(
    "content, match",
    [("{not json", "not valid JSON"), ("[1, 2]", "not a probe result"), ('{"gpus": []}', "not a probe result")],
)
def test_load_probe_rejects_bad_files(tmp_path, content, match):
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=match) as err:
        load_probe(path)
    assert str(path) in str(err.value)


def test_load_probe_rejects_missing_and_huge_files(tmp_path):
    with pytest.raises(ValueError, match="cannot read"):
        load_probe(tmp_path / "missing.json")
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (probe.MAX_PROBE_FILE_BYTES + 1))
    with pytest.raises(ValueError, match="larger than a probe result"):
        load_probe(big)


def test_cluster_from_probe_names_a_bad_field():
    _estimate, default_scenario, _replace = _core()
    base = default_scenario().cluster
    bad = {"cuda_available": True, "gpus": [{"name": "NVIDIA X", "total_memory_bytes": "lots"}]}
    with pytest.raises(ValueError, match=r"gpus\[0\]\.total_memory_bytes"):
        cluster_from_probe(bad, base)
    tiny = {"cuda_available": False, "host": {"ram_available_bytes": 2**20}}
    with pytest.raises(ValueError, match="host.ram_available_bytes"):
        cluster_from_probe(tiny, base)
    with pytest.raises(ValueError, match="not a probe result"):
        cluster_from_probe({"gpus": []}, base)
    huge = {"cuda_available": False, "host": {"ram_available_bytes": 2**60}}
    with pytest.raises(ValueError, match="cluster field cpu_memory_bytes") as err:
        cluster_from_probe(huge, base)
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------------------------------------------------
# Calibration
# ------------------------------------------------------------------------------------------------------------
def test_fit_efficiency_recovers_the_mfu_that_produced_the_times():
    estimate, default_scenario, replace = _core()
    from zeroplanner.calibrate.fits import fit_efficiency

    base = default_scenario()
    runs = []
    for micro_batch in (1, 2):
        s = replace(base, training=replace(base.training, micro_batch=micro_batch))
        # the "measurement" is the model itself at MFU 0.3: a consistent fitter must return 0.3 for both runs
        truth = estimate(replace(s, assumptions=replace(s.assumptions, mfu=0.3))).step_seconds
        runs.append((s, truth))
    result = fit_efficiency(runs)
    assert result["mfu"] == pytest.approx(0.3, rel=1e-4)
    # with no fixed MFU the cost model's own fraction (GPU generation x GEMM size) is the "before" value
    assert result["mfu_default"] == estimate(base).achieved_fraction and not result["at_bound"]
    for row in result["runs"]:
        assert abs(row["relative_error_after"]) < 1e-4
        assert row["predicted_step_seconds_before"] == pytest.approx(
            estimate(base if row is result["runs"][0] else runs[1][0]).step_seconds)


def test_fit_efficiency_reports_an_impossible_measurement():
    estimate, default_scenario, replace = _core()
    from zeroplanner.calibrate.fits import fit_efficiency

    s = default_scenario()
    floor = estimate(replace(s, assumptions=replace(s.assumptions, mfu=1.0))).step_seconds
    result = fit_efficiency([(s, floor / 3)])  # faster than the model allows even at MFU 1
    assert result["at_bound"] and "bound" in result["note"]
    with pytest.raises(ValueError, match="runs"):
        fit_efficiency([])
    with pytest.raises(ValueError, match="measured_step_seconds"):
        fit_efficiency([(s, 0.0)])


def _calibration(device: str, ranks: int):
    """One real calibration run of the default scenario's architecture (zeroplanner.calibrate, DeepSpeed)."""
    _core()
    try:
        from zeroplanner import calibrate
        from zeroplanner.scenarios import default_scenario
    except ImportError as exc:  # pragma: no cover
        pytest.skip(f"zeroplanner.calibrate not available: {exc}")
    try:
        return calibrate.run_calibration(default_scenario(), ranks=ranks, steps=2, device=device,
                                         timeout_seconds=240)
    except calibrate.CalibrationError as exc:
        if "missing" in str(exc):
            pytest.skip(str(exc))
        raise


@pytest.mark.engine
def test_fit_from_a_real_calibration_run():
    estimate, _default_scenario, _replace = _core()
    from zeroplanner.calibrate.fits import fit_from_calibration
    from zeroplanner.specs import Scenario

    report = _calibration("cpu", 1)  # DeepSpeed on one CPU rank: about 25 s here
    t = report.timings
    measured = t["forward_seconds"] + t["backward_seconds"] + t["step_seconds"]
    result = fit_from_calibration([report])
    (row,) = result["runs"]
    assert row["measured_step_seconds"] == measured
    # a tiny model on a CPU rank priced against the catalog GPU: far slower than the default MFU predicts
    assert row["predicted_step_seconds_before"] < measured
    assert not result["at_bound"] and 1e-9 < result["mfu"] < result["mfu_default"]
    assert row["predicted_step_seconds_after"] == pytest.approx(measured, rel=1e-6)
    (mem,) = result["memory"]
    predicted = estimate(Scenario.model_validate(report.scenario)).per_gpu_bytes
    assert mem["measured_peak_allocated_bytes"] is None and mem["relative_error"] is None
    assert mem["predicted_bytes_without_overhead"] == predicted.total - predicted.overhead
    # the same from the report's JSON form
    assert fit_from_calibration([json.loads(report.model_dump_json())])["mfu"] == pytest.approx(result["mfu"])
    with pytest.raises(ValueError, match="not a calibration report"):
        fit_from_calibration([{"name": "x"}])


# ------------------------------------------------------------------------------------------------------------
# On a CUDA machine (scripts/gpu_probe.sh); skipped here
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@needs_cuda
def test_gpu_inventory_matches_device_properties():
    result = probe_in_subprocess(timeout_seconds=120)
    assert result["cuda_available"] is True, result["message"]
    assert result["gpu_count"] == torch.cuda.device_count()
    for g in result["gpus"]:
        props = torch.cuda.get_device_properties(g["index"])
        assert g["name"] == props.name
        assert g["total_memory_bytes"] == props.total_memory
        assert g["compute_capability"] == f"{props.major}.{props.minor}"
        assert g["multi_processor_count"] == props.multi_processor_count
        assert g["uuid"] == probe.hardware._uuid_key(props.uuid) and len(g["uuid"]) == 36
        assert 0 < g["free_memory_bytes"] <= g["total_memory_bytes"]
    n = result["gpu_count"]
    assert len(result["peer_access"]) == n and all(result["peer_access"][i][i] for i in range(n))


@pytest.mark.gpu
@needs_cuda
def test_gpu_matmul_within_the_catalog_peak():
    from zeroplanner import catalog

    props = torch.cuda.get_device_properties(0)
    match = match_catalog(props.name, props.total_memory)
    result = benchmark_matmul(0, budget_seconds=2.0)
    assert result["ok"] and result["tflops"] > 0
    if match is None:
        pytest.skip(f"{props.name} is not in the GPU catalog; measured {result['tflops']:.0f} TFLOP/s")
    spec = catalog.gpu(match["name"])
    peak = spec.peak_tflops("bf16" if result["dtype"] == "bfloat16" else "fp16")
    # dense vendor peak bounds it; a healthy GPU reaches well over a fifth of it on 8192^3 (cuBLAS)
    assert 0.2 * peak < result["tflops"] <= peak, (result["tflops"], peak)


@pytest.mark.gpu
@needs_cuda
def test_gpu_host_transfer_and_collectives():
    transfer = benchmark_host_transfer(0)
    assert transfer["ok"] and transfer["h2d_pinned_gb_per_s"] > 1.0
    result = benchmark_collectives(budget_seconds=20, timeout_seconds=120)
    if torch.cuda.device_count() < 2:
        assert not result["ok"] and "at least 2 ranks" in result["message"]
        return
    assert result["ok"], result["message"]
    assert result["backend"] == "nccl"
    for r in result["world"]:
        assert r["busbw_gb_per_s"] == pytest.approx(
            r["algbw_gb_per_s"] * _expected_factor(r["collective"], r["ranks"]), rel=1e-12)


@pytest.mark.gpu
@needs_cuda
def test_gpu_calibration_peak_memory_next_to_the_prediction(capsys):
    from zeroplanner.calibrate.fits import fit_from_calibration

    report = _calibration("cuda", min(2, torch.cuda.device_count()))
    result = fit_from_calibration([report])
    (mem,) = result["memory"]
    peak, predicted = mem["measured_peak_allocated_bytes"], mem["predicted_bytes_without_overhead"]
    with capsys.disabled():
        print(f"\ncalibration on CUDA: peak allocated {peak:,} B measured, {predicted:,} B predicted "
              f"({100 * mem['relative_error']:+.1f}%); step {result['runs'][0]['measured_step_seconds']:.4f} s "
              f"measured, fitted MFU {result['mfu']:.3g} (tiny model)")
    assert peak > 0
    assert 0.25 < predicted / peak < 4, "prediction and measurement of a tiny model's peak differ by over 4x"


def test_a_probe_without_gpus_says_the_gpus_are_kept():
    """A new user's try-out: `--cluster-from` a CPU-only probe planned 8 x A100-80GB without a word; the GPUs are
    kept as given (nothing was measured about them) and the notes now say so."""
    from zeroplanner.probe.cluster import cluster_changes
    from zeroplanner.scenarios import default_scenario

    base = default_scenario().cluster
    probe_result = {"cuda_available": False, "message": "no CUDA device: test", "gpus": [],
                    "host": {"ram_available_bytes": 64 * 2**30}}
    changes, notes = cluster_changes(probe_result, base)
    assert "gpu" not in changes and changes["cpu_memory_bytes"] == 64 * 2**30
    assert any("found no GPU" in n and f"{base.gpus_per_node} x {base.gpu.name}" in n for n in notes), notes
