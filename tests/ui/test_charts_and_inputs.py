"""Without a browser: the Largest-model table says what limits each row, the scaling chart spreads coinciding
points, axes never use exponents, and a config.json nested 10,000 deep gets the reader's depth limit (the page's
paste boxes and the CLI's reader share it). The browser side is tests/browser/test_browser_charts.py."""

from __future__ import annotations

import html
import re

import numpy as np
import pytest

pytest.importorskip("ipywidgets")

from zeroplanner.catalog.hfconfig import MAX_CONFIG_DEPTH, load_hf_config, read_hf_config_bytes  # noqa: E402
from zeroplanner.deepspeed import MAX_DEPTH  # noqa: E402
from zeroplanner.planner import GRID_TOP, largest_model, largest_model_limits  # noqa: E402
from zeroplanner.scenarios import build_scenario  # noqa: E402
from zeroplanner.ui import PlannerApp  # noqa: E402
from zeroplanner.ui.charts import dodge_nodes  # noqa: E402

DEEP = ["[" * 10_000 + "]" * 10_000, '{"a": ' * 10_000 + "1" + "}" * 10_000]


def _text(value: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", value))


@pytest.fixture(scope="module")
def app():
    return PlannerApp(debounce_seconds=0)


def test_largest_model_rows_name_their_limit():
    """On 4 nodes, offloading the parameters too stops at a smaller model than offloading the optimizer alone:
    both are stopped by host RAM, which the parameters' offload fills first."""
    limits = largest_model_limits(build_scenario(nodes=4))
    assert {k: v["parameters"] for k, v in limits.items()} == largest_model(build_scenario(nodes=4))
    opt, both = limits["ZeRO-3 + CPU optimizer"], limits["ZeRO-3 + CPU optimizer & params"]
    assert both["parameters"] < opt["parameters"]
    assert opt["limited_by"] == both["limited_by"] == ("host RAM",)
    assert limits["ZeRO-3"]["limited_by"] == ("GPU memory",)
    for r in limits.values():  # the next size searched is the first that does not fit
        assert r["next_parameters"] > r["parameters"] and r["limited_by"] and GRID_TOP not in r["limited_by"]


def test_largest_model_table_shows_the_limits(app):
    app.set(nodes=4)
    app.flush()
    app.show_tab("largest")
    app.compute_largest()
    text = app.largest_html.value
    # the limit is the next size searched, not the model's own limit (a new user read "GPU memory at 4.2 B" so)
    assert "<th>limited by (the next size searched)</th>" in text
    assert re.search(r"ZeRO-3 \+ CPU optimizer &amp; params</td><td style='text-align:right'>[\d.,]+ B</td>"
                     r"<td style='text-align:right'>host RAM at [\d.,]+ B</td>", text), text
    assert re.search(r"ZeRO-3</td><td[^>]*>[\d.,]+ B</td><td[^>]*>GPU memory at [\d.,]+ B</td>", text), text
    app.set(nodes=1)
    app.flush()


def test_coinciding_scaling_points_are_spread_apart_and_others_stay():
    nodes = np.array([1.0, 2.0, 4.0])
    y = np.array([[100.0, 200.0, 400.0], [100.0, 200.0, 400.0], [10.0, 20.0, np.nan]])
    x = dodge_nodes(nodes, y, x_decades=2.0, y_decades=2.0, width_px=600, height_px=300)
    assert x[0, 0] < 1.0 < x[1, 0] and np.allclose(x[0] * x[1], nodes**2)  # symmetric about the node count
    assert np.allclose(x[2, :2], nodes[:2])  # a point that stands apart keeps its node count
    px = np.abs(np.log10(x[1] / x[0])) * 600 / 2.0
    assert np.all(px >= 6.9)


def test_scaling_chart_draws_every_point_inside_the_axis_with_the_current_line_under(app):
    app.show_tab("scaling")
    chart = app.scaling_chart
    assert chart.marks[0] is chart.current and chart.marks[-1] is chart.lines[0]  # Recommended on top
    xs = np.concatenate([np.asarray(line.x, dtype=float) for line in chart.lines if line.visible])
    assert chart.x_scale.min < xs.min() and xs.max() < chart.x_scale.max  # none on the plot's edge
    assert chart.node_counts(0)[0] == 1.0 and len(chart.lines[0].x) == len(chart.node_counts(0))


def test_no_axis_uses_an_exponent_format(app):
    app.show_tab("time")
    app.show_tab("host")
    figures = [app.memory_chart, app.time_chart, app.host_chart, app.scaling_chart]
    app.compare.pin()
    figures += [app.compare.memory_chart, app.compare.time_chart]
    for fig in figures:
        for axis in fig.axes:
            fmt = axis.tick_format or ""
            assert not re.search(r"[eg]$", fmt), (fig.title, fmt)  # d3 "e" / "g" write 3000 as "3e+3"
    app.compare.unpin()


@pytest.mark.parametrize("text", DEEP, ids=["brackets", "objects"])
def test_a_10000_deep_paste_gets_the_depth_limit(app, text):
    app.load_hf_config(text, "pasted config.json")
    said = _text(app.hf_message.value)
    assert f"nested deeper than {MAX_CONFIG_DEPTH} levels" in said and "recursion" not in said, said
    app.load_config(text)
    said = _text(app.paste_findings.value)
    assert f"deeper than {MAX_DEPTH} levels" in said and "recursion" not in said, said


@pytest.mark.parametrize("text", DEEP, ids=["brackets", "objects"])
def test_the_cli_file_reader_is_the_same_reader(tmp_path, text):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"nested deeper than {MAX_CONFIG_DEPTH} levels"):
        load_hf_config(path)
    with pytest.raises(ValueError, match=f"nested deeper than {MAX_CONFIG_DEPTH} levels"):
        read_hf_config_bytes(text.encode(), "x.json")
