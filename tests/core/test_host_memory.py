"""Host RAM and NVMe per node for CPU and NVMe offload, at the command line (JSON asserted).

Expected bytes are written out here from DeepSpeed 0.19.8's own allocations, line by line (the derivation and
the CPU-rank measurement that backs it: docs/validation.md, section "NVMe offload: host RAM";
benchmarks/measure_nvme_host.py):

- optimizer swapper: ``buffer_count`` (4) pinned fp32 buffers of the largest sub-group partition,
  min(sub_group_size = 1e9, Ψ_t/N_d) elements (swap_tensor/optimizer_utils.py ``OptimizerSwapper.__init__``:
  ``SwapBufferManager(num_elems=largest_numel, count=swap_config.buffer_count, dtype)``; stage3.py
  ``_configure_tensor_swapping``: ``largest_numel=max(self.fp16_partitioned_groups_flat_numel)``);
- the 16-bit gradient partition ``grad_partitions_flat_buffer`` (stage3.py ``_setup_for_real_optimizer``);
- parameter swapper: min(Ψ/N_d, max_in_cpu = 1e9) 16-bit elements stay in host RAM (stage3.py
  ``_create_param_groups_fp16_flat_cpu_memory``), ``buffer_count`` (5) x ``buffer_size`` (1e8) pinned 16-bit
  swap buffers (partitioned_param_swapper.py ``_configure_aio``), and, when parameters spill past max_in_cpu, a
  pinned swap-out buffer of the largest sub-group's full parameters (``reserve_partitioned_swap_space``).

Llama-2-7B has Ψ = 6,738,415,616 parameters (catalog; docs/references.md s.3).
"""

from __future__ import annotations

import json

import pytest

from zeroplanner.cli import main

PSI_7B = 6_738_415_616
GIB = 2**30


def run(capsys, *argv: str) -> tuple[dict, str]:
    """(the JSON object, the text output) of one ``zeroplanner`` command; bad input (exit 2) fails the test. The
    exit status of a configuration that does not fit is another contract's (README, exit statuses)."""
    rc = main([*argv, "--json"])
    obj = json.loads(capsys.readouterr().out)
    assert rc != 2
    main(list(argv))
    return obj, capsys.readouterr().out


def zero3(offload: str, *extra: str) -> tuple[str, ...]:
    return ("estimate", "--model", "llama-2-7b", "--stage", "3", "--offload-optimizer", offload,
            "--offload-param", offload, *extra)


def test_nvme_host_ram_is_the_swap_buffers_and_what_stays_in_cpu_7b_8_gpus(capsys):
    """7B on 8 GPUs at DeepSpeed's defaults: each rank's partition (Ψ/8 = 842M) is below sub_group_size (1e9) and
    max_in_cpu (1e9), so the 4 fp32 swap buffers hold the whole partition (16 B/param, what CPU offload keeps for
    master + Adam states + fp32 gradients) and every 16-bit parameter stays in host RAM: NVMe offload does not
    lower host RAM here (it adds the parameter swap buffers) (measured in the same regime: docs/validation.md, run nvme_nvme_default_limits). It needs
    far less than the 339-346 GiB priced before (the whole fp32 states x buffer_count)."""
    nvme, _ = run(capsys, *zero3("nvme"))
    cpu, _ = run(capsys, *zero3("cpu"))
    g, p = 8, PSI_7B / 8
    expected_nvme = {
        "pinned NVMe swap buffers (optimizer)": g * 4 * 4 * p,
        "16-bit host copies": g * 2 * p,
        "parameters kept in host RAM (max_in_cpu)": g * 2 * p,
        "pinned NVMe swap buffers (parameters)": g * 5 * 1e8 * 2,
    }
    parts = nvme["host_memory"]["parts_bytes"]
    for label, value in expected_nvme.items():
        assert parts[label] == pytest.approx(value, abs=1), label
    assert nvme["per_node_cpu_bytes"] == pytest.approx(sum(expected_nvme.values()), abs=8)
    expected_cpu = g * (12 + 4 + 2 + 2) * p  # master + Adam 12, fp32 grads 4, 16-bit grads 2, 16-bit params 2
    assert cpu["per_node_cpu_bytes"] == pytest.approx(expected_cpu, abs=8)
    # the optimizer's pinned buffers equal CPU offload's states + fp32 gradients at this size
    assert parts["pinned NVMe swap buffers (optimizer)"] == pytest.approx(
        cpu["host_memory"]["parts_bytes"]["optimizer states + fp32 master"]
        + cpu["host_memory"]["parts_bytes"]["fp32 gradients"], abs=2)
    assert nvme["per_node_cpu_bytes"] == pytest.approx(cpu["per_node_cpu_bytes"] + g * 5 * 1e8 * 2, abs=16)
    assert nvme["per_node_cpu_bytes"] < 140 * GIB  # was 346 GiB (x buffer_count on all of K = 12 B/param)
    # NVMe holds master + Adam states and the fp32 gradients (optimizer swap files) and the 16-bit parameters
    assert nvme["nvme"]["parts_bytes"] == pytest.approx(
        {"optimizer states + fp32 master": g * 12 * p, "fp32 gradients": g * 4 * p, "parameter partition": g * 2 * p},
        abs=1)
    assert cpu["nvme"]["required_bytes"] == 0 and cpu["nvme_bytes"] == 0


@pytest.mark.parametrize("argv, psi, gpus", [
    (("--gpus-per-node", "1"), PSI_7B, 1),
    (("--model", "llama-2-70b"), None, 8),
])
def test_nvme_offload_needs_less_host_ram_than_cpu_offload_once_partitions_exceed_a_sub_group(capsys, argv, psi,
                                                                                               gpus):
    """Once Ψ/N_d exceeds sub_group_size (1e9) the swap buffers stay at 4 x 4 B x 1e9 per rank while CPU offload
    grows with the partition: 7B on one GPU, 70B on 8 GPUs."""
    nvme, _ = run(capsys, *zero3("nvme"), *argv)
    cpu, _ = run(capsys, *zero3("cpu"), *argv)
    psi = psi or nvme["parameters"]
    p = psi / gpus
    assert p > 1e9
    parts = nvme["host_memory"]["parts_bytes"]
    assert parts["pinned NVMe swap buffers (optimizer)"] == pytest.approx(gpus * 4 * 4 * 1e9, abs=1)
    assert parts["parameters kept in host RAM (max_in_cpu)"] == pytest.approx(gpus * 2 * 1e9, abs=1)
    # full parameters of the largest sub-group: N_d x its 1e9-element partition, 16-bit
    assert parts["pinned NVMe swap-out buffer (parameters)"] == pytest.approx(gpus * 2 * gpus * 1e9, abs=1)
    assert cpu["per_node_cpu_bytes"] == pytest.approx(gpus * 20 * p, rel=1e-9)
    assert nvme["per_node_cpu_bytes"] < cpu["per_node_cpu_bytes"]
    assert nvme["host_memory"]["required_bytes"] < cpu["host_memory"]["required_bytes"]


@pytest.mark.parametrize("argv", [zero3("nvme"), zero3("cpu"), ("estimate", "--stage", "2", "--offload-optimizer",
                                                                 "cpu"), ("estimate",)])
def test_host_ram_and_nvme_are_one_figure_each_whose_parts_add_up(capsys, argv):
    d, text = run(capsys, *argv)
    host, nvme = d["host_memory"], d["nvme"]
    assert sum(host["parts_bytes"].values()) == host["required_bytes"]
    assert sum(nvme["parts_bytes"].values()) == nvme["required_bytes"]
    assert set(host["formulas"]) == set(host["parts_bytes"])
    assert host["offloaded_bytes"] == pytest.approx(d["per_node_cpu_bytes"], abs=len(host["parts_bytes"]))
    assert nvme["required_bytes"] == pytest.approx(d["nvme_bytes"], abs=len(nvme["parts_bytes"]))
    # the safety factor is a part of its own: DeepSpeed's additional_buffer_factor 1.5 on the offloaded bytes
    assert host["safety_factor"] == 1.5
    assert host["required_bytes"] == pytest.approx(1.5 * d["per_node_cpu_bytes"], abs=8)
    if d["per_node_cpu_bytes"]:
        headroom = host["parts_bytes"]["safety headroom (x1.5 host_buffer_factor)"]
        assert headroom == pytest.approx(0.5 * d["per_node_cpu_bytes"], abs=8)
        assert f"host RAM per node: {host['required_bytes'] / GIB:.1f} GiB needed, 1024 GiB available (fits)" in text
        assert "safety headroom (x1.5 host_buffer_factor)" in text
    else:
        assert host["parts_bytes"] == {} and "host RAM per node" not in text
    assert host["available_bytes"] == 1024 * GIB and host["fits"] == d["fits_cpu"]


def test_nvme_capacity_is_an_input_and_the_verdict_names_nvme_when_it_is_exceeded(capsys):
    """7B on 8 GPUs with both offloads on NVMe needs (12 + 4 + 2) x Ψ = 113.0 GiB of NVMe per node."""
    need = 18 * PSI_7B
    short, text = run(capsys, *zero3("nvme", "--nvme-capacity-gib", "100"))
    assert short["nvme"]["required_bytes"] == pytest.approx(need, abs=4)
    assert short["nvme"]["capacity_bytes"] == 100 * GIB
    assert short["nvme"]["fits"] is False and short["fits"] is False
    assert short["fits_gpu"] is True and short["fits_cpu"] is True
    assert any(w.startswith("NVMe: needs 113 GiB per node, node has 100 GiB") for w in short["warnings"])
    assert "does NOT fit: NVMe capacity" in text
    assert "NVMe per node: 113.0 GiB needed, 100 GiB capacity (does NOT fit)" in text
    roomy, text = run(capsys, *zero3("nvme", "--nvme-capacity-gib", "120"))
    assert roomy["nvme"]["fits"] is True and roomy["fits"] is True
    assert "NVMe per node: 113.0 GiB needed, 120 GiB capacity (fits)" in text
    default, _ = run(capsys, *zero3("nvme"))
    assert default["nvme"]["capacity_bytes"] == 4 * 2**40  # ClusterSpec.nvme_bytes default (cited there)


def test_bad_nvme_capacity_is_one_line_naming_the_option(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["estimate", "--nvme-capacity-gib", "-5"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--nvme-capacity-gib" in err[0] and "[0, " in err[0]


def test_zero2_reads_an_nvme_optimizer_offload_as_cpu_offload(capsys):
    """stage_1_and_2.py ``__init__``: any offload_optimizer device other than none sets ``self.cpu_offload``; ZeRO-1/2
    have no NVMe swapper, so the states stay in host RAM and nothing goes to NVMe."""
    nvme, _ = run(capsys, "estimate", "--stage", "2", "--offload-optimizer", "nvme")
    cpu, _ = run(capsys, "estimate", "--stage", "2", "--offload-optimizer", "cpu")
    assert nvme["host_memory"]["parts_bytes"] == cpu["host_memory"]["parts_bytes"]
    assert nvme["nvme_bytes"] == 0 and nvme["nvme"]["parts_bytes"] == {}


def test_nvme_optimizer_below_stage3_is_priced_as_cpu_offload():
    """ZeRO-1/2 run offload_optimizer nvme as CPU offload (runtime/zero/stage_1_and_2.py cpu_offload; the engine
    trains such a config without an nvme_path: tests/evidence/test_error_rules.py
    nvme_optimizer_below_stage3_needs_no_path): same step time and host RAM as cpu; stage 3 swaps to NVMe."""
    from zeroplanner import build_scenario
    from zeroplanner.costmodel import estimate

    for stage in (1, 2):
        nvme = estimate(build_scenario(model="llama-2-7b", stage=stage, offload_optimizer="nvme"))
        cpu = estimate(build_scenario(model="llama-2-7b", stage=stage, offload_optimizer="cpu"))
        assert nvme.step_seconds == cpu.step_seconds and nvme.per_node_cpu_bytes == cpu.per_node_cpu_bytes
    nvme3 = estimate(build_scenario(model="llama-2-7b", stage=3, offload_optimizer="nvme"))
    cpu3 = estimate(build_scenario(model="llama-2-7b", stage=3, offload_optimizer="cpu"))
    assert nvme3.offload_seconds_per_step > cpu3.offload_seconds_per_step
