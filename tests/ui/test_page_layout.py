"""The one-view page without a browser: tabs built and redrawn only when open, a HF config.json read into the
scenario (and refused with the key named), the memory axis kept near the GPU's memory, widget models per page."""

from __future__ import annotations

import html
import json
import warnings

import numpy as np
import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("bqplot")

import ipywidgets as w  # noqa: E402

from zeroplanner.catalog.hfconfig import MAX_CONFIG_BYTES, architecture_from_hf_config  # noqa: E402
from zeroplanner.scenarios import build_scenario  # noqa: E402
from zeroplanner.ui import PlannerApp  # noqa: E402
from zeroplanner.ui.app import TABS  # noqa: E402
from zeroplanner.ui.charts import short_label  # noqa: E402
from zeroplanner.ui.state import state_from_scenario  # noqa: E402

from tests.helpers import HF_CONFIGS  # noqa: E402

HF = HF_CONFIGS / "mixtral-8x22b.json"
MIXTRAL = {  # the shape keys of Mixtral-8x22B's config.json (mistralai/Mixtral-8x22B-v0.1)
    "model_type": "mixtral", "hidden_size": 6144, "intermediate_size": 16384, "num_attention_heads": 48,
    "num_hidden_layers": 56, "num_key_value_heads": 8, "vocab_size": 32768, "num_local_experts": 8,
    "num_experts_per_tok": 2, "max_position_embeddings": 65536, "tie_word_embeddings": False,
}


def _config_text() -> str:
    return HF.read_text()


def test_the_main_chart_comes_first_and_the_other_views_are_tabs_built_when_opened():
    app = PlannerApp()
    assert [t for _, t in TABS][0] == "Memory per GPU" and app.details.selected_index == 0
    assert set(app._charts) == {"memory"} and app._explain_panel is None and app._compare_panel is None
    app.show_tab("time")
    assert "time" in app._charts and app._tab_boxes[app.tab_index("time")].children[0] is app.time_chart


def test_only_the_open_chart_is_redrawn_and_a_tab_catches_up_when_opened():
    app = PlannerApp()
    app.show_tab("time")
    before = np.asarray(app._charts["time"].bars.y).copy()
    app.show_tab("memory")
    app.set(nodes=4, network="eth-25g")
    assert np.array_equal(np.asarray(app._charts["time"].bars.y), before)  # hidden: not redrawn
    assert "time" in app._stale
    app.show_tab("time")
    assert not np.array_equal(np.asarray(app._charts["time"].bars.y), before)
    assert "time" not in app._stale


def test_one_recompute_per_change():
    app = PlannerApp()
    n = app.recomputes
    app.controls.widgets["nodes"].value = 2
    assert app.recomputes == n + 1


def test_a_hf_config_json_becomes_the_scenarios_model_with_the_cli_reader():
    app = PlannerApp(state=state_from_scenario(build_scenario(nodes=4)))
    banner, config = app.banner.value, app.config_area.value
    arch = app.load_hf_config(_config_text(), "mixtral-8x22b.json")
    assert arch == architecture_from_hf_config(json.loads(_config_text()), name=arch.name)
    assert app.state.scenario.model == arch and app.state.scenario.cluster.nodes == 4
    assert app.banner.value != banner and app.config_area.value != config
    assert "mixtral-8x22b.json" in app.hf_message.value and "zp-error" not in app.hf_message.value
    assert "uploaded config.json" in app.share_link.value and "mixtral-8x22b.json" in app.share_link.value
    app.set(model="llama-2-7b")  # a preset replaces it; the link is a plain one again
    assert "uploaded config.json" not in app.share_link.value


@pytest.mark.parametrize("text, key", [
    (json.dumps({k: v for k, v in MIXTRAL.items() if k != "num_attention_heads"}), "num_attention_heads"),
    (json.dumps({**MIXTRAL, "model_type": "resnet"}), "model_type"),
    (json.dumps({**MIXTRAL, "hidden_size": "big"}), "hidden_size"),
    ('{"model_type": "llama", "hidden_size": NaN}', "NaN"),
    ("[1, 2]", "JSON object"),
    ("", "empty"),
    ("x" * (MAX_CONFIG_BYTES + 1), f"the limit is {MAX_CONFIG_BYTES} bytes"),  # the CLI's words (hfconfig.too_large_message)
])
def test_a_malformed_config_json_names_the_key_and_keeps_the_last_setup(text, key):
    app = PlannerApp()
    scenario, config = app.state.scenario, app.config_area.value
    assert app.load_hf_config(text, "bad.json") is None
    assert "zp-error" in app.hf_message.value and key in app.hf_message.value, app.hf_message.value
    assert app.state.scenario == scenario and app.config_area.value == config
    app.controls.widgets["nodes"].value = 2  # still working
    assert app.state.scenario.cluster.nodes == 2


def test_the_upload_widget_feeds_the_reader():
    app = PlannerApp()
    data = _config_text().encode()
    app._hf_uploaded({"new": ({"name": "mixtral-8x22b.json", "content": memoryview(data)},)})
    assert app.state.scenario.model.family == "mixtral"


def test_pasted_deepspeed_config_findings_sit_by_the_verdict():
    app = PlannerApp()
    app.load_config(json.dumps({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3},
                                "bf16": {"enabled": True}, "fp16": {"enabled": True}}))
    assert app.state.scenario.zero.stage == 3
    center = app.grid.center.children
    assert center.index(app.findings) == center.index(app.banner) + 1
    assert "This config as written" in app.findings.value and "error" in app.findings.value


def test_the_memory_axis_stays_near_the_gpu_and_off_scale_bars_carry_their_value():
    app = PlannerApp(state=state_from_scenario(build_scenario(model="llama-2-70b", nodes=4, network="eth-25g")))
    chart = app.memory_chart
    cap = app.view.memory.capacity_gib
    assert chart.y_scale.max <= 2.5 * cap
    off = [lab for lab, t in zip(app.view.memory.labels, app.view.memory.total_gib) if t > chart.y_scale.max]
    assert off and list(chart.offscale_labels.x) == [short_label(lab) for lab in off]
    assert all(text.endswith("↑") for text in chart.offscale_labels.text)
    assert list(chart.capacity_label.text) == [f"GPU {cap:.0f} GiB"]


def test_tick_names_are_short_and_distinct_and_the_key_names_them_all():
    app = PlannerApp()
    labels = app.view.memory.labels
    ticks = [short_label(lab) for lab in labels]
    assert len(set(ticks)) == len(ticks) and max(map(len, ticks)) <= 10
    for lab in labels:
        assert html.escape(lab) in app.memory_chart.legend.value


def test_widget_models_per_page():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        before = len(w.Widget.widgets)
        PlannerApp()
        models = len(w.Widget.widgets) - before
    assert models <= 200, models  # 347 before the one-view page (hidden views built lazily, shared styles)
