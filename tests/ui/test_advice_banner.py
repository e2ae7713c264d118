"""The app opened from a share link tells one story: the banner's headline, the config preview and the
planner's choice are the same candidate, and the banner carries the assumptions and advice the CLI prints first."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("bqplot")

from zeroplanner.planner import plan  # noqa: E402
from zeroplanner.scenarios import build_scenario  # noqa: E402
from zeroplanner.share import scenario_from_query, scenario_to_query  # noqa: E402
from zeroplanner.ui import PlannerApp  # noqa: E402
from zeroplanner.ui.state import state_from_scenario  # noqa: E402


def _open_link(**kw) -> tuple[PlannerApp, object]:
    query = scenario_to_query(build_scenario(**kw))
    scenario = scenario_from_query(query)
    return PlannerApp(state_from_scenario(scenario), debounce_seconds=0.0), plan(scenario)


def test_qlora_link_headline_equals_the_config():
    """QLoRA Llama-3.1-70B on 4 x RTX 4090: the pick offloads parameters only (the headline once said 'parameters
    and optimizer offloaded to CPU' while the config had offload_param only)."""
    app, p = _open_link(model="llama-3.1-70b", gpu="RTX-4090", gpus_per_node=4, lora_rank=16, cpu_memory_gib=128,
                        qlora=True, bnb_4bit_quant_storage="bfloat16")
    assert f"Recommended: {p.choice.label}." in app.banner.value
    assert "optimizer offloaded" not in app.banner.value
    zero = json.loads(app.config_area.value)["zero_optimization"]
    assert zero["offload_param"]["device"] == p.choice.offload_param == "cpu"
    assert "offload_optimizer" not in zero and p.choice.offload_optimizer == "none"
    assert zero["stage"] == p.choice.stage


def test_banner_states_assumptions_and_advice():
    app, p = _open_link(model="llama-3.1-70b", gpu="RTX-4090", gpus_per_node=4, lora_rank=16, cpu_memory_gib=128)
    banner = app.banner.value
    assert "Assumes 4,096 GiB NVMe per node" in banner
    assert "<b>Advice:</b> Change of method, not picked for you: QLoRA" in banner
    # both before the reasons
    assert banner.index("Assumes 4,096 GiB") < banner.index("zp-reasons")
