"""The controls without a browser: the node and GPU-count sliders step over powers of two and keep typed values,
the GPU / Network menus say "(custom)" once a slider leaves their preset, the page says which controls do nothing in
the scenario, a line says that the numbers take typed values, and the verdict puts its headline and warnings first.
"""

from __future__ import annotations

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("bqplot")

import ipywidgets as w  # noqa: E402

from zeroplanner import catalog  # noqa: E402
from zeroplanner.planner import plan  # noqa: E402
from zeroplanner.scenarios import build_scenario  # noqa: E402
from zeroplanner.ui import PlannerApp  # noqa: E402
from zeroplanner.ui.controls import (  # noqa: E402
    CUSTOM_PRESET,
    TYPE_HINT,
    no_effect_notes,
    shown_presets,
)
from zeroplanner.ui.state import banner_html, default_state, state_from_scenario  # noqa: E402
from zeroplanner.ui.tutorial import Tutorial  # noqa: E402
from zeroplanner.units import GIB  # noqa: E402


@pytest.fixture
def app() -> PlannerApp:
    return PlannerApp(debounce_seconds=0)


@pytest.mark.parametrize("key,top", [("nodes", 128), ("gpus_per_node", 16)])
def test_counts_step_over_powers_of_two_and_keep_typed_values(app, key, top):
    slider = app.controls.widgets[key]
    assert isinstance(slider, w.FloatLogSlider) and (slider.base, slider.min, slider.step) == (2, 0, 1)
    assert slider.base ** slider.max == top  # handle stops: 1, 2, 4, ..., top
    path = {"nodes": "nodes", "gpus_per_node": "gpus_per_node"}[key]
    seen = []
    for stop in (1, 2, 4):  # where the handle stops (what a drag sends)
        slider.value = stop
        seen.append(getattr(app.state.scenario.cluster, path))
    assert seen == [1, 2, 4]
    slider.value = 3  # typed into the readout: kept as typed
    assert getattr(app.state.scenario.cluster, path) == 3 and slider.value == 3
    assert isinstance(getattr(app.state.scenario.cluster, path), int)


def test_the_tutorial_node_slider_is_a_power_of_two_slider_too():
    t = Tutorial()
    nodes = t.widgets["nodes"]
    assert isinstance(nodes, w.FloatLogSlider) and nodes.base ** nodes.max == 64
    nodes.value = 4
    assert t.scenario.cluster.nodes == 4


def test_a_line_under_the_title_says_the_numbers_take_typed_values(app):
    assert app.controls.children[0] is app.controls.title and "type" in TYPE_HINT.lower()
    assert f"<small class='zp-hint'>{TYPE_HINT}</small>" in app.controls.title.value
    assert all(s.tooltip and "type" in s.tooltip for s in app.controls.widgets.values()
               if isinstance(s, (w.FloatSlider, w.FloatLogSlider)))


def test_the_gpu_menu_says_custom_when_the_memory_slider_leaves_the_preset_and_comes_back(app):
    gpu, memory = app.controls.widgets["gpu"], app.controls.widgets["gpu_memory_gib"]
    assert gpu.value == "A100-80GB" and CUSTOM_PRESET in gpu.options
    memory.value = 40
    assert gpu.value == CUSTOM_PRESET and app.state.scenario.cluster.memory_per_gpu_bytes == 40 * GIB
    memory.value = round(catalog.gpu("A100-80GB").memory_bytes / GIB, 1)  # the preset's memory typed back
    assert gpu.value == "A100-80GB"
    memory.value = 40
    gpu.value = "A100-80GB"  # choosing the preset applies it again
    assert gpu.value == "A100-80GB" and app.state.scenario.cluster.gpu_memory_bytes is None
    assert memory.value == pytest.approx(round(catalog.gpu("A100-80GB").memory_bytes / GIB, 1))


def test_the_network_menu_says_custom_when_its_slider_moves_and_custom_itself_changes_nothing(app):
    network, gbps = app.controls.widgets["network"], app.controls.widgets["inter_node_gbps"]
    assert network.value == "ib-hdr"
    gbps.value = 100.0
    assert network.value == CUSTOM_PRESET
    scenario, recomputes = app.state.scenario, app.recomputes
    network.value = "ib-ndr"
    network.value = CUSTOM_PRESET  # not a preset: nothing to apply, the menu shows the scenario again
    assert network.value == "ib-ndr" and app.recomputes == recomputes + 1 and app.state.scenario != scenario
    gbps.value = 100.0
    gbps.value = 400.0  # ib-ndr's own 400 Gb/s per node
    assert network.value == "ib-ndr"


def test_shown_presets_is_a_function_of_the_state():
    state = default_state()
    assert shown_presets(state) == {"gpu": "A100-80GB", "network": "ib-hdr"}
    custom = state_from_scenario(build_scenario(gpu_memory_gib=40, inter_node_gbps=25))
    assert shown_presets(custom) == {"gpu": CUSTOM_PRESET, "network": CUSTOM_PRESET}


def test_the_network_controls_say_they_do_nothing_at_one_node(app):
    note = next(n for keys, n in app.controls.notes.items() if "network" in keys)
    assert app.state.scenario.cluster.nodes == 1
    assert "no effect at 1 node" in note.value and "Network" in note.value
    assert "zp-inactive" in app.controls.widgets["inter_node_gbps"]._dom_classes
    app.controls.widgets["nodes"].value = 2
    assert note.value == ""
    assert "zp-inactive" not in app.controls.widgets["inter_node_gbps"]._dom_classes
    assert "zp-inactive" not in app.controls.widgets["network"]._dom_classes


def test_no_effect_notes_match_the_cost_model():
    """Each note is true: the noted control leaves the plan as it is."""
    one = build_scenario()
    notes = no_effect_notes(one)
    assert {"network", "inter_node_gbps", "freeze_vision", "images_per_sample"} == set(notes)
    p = plan(one)
    for other in (build_scenario(network="eth-1g"), build_scenario(inter_node_gbps=1.0),
                  build_scenario(freeze_vision=True)):
        q = plan(other)
        assert (q.choice.label, q.estimate.step_seconds) == (p.choice.label, p.estimate.step_seconds)
    assert not {"network", "inter_node_gbps"} & set(no_effect_notes(build_scenario(nodes=2)))


def test_the_verdict_puts_the_headline_and_warnings_first_and_folds_the_reasons():
    p = plan(build_scenario(model="llama-2-70b", nodes=4, network="eth-25g"))
    text = banner_html(p)
    assert p.warnings and p.reasons and p.advice and p.assumptions
    order = [text.index(m) for m in ("zp-headline", "zp-step-peak", "zp-warnings", "zp-advice", "zp-assume",
                                     "<details class='zp-why'>", "zp-reasons")]
    assert order == sorted(order), order
    assert text.index("zp-headline") < text.index("Recommended:") < text.index("zp-step-peak")
    assert f"Why this pick ({len(p.reasons)} reasons)" in text
