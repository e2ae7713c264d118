"""The planner app without a browser: set a control's value, check the charts' mark data, the banner and the
config text against the cost model and planner run on the same scenario (built independently with
``zeroplanner.scenarios.build_scenario``), count recomputes during bursts, and check invalid input gives a
message, not an exception."""

from __future__ import annotations

import asyncio
import html
import json
from unittest import mock

import numpy as np
import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("bqplot")

from zeroplanner import catalog  # noqa: E402
from zeroplanner.deepspeed import to_deepspeed_config  # noqa: E402
from zeroplanner.planner import plan as make_plan  # noqa: E402
from zeroplanner.planner import scaling  # noqa: E402
from zeroplanner.scenarios import build_scenario  # noqa: E402
from zeroplanner.ui import PlannerApp  # noqa: E402
from zeroplanner.ui import app as app_module  # noqa: E402
from zeroplanner.ui.charts import segment_tooltip  # noqa: E402
from zeroplanner.ui.state import MEMORY_TERMS, apply_changes, choice_text, scaling_nodes  # noqa: E402
from zeroplanner.units import GIB  # noqa: E402


def _bars(plan) -> list:
    """(label, scenario, estimate) of the expected bars: the recommendation first when something fits, then the
    planner's fixed variants."""
    head = [("Recommended", plan.scenario, plan.estimate)] if plan.fits else []
    return head + [(v.label, v.scenario, v.estimate) for v in plan.variants]


def _memory_gib(plan) -> np.ndarray:
    return np.array([[getattr(e.per_gpu_bytes, key) / GIB for _, _, e in _bars(plan)] for key, _ in MEMORY_TERMS])


def _step_parts(plan) -> np.ndarray:
    return np.array([
        [e.compute_seconds_per_step for _, _, e in _bars(plan)],
        [e.communication.exposed_seconds_per_step for _, _, e in _bars(plan)],
        [e.offload_seconds_per_step + e.optimizer_seconds_per_step for _, _, e in _bars(plan)],
    ])


def assert_shows(app: PlannerApp, scenario) -> None:
    """Every output of ``app`` is what the planner / cost model / zeroplanner.deepspeed say for ``scenario``."""
    plan = make_plan(scenario)
    bars = _bars(plan)
    n = len(bars)
    np.testing.assert_allclose(np.asarray(app.memory_chart.bars.y)[:, :n], _memory_gib(plan), rtol=1e-9)
    cap = scenario.cluster.memory_per_gpu_bytes / GIB
    np.testing.assert_allclose(np.asarray(app.memory_chart.capacity.y, dtype=float), cap, rtol=1e-9)
    np.testing.assert_allclose(np.asarray(app.time_chart.bars.y)[:, :n], _step_parts(plan), rtol=1e-9)
    np.testing.assert_allclose(np.asarray(app.host_chart.bars.y)[:n],
                               [e.host_required_bytes / GIB for _, _, e in bars], rtol=1e-9)  # what the verdict compares
    # fits / OOM / RAM / NVMe markings over the memory bars: the estimate's whole verdict, in the bars' order
    words = ["fits" if e.fits else "OOM" if not e.fits_gpu else "RAM" if not e.fits_cpu else "NVMe"
             for _, _, e in bars]
    assert list(app.memory_chart.fit_labels.text) == [w for w in words if w == "fits"]
    assert list(app.memory_chart.oom_labels.text) == [w for w in words if w != "fits"]
    # scaling: each visible line is the planner's tokens/s at the node counts where the variant fits
    nodes = scaling_nodes(scenario.cluster.nodes)
    table = scaling(scenario, nodes=[int(x) for x in nodes])
    chart = app.scaling_chart
    first = 1 if plan.fits else 0
    for i, v in enumerate(plan.variants, start=first):
        line = chart.lines[i]
        row = table[v.label]
        fits = np.asarray(row["fits"], dtype=bool)
        np.testing.assert_allclose(chart.node_counts(i), nodes[fits])  # line.x: spread where lines coincide
        np.testing.assert_allclose(np.asarray(line.x, dtype=float), nodes[fits], rtol=0.3)
        np.testing.assert_allclose(np.asarray(line.y, dtype=float),
                                   np.asarray(row["tokens_per_second"])[fits], rtol=1e-9)
    assert float(app.scaling_chart.current.x[0]) == scenario.cluster.nodes
    if plan.fits and scenario.cluster.nodes in nodes:  # the recommendation's line passes through its estimate
        rec = app.scaling_chart.lines[0]
        at = list(chart.node_counts(0)).index(float(scenario.cluster.nodes))
        assert float(np.asarray(rec.y)[at]) == pytest.approx(plan.estimate.tokens_per_second, rel=1e-9)
    # banner and config
    if plan.fits:
        assert choice_text(plan.choice) in app.banner.value
    else:
        assert "Does not fit" in app.banner.value
    expected = json.dumps(to_deepspeed_config(plan.scenario, mode=app.state.config_mode), indent=2)
    assert app.config_area.value == expected
    assert app.message.value == ""


def _outputs(app: PlannerApp):
    return (np.asarray(app.memory_chart.bars.y).tobytes(), np.asarray(app.time_chart.bars.y).tobytes(),
            tuple(np.asarray(line.y).tobytes() for line in app.scaling_chart.lines), app.banner.value,
            app.config_area.value)


def test_opening_page_shows_the_default_scenario():
    app = PlannerApp()
    assert_shows(app, build_scenario())
    assert app.recomputes == 1
    # the charts' "Recommended" column is the tuned pick, the others the controls' settings (a new user read a
    # faster Recommended than its own stage's column as a contradiction)
    assert "<i>Recommended</i> is the planner's pick" in app.timing.value


# (control key, value, build_scenario keywords of the expected scenario, keywords set before the change)
MAIN_CONTROLS = [
    ("model", "qwen2.5-14b", dict(model="qwen2.5-14b"), {}),
    ("model_params_b", 30.0, dict(params=30_000_000_000), {}),
    ("gpu", "H100-80GB", dict(gpu="H100-80GB"), {}),
    ("gpu", "A100-40GB", dict(gpu="A100-40GB"), {}),
    ("gpu_memory_gib", 24.0, dict(gpu_memory_gib=24.0), {}),
    ("gpus_per_node", 2, dict(gpus_per_node=2), {}),
    ("nodes", 4, dict(nodes=4), {}),
    ("network", "eth-25g", dict(nodes=4, network="eth-25g"), {"nodes": 4}),
    ("inter_node_gbps", 10.0, dict(nodes=4, inter_node_gbps=10.0), {"nodes": 4}),
]


@pytest.mark.parametrize("key,value,expected,before", MAIN_CONTROLS, ids=[f"{c[0]}={c[1]}" for c in MAIN_CONTROLS])
def test_each_main_control_updates_charts_banner_and_config(key, value, expected, before):
    app = PlannerApp()
    if before:
        app.set(**before)
    previous = _outputs(app)
    app.controls.widgets[key].value = value
    assert_shows(app, build_scenario(**expected))
    assert _outputs(app) != previous, f"changing {key} changed nothing on screen"


def test_model_preset_moves_the_size_slider_and_the_size_slider_makes_a_custom_model():
    app = PlannerApp()
    app.controls.widgets["model"].value = "llama-2-13b"
    assert app.controls.widgets["model_params_b"].value == pytest.approx(
        catalog.model("llama-2-13b").parameter_count / 1e9)
    app.controls.widgets["model_params_b"].value = 3.0
    assert app.state.model_name == "(custom size)"
    assert app.controls.widgets["model"].value == "(custom size)"
    assert app.state.scenario.parameters == 3_000_000_000


def test_gpu_preset_sets_the_memory_slider():
    app = PlannerApp()
    app.controls.widgets["gpu"].value = "H200"
    assert app.controls.widgets["gpu_memory_gib"].value == pytest.approx(
        round(catalog.gpu("H200").memory_bytes / GIB, 1))


def test_fifty_rapid_changes_cost_at_most_two_recomputes_and_end_in_the_last_state(monkeypatch):
    app = PlannerApp(debounce_seconds=0.05)
    counter = mock.Mock(wraps=app_module.derive)
    monkeypatch.setattr(app_module, "derive", counter)
    slider = app.controls.widgets["nodes"]

    async def burst():
        for i in range(50):
            slider.value = 1 + (i * 7) % 64
        slider.value = 6
        await asyncio.sleep(0.3)

    asyncio.run(burst())
    assert counter.call_count <= 2
    assert app.state.scenario.cluster.nodes == 6
    assert_shows(app, build_scenario(nodes=6))


def test_burst_across_different_controls_keeps_every_last_value(monkeypatch):
    app = PlannerApp(debounce_seconds=0.05)
    counter = mock.Mock(wraps=app_module.derive)
    monkeypatch.setattr(app_module, "derive", counter)
    w = app.controls.widgets

    async def burst():
        for i in range(25):
            w["nodes"].value = 2 + i % 5
            w["gpus_per_node"].value = 1 + i % 8
        w["network"].value = "ib-ndr"
        await asyncio.sleep(0.3)

    asyncio.run(burst())
    assert counter.call_count <= 2
    assert_shows(app, build_scenario(nodes=2 + 24 % 5, gpus_per_node=1 + 24 % 8, network="ib-ndr"))


@pytest.mark.parametrize("changes,field", [
    ({"qlora": True}, "lora_rank"),  # TrainingSpec: qlora needs lora_rank >= 1
    ({"lora_rank": 8, "precision": "fp32", "qlora": True}, "precision"),  # QLoRA needs bf16/fp16
])
def test_invalid_combination_shows_a_message_and_keeps_the_last_valid_plan(changes, field):
    app = PlannerApp()
    *valid, (last_key, last_value) = changes.items()
    for key, value in valid:
        app.controls.widgets[key].value = value
    before = _outputs(app)
    app.controls.widgets[last_key].value = last_value  # must not raise
    assert "Not a valid setup" in app.message.value and field in app.message.value
    assert "Traceback" not in app.message.value
    assert _outputs(app) == before


def test_rejected_value_is_kept_until_fixed():
    app = PlannerApp()
    app.controls.widgets["qlora"].value = True
    assert "lora_rank" in app.message.value
    app.controls.widgets["lora_rank"].value = 16
    assert app.message.value == ""
    assert app.state.scenario.training.qlora and app.state.scenario.training.lora_rank == 16
    assert_shows(app, build_scenario(lora_rank=16, qlora=True))


def test_an_internal_error_is_a_message_not_a_traceback(monkeypatch):
    app = PlannerApp()
    before = _outputs(app)

    def broken(state):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(app_module, "derive", broken)
    app.controls.widgets["nodes"].value = 2  # must not raise
    assert "Internal error while planning" in app.message.value and "ZeroDivisionError" in app.message.value
    assert _outputs(app) == before
    monkeypatch.undo()
    app.controls.widgets["nodes"].value = 3
    assert app.message.value == ""
    assert_shows(app, build_scenario(nodes=3))


def test_unknown_catalog_name_is_a_message():
    app = PlannerApp()
    app.set(gpu="no-such-gpu")
    assert "unknown gpu" in app.message.value


def test_apply_changes_is_pure_and_validates():
    app = PlannerApp()
    state = app.state
    new = apply_changes(state, {"nodes": 3, "micro_batch": 2})
    assert state.scenario.cluster.nodes == 1 and new.scenario.cluster.nodes == 3
    assert new.scenario.training.micro_batch == 2
    with pytest.raises(KeyError):
        apply_changes(state, {"no_such_control": 1})


def test_advanced_controls_reach_the_scenario():
    app = PlannerApp()
    app.set(seq_len=2048, micro_batch=2, grad_accum=4, precision="fp16", optimizer="sgd", checkpointing="none",
            flash_attention=False, mfu=0.5, cpu_memory_gib=256, reduce_bucket_size=2e8, overlap_comm="on",
            pin_memory=False)
    s = app.state.scenario
    assert (s.training.seq_len, s.training.micro_batch, s.training.grad_accum) == (2048, 2, 4)
    assert (s.training.precision, s.training.optimizer, s.training.checkpointing) == ("fp16", "sgd", "none")
    assert s.training.flash_attention is False and s.assumptions.mfu == 0.5
    assert s.cluster.cpu_memory_bytes == 256 * GIB
    assert s.zero.reduce_bucket_size == 200_000_000 and s.zero.overlap_comm is True
    assert s.zero.offload_optimizer.pin_memory is False
    assert_shows(app, s)


def test_zeropp_options_add_a_variant_priced_by_the_cost_model():
    from zeroplanner.costmodel import estimate
    from zeroplanner.specs import replace

    app = PlannerApp()
    app.set(nodes=4, zero_hpz_partition_size=8, zero_quantized_weights=True, zero_quantized_gradients=True)
    label = app.view.memory.labels[-1]
    assert app.view.memory.labels[0] == "Recommended"
    assert label == "ZeRO-3 + ZeRO++ (hpZ 8, qwZ, qgZ)"
    base = build_scenario(nodes=4)
    zpp = replace(base, zero=replace(base.zero, stage=3, zero_hpz_partition_size=8, zero_quantized_weights=True,
                                     zero_quantized_gradients=True))
    est = estimate(zpp)
    assert app.view.time.tokens_per_second[-1] == pytest.approx(est.tokens_per_second)
    assert np.asarray(app.memory_chart.bars.y)[:, -1].sum() == pytest.approx(est.per_gpu_bytes.total / GIB)
    app.variant_picker.value = label
    assert json.loads(app.config_area.value)["zero_optimization"]["zero_quantized_weights"] is True


def test_config_preview_follows_variant_picker_and_hf_toggle():
    app = PlannerApp()
    plan = make_plan(build_scenario())
    app.variant_picker.value = "ZeRO-3 + CPU optimizer"
    cfg = json.loads(app.config_area.value)
    assert cfg["zero_optimization"]["stage"] == 3
    assert cfg["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    app.mode_toggle.value = "hf_trainer"
    variant = next(v for v in plan.variants if v.label == "ZeRO-3 + CPU optimizer")
    assert app.config_area.value == json.dumps(to_deepspeed_config(variant.scenario, mode="hf_trainer"), indent=2)
    assert '"auto"' in app.config_area.value
    assert "download=\"ds_config_hf_trainer.json\"" in app.config_actions.value.replace("'", '"')
    # Download and Copy take the text the preview shows (read in the browser), so the buttons' HTML does not carry
    # the config and is not re-sent when it changes; tests/browser/test_browser.py checks the downloaded file.
    assert "querySelector('.zp-config textarea').value" in html.unescape(app.config_actions.value)
    assert app.config_area.value not in app.config_actions.value


def test_tooltip_names_the_term_and_its_gib():
    app = PlannerApp()
    view = app.view.memory
    z0 = view.labels.index("ZeRO-0")
    tip = segment_tooltip(view, 2, z0)  # optimizer states of ZeRO-0
    assert "Optimizer states" in tip and f"{view.gib[2, z0]:.2f} GiB" in tip and "ZeRO-0" in tip
    assert "fp32 master" in tip  # the cost model's formula text for this term
    hover = {"event": "hover", "data": {"index": view.labels.index("ZeRO-3"), "subIndex": 0}}
    app.memory_chart._on_hover(app.memory_chart.bars, hover)
    assert "ZeRO-3" in app.memory_chart.tooltip_html.value and "Parameters" in app.memory_chart.tooltip_html.value


def test_step_time_tooltip_names_the_part_and_seconds():
    app = PlannerApp()
    view = app.view.time
    z3 = view.labels.index("ZeRO-3")
    app.time_chart._on_hover(app.time_chart.bars, {"event": "hover", "data": {"index": z3, "subIndex": 1}})
    text = app.time_chart.tooltip_html.value
    assert "ZeRO-3" in text and "Exposed communication" in text
    assert f"{view.seconds[1, z3]:.3g} s" in text and f"{view.tokens_per_second[z3]:,.0f} tokens/s" in text


def test_config_for_a_variant_that_does_not_fit_says_so():
    app = PlannerApp()
    assert not app.view.memory.fits[app.view.memory.labels.index("ZeRO-0")]  # 7B, 8 GPUs: ZeRO-0 needs > 80 GiB
    app.variant_picker.value = "ZeRO-0"
    assert "ZeRO-0 does not fit" in app.config_actions.value
    assert json.loads(app.config_area.value)["zero_optimization"]["stage"] == 0


def test_nothing_fits_is_said_in_banner_charts_and_config():
    app = PlannerApp()
    app.set(model="llama-3.1-405b", cpu_memory_gib=64)
    scenario = build_scenario(model="llama-3.1-405b", cpu_memory_gib=64)
    assert not make_plan(scenario).fits
    assert_shows(app, scenario)
    assert "Recommended" not in app.view.memory.labels
    assert "Nothing fits this cluster" in app.config_actions.value


def test_an_offload_bar_within_gpu_memory_but_over_host_ram_is_not_marked_fits():
    """Llama-2-70B on 8 x 80 GB with 256 GiB host RAM: ZeRO-3 + CPU offload holds 1,734 GiB per node on the host
    (the host chart); its bar is within GPU memory, and the memory chart's row says "RAM", not "fits"."""
    app = PlannerApp()
    app.set(model="llama-2-70b", cpu_memory_gib=256)
    scenario = build_scenario(model="llama-2-70b", cpu_memory_gib=256)
    assert_shows(app, scenario)
    m = app.view.memory
    i = m.labels.index("ZeRO-3 + CPU optimizer")
    assert m.fits_gpu[i] and not m.fits_cpu[i] and m.host_gib[i] > 256
    assert "fits" not in list(app.memory_chart.fit_labels.text)
    assert "RAM" in list(app.memory_chart.oom_labels.text)
    assert "host RAM is short" in segment_tooltip(m, 0, i)


def test_clicking_a_segment_opens_explain_on_that_variant_and_term():
    app = PlannerApp()
    bars = app.memory_chart.bars
    z3 = app.view.memory.labels.index("ZeRO-3")
    # what bqplot sends: a hover datum with index/subIndex, then the clicked bar in `selected`
    bars._handle_custom_msgs(bars, {"event": "hover", "data": {"index": z3, "subIndex": 1}}, [])
    bars.selected = [z3]
    assert app.details.selected_index == app.tab_index("explain")
    assert app.explain.variant.value == "ZeRO-3" and app.explain.term.value == "gradients"
    assert "Gradients" in app.explain.math.value
    assert bars.selected is None  # cleared so the same bar can be clicked again
    tbars = app.time_chart.bars
    tbars._handle_custom_msgs(tbars, {"event": "hover", "data": {"index": z3, "subIndex": 1}}, [])
    tbars.selected = [z3]
    assert app.explain.term.value == "time:communication"


def test_compare_panel_follows_the_controls_once_pinned():
    app = PlannerApp()
    app.compare.pin()
    app.controls.widgets["nodes"].value = 2
    assert app.compare.pinned.scenario.cluster.nodes == 1
    assert app.compare.current.scenario.cluster.nodes == 2


def test_share_link_and_page_query_round_trip(monkeypatch):
    from zeroplanner.share import scenario_from_query

    app = PlannerApp()
    app.set(nodes=4, network="ib-ndr", model="qwen2.5-14b")
    query = app.share_query()
    assert "nodes=4" in query and "network=ib-ndr" in query and "model=qwen2.5-14b" in query
    assert "zp-copy-link" in app.share_link.value
    monkeypatch.setenv("QUERY_STRING", query)
    reopened = PlannerApp()
    assert reopened.state.scenario == scenario_from_query(query)
    assert reopened.controls.widgets["nodes"].value == 4
    assert reopened.controls.widgets["network"].value == "ib-ndr"
    assert reopened.config_area.value == app.config_area.value


def test_a_bad_link_opens_the_default_with_a_message(monkeypatch):
    monkeypatch.setenv("QUERY_STRING", "nodes=-3")
    app = PlannerApp()
    assert "link" in app.message.value and "nodes" in app.message.value
    assert app.state.scenario == build_scenario()


def test_a_link_with_one_bad_key_applies_the_rest_and_names_it(monkeypatch):
    monkeypatch.setenv("QUERY_STRING", "model=llama-2-13b&nodes=-3&gpu=H100-80GB&nodez=4")
    app = PlannerApp()
    assert app.state.scenario == build_scenario(model="llama-2-13b", gpu="H100-80GB")
    assert "Not used from the link: nodes (must be an integer in [1, 100000] (got &#x27;-3&#x27;))" in \
        app.message.value and "nodez (unknown key; did you mean nodes?)" in app.message.value
    app.controls.widgets["nodes"].value = 2  # the note goes with the first change
    assert app.message.value == ""


def test_a_preheated_kernel_builds_the_page_before_the_request_and_then_opens_the_link(monkeypatch):
    """In a pre-heated Voilà kernel (VOILA_PREHEAT=True, no QUERY_STRING yet) the page is built at once on the
    default scenario, without blocking on the request; when the request info arrives (Voilà's request-info
    websocket, replaced here by a wait that sets the environment) the link's scenario is applied with one
    recompute and the share link names the page's own URL."""
    from zeroplanner.share import scenario_from_query

    query = "model=llama-2-13b&nodes=2&network=ib-hdr"
    arrived = asyncio.Event()
    monkeypatch.setenv("VOILA_PREHEAT", "True")
    monkeypatch.delenv("QUERY_STRING", raising=False)

    async def main():
        loop = asyncio.get_running_loop()
        gate = __import__("threading").Event()

        def wait_for_request():  # what Voila's request-info websocket delivers (voila/utils.py wait_for_request)
            gate.wait(10)
            for key, value in {"QUERY_STRING": query, "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8866",
                               "SCRIPT_NAME": "/"}.items():
                monkeypatch.setenv(key, value)
            loop.call_soon_threadsafe(arrived.set)

        monkeypatch.setattr(app_module, "receive_voila_request", wait_for_request)
        app = PlannerApp()
        assert app.state.scenario == build_scenario()  # built before any request, on the default
        assert app.recomputes == 1
        gate.set()
        await asyncio.wait_for(arrived.wait(), 10)
        for _ in range(50):  # _voila_request_arrived runs on this loop right after the thread's callback
            await asyncio.sleep(0.01)
            if app.recomputes == 2:
                break
        return app

    app = asyncio.run(main())
    assert app.state.scenario == scenario_from_query(query)
    assert app.recomputes == 2
    assert app.controls.widgets["nodes"].value == 2
    assert "http://127.0.0.1:8866/?" in app.share_link.value


def test_a_request_without_a_link_keeps_what_the_page_shows(monkeypatch):
    """The request info of a page opened without a link (empty QUERY_STRING) never resets the page, even when it
    arrives after the visitor's first change."""
    monkeypatch.setenv("VOILA_PREHEAT", "True")
    monkeypatch.delenv("QUERY_STRING", raising=False)

    async def main():
        gate = __import__("threading").Event()
        monkeypatch.setattr(app_module, "receive_voila_request", lambda: (gate.wait(10),
                                                                         monkeypatch.setenv("QUERY_STRING", "")))
        app = PlannerApp()
        app.controls.widgets["nodes"].value = 3
        await asyncio.sleep(0.1)
        gate.set()
        for _ in range(50):
            await asyncio.sleep(0.01)
            if "QUERY_STRING" in __import__("os").environ:
                break
        await asyncio.sleep(0.05)
        return app

    app = asyncio.run(main())
    assert app.state.scenario.cluster.nodes == 3
    assert app.controls.widgets["nodes"].value == 3


def test_receive_voila_request_reads_voilas_request_info_websocket(monkeypatch):
    """``receive_voila_request`` connects where Voilà's ``wait_for_request`` does (voila/utils.py, Voilà 0.5.13:
    ws://VOILA_APP_IP:VOILA_APP_PORT/VOILA_SERVER_URL voila/query/KERNEL_ID) and puts the one JSON message it
    receives into os.environ; a real websocket server on loopback stands in for Voilà's RequestInfoSocketHandler."""
    import threading

    from websockets.sync.server import serve

    paths = []

    def handler(ws):
        paths.append(ws.request.path)
        ws.send(json.dumps({"QUERY_STRING": "nodes=4", "SERVER_NAME": "127.0.0.1", "SCRIPT_NAME": "/"}))

    with serve(handler, "127.0.0.1", 0) as server:
        port = server.socket.getsockname()[1]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        environ = {"VOILA_PREHEAT": "True", "VOILA_APP_PORT": str(port), "VOILA_SERVER_URL": "/",
                   "VOILA_KERNEL_ID": "k-123", "SERVER_NAME": "old"}  # SERVER_NAME is replaced by the message
        monkeypatch.setattr(app_module.os, "environ", environ)  # the whole environment, restored afterwards
        app_module.receive_voila_request()
        server.shutdown()
    assert paths == ["/voila/query/k-123"]
    assert environ["QUERY_STRING"] == "nodes=4" and environ["SERVER_NAME"] == "127.0.0.1"
    del environ["QUERY_STRING"], environ["VOILA_PREHEAT"]
    app_module.receive_voila_request()  # outside a pre-heated kernel: returns at once


def test_report_button_offers_an_html_download():
    app = PlannerApp()
    text = app.build_report()
    assert text.lstrip().lower().startswith("<!doctype html") or "<html" in text[:500].lower()
    assert "download='zeroplanner-report.html'" in app.report_link.value


def test_largest_model_panel_matches_the_planner_and_goes_stale():
    from zeroplanner.planner import largest_model

    app = PlannerApp()
    app.show_tab("largest")  # opening the tab computes it
    expected = largest_model(build_scenario())
    assert app._largest_for == app.state.scenario
    for label, params in expected.items():
        shown = f"{params / 1e9:,.1f} B" if params else "none on the grid"
        assert f"<td>{html.escape(label)}</td><td style='text-align:right'>{shown}</td>" in app.largest_html.value
    app.controls.widgets["nodes"].value = 2
    assert "Out of date" in app.largest_html.value
    assert app.compute_largest() == largest_model(build_scenario(nodes=2))
    assert "Out of date" not in app.largest_html.value


def test_about_lists_the_pinned_versions():
    app = PlannerApp()
    app.about.selected_index = 0  # its panel is placed when first opened (controls.lazy_accordion)
    about = app.children[-1].children[0].children[0].value
    for name, version in [("voila", "0.5.13"), ("ipywidgets", "8.1.9"), ("jupyterlab_widgets", "3.0.17"),
                          ("bqplot", "0.13.1")]:
        assert f"<td>{name}</td><td><code>{version}</code></td>" in about


def test_paste_config_loads_controls_and_shows_findings():
    app = PlannerApp()
    text = json.dumps({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
                       "bf16": {"enabled": True}, "fp16": {"enabled": True},
                       "zero_optimization": {"stage": 3, "reduce_bucket_size": 5e7}})
    findings = app.load_config(text)
    assert app.controls.widgets["micro_batch"].value == 2 and app.controls.widgets["grad_accum"].value == 4
    assert app.state.scenario.zero.reduce_bucket_size == 50_000_000
    assert any(f.severity == "error" for f in findings)  # fp16 and bf16 both enabled (lint rule)
    assert "error" in app.paste_findings.value
    assert_shows(app, app.state.scenario)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "x" * 2_000_000])
def test_paste_bad_config_is_a_message(text):
    app = PlannerApp()
    before = _outputs(app)
    assert app.load_config(text) == []
    assert "Cannot read this config" in app.paste_findings.value
    assert _outputs(app) == before


@pytest.mark.parametrize("text", ["", "  \n\t "])
def test_paste_of_nothing_names_the_size_limits(text):
    """An empty box, and what arrives after a paste over the 10 MiB websocket limit (nothing: the connection drops
    it; docs/security.md), say so and name both limits instead of "not valid JSON"."""
    app = PlannerApp()
    before = _outputs(app)
    assert app.load_config(text) == []
    message = app.paste_findings.value
    assert "Nothing to load" in message and "1,000,000 bytes" in message and "10 MiB" in message
    assert "not valid JSON" not in message
    assert _outputs(app) == before


def test_use_this_machine_without_cuda_says_so():
    """Runs the real probe in a subprocess (this test machine has no CUDA device: torch is the CPU build)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this test covers the no-CUDA path")
    app = PlannerApp()
    result = app.use_this_machine(timeout_seconds=120)
    assert result["cuda_available"] is False
    assert "No CUDA GPU found" in app.probe_message.value
    host = result.get("host") or {}
    if "ram_available_bytes" in host:
        assert app.state.scenario.cluster.cpu_memory_bytes == int(host["ram_available_bytes"])
        assert app.controls.widgets["cpu_memory_gib"].value == round(host["ram_available_bytes"] / GIB)
    assert_shows(app, app.state.scenario)
