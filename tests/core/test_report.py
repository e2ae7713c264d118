"""The downloadable report: self-contained (no external resources), the charts are the planner's numbers, the config
is the generator's; in Chromium it renders the charts (screenshot artifacts/report.png checked non-blank)."""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path

import pytest

from zeroplanner.deepspeed import to_deepspeed_config
from zeroplanner.planner import plan
from zeroplanner.report import build_report, memory_chart, report_data_uri, svg_stacked_bars, time_chart
from zeroplanner.scenarios import build_scenario
from zeroplanner.units import GIB

from ..browserkit import CHROMIUM, CHROMIUM_ARGS, png_stats

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"

SCENARIO = build_scenario(model="llama-2-70b", nodes=4, network="ib-hdr")


def test_html_report_is_self_contained_and_shows_the_plan():
    page = build_report(SCENARIO, link="http://127.0.0.1:8866/?model=llama-2-70b&nodes=4")
    p = plan(SCENARIO)
    assert page.startswith("<!DOCTYPE html>")
    # nothing to fetch: no scripts, no external stylesheets or images
    assert "<script" not in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert page.count("<svg") == 3  # memory per GPU, step time, memory over one step
    assert f"Recommendation: {p.choice.label}" in page
    for reason in p.reasons:
        assert reason.replace("'", "&#x27;").replace('"', "&quot;").replace("<", "&lt;") in page
    config = re.search(r"<pre class='config'>(.*?)</pre>", page, re.S).group(1)
    assert json.loads(html.unescape(config)) == to_deepspeed_config(p.scenario)
    assert "http://127.0.0.1:8866/?model=llama-2-70b&amp;nodes=4" in page


def test_chart_bars_are_the_planners_numbers():
    p = plan(SCENARIO)
    svg = memory_chart(p, SCENARIO)
    rows = [("Recommended", p.estimate)] + [(v.label, v.estimate) for v in p.variants]
    # each non-zero term of each bar is one rect whose tooltip carries its GiB value
    for label, e in rows:
        for key, name in (("parameters", "Parameters"), ("optimizer_states", "Optimizer states")):
            value = getattr(e.per_gpu_bytes, key) / GIB
            if value > 0:
                assert f"<title>{html.escape(label)}: {name} {value:.3g}</title>" in svg, (label, key)
    expected = sum(1 for _, e in rows for k in ("parameters", "gradients", "optimizer_states", "activations",
                                                "buffers", "overhead") if getattr(e.per_gpu_bytes, k) > 0)
    assert svg.count('class="bar"') == expected
    assert svg.count(">OOM<") == sum(1 for _, e in rows if not e.fits_gpu)
    tsvg = time_chart(p)
    assert f"{p.estimate.tokens_per_second / 1e3:.3g}k tok/s" in tsvg


def test_markdown_report_embeds_svg_images():
    md = build_report(SCENARIO, "markdown")
    uris = re.findall(r"!\[[^\]]*\]\(data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)\)", md)
    assert len(uris) == 3
    assert all(base64.b64decode(u).startswith(b"<svg") for u in uris)
    assert "```json" in md and "$$" in md


def test_report_when_nothing_fits():
    s = build_scenario(model="llama-3.1-405b", gpu="RTX-4090", gpus_per_node=1, cpu_memory_gib=64)
    page = build_report(s)
    assert "Nothing fits" in page and "no config" in page


def test_data_uri_and_bad_format():
    uri = report_data_uri(SCENARIO)
    assert uri.startswith("data:text/html;charset=utf-8;base64,")
    assert base64.b64decode(uri.split(",", 1)[1]).decode().startswith("<!DOCTYPE html>")
    with pytest.raises(ValueError, match="fmt"):
        build_report(SCENARIO, "pdf")
    with pytest.raises(ValueError, match="values for 2 bars"):
        svg_stacked_bars("t", ["a", "b"], [("x", "#000", [1.0])], "y")


def test_labels_are_escaped_in_svg():
    svg = svg_stacked_bars("<b>", ["<script>"], [("a&b", "#000", [1.0])], "y")
    assert "<script>" not in svg and "&lt;script&gt;" in svg and "a&amp;b" in svg


@pytest.mark.browser
def test_report_opens_in_chromium_and_shows_the_charts(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    path = tmp_path / "report.html"
    path.write_text(build_report(SCENARIO), encoding="utf-8")
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            failed = []
            page.on("requestfailed", lambda r: failed.append(r.url))
            page.goto(path.as_uri())
            charts = page.locator("figure.chart svg")
            assert charts.count() == 3  # memory per GPU, step time, memory over one step
            for i in range(3):
                box = charts.nth(i).bounding_box()
                assert box and box["width"] > 600 and box["height"] > 300
            bars = page.locator("figure.chart svg rect.bar")
            assert bars.count() > 20
            heights = bars.evaluate_all("els => els.map(e => e.getBoundingClientRect().height)")
            assert max(heights) > 50
            page.locator("figure.chart.memory").screenshot(path=str(tmp_path / "memory.png"))
            page.screenshot(path=str(shot), full_page=True)
            assert not failed
        finally:
            browser.close()
    width, height, distinct = png_stats(shot.read_bytes())
    assert width >= 1000 and height >= 900 and distinct > 40, "report screenshot looks blank"
    _, _, chart_distinct = png_stats((tmp_path / "memory.png").read_bytes())
    assert chart_distinct > 20, "memory chart screenshot looks blank"
