"""The advice an experienced engineer gives first (zeroplanner/advice.py), on the scenarios a new user met:

- llama-2-13b on 2 x 8 A100-80GB over 1 Gbit/s Ethernet: 96% of the step is exposed communication; one node at
  the same global batch is an order of magnitude faster, and two nodes pay off only above a crossover bandwidth;
- LoRA on Llama-3.1-70B, 4 x RTX 4090, 128 GiB host RAM: the LoRA pick needs NVMe (on a default capacity the user
  never gave); QLoRA with bnb_4bit_quant_storage = bfloat16 fits with CPU offload and no NVMe, 3.5x faster;
- Llama-3.1-70B on 4 x 8 H100 over 100 Gbit/s Ethernet: the ZeRO-3 alternative is its best micro-batch split.

Every figure the advice quotes is checked against an independent plan of the changed scenario
(``advice=False``), built here with build_scenario, so the advice cannot drift from what the planner predicts.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from zeroplanner.advice import CROSSOVER_MAX_GBPS, with_inter_node_gbps
from zeroplanner.cli import main
from zeroplanner.costmodel import evaluate, make_context
from zeroplanner.planner import DEFAULT_TOLERANCE, candidate_grid, plan, rank_candidates
from zeroplanner.scenarios import build_scenario

SLOW_CLUSTER = dict(model="llama-2-13b", gpus_per_node=8, nodes=2, network="eth-1g")
LORA_70B_4090 = dict(model="llama-3.1-70b", gpu="RTX-4090", gpus_per_node=4, lora_rank=16, cpu_memory_gib=128)
QLORA_70B_4090 = dict(LORA_70B_4090, qlora=True, bnb_4bit_quant_storage="bfloat16")
H100_ETH = dict(model="llama-3.1-70b", gpu="H100-80GB", gpus_per_node=8, nodes=4, network="eth-100g")


def _tps(**kw) -> float:
    p = plan(build_scenario(**kw), advice=False)
    return p.estimate.tokens_per_second if p.fits else 0.0


def test_fewer_nodes_are_advised_with_speedup_and_crossover():
    p = plan(build_scenario(**SLOW_CLUSTER))
    a = p.cluster_advice
    assert a is not None and a.exposed_fraction > 0.30
    # the same global batch on one node: 8 GPUs x 1 x 16 = 16 GPUs x 1 x 8 samples per step
    one_node = _tps(model="llama-2-13b", gpus_per_node=8, nodes=1, grad_accum=16)
    assert a.fewer_nodes == 1
    assert a.fewer_nodes_tokens_per_second == pytest.approx(one_node, rel=1e-9)
    assert a.tokens_per_second == pytest.approx(p.estimate.tokens_per_second, rel=1e-9)
    assert a.speedup == pytest.approx(one_node / p.estimate.tokens_per_second, rel=1e-9)
    assert a.speedup > 10  # 1,171 -> 17,031 tokens/s when this test was written
    assert f"{a.speedup:.1f}x faster" in a.text and "Train on 1 node" in a.text
    assert a.speedup >= 1.5  # the ratio form; below 1.5x the text says the percentage (test below)
    # the crossover: two nodes at that bandwidth are at least as fast as one node, 10% below it they are not
    x = a.crossover_inter_node_gbps
    assert x is not None and 1.0 < x < CROSSOVER_MAX_GBPS
    two = build_scenario(**SLOW_CLUSTER)
    assert plan(with_inter_node_gbps(two, x), advice=False).estimate.tokens_per_second >= one_node
    assert plan(with_inter_node_gbps(two, 0.9 * x), advice=False).estimate.tokens_per_second < one_node
    assert f"2 nodes pay off only above {x:,.0f} Gbit/s per node" in a.text
    assert p.advice[0] == a.text  # said first


def test_no_cluster_advice_when_the_network_is_not_the_bottleneck():
    p = plan(build_scenario(model="llama-2-7b", gpus_per_node=8, nodes=2, network="ib-ndr-8x"))
    est = p.estimate
    assert est.communication.exposed_seconds_per_step / est.step_seconds <= 0.30
    assert p.cluster_advice is None


def test_cluster_advice_in_json_and_first_lines(capsys):
    assert main(["recommend", *_flags(SLOW_CLUSTER), "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["cluster_advice"]["fewer_nodes"] == 1 and obj["cluster_advice"]["speedup"] > 10
    main(["recommend", *_flags(SLOW_CLUSTER)])
    lines = capsys.readouterr().out.splitlines()
    head = lines[:4]
    assert lines[0].startswith("Recommended: ")
    assert any(ln.startswith("advice: Train on 1 node") for ln in head), head


def _flags(kw: dict) -> list[str]:
    out = []
    for k, v in kw.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            out.append(flag)
        else:
            out += [flag, str(v)]
    return out


def test_qlora_is_offered_with_its_figure_never_picked():
    p = plan(build_scenario(**LORA_70B_4090))
    assert p.fits and not p.scenario.training.qlora  # the pick keeps the user's method
    assert p.choice.offload_param == "nvme"
    [q] = [m for m in p.method_advice if m.method == "qlora"]
    expected = plan(build_scenario(**QLORA_70B_4090), advice=False)
    assert q.tokens_per_second == pytest.approx(expected.estimate.tokens_per_second, rel=1e-9)
    assert q.label == expected.choice.label
    assert q.tokens_per_second > 3 * p.estimate.tokens_per_second  # 815 vs 234 tokens/s when written
    assert q.text.startswith("Change of method, not picked for you: QLoRA")
    assert "--qlora --bnb-4bit-quant-storage bfloat16" in q.text and "no NVMe" in q.text
    assert f"{q.tokens_per_second:,.0f} tokens/s" in q.text


def test_no_method_advice_when_the_method_fits_without_offload():
    p = plan(build_scenario(model="llama-2-7b"))
    assert p.fits and p.choice.offload_optimizer == "none" and p.method_advice == []


def test_nothing_fits_prices_the_change_of_method():
    full = dict(LORA_70B_4090)
    del full["lora_rank"]
    p = plan(build_scenario(**full))
    assert not p.fits
    methods = {m.method: m for m in p.method_advice}
    assert set(methods) == {"lora", "qlora"}
    assert methods["qlora"].tokens_per_second == pytest.approx(
        _tps(**dict(full, lora_rank=8, qlora=True, bnb_4bit_quant_storage="bfloat16")), rel=1e-9)
    assert methods["lora"].tokens_per_second == pytest.approx(_tps(**dict(full, lora_rank=8)), rel=1e-9)
    assert "change the method (--lora-rank 8 --qlora --bnb-4bit-quant-storage bfloat16 fits at" in p.warnings[0]


def test_nvme_assumption_is_in_the_first_lines(capsys):
    main(["recommend", *_flags(LORA_70B_4090)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Recommended: ZeRO-3 + NVMe params")
    assert lines[1] == ("assumes 4,096 GiB NVMe per node at 6 GB/s (not given): set --nvme-capacity-gib, or measure "
                        "with `zeroplanner probe`")
    # given, it is no longer an assumption
    main(["recommend", *_flags(LORA_70B_4090), "--nvme-capacity-gib", "4096"])
    assert not any("NVMe per node" in ln for ln in capsys.readouterr().out.splitlines()[:3])


def test_python_api_counts_default_values_as_assumed():
    p = plan(build_scenario(**dict(H100_ETH)))
    assert p.choice.offload_optimizer == "cpu"
    text = " | ".join(p.assumptions)
    assert "1,024 GiB host RAM per node" in text and "DeepSpeedCPUAdam on 1 thread per rank" in text
    assert "eth-100g preset between nodes: 1 x 100 Gbit/s per node" in text
    given = plan(build_scenario(**dict(H100_ETH, cpu_memory_gib=512, inter_node_gbps=100)),
                 given={"cpu_memory_gib", "inter_node_gbps"})
    assert not any("host RAM" in a or "preset between nodes" in a for a in given.assumptions)


def test_alternatives_are_the_best_variant_of_their_group():
    """70B on 4 x 8 H100 over 100 Gb/s Ethernet: ZeRO-3 without offload at micro-batch 2 x 4 fits and is faster
    than at 1 x 8, so the ZeRO-3 alternative is 2 x 4 (1,580 vs 3,128 tokens/s when written)."""
    sc = build_scenario(**H100_ETH)
    p = plan(sc)
    [z3] = [a for a in p.alternatives if a.label.startswith("ZeRO-3 (")]
    assert (z3.choice.micro_batch, z3.choice.grad_accum) == (2, 4)
    ctx = make_context(sc)
    cand = candidate_grid(sc)
    values = evaluate(ctx, cand)
    ranked = rank_candidates(values, cand, DEFAULT_TOLERANCE, ctx.gpu_memory_bytes)
    for a in p.alternatives:  # each is the fastest candidate the ranking keeps in its group
        c = a.choice
        group = ranked[(cand.stage[ranked] == c.stage)
                       & (cand.offload_optimizer[ranked] == {"none": 0, "cpu": 1, "nvme": 2}[c.offload_optimizer])
                       & (cand.offload_param[ranked] == {"none": 0, "cpu": 1, "nvme": 2}[c.offload_param])
                       & (cand.hpz[ranked] == c.zero_hpz_partition_size)]
        assert a.estimate.tokens_per_second == pytest.approx(values.tokens_per_second[group].max(), rel=1e-9)


@pytest.mark.parametrize("kw", [dict(model="qwen2.5-7b", gpu="RTX-4090", gpus_per_node=4),
                                dict(model="llama-3.1-70b", gpu="A100-40GB", gpus_per_node=8, nodes=2)])
def test_reasons_name_the_whole_variant_they_compare_with(kw):
    """The parameter-offload reason names the faster candidate in full: with the optimizer offloaded too."""
    sc = build_scenario(**kw)
    p = plan(sc)
    ctx = make_context(sc)
    cand = candidate_grid(sc)
    values = evaluate(ctx, cand)
    po = np.flatnonzero(values.fits & (cand.offload_param > 0))
    j = int(po[np.argmax(values.tokens_per_second[po])])
    assert cand.offload_optimizer[j] == 1  # the faster one offloads the optimizer as well
    [r] = [r for r in p.reasons if "offloads the parameters" in r and "is predicted" in r]
    assert r.startswith("ZeRO-3, offload_optimizer cpu, offload_param cpu")
    gain = values.tokens_per_second[j] / p.estimate.tokens_per_second - 1
    assert f"is predicted {gain:.0%} faster" in r


def test_no_zero3_without_offload_reason_for_an_offload_pick():
    p = plan(build_scenario(**LORA_70B_4090))
    assert p.choice.offload_param != "none"
    assert any(r.startswith("ZeRO-3 without offload does not fit") for r in p.reasons)
    assert not any(r.startswith("ZeRO-3 without offload: parameters") for r in p.reasons)


def test_headline_names_the_chosen_offload_only():
    """The QLoRA 70B on 4 x RTX 4090 pick offloads parameters only; the headline used to say 'parameters and
    optimizer offloaded'."""
    from zeroplanner.deepspeed import to_deepspeed_config
    from zeroplanner.ui.state import banner_html, choice_text

    p = plan(build_scenario(**QLORA_70B_4090))
    assert (p.choice.offload_param, p.choice.offload_optimizer) == ("cpu", "none")
    assert choice_text(p.choice) == p.choice.label
    assert p.choice.label in banner_html(p) and "optimizer offloaded" not in banner_html(p)
    zero = to_deepspeed_config(p.scenario)["zero_optimization"]
    assert zero["offload_param"]["device"] == "cpu" and "offload_optimizer" not in zero


def _readme_examples() -> list[tuple[list[str], list[str]]]:
    """(argv, printed lines) of the 'Advice before the stage' block of docs/guide.md."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "guide.md").read_text(encoding="utf-8")
    block = text.split("**Advice before the stage.**", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    out, argv, lines = [], None, []
    for ln in block.strip("\n").splitlines():
        if ln.startswith("$ zeroplanner "):
            if argv:
                out.append((argv, lines))
            argv, lines = ln.split()[2:], []
        elif ln:
            lines.append(ln)
    out.append((argv, lines))
    return out


def test_readme_shows_the_real_output(capsys):
    examples = _readme_examples()
    assert len(examples) == 2
    for argv, lines in examples:
        main(argv)
        printed = capsys.readouterr().out.splitlines()
        assert printed[:len(lines)] == lines, argv


def test_method_advice_when_the_pick_offloads_though_something_fits_without():
    """70B full fine-tune on 4 x 8 H100 over eth-100g: ZeRO-3 without offload fits, the faster pick offloads the
    optimizer; LoRA and QLoRA avoid the offload and are priced (9,138 and 34,313 vs 5,978 tokens/s when written)."""
    p = plan(build_scenario(**H100_ETH))
    assert p.choice.offload_optimizer == "cpu"
    methods = {m.method: m for m in p.method_advice}
    assert methods["lora"].tokens_per_second == pytest.approx(_tps(**dict(H100_ETH, lora_rank=8)), rel=1e-9)
    assert not methods["lora"].offloads and "without offload" in methods["lora"].text
    # the plan already states the network preset: the advice does not repeat it
    assert not any("preset between nodes" in m.text for m in p.method_advice)


def test_advice_states_the_defaults_its_own_pick_rests_on():
    full = dict(LORA_70B_4090)
    del full["lora_rank"]
    p = plan(build_scenario(**full))
    [lora] = [m for m in p.method_advice if m.method == "lora"]
    assert "nvme" in lora.label.lower() and "It assumes 4,096 GiB NVMe per node" in lora.text
    # the nothing-fits line gives host RAM with DeepSpeed's buffer factor, as the host-RAM verdict compares it
    assert "x1.5 buffer factor" in p.warnings[0] and "needed of 128)" in p.warnings[0]


def test_config_recommend_carries_the_advice(capsys):
    assert main(["config", "--recommend", *_flags(SLOW_CLUSTER)]) == 0
    err = capsys.readouterr().err
    assert "advice: Train on 1 node" in err and "assumes the eth-1g preset" in err
    assert main(["config", "--recommend", *_flags(SLOW_CLUSTER), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cluster_advice"]["fewer_nodes"] == 1


@pytest.mark.parametrize("kw", [SLOW_CLUSTER, H100_ETH])
def test_warnings_say_what_the_planner_priced_for_the_stage_they_suggest(kw):
    """'prefer ZeRO-2 where it fits' is followed by the planner's own figure for ZeRO-2: on the slow cluster it
    fits but is slower than the pick (779 vs 1,171 tokens/s when written); on 70B / 32 H100 it does not fit."""
    import re

    sc = build_scenario(**kw)
    p = plan(sc)
    values = evaluate(make_context(sc), candidate_grid(sc))
    cand = candidate_grid(sc)
    hits = [m for w in p.warnings for m in re.finditer(r"ZeRO-([0-3]) (?:if|where) it fits \(([^)]*)\)", w)]
    assert hits
    for m in hits:
        ok = values.fits & (cand.stage == int(m.group(1)))
        expected = (f"priced here: at best {values.tokens_per_second[ok].max():,.0f} tokens/s" if ok.any()
                    else f"priced here: no ZeRO-{m.group(1)} candidate fits")
        assert expected in m.group(2)


def test_a_small_gain_reads_as_a_percentage_not_one_point_zero_x():
    """advice.faster_text: the fewer-nodes advice fires from a 1% gain; "1.0x faster" read as no gain."""
    from zeroplanner.advice import faster_text

    assert faster_text(1.04) == "4% faster" and faster_text(1.49) == "49% faster"
    assert faster_text(1.5) == "1.5x faster" and faster_text(13.6) == "13.6x faster"
