"""``PlannerApp``: the interactive planner, an ipywidgets container usable inline (``PlannerApp()``) and as the
Voilà page ``notebooks/planner.ipynb``.

Data flow (one direction): a control reports ``(key, value)`` -> the change is queued -> :meth:`PlannerApp.flush`
applies every queued change to the frozen state at once (:func:`~zeroplanner.ui.state.apply_changes`), derives the
view with one call to :func:`~zeroplanner.ui.state.derive` (the planner) and pushes it to the chart on screen and
the banner; the config preview and the rest of the page follow a few milliseconds later
(:data:`FOLLOW_UP_DELAY_SECONDS`). Watchers only queue changes and cause effects; nothing is computed inside them.

Coalescing: the first change after a quiet period is applied at once (no added latency for a single slider move);
changes arriving within ``debounce_seconds`` after that are queued and applied together when the window closes,
so a burst of N changes costs at most two recomputes and ends in the state of the last change. Coalescing needs a
running asyncio loop (the Jupyter/Voilà kernel has one); without one every change is applied immediately.

Invalid input (``ValidationError``, ``ValueError``, ``KeyError``) is shown as a message above the charts; the last
valid plan stays on screen. No traceback reaches the page.
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import os
import threading
import time
from importlib import metadata
from typing import Any

import ipywidgets as w
from pydantic import ValidationError

from ..deepspeed import MAX_CONFIG_BYTES
from ..pagejs import COPY_CONFIG_JS, COPY_LINK_JS, DOWNLOAD_CONFIG_JS
from .charts import HostMemoryChart, MemoryChart, ScalingChart, StepTimeChart, StepTimelineChart
from .controls import Controls, lazy_accordion
from .state import (
    RECOMMENDED,
    AppState,
    View,
    apply_changes,
    data_uri,
    default_state,
    derive,
    error_message,
    state_from_scenario,
)

_CSS = """
<style>
.zp-app { font-family: var(--jp-ui-font-family, sans-serif); container-type: inline-size; }
/* the verdict: headline, step peak and warnings first (state.banner_html), reasons collapsed; the box is bounded so
   that the main chart stays above the fold at 1440 x 900, and tall enough for the headline and the first warning */
.zp-verdict { max-height: 330px; overflow-y: auto; }
.zp-verdict summary { cursor: pointer; color: #333; margin-top: 2px; }
.zp-verdict .zp-advice, .zp-verdict .zp-warnings, .zp-verdict .zp-reasons { margin: 2px 0 0 0; }
/* tab titles keep their width (never cut); a bar too narrow for them wraps */
.zp-app .lm-TabBar-tab { min-width: 0 !important; flex: 0 0 auto !important; padding: 0 10px !important; }
.zp-app .lm-TabBar-content { flex-wrap: wrap; }
.zp-app .widget-toggle-button { text-overflow: clip; padding: 0 10px; }
/* controls: a label never cut (it wraps), a readout looks like the box it is (it takes a typed value) */
.zp-controls .widget-inline-hbox > .widget-label { white-space: normal; overflow-wrap: anywhere; text-overflow: clip;
                                                  line-height: 14px; display: flex; align-items: center;
                                                  justify-content: flex-end; align-self: stretch; }
.zp-controls .jupyter-widget-Collapse-contents { padding: 6px 2px 6px 4px; }
/* the column scrolls (max-height) instead of squeezing its parts: an open Advanced section left the main controls
   0 px tall */
.zp-controls > .lm-Widget { flex-shrink: 0; }
.zp-controls .widget-checkbox .widget-label-basic { white-space: normal; text-overflow: clip; line-height: 16px; }
.zp-controls .widget-readout { border: 1px solid #b5b5b5; border-radius: 3px; background: #fff; cursor: text;
                               min-width: 52px; max-width: 84px; height: 24px; line-height: 24px; padding: 0 4px; }
.zp-controls .widget-readout:focus { outline: 2px solid #4c78a8; }
.zp-controls .zp-hint { color: #555; margin: 0 0 2px 0; }
.zp-controls .zp-no-effect { color: #8a5a00; margin: -2px 0 4px 8px; }
.zp-controls .zp-note:not(:has(small)) { display: none; }
.zp-controls .zp-inactive { opacity: 0.6; }
/* three columns: a slider's label sits above its track, so the track has the column's width (>= 180 px) */
@container (min-width: 1241px) {
  .zp-grid .zp-controls .widget-inline-hbox > .widget-label { justify-content: flex-start; padding-left: 4px; }
  .zp-grid .zp-controls .widget-hslider { flex-wrap: wrap; height: auto; row-gap: 0; }
  .zp-grid .zp-controls .widget-hslider > .widget-label { width: 100% !important; justify-content: flex-start;
                                                          line-height: 18px; margin: 2px 0 0 0; }
}
.zp-verdict .zp-banner { margin: 0 0 4px 0; }
.zp-grid .zp-controls .widget-accordion, .zp-grid .zp-controls .lm-Widget { max-width: 100%; }
/* narrower than three columns (a small window, a JupyterLab cell): one column, controls first */
@container (max-width: 1240px) {
  .zp-grid { grid-template-columns: minmax(0, 1fr) !important;
             grid-template-areas: "left-sidebar" "center" "right-sidebar" !important; }
  .zp-grid .zp-controls { max-height: none !important; max-width: 600px; }
}
.zp-banner { padding: 8px 12px; border-radius: 4px; margin: 4px 0; line-height: 1.35; }
.zp-good { background: #e8f5e9; border-left: 5px solid #2e7d32; }
.zp-bad { background: #ffebee; border-left: 5px solid #c62828; }
.zp-banner ul { margin: 4px 0 0 0; padding-left: 20px; }
.zp-warn-title { margin-top: 4px; font-weight: bold; color: #8a5a00; }
.zp-warnings li { color: #8a5a00; }
.zp-step-peak { margin-top: 2px; }
.zp-peak-risky { color: #8a5a00; }
.zp-peak-over { color: #c62828; }
.zp-error { background: #fff3e0; border-left: 5px solid #ef6c00; padding: 6px 10px; margin: 4px 0; }
.zp-config textarea { font-family: var(--jp-code-font-family, monospace); font-size: 12px; }
.zp-muted { color: #666; font-size: 12px; }
.zp-controls small { display: block; line-height: 1.35; }
.zp-button { padding: 3px 10px; margin-right: 8px; border: 1px solid #999; border-radius: 3px; background: #f5f5f5;
             color: #222; text-decoration: none; font-size: 13px; cursor: pointer; }
</style>
"""

_log = logging.getLogger(__name__)

WEBSOCKET_LIMIT_MIB = 10
"""Largest websocket message the page's server accepts, MiB: tornado's ``websocket_max_message_size`` default
(tornado/websocket.py, ``_default_max_message_size = 10 * 1024 * 1024``), which jupyter_server and Voilà keep. A
longer paste closes the page's kernel connection and never reaches :meth:`PlannerApp.load_config`."""

FOLLOW_UP_DELAY_SECONDS = 0.005
"""Delay, seconds, between a change's chart/verdict update and its follow-up (config preview, other controls, share
link, detail panel, timing; :meth:`PlannerApp._follow_up`). The kernel hands its messages to ipykernel's IOPub thread,
which needs the GIL to send them; while the main thread computes, it gets the GIL only at the interpreter's switch
interval (``sys.getswitchinterval()``, 5 ms by default). Returning to the event loop for this long first lets the
visible updates leave before the follow-up's few milliseconds of work (the share query alone was a quarter of a
node-slider change, cProfile)."""

ABOUT_PACKAGES = ("zeroplanner", "voila", "ipywidgets", "jupyterlab_widgets", "bqplot", "deepspeed")
"""Packages whose installed versions the About section lists."""


def installed_versions(packages: tuple[str, ...] = ABOUT_PACKAGES) -> dict[str, str]:
    """Installed version of each package ("not installed" when absent), from the distribution metadata."""
    out = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def initial_state(environ: dict[str, str] | None = None) -> tuple[AppState, str]:
    """The opening state: the page's query string when it names a scenario (``zeroplanner.share``: Voilà puts the
    request's query string in the kernel's environment), else :func:`default_state`. Returns (state, message).

    A link is applied as far as it can be (``zeroplanner.share.link_from_environment``): an unknown key or a bad
    value is left out, the rest applied, and the message names what was left out (``Not used from the link: nodez
    (unknown key; did you mean nodes?). ...``); a query refused as a whole (too long, malformed) opens the default
    and the message says why. ``environ`` (a mapping) replaces ``os.environ`` and then nothing waits; without it a
    pre-heated Voilà kernel first waits for its page request (``zeroplanner.share.wait_for_voila_request``)."""
    from ..share import link_from_environment

    try:
        link = link_from_environment(environ)
    except ValueError as exc:  # ShareError is a ValueError naming the key
        return default_state(), f"The link's scenario was not used: {error_message(exc)}"
    if link is None:
        return default_state(), ""
    return state_from_scenario(link.scenario), link.note


TABS: tuple[tuple[str, str], ...] = (
    ("memory", "Memory per GPU"), ("step", "Over one step"), ("time", "Step time"), ("host", "Host RAM"),
    ("scaling", "Scaling"),
    ("explain", "Explain"), ("compare", "Compare"), ("largest", "Largest model"),
)
"""The views beside the main chart (key, tab title), in tab order. Only the open tab is drawn and updated. "Over one
step" is the memory timeline of one training step of the variant the config preview shows (``View.step``)."""


def awaiting_voila_request() -> bool:
    """True in a pre-heated Voilà kernel that no page has taken yet: ``VOILA_PREHEAT=True`` and no
    ``QUERY_STRING`` in the environment (the condition of ``zeroplanner.share.wait_for_voila_request``, from Voilà
    0.5.13's ``voila/utils.py`` ``wait_for_request`` and ``voila/voila_kernel_manager.py`` ``fill_if_needed``)."""
    return os.environ.get("VOILA_PREHEAT", "False") == "True" and "QUERY_STRING" not in os.environ


def receive_voila_request() -> None:
    """Block until Voilà sends this pre-heated kernel its page request's info, and put it in ``os.environ``
    (``QUERY_STRING``, ``SERVER_NAME``, ``SERVER_PORT``, ``SCRIPT_NAME``, ...). Returns at once outside a
    pre-heated kernel (:func:`awaiting_voila_request`).

    What ``voila.utils.wait_for_request`` does (Voilà 0.5.13: the URL from the same environment variables, one
    message on ``voila/query/<kernel id>``), with the ``websockets`` package's synchronous client. Voilà's own
    version (an asyncio loop in a second thread) returned about 4.5 s after the page request in the one loaded
    run where it was timed, after the visitor's first change; this one returned 0.1 s after it (connected,
    received and closed, timed twice in the planner's kernel on the 2-core build machine). Raises what
    ``websockets`` raises when the server cannot be reached (``OSError``, ``TimeoutError``: no connection within
    5 s, Voilà's ``open_timeout``) or ``ValueError`` for a malformed message."""
    if not awaiting_voila_request():
        return
    try:
        from websockets.sync.client import connect
    except ImportError:  # pragma: no cover - websockets is a Voila dependency; Voila's own wait then
        from ..share import wait_for_voila_request

        wait_for_voila_request()
        return
    env = os.environ
    base = env.get("VOILA_WS_BASE_URL", env.get("VOILA_SERVER_URL", "/"))
    url = (f"{env.get('VOILA_WS_PROTOCOL', 'ws')}://{env.get('VOILA_APP_IP', '127.0.0.1')}:"
           f"{env.get('VOILA_APP_PORT', '8866')}{base}voila/query/{env.get('VOILA_KERNEL_ID', '')}")
    with connect(url, open_timeout=5) as websocket:
        info = json.loads(websocket.recv())
    if not isinstance(info, dict):
        raise ValueError(f"Voila's request info is not a JSON object: {type(info).__name__}")
    for key, value in info.items():
        os.environ[str(key)] = str(value)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None



def _bar_table(css_class: str, headers: tuple[str, ...], colour: str, bar_px: int, rows) -> str:
    """An HTML table of ``rows`` (``(cells, fraction)``: the first cell left-aligned, the others right-aligned,
    then a bar ``fraction`` of ``bar_px`` wide); every cell is escaped."""
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" if j == 0 else
                         f"<td style='text-align:right'>{html.escape(str(c))}</td>" for j, c in enumerate(cells))
        + f"<td><div style='background:{colour};height:10px;width:{int(bar_px * fraction)}px'></div></td></tr>"
        for cells, fraction in rows)
    return (f"<table class='{css_class}'><tr>" + "".join(f"<th>{h}</th>" for h in headers) + "<th></th></tr>"
            + body + "</table>")

class PlannerApp(w.VBox):
    """The planner. ``PlannerApp()`` opens on the page's query string when it names a scenario (a shared link,
    :mod:`zeroplanner.share`), else on :func:`~zeroplanner.ui.state.default_state`; pass ``state=`` (an
    :class:`~zeroplanner.ui.state.AppState`) to open elsewhere.

    Layout (``grid``, an ``AppLayout``): controls on the left; the verdict (``banner``), the findings of a pasted
    config (``findings``) and the views in tabs (``details``: :data:`TABS`, the memory chart first) in the middle;
    the live DeepSpeed config on the right. Below 1240 px of width (a CSS container query: a narrow window or a
    JupyterLab cell) the three columns stack. A tab's view is built the first time it opens, and only the open
    chart is redrawn on a change; the others catch up when their tab opens.

    Attributes for scripts and tests: ``state`` (current :class:`AppState`), ``view`` (current :class:`View`),
    ``controls.widgets`` (control key -> widget), ``memory_chart``, ``step_chart`` (memory over one step of the
    config preview's variant), ``host_chart``, ``time_chart``, ``scaling_chart`` (bqplot figures; reading one
    builds it and brings it up to date), ``banner``, ``message``,
    ``config_area``, ``explain`` / ``compare`` (the detail panels), ``share_link``, ``hf_upload`` / ``hf_area`` /
    ``hf_message`` (bring your own config.json), ``recomputes`` (how many times the plan was derived),
    ``last_recompute_seconds``. Methods: ``set(**changes)``, ``show_tab(name)``, ``load_config(text)``,
    ``load_hf_config(text, name)``, ``use_this_machine()``, ``share_query()``, ``build_report()``.
    """

    def __init__(self, state: AppState | None = None, debounce_seconds: float = 0.05) -> None:
        self.debounce_seconds = float(debounce_seconds)
        link_problem = ""
        loop = _running_loop()
        waiting = state is None and loop is not None and awaiting_voila_request()
        if waiting:
            # A pre-heated Voilà kernel runs the notebook before any visitor arrives. Build the page now, on the
            # default scenario, so that Voilà has it rendered when the request comes; the link's scenario (if
            # any) is applied the moment the request info arrives (_voila_request_arrived), about a second
            # before the visitor's browser has loaded the widget code and asks for the widgets' state.
            state = default_state()
        elif state is None:
            state, link_problem = initial_state()
        self.state = state
        self.view: View | None = None
        self.recomputes = 0
        self.last_recompute_seconds = 0.0
        self._pending: dict[str, Any] = {}
        self._rejected: dict[str, Any] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._follow_up_timer: asyncio.TimerHandle | None = None
        self._built = False  # the first plan is drawn completely before the page is shown

        self.controls = Controls(self.state, self._queue)
        html_widget = self.controls.shared.html  # one HTMLStyle and one Layout for every text widget
        self.memory_chart = MemoryChart()
        self._charts: dict[str, Any] = {"memory": self.memory_chart}
        self._measured: dict[str, tuple[float | None, str]] = {}  # chart -> (figure from a pasted log, label)
        self._stale: set[str] = set()
        self._explain_panel = None
        self._compare_panel = None
        self.banner = html_widget()
        self.banner.add_class("zp-verdict")
        self.message = html_widget()
        self.timing = html_widget()
        self.findings = html_widget()  # lint findings of a pasted DeepSpeed config / a read config.json, by the verdict

        # config preview
        self.variant_picker = w.Dropdown(options=[RECOMMENDED], value=RECOMMENDED, description="Config for",
                                         style={"description_width": "70px"}, layout=w.Layout(width="100%"))
        self.mode_toggle = w.ToggleButtons(options=[("DeepSpeed JSON", "deepspeed"), ("HF Trainer (auto)",
                                                                                       "hf_trainer")],
                                           value=self.state.config_mode, style={"button_width": "auto"})
        self.variant_picker.observe(lambda ch: self._queue("config_variant", ch["new"]), names="value")
        self.mode_toggle.observe(lambda ch: self._queue("config_mode", ch["new"]), names="value")
        self.config_area = w.Textarea(layout=w.Layout(width="100%", height="430px"))
        self.config_area.add_class("zp-config")
        self.config_actions = html_widget()
        config_box = w.VBox([
            html_widget("<b>DeepSpeed config</b> <span class='zp-muted'>(follows every change)</span>"),
            self.variant_picker, self.mode_toggle, self.config_actions, self.config_area,
        ], layout=w.Layout(width="100%"))
        config_box.add_class("zp-config-box")

        # share: a link that reopens this scenario, and a self-contained report
        self.share_link = html_widget()
        self.report_button = w.Button(description="Build report", tooltip="A self-contained HTML report: "
                                      "recommendation, charts, every term, the config", layout=w.Layout(width="120px"))
        self.report_link = html_widget()
        self.report_button.on_click(lambda _: self.build_report())
        share_box = w.VBox([w.HBox([w.HTML("<b>Share</b>", layout=w.Layout(width="50px")), self.report_button],
                                   layout=w.Layout(align_items="center")), self.share_link, self.report_link])

        # the views: the main chart first, the others in tabs beside it, each built when its tab is first opened
        self.largest_html = html_widget()
        self._largest_for = None
        self._largest_table = ""
        self.longest_html = html_widget()
        self._longest_for = None
        self._longest_table = ""
        self._tab_boxes = [w.VBox([]) for _ in TABS]
        self._tab_boxes[0].children = [self.memory_chart, self.memory_chart.legend]
        self.details = w.Tab(children=self._tab_boxes, selected_index=0, titles=[t for _, t in TABS],
                             layout=w.Layout(width="100%"))
        self.details.observe(lambda _: self._tab_opened(), names="selected_index")
        self.memory_chart.on_select(lambda variant, term: self._explain_clicked("memory", variant, term))

        self.extras = self._build_extras()
        about = lazy_accordion([("About", html_widget(self._about_html()))], layout=self.controls.shared.plain)
        self.about = about

        self.controls.extra.children = self.extras
        self.controls.layout = w.Layout(width="100%", min_width="0", overflow="hidden auto", max_height="860px")
        center = w.VBox([self.message, self.banner, self.findings, self.details, self.timing],
                        layout=w.Layout(min_width="0", width="100%"))
        center.add_class("zp-center")
        right = w.VBox([config_box, share_box], layout=w.Layout(min_width="0", width="100%"))
        right.add_class("zp-right")
        self.grid = w.AppLayout(left_sidebar=self.controls, center=center, right_sidebar=right,
                                pane_widths=["300px", "1fr", "380px"], grid_gap="10px",
                                layout=w.Layout(width="100%", align_items="flex-start"))
        self.grid.add_class("zp-grid")
        super().__init__([html_widget(_CSS), self.grid, about], layout=w.Layout(width="100%"))
        self.add_class("zp-app")
        self.flush()
        self._built = True
        if link_problem:
            self.message.value = f"<div class='zp-error'>{html.escape(link_problem)}</div>"
        if waiting:
            self._wait_for_voila_request(loop)

    # -- a pre-heated Voilà kernel: the visitor's request ------------------------------------------------------
    def _wait_for_voila_request(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait for the page request in a daemon thread (:func:`receive_voila_request` blocks on Voilà's
        request-info websocket), then hand over to the kernel's event loop."""
        built_at = self.recomputes

        def wait() -> None:
            try:
                receive_voila_request()
            except Exception:  # a failed wait leaves the default scenario on the page; never a traceback
                _log.debug("waiting for the Voila request failed", exc_info=True)
            try:
                loop.call_soon_threadsafe(self._voila_request_arrived, built_at)
            except RuntimeError:  # the kernel's loop is closed: the kernel is shutting down
                pass

        threading.Thread(target=wait, name="zeroplanner-voila-request", daemon=True).start()

    def _voila_request_arrived(self, built_at: int) -> None:
        """The request info is in ``os.environ`` (or waiting failed): open the link's scenario when it names one
        and nothing was changed on the page yet (one recompute), and draw the share link now that the page's URL
        is known. A page opened without a link keeps what it shows."""
        state, problem = initial_state(dict(os.environ))
        untouched = self.recomputes == built_at
        if untouched and state.scenario != self.state.scenario and os.environ.get("QUERY_STRING"):
            self._replace_scenario(state.scenario)
        else:
            self._render_share()
        if problem and untouched:
            self.message.value = f"<div class='zp-error'>{html.escape(problem)}</div>"

    # -- views in tabs ------------------------------------------------------------------------------------------
    def tab_index(self, name: str) -> int:
        """Index of the tab ``name`` (one of :data:`TABS`' keys: memory, time, host, scaling, explain, compare,
        largest)."""
        return [key for key, _ in TABS].index(name)

    def show_tab(self, name: str) -> None:
        """Open the tab ``name`` (builds its view the first time and brings it up to date)."""
        self.details.selected_index = self.tab_index(name)
        self._tab_opened()

    def _visible(self) -> str:
        index = self.details.selected_index
        return TABS[index][0] if index is not None else ""

    def _chart(self, name: str):
        """The chart of tab ``name``, built (and placed in its tab) on first use."""
        chart = self._charts.get(name)
        if chart is None:
            chart = {"time": StepTimeChart, "host": HostMemoryChart, "scaling": ScalingChart,
                     "step": StepTimelineChart}[name]()
            if name == "time":
                chart.on_select(lambda variant, part: self._explain_clicked("time", variant, part))
            self._charts[name] = chart
            if name in self._measured:
                chart.show_measured(*self._measured[name])
            self._stale.add(name)
            self._tab_boxes[self.tab_index(name)].children = [chart, chart.legend]
        if name in self._stale and self.view is not None:
            self._stale.discard(name)
            self._update_chart(name, self.view)
        return chart

    @property
    def time_chart(self) -> StepTimeChart:
        return self._chart("time")

    @property
    def step_chart(self) -> StepTimelineChart:
        """The "Memory over one step" chart (built and brought up to date when first read)."""
        return self._chart("step")

    @property
    def host_chart(self) -> HostMemoryChart:
        return self._chart("host")

    @property
    def scaling_chart(self) -> ScalingChart:
        return self._chart("scaling")

    @property
    def explain(self):
        """The Explain panel (built when first needed)."""
        if self._explain_panel is None:
            from .explain_panel import ExplainPanel

            self._explain_panel = ExplainPanel()
            self._tab_boxes[self.tab_index("explain")].children = [self._explain_panel]
        return self._explain_panel

    @property
    def compare(self):
        """The Compare panel (built when first needed)."""
        if self._compare_panel is None:
            from .compare import ComparePanel

            self._compare_panel = ComparePanel()
            self._tab_boxes[self.tab_index("compare")].children = [self._compare_panel]
            if self.view is not None:
                self._compare_panel.update(self.state.scenario)
        return self._compare_panel

    def _largest_box(self) -> None:
        box = self._tab_boxes[self.tab_index("largest")]
        if box.children:
            return
        self.largest_button = w.Button(description="Update", layout=w.Layout(width="auto", min_width="90px"),
                                       tooltip="Search the largest Llama-shaped model each variant can train here")
        self.largest_button.on_click(lambda _: (self.compute_largest(), self.compute_longest()))
        box.children = [w.HBox([self.largest_button, w.HTML(
            "<span class='zp-muted'>Largest model each ZeRO variant can train on this cluster with these training "
            "settings (Llama-shaped models on a 15% grid; <code>planner.largest_model</code>, about 0.3 s), and "
            "the longest sequence each can train for this model (Ulysses degrees over the whole cluster; "
            "<code>planner.longest_sequence</code>).</span>")]),
            w.HBox([self.largest_html, self.longest_html], layout=w.Layout(flex_flow="row wrap", gap="16px"))]

    def _tab_opened(self) -> None:
        name = self._visible()
        if name in ("time", "host", "scaling", "step"):
            self._chart(name)
        elif name == "memory" and "memory" in self._stale and self.view is not None:
            self._stale.discard("memory")
            self._update_chart("memory", self.view)
        elif name == "explain":
            self.explain  # noqa: B018 - builds it
        elif name == "compare":
            self.compare  # noqa: B018
        elif name == "largest":
            self._largest_box()
        self._update_details()

    # -- change handling ----------------------------------------------------------------------------------------
    def _queue(self, key: str, value: Any) -> None:
        """Record a control change and schedule the recompute (leading edge now, then one per window)."""
        self._pending.pop(key, None)
        self._pending[key] = value
        loop = _running_loop()
        if loop is None or self.debounce_seconds <= 0:
            self.flush()
            return
        if self._timer is None:
            self.flush()
            self._timer = loop.call_later(self.debounce_seconds, self._window_closed)

    def _window_closed(self) -> None:
        self._timer = None
        if self._pending:
            self.flush()
            loop = _running_loop()
            if loop is not None:
                self._timer = loop.call_later(self.debounce_seconds, self._window_closed)

    def set(self, **changes: Any) -> None:
        """Apply control changes by key (``app.set(nodes=4, network="ib-ndr")``) with one recompute, and make the
        widgets show the result."""
        self._pending.update(changes)
        self.flush()
        self._follow_up()  # at once, not after FOLLOW_UP_DELAY_SECONDS: a script reads the result next

    def flush(self) -> None:
        """Apply queued changes and recompute once (no-op when nothing is queued, or the changes leave the state as
        it is, and a view exists)."""
        changes, self._pending = self._pending, {}
        if not changes and self.view is not None:
            return
        # Widgets keep showing a rejected value, so it stays part of the input until it is fixed or replaced.
        changes = {**{k: v for k, v in self._rejected.items() if k not in changes}, **changes}
        started = time.perf_counter()
        try:
            new_state = apply_changes(self.state, changes) if changes else self.state
            # changes that leave the state as it is (a value set to what it was) cost no recompute and no message
            view = None if self.view is not None and new_state == self.state else derive(new_state)
        except (ValidationError, ValueError, KeyError, TypeError) as exc:
            self.recomputes += 1
            self._rejected = changes
            self.message.value = (
                f"<div class='zp-error'><b>Not a valid setup:</b> {html.escape(error_message(exc))}. "
                "The charts still show the last valid setup.</div>"
            )
            return
        except Exception as exc:  # a bug, not bad input: say so in one line, keep the page working
            _log.debug("planner app recompute failed", exc_info=True)
            self.recomputes += 1
            self._rejected = changes
            self.message.value = (
                f"<div class='zp-error'><b>Internal error while planning</b> ({html.escape(type(exc).__name__)}: "
                f"{html.escape(str(exc))[:300]}). The charts still show the last valid setup; please report the "
                "inputs that caused it.</div>"
            )
            return
        if view is None:
            self._rejected = {}
            self.message.value = ""
            return
        self.recomputes += 1
        self._rejected = {}
        self.state = new_state
        self.view = view
        self.message.value = ""
        self._render(view)
        self.last_recompute_seconds = time.perf_counter() - started
        loop = _running_loop()
        if loop is None or self.debounce_seconds <= 0 or not self._built:
            self._follow_up()
        elif self._follow_up_timer is None:
            self._follow_up_timer = loop.call_later(FOLLOW_UP_DELAY_SECONDS, self._follow_up)

    def _follow_up(self) -> None:
        """What a change updates besides the chart on screen and the verdict: the config preview
        (:meth:`_render_config`), the other controls (presets move them: model -> size, GPU -> memory, ...), the
        share link, the open detail panel and the timing line. In a running kernel this runs
        :data:`FOLLOW_UP_DELAY_SECONDS` after :meth:`flush`, so the chart and verdict messages leave the kernel
        first; once the share link shows a change, everything else on the page shows it too."""
        if self._follow_up_timer is not None:
            self._follow_up_timer.cancel()
            self._follow_up_timer = None
        if self.view is None:
            return
        view = self.view
        self._render_config(view)
        self.controls.show(self.state)
        self._update_details()
        self.timing.value = (f"<span class='zp-muted'>Planned {len(view.memory.labels)} ZeRO variants in "
                             f"{1e3 * self.last_recompute_seconds:.0f} ms. Columns: <i>Recommended</i> is the "
                             "planner's pick, which may also change micro-batch, activation checkpointing, "
                             "overlap_comm or ZeRO++; every other column is one ZeRO stage with the settings as "
                             "the controls give them.</span>")
        self._render_share()  # last

    # -- rendering ------------------------------------------------------------------------------------------
    def _update_details(self) -> None:
        """Feed the open detail panel (explain: the chart's variants; compare: the current scenario). Closed panels
        cost nothing per change; opening one brings it up to date."""
        if self.view is None:
            return
        visible = self._visible()
        if visible == "explain":
            self.explain.set_variants([(label, sc) for label, sc in zip(self.view.memory.labels,
                                                                        self.view.variant_scenarios)])
        if self._compare_panel is not None:
            self._compare_panel.update(self.state.scenario)  # plans only while something is pinned
        if visible == "largest" and self._largest_for is None:
            self.compute_largest()
        elif self._largest_for is not None and self._largest_for != self.state.scenario:
            self.largest_html.value = ("<div class='zp-muted'>Out of date: the setup changed. Press Update.</div>"
                                       + self._largest_table)
        if visible == "largest" and self._longest_for is None:
            self.compute_longest()
        elif self._longest_for is not None and self._longest_for != self.state.scenario:
            self.longest_html.value = ("<div class='zp-muted'>Out of date: the setup changed. Press Update.</div>"
                                       + self._longest_table)

    def _on_demand(self, fn, widget):
        """``(scenario, fn(scenario))`` for the current scenario, or ``(scenario, None)`` with the error shown in
        ``widget`` (an on-demand table's failure is shown, never raised into the page)."""
        scenario = self.state.scenario
        try:
            return scenario, fn(scenario)
        except Exception as exc:  # shown, not raised into the page
            _log.debug("%s failed", getattr(fn, "__name__", fn), exc_info=True)
            widget.value = f"<div class='zp-error'>{html.escape(error_message(exc))}</div>"
            return scenario, None

    def compute_largest(self) -> dict[str, int]:
        """``zeroplanner.planner.largest_model`` for the current scenario, shown as a table (parameters, B).
        On demand only (about 0.3 s): the result is marked out of date when the setup changes."""
        from ..planner import largest_model_limits
        from .charts import largest_limit_text

        scenario, limits = self._on_demand(largest_model_limits, self.largest_html)
        if limits is None:
            return {}
        result = {label: r["parameters"] for label, r in limits.items()}
        top = max(result.values(), default=0) or 1
        self._largest_table = _bar_table(
            "zp-largest", ("variant", "largest model (parameters)", "limited by (the next size searched)"), "#4c78a8",
            200,
            [((label, f"{p / 1e9:,.1f} B" if p else "none on the grid", largest_limit_text(limits[label])), p / top)
             for label, p in result.items()])
        self._largest_for = scenario
        self.largest_html.value = self._largest_table
        return result

    def compute_longest(self) -> dict[str, dict[str, int]]:
        """``zeroplanner.planner.longest_sequence`` for the current scenario, shown as a table (tokens, the Ulysses
        degree that fits them). On demand, like :meth:`compute_largest`; out of date when the setup changes."""
        from ..planner import longest_sequence

        scenario, result = self._on_demand(longest_sequence, self.longest_html)
        if result is None:
            return {}
        top = max((r["seq_len"] for r in result.values()), default=0) or 1
        self._longest_table = _bar_table(
            "zp-longest", ("variant", "longest sequence (tokens)", "SP"), "#72b7b2", 160,
            [((label, format(r["seq_len"], ",") if r["seq_len"] else "none fits", r["sequence_parallel_size"] or ""),
              r["seq_len"] / top) for label, r in result.items()])
        self._longest_for = scenario
        self.longest_html.value = self._longest_table
        return result

    def _explain_clicked(self, chart: str, variant: int, part: int) -> None:
        """A click on bar ``variant``, segment ``part`` of the memory or step-time chart: open Explain on it."""
        from .explain_panel import MEMORY_KEYS, TIME_SEGMENTS

        if self.view is None or not 0 <= variant < len(self.view.memory.labels):
            return
        self.show_tab("explain")
        key = MEMORY_KEYS[part] if chart == "memory" else "time:" + TIME_SEGMENTS[part][0]
        try:
            self.explain.show(self.view.memory.labels[variant], key)
        except KeyError:
            return

    def share_query(self) -> str:
        """Query string of the current scenario (``zeroplanner.share``); raises ``ValueError`` (ShareError) when it
        cannot be a link (a model read from a HF config.json)."""
        from ..share import scenario_to_query

        return scenario_to_query(self.state.scenario)

    def build_report(self) -> str:
        """Build the HTML report of the current scenario (``zeroplanner.report``) and offer it as a download link.
        Returns the HTML."""
        from ..report import build_report

        try:
            text = build_report(self.state.scenario, "html", link=self._link_url())
        except Exception as exc:  # shown, not raised into the page
            _log.debug("report failed", exc_info=True)
            self.report_link.value = f"<span class='zp-error'>No report: {html.escape(error_message(exc))}</span>"
            return ""
        self.report_link.value = (f"<a class='zp-button zp-report' download='zeroplanner-report.html' "
                                  f"href='{data_uri(text, 'text/html')}'>Download zeroplanner-report.html</a>")
        return text

    def _link_url(self) -> str | None:
        from ..share import page_url

        try:
            query = self.share_query()
        except ValueError:
            return None
        base = page_url() or ""
        return f"{base}?{query}"

    def _render_share(self) -> None:
        try:
            url = self._link_url()
        except Exception:  # pragma: no cover - share never raises beyond ValueError
            url = None
        uploaded = self._uploaded_model
        if uploaded is not None and uploaded[1] == self.state.scenario.model:
            from ..share import page_url, scenario_to_query

            try:
                query = scenario_to_query(self.state.scenario, approximate_model=True)
            except ValueError:
                query = None
            note = (f"<span class='zp-muted zp-uploaded-note'>The model came from an uploaded config.json "
                    f"({html.escape(uploaded[0][:120])}); a link cannot carry it"
                    + (", so this link opens a model of the same parameter count." if query else ".") + "</span>")
            if query:
                url = f"{page_url() or ''}?{query}"
                note = (f"<button class='zp-button zp-copy-link' title='{html.escape(url)}' "
                        f"data-url='{html.escape(url)}' onclick=\"{html.escape(COPY_LINK_JS)}\">"
                        "Copy link (parameter count only)</button><br>" + note)
            self.share_link.value = note
            self.report_link.value = ""
            return
        if url is None:
            try:  # say why (a HF config.json model, a probed GPU, a setting a link has no key for)
                self.share_query()
                why = ""
            except ValueError as exc:
                why = error_message(exc)
            self.share_link.value = (f"<span class='zp-muted'>No link for this setup: {html.escape(why)}</span>")
        else:
            self.share_link.value = (f"<button class='zp-button zp-copy-link' title='{html.escape(url)}' "
                                     f"data-url='{html.escape(url)}' onclick=\"{html.escape(COPY_LINK_JS)}\">"
                                     "Copy link</button>")
        self.report_link.value = ""

    def _update_chart(self, name: str, view: View) -> None:
        chart = self._charts[name]
        # view.scaling, view.time and view.step are computed when first read: only when their chart is drawn
        chart.update(getattr(view, name) if name in ("scaling", "time", "step") else view.memory)

    def _render(self, view: View) -> None:
        """The verdict and the chart on screen: what a change must update first. The config preview follows in
        :meth:`_follow_up` (:meth:`_render_config`). The verdict's message is sent before the bars' (measured
        together with the memory chart's fixed fits/OOM row: benchmarks/bench_app.py docstring, not on its own)."""
        visible = self._visible()
        self.banner.value = view.banner_html
        for name in self._charts:  # only the chart on screen is redrawn; the others when their tab opens
            if name == visible:
                self._stale.discard(name)
                self._update_chart(name, view)
            else:
                self._stale.add(name)

    def _render_config(self, view: View) -> None:
        """The config preview: variant picker, the note above the text (with the Download and Copy buttons), the
        JSON text. A value equal to the one shown sends nothing (traitlets notifies only on a change)."""
        if tuple(self.variant_picker.options) != view.variant_options:
            with self.variant_picker.hold_trait_notifications():
                picked = self.state.config_variant
                self.variant_picker.unobserve_all("value")
                self.variant_picker.options = view.variant_options
                self.variant_picker.value = picked if picked in view.variant_options else RECOMMENDED
                self.variant_picker.observe(lambda ch: self._queue("config_variant", ch["new"]), names="value")
        if view.config_error:
            text = ""
            actions = f"<div class='zp-error'>{html.escape(view.config_error)}</div>"
        else:
            text = view.config_text
            note = ""
            picked = self.variant_picker.value
            if picked == RECOMMENDED and not getattr(view.plan, "fits", True):
                note = ("<div class='zp-error'>Nothing fits this cluster: this is the config of your inputs as "
                        "they are, and it would run out of memory.</div>")
            elif picked in view.memory.labels and not view.memory.fits[view.memory.labels.index(picked)]:
                note = (f"<div class='zp-error'>{html.escape(picked)} does not fit this cluster (GPU memory or host "
                        "RAM); this config would run out of memory.</div>")
            actions = note + self._config_actions_html(view.config_filename)
        self.config_area.value = text
        self.config_actions.value = actions

    @classmethod
    def _config_actions_html(cls, filename: str) -> str:
        """Download and Copy buttons for the config preview. Both take the text the preview shows in the browser
        (a ``data:`` URI made when Download is clicked; the clipboard API for Copy), so this HTML depends on the
        file name only and is not re-sent when the config changes: it was a 3 kB message per slider change when
        it carried the config as a base64 ``data:`` URI (benchmarks/bench_app.py). An edit made in the preview
        is what is downloaded or copied. The handlers are :mod:`zeroplanner.pagejs`'s constants, the only inline
        handlers the page's Content-Security-Policy allows."""
        name = html.escape(filename)
        return (
            f"<div style='margin:4px 0'><a class='zp-button zp-download' download='{name}' href='#' "
            f"onclick=\"{html.escape(DOWNLOAD_CONFIG_JS)}\">Download {name}</a>"
            f"<button class='zp-button zp-copy' onclick=\"{html.escape(COPY_CONFIG_JS)}\">Copy to clipboard"
            "</button></div>"
        )

    # -- extras (filled in by _build_extras) --------------------------------------------------------------------
    def _build_extras(self) -> list[w.Widget]:
        """"Use this machine" (probe in a subprocess) and "Paste your config" (read + lint a DeepSpeed config)."""
        self.probe_button = w.Button(description="Use this machine", tooltip="Probe this machine's GPUs and host "
                                     "RAM in a short-lived subprocess and fill the controls",
                                     layout=w.Layout(width="100%"))
        html_widget = self.controls.shared.html
        self.probe_message = html_widget()
        self.probe_button.on_click(lambda _: self.use_this_machine())
        self.paste_area = w.Textarea(placeholder=f"Paste a DeepSpeed config (JSON, at most {MAX_CONFIG_BYTES:,} "
                                                 "bytes) here, then Load",
                                     layout=w.Layout(width="100%", height="120px"))
        self.paste_mode = w.Checkbox(value=False, description="HF Trainer config (\"auto\" allowed)", indent=False)
        self.paste_button = w.Button(description="Load config", layout=w.Layout(width="120px"))
        self.paste_button.on_click(lambda _: self.load_config(self.paste_area.value))
        paste = w.VBox([self.paste_area, self.paste_mode, self.paste_button])
        # bring your own model: a HF config.json, uploaded or pasted (the CLI's --hf-config reader and limits)
        self.hf_upload = w.FileUpload(accept=".json,application/json", multiple=False,
                                      description="Upload config.json", layout=w.Layout(width="100%"))
        self.hf_upload.observe(self._hf_uploaded, names="value")
        # the page checks a chosen file's size before sending it (the template's upload-limit script): a file
        # over tornado's 10 MiB websocket limit would never arrive. It reads the limit from this hidden element.
        self.hf_upload.add_class("zp-upload")
        from ..catalog.hfconfig import MAX_CONFIG_BYTES as HF_LIMIT

        self.hf_limit = html_widget(f"<span class='zp-upload-limit' data-zp-max-bytes='{int(HF_LIMIT)}'></span>",
                                    layout=w.Layout(display="none"))
        self.hf_area = w.Textarea(placeholder="or paste a HF config.json here, then Use this model",
                                  layout=w.Layout(width="100%", height="90px"))
        self.hf_button = w.Button(description="Use this model", layout=w.Layout(width="140px"))
        self.hf_button.on_click(lambda _: self.load_hf_config(self.hf_area.value, "pasted config.json"))
        self.hf_message = html_widget()
        self.hf_message.add_class("zp-hf-message")
        hf = w.VBox([self.hf_upload, self.hf_limit, self.hf_area, self.hf_button, self.hf_message])
        hf.add_class("zp-hf")
        self._uploaded_model = None  # (file name, Architecture) of a model read from a config.json
        # a training log read against the plan (zeroplanner.diagnose: the CLI's `diagnose`)
        self.log_area = w.Textarea(placeholder="Paste a training log (CUDA OOM, DeepSpeed timers, comms summary, "
                                               "see_memory_usage, HF Trainer metrics) here, then Diagnose",
                                   layout=w.Layout(width="100%", height="120px"))
        self.log_button = w.Button(description="Diagnose log", layout=w.Layout(width="120px"))
        self.log_button.on_click(lambda _: self.diagnose_log(self.log_area.value))
        log_box = w.VBox([self.log_area, self.log_button])
        acc = lazy_accordion([("Your model: HF config.json", hf), ("Paste your DeepSpeed config", paste),
                              ("Paste your log", log_box)], layout=self.controls.shared.plain)
        self.paste_findings = self.findings
        return [html_widget("<b>Your setup</b>"), self.probe_button, self.probe_message, acc]

    def _hf_uploaded(self, change) -> None:
        files = change["new"] or ()
        if not files:
            return
        item = files[-1]
        name = str(item.get("name", "config.json"))
        content = item.get("content", b"")
        data = content.tobytes() if hasattr(content, "tobytes") else bytes(content)
        self.load_hf_config(data, name)

    def load_hf_config(self, text: str | bytes, name: str = "config.json"):
        """Make a HF ``config.json`` (its text or bytes) the scenario's model, with the reader and limits of the
        CLI's ``--hf-config`` (``zeroplanner.catalog.hfconfig``: size, JSON, ``model_type``, shape keys). Errors are shown
        in the page naming the key; the last valid setup stays. Returns the Architecture, or None."""
        from ..catalog.hfconfig import architecture_from_hf_config, read_hf_config_bytes

        shown = html.escape(name[:120])
        try:
            # the CLI's reader: its size, nesting-depth and JSON limits and messages (catalog.hfconfig)
            data = read_hf_config_bytes(text, name[:120])
            stem = name.rsplit("/", 1)[-1].removesuffix(".json")
            label = data.get("_name_or_path") if isinstance(data.get("_name_or_path"), str) else None
            arch = architecture_from_hf_config(data, name=(label or stem or "uploaded")[:200])
            scenario = self.state.scenario.model_copy(update={"model": arch})
            from ..specs import Scenario

            scenario = Scenario.model_validate(scenario.model_dump())  # the specs' cross-field rules
        except Exception as exc:  # ValueError/ValidationError name the key; anything else is shown, not raised
            _log.debug("HF config not read", exc_info=True)
            self.hf_message.value = (f"<div class='zp-error'><b>Cannot use {shown}:</b> "
                                     f"{html.escape(error_message(exc))}. The planner keeps the last valid "
                                     "setup.</div>")
            return None
        self._uploaded_model = (name, scenario.model)
        self._replace_scenario(scenario)
        self.hf_message.value = (
            f"<div class='zp-muted'>Model from <b>{shown}</b>: {html.escape(arch.name)} ({arch.family}), "
            f"{arch.parameter_count / 1e9:,.2f} B parameters. Any model preset replaces it.</div>")
        return arch

    def _replace_scenario(self, scenario) -> None:
        """Adopt a whole new scenario (probe, pasted config): one recompute, widgets updated to show it."""
        ui = self.state.model_dump(exclude={"scenario", "model_name", "gpu_name", "network_name"})
        new_state = state_from_scenario(scenario, **ui)
        view = derive(new_state)
        self.recomputes += 1
        self.state, self.view = new_state, view
        self._rejected = {}
        self.message.value = ""
        self._render(view)
        self._follow_up()

    def use_this_machine(self, timeout_seconds: float = 60.0) -> dict:
        """Run ``zeroplanner.probe`` in a subprocess (no CUDA context in this kernel) and apply what it found to
        the cluster. Says plainly when no GPU is found (host RAM is still applied). Returns the probe dict."""
        from ..probe import cluster_changes, cluster_from_probe, probe_in_subprocess

        self.probe_button.disabled = True
        self.probe_button.description = "Probing this machine..."
        try:
            result = probe_in_subprocess(timeout_seconds=timeout_seconds)
            lines = []
            if not result.get("cuda_available"):
                lines.append(f"<b>No CUDA GPU found on this machine.</b> {html.escape(str(result.get('message')))}")
            try:
                _, notes = cluster_changes(result, self.state.scenario.cluster)
                cluster = cluster_from_probe(result, self.state.scenario.cluster)
                self._replace_scenario(self.state.scenario.model_copy(update={"cluster": cluster}))
                lines += [html.escape(n) for n in notes]
                if not result.get("cuda_available"):
                    lines.append("GPU settings were left as they were.")
            except Exception as exc:  # ValidationError/ValueError name the field; anything else is shown, not raised
                _log.debug("probe result not applied", exc_info=True)
                lines.append(f"Could not use the probe result: {html.escape(error_message(exc))}")
            self.probe_message.value = "<div class='zp-muted'>" + "<br>".join(lines) + "</div>"
            return result
        finally:
            self.probe_button.disabled = False
            self.probe_button.description = "Use this machine"

    def load_config(self, text: str) -> list:
        """Read a pasted DeepSpeed config into the controls (``zeroplanner.deepspeed.from_deepspeed_config``) and show its
        findings (``lint.lint``) and the cost model's estimate of it. Never raises for bad text. Returns the
        findings."""
        from ..costmodel import estimate
        from ..deepspeed import from_deepspeed_config, load_config_text
        from ..deepspeed.lint import lint

        mode = "hf_trainer" if self.paste_mode.value else "deepspeed"
        if not text.strip():
            # Also what a paste over tornado's 10 MiB websocket message limit looks like from here: the page drops
            # the connection, reconnects, and the text never arrives (docs/security.md).
            self.paste_findings.value = (
                "<div class='zp-error'><b>Nothing to load:</b> the planner received no text. Paste a DeepSpeed "
                f"config (JSON, at most {MAX_CONFIG_BYTES:,} bytes). A paste over {WEBSOCKET_LIMIT_MIB} MiB never "
                "reaches the planner: the page's connection drops it.</div>")
            return []
        try:
            config, read_findings = load_config_text(text)
            scenario, findings = from_deepspeed_config(config, base=self.state.scenario, mode=mode)
            findings = lint(config, scenario, mode=mode, merge=[*read_findings, *findings])
            est = estimate(scenario)
        except Exception as exc:  # ConfigError/ValidationError/ValueError explain the input; others are shown too
            _log.debug("pasted config not read", exc_info=True)
            self.paste_findings.value = (f"<div class='zp-error'><b>Cannot read this config:</b> "
                                         f"{html.escape(error_message(exc))}</div>")
            return []
        self._replace_scenario(scenario)
        colors = {"error": "#c62828", "warning": "#8a5a00", "info": "#555"}
        items = "".join(
            f"<li style='color:{colors.get(f.severity, '#333')}'><b>{html.escape(f.severity)}</b> "
            f"<code>{html.escape(f.key or '(config)')}</code>: {html.escape(f.message)}"
            + (f" <i>Fix: {html.escape(f.fix)}</i>" if f.fix else "") + "</li>"
            for f in findings
        )
        verdict = "fits" if est.fits else "does NOT fit"
        self.paste_findings.value = (
            f"<div><b>This config as written:</b> ZeRO-{scenario.zero.stage}, "
            f"{est.per_gpu_bytes.total / 2**30:.1f} GiB per GPU ({verdict}), step {est.step_seconds:.3g} s, "
            f"{est.tokens_per_second:,.0f} tokens/s. The controls now show it; the charts compare every stage."
            f"</div><ul style='padding-left:18px;margin:4px 0'>{items or '<li>No findings.</li>'}</ul>"
        )
        return findings

    def diagnose_log(self, text: str):
        """Read a pasted training log against the current scenario (:func:`zeroplanner.diagnose.diagnose`) and show
        the diagnosis under the verdict. Never raises for bad text; returns the Diagnosis (None when nothing was
        read). The log's text is shown escaped, never executed."""
        from ..diagnose import diagnose
        from ..runlog import read_log

        reading = read_log(text or "")
        if reading.empty:
            self.findings.value = ("<div class='zp-error'><b>Nothing read from this log:</b> paste a CUDA "
                                   "out-of-memory message, DeepSpeed's wall_clock_breakdown timers, the comms "
                                   "logger summary, see_memory_usage lines or the HF Trainer's metrics.</div>")
            return None
        try:
            d = diagnose(reading, self.state.scenario)
        except Exception as exc:  # noqa: BLE001 - shown as one line, never a traceback
            _log.debug("log not diagnosed", exc_info=True)
            self.findings.value = (f"<div class='zp-error'><b>Cannot diagnose this log:</b> "
                                   f"{html.escape(error_message(exc))}</div>")
            return None
        rows = "".join(
            f"<tr><td>{html.escape(c.part)}</td><td>{c.measured:.4g} {html.escape(c.unit)}</td>"
            f"<td>{c.predicted:.4g} {html.escape(c.unit)}</td><td>x{c.ratio:.2f}"
            + (" <b>outside the model's error</b>" if c.disagrees else "") + "</td></tr>" for c in d.comparisons)
        table = ("<table class='zp-diagnosis-table'><tr><th>part</th><th>measured</th><th>predicted</th><th></th></tr>"
                 + rows + "</table>") if rows else ""
        problems = "".join(f"<li style='color:#c62828'>{html.escape(p)}</li>" for p in d.problems)
        read = "".join(f"<li>{html.escape(r['what'])}: {html.escape(str(r['value']))} "
                       f"<i>(line {r['line_number']})</i></li>" for r in d.read)
        self._measured = {
            "time": (d.measured_step_seconds, f"your log: {d.measured_step_seconds:.3g} s"
                     if d.measured_step_seconds else ""),
            "step": (d.measured_memory_gib, d.measured_memory_label)}
        for name, args in self._measured.items():  # drawn now if the chart exists, else when it is first built
            if name in self._charts:
                self._charts[name].show_measured(*args)
        fix = f"<p><b>Fix:</b> {html.escape(d.remedy['text'])}</p>" if d.remedy else ""
        head = "healthy: no problem found" if d.healthy else "a problem was found"
        self.findings.value = (f"<div class='zp-diagnosis'><b>Your log, against this plan: {head}.</b>"
                               f"<ul style='padding-left:18px;margin:4px 0'>{problems}</ul>{fix}{table}"
                               f"<details><summary>What was read</summary><ul>{read}</ul></details></div>")
        return d

    @staticmethod
    def _about_html() -> str:
        rows = "".join(f"<tr><td>{html.escape(k)}</td><td><code>{html.escape(v)}</code></td></tr>"
                       for k, v in installed_versions().items())
        return (
            "<p>zeroplanner estimates per-GPU memory, host RAM, communication and step time of DeepSpeed ZeRO "
            "runs from the model's architecture and the cluster. GiB = 2<sup>30</sup> bytes; network rates in "
            "Gbit/s.</p><table>" + rows + "</table>"
        )
