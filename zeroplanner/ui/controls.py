"""The planner's input widgets: main controls and the collapsed "Advanced" section.

:class:`Controls` builds every widget once and knows two things: how to show a state (:meth:`Controls.show`, which
sets the widgets without reporting changes) and how to report a user's change (``on_change(key, value)`` with the
keys of :data:`zeroplanner.ui.state.SETTERS`). It computes nothing. Sliders use ``continuous_update=False`` so a drag
sends one value, not dozens.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import ipywidgets as w

from .. import catalog
from ..units import GIB
from .state import CUSTOM_MODEL, AppState

_DESC = {"description_width": "140px"}
_WIDE = w.Layout(width="97%")


def _log_slider(description: str, value: float, lo: float, hi: float, step: float = 0.01, fmt: str = ".3g"):
    return w.FloatLogSlider(
        value=value,
        base=10,
        min=math.log10(lo),
        max=math.log10(hi),
        step=step,
        description=description,
        readout_format=fmt,
        continuous_update=False,
        style=_DESC,
        layout=_WIDE,
    )


class Controls(w.VBox):
    """Main controls (model, GPU, cluster, network) and an Advanced accordion (training, ZeRO, offload, LoRA,
    assumptions). ``widgets`` maps each control key to its widget."""

    def __init__(self, state: AppState, on_change: Callable[[str, Any], None]) -> None:
        self._on_change = on_change
        self._quiet = False
        s = state.scenario
        c, t, z = s.cluster, s.training, s.zero
        net = c.network

        model_options = [CUSTOM_MODEL, *catalog.model_names()]
        self.widgets: dict[str, w.Widget] = {
            "model": w.Dropdown(options=model_options, value=state.model_name, description="Model",
                                style=_DESC, layout=_WIDE),
            "model_params_b": _log_slider("Size (B params)", s.parameters / 1e9, 0.1, 2000.0),
            "gpu": w.Dropdown(options=catalog.gpu_names(), value=state.gpu_name, description="GPU",
                              style=_DESC, layout=_WIDE),
            "gpu_memory_gib": w.FloatSlider(value=round(c.memory_per_gpu_bytes / GIB, 1), min=1, max=320, step=0.5,
                                            description="GPU memory (GiB)", readout_format=".1f",
                                            continuous_update=False, style=_DESC, layout=_WIDE),
            "gpus_per_node": w.IntSlider(value=c.gpus_per_node, min=1, max=16, description="GPUs per node",
                                         continuous_update=False, style=_DESC, layout=_WIDE),
            "nodes": w.IntSlider(value=c.nodes, min=1, max=128, description="Nodes",
                                 continuous_update=False, style=_DESC, layout=_WIDE),
            "network": w.Dropdown(options=catalog.network_names(), value=state.network_name,
                                  description="Network", style=_DESC, layout=_WIDE),
            "inter_node_gbps": _log_slider("Network Gb/s / node", net.link_gbps * net.nics_per_node,
                                           1.0, 6400.0, fmt=".4g"),
            # advanced: training
            "seq_len": w.BoundedIntText(value=t.seq_len, min=1, max=4_194_304, description="Sequence length",
                                        style=_DESC, layout=_WIDE),
            "micro_batch": w.BoundedIntText(value=t.micro_batch, min=1, max=65_536, description="Micro-batch / GPU",
                                            style=_DESC, layout=_WIDE),
            "grad_accum": w.BoundedIntText(value=t.grad_accum, min=1, max=65_536,
                                           description="Gradient accumulation", style=_DESC, layout=_WIDE),
            "precision": w.Dropdown(options=["bf16", "fp16", "fp32"], value=t.precision, description="Precision",
                                    style=_DESC, layout=_WIDE),
            "optimizer": w.Dropdown(options=[("AdamW", "adamw"), ("Adam", "adam"), ("SGD + momentum", "sgd"),
                                             ("8-bit Adam", "adam8bit")],
                                    value=t.optimizer, description="Optimizer", style=_DESC, layout=_WIDE),
            "checkpointing": w.Dropdown(options=[("none", "none"), ("selective", "selective"), ("full", "full")],
                                        value=t.checkpointing, description="Activation ckpt",
                                        style=_DESC, layout=_WIDE),
            "flash_attention": w.Checkbox(value=t.flash_attention, description="Flash attention", indent=False),
            "lora_rank": w.BoundedIntText(value=t.lora_rank, min=0, max=65_536, description="LoRA rank (0 = full)",
                                          style=_DESC, layout=_WIDE),
            "qlora": w.Checkbox(value=t.qlora, description="QLoRA (4-bit base)", indent=False),
            "mfu": w.FloatSlider(value=s.assumptions.mfu, min=0.05, max=0.8, step=0.01, description="MFU",
                                 readout_format=".2f", continuous_update=False, style=_DESC, layout=_WIDE),
            # advanced: cluster / offload
            "cpu_memory_gib": w.BoundedFloatText(value=round(c.cpu_memory_bytes / GIB), min=1, max=2**20,
                                                 description="Host RAM/node GiB", style=_DESC, layout=_WIDE),
            "pin_memory": w.Checkbox(value=z.offload_optimizer.pin_memory, description="Pinned offload memory",
                                     indent=False),
            # advanced: ZeRO
            "reduce_bucket_size": _log_slider("", z.reduce_bucket_size, 1e6, 2e9),
            "allgather_bucket_size": _log_slider("", z.allgather_bucket_size, 1e6, 2e9),
            "stage3_prefetch_bucket_size": _log_slider("", max(z.stage3_prefetch_bucket_size, 1e6), 1e6, 2e9),
            "overlap_comm": w.Dropdown(options=[("DeepSpeed default", "default"), ("on", "on"), ("off", "off")],
                                       value={None: "default", True: "on", False: "off"}[z.overlap_comm],
                                       description="overlap_comm", style=_DESC, layout=_WIDE),
            "zero_hpz_partition_size": w.BoundedIntText(value=state.zero_hpz_partition_size, min=1, max=1024,
                                                        description="hpZ partition", style=_DESC,
                                                        layout=_WIDE),
            "zero_quantized_weights": w.Checkbox(value=state.zero_quantized_weights,
                                                 description="zero_quantized_weights (qwZ)", indent=False),
            "zero_quantized_gradients": w.Checkbox(value=state.zero_quantized_gradients,
                                                   description="zero_quantized_gradients (qgZ)", indent=False),
        }
        for key, widget in self.widgets.items():
            widget.observe(self._make_handler(key), names="value")

        W = self.widgets
        main = w.VBox([
            W["model"], W["model_params_b"], W["gpu"], W["gpu_memory_gib"], W["gpus_per_node"], W["nodes"],
            W["network"], W["inter_node_gbps"],
        ])
        training = w.VBox([W["seq_len"], W["micro_batch"], W["grad_accum"], W["precision"], W["optimizer"],
                           W["checkpointing"], W["flash_attention"], W["mfu"]])
        lora = w.VBox([W["lora_rank"], W["qlora"]])
        offload = w.VBox([W["cpu_memory_gib"], W["pin_memory"]])
        def above(text: str) -> w.HTML:
            return w.HTML(f"<code style='font-size:12px'>{text}</code>", layout=w.Layout(margin="2px 0 0 8px"))

        zero = w.VBox([
            w.HTML("<small>Bucket sizes in elements, as DeepSpeed's keys.</small>"),
            above("reduce_bucket_size"), W["reduce_bucket_size"],
            above("allgather_bucket_size"), W["allgather_bucket_size"],
            above("stage3_prefetch_bucket_size"), W["stage3_prefetch_bucket_size"],
            W["overlap_comm"],
            w.HTML("<small>ZeRO++ (<code>zero_hpz_partition_size</code>, <code>zero_quantized_*</code>): adds a "
                   "'ZeRO-3 + ZeRO++' variant to the charts; the planner itself already tries hpZ = GPUs per node "
                   "with qwZ + qgZ on multi-node runs.</small>"),
            W["zero_hpz_partition_size"], W["zero_quantized_weights"], W["zero_quantized_gradients"],
        ])
        def section(title: str, box: w.VBox) -> list[w.Widget]:
            return [w.HTML(f"<div style='margin-top:6px;border-bottom:1px solid #ddd'><b>{title}</b></div>"), box]

        self.advanced = w.VBox(section("Training", training) + section("ZeRO buckets and ZeRO++", zero)
                               + section("Offload and host", offload) + section("LoRA / QLoRA", lora))
        self.outer = w.Accordion(children=[self.advanced], selected_index=None)
        self.outer.set_title(0, "Advanced")
        self.extra = w.VBox([])
        super().__init__([w.HTML("<b>Model and cluster</b>"), main, self.outer, self.extra],
                         layout=w.Layout(width="380px", min_width="340px", flex="0 0 auto"))
        self.add_class("zp-controls")

    def _make_handler(self, key: str):
        def handler(change: dict) -> None:
            if not self._quiet:
                self._on_change(key, change["new"])

        return handler

    def set_values(self, values: dict[str, Any]) -> None:
        """Set widget values without reporting them as user changes."""
        self._quiet = True
        try:
            for key, value in values.items():
                widget = self.widgets[key]
                if widget.value != value:
                    widget.value = value
        finally:
            self._quiet = False

    def show(self, state: AppState) -> None:
        """Make the widgets show ``state`` (after a model/GPU/network preset or a loaded config changed several
        values at once)."""
        s = state.scenario
        c, t, z = s.cluster, s.training, s.zero
        net = c.network
        self.set_values({
            "model": state.model_name,
            "model_params_b": s.parameters / 1e9,
            "gpu": state.gpu_name if state.gpu_name in self.widgets["gpu"].options else self.widgets["gpu"].value,
            "gpu_memory_gib": round(c.memory_per_gpu_bytes / GIB, 1),
            "gpus_per_node": c.gpus_per_node,
            "nodes": c.nodes,
            "network": state.network_name,
            "inter_node_gbps": net.link_gbps * net.nics_per_node,
            "seq_len": t.seq_len,
            "micro_batch": t.micro_batch,
            "grad_accum": t.grad_accum,
            "precision": t.precision,
            "optimizer": t.optimizer,
            "checkpointing": t.checkpointing,
            "flash_attention": t.flash_attention,
            "lora_rank": t.lora_rank,
            "qlora": t.qlora,
            "mfu": s.assumptions.mfu,
            "cpu_memory_gib": round(c.cpu_memory_bytes / GIB),
            "pin_memory": z.offload_optimizer.pin_memory,
            "reduce_bucket_size": z.reduce_bucket_size,
            "allgather_bucket_size": z.allgather_bucket_size,
            "stage3_prefetch_bucket_size": max(z.stage3_prefetch_bucket_size, 1e6),
            "overlap_comm": {None: "default", True: "on", False: "off"}[z.overlap_comm],
            "zero_hpz_partition_size": state.zero_hpz_partition_size,
            "zero_quantized_weights": state.zero_quantized_weights,
            "zero_quantized_gradients": state.zero_quantized_gradients,
        })
