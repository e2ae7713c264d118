"""``zeroplanner estimate | recommend | deepspeed-estimate | models | gpus | networks``: the cost model and the
planner on one scenario, DeepSpeed's own estimator, and the catalog."""

from __future__ import annotations

import argparse

from .. import catalog
from ..inputs import BY_KEY
from ..units import GIB
from .common import (
    EXIT_DOES_NOT_FIT,
    EXIT_FITS,
    EXIT_STATUSES_HELP,
    _emit,
    _positive_int,
    advice_json,
    advice_text,
    estimate_json,
    fail,
    given_inputs,
    inputs_json,
    scenario_from_args,
)

RECOMMEND_DESCRIPTION = (
    "Evaluate every candidate configuration (ZeRO stage, optimizer and parameter offload, activation "
    "checkpointing, micro-batch split at the same samples per GPU, overlap_comm, reduce bucket, ZeRO++) and "
    "recommend one. A search option you give is held, not searched: --stage 2 searches ZeRO-2 only; likewise "
    "--offload-optimizer, --offload-param, --checkpointing, --micro-batch / --grad-accum, --overlap-comm, "
    "--reduce-bucket-size and the ZeRO++ options. Options left out are searched. The reasons (and the JSON's "
    "held / varied) say which were held and which varied."
)


def sequence_json(scenario) -> dict | None:
    """What the language model processes per sample for a vision-language model (None for a text-only one):
    ``seq_len`` text tokens plus ``images_per_sample`` x the vision tokens per image (``Scenario.sequence_tokens``,
    what the activations and FLOPs are priced at), and whether the vision tower trains."""
    m, t = scenario.model, scenario.training
    if m.vision_params == 0 and not m.vision_tokens_per_image:
        return None
    return {"text_tokens": t.seq_len, "images_per_sample": t.images_per_sample,
            "tokens_per_image": m.vision_tokens_per_image,
            "patches_per_image": m.vision.patches_per_image if m.vision is not None else None,
            "image_tokens": t.images_per_sample * m.vision_tokens_per_image,
            "tokens": scenario.sequence_tokens, "vision_parameters": m.vision_params,
            "vision_tower_trains": bool(m.vision_params) and t.trains_vision_tower}


def sequence_text(seq: dict | None) -> str:
    """One line for :func:`sequence_json` ("" for a text-only model)."""
    if seq is None:
        return ""
    tower = (f"vision tower ({seq['vision_parameters']:,} parameters) "
             + ("trains" if seq["vision_tower_trains"] else "frozen"))
    patches = f" ({seq['patches_per_image']:,} patches merged)" if seq["patches_per_image"] else ""
    return (f"per sample: {seq['text_tokens']:,} text + {seq['images_per_sample']} image(s) x "
            f"{seq['tokens_per_image']:,} tokens{patches} = {seq['tokens']:,} tokens through the language model; "
            f"{tower}\n")


def model_assumptions(scenario) -> list[str]:
    """What the answer assumes about the model that its numbers do not show, one sentence each: a model read by
    transformers on the meta device (exact count, approximate activations / FLOPs), recurrent mixers priced as
    their GPU kernels save them, a quantised checkpoint trained dequantised."""
    m = scenario.model
    out = []
    if m.source.startswith("transformers "):
        out.append(f"{m.family} is read by transformers on the meta device: parameter count, largest module and "
                   "tied weights exact; activations, FLOPs and LoRA sizes approximate (Llama-like layers of the "
                   "text config)")
    if m.linear_mixer is not None:
        # whole-model census ratios, reference path / kernel path, of the small configs at 128 tokens
        # (docs/validation.md section 6: qwen3_next 5,296,684 / 2,865,196; nemotron_h 6,260,524 / 1,515,164)
        kernels, ratio = (("flash-linear-attention's chunk_gated_delta_rule and causal-conv1d", "1.8x")
                          if m.linear_mixer.kind == "gated_deltanet" else
                          ("mamba_ssm's mamba_split_conv1d_scan_combined", "4.1x"))
        out.append(f"the {m.linear_mixer.layers} {m.linear_mixer.kind} layers' activations are priced as the GPU "
                   f"kernels save them ({kernels}); without those packages transformers runs a PyTorch reference "
                   f"that keeps more ({ratio} the whole model's activations in the small census config, "
                   "docs/validation.md section 6)")
    if "auto_map" in m.source:  # the config.json reader's note (imported only then: 20 ms of an estimate's start)
        from ..catalog.hfconfig import AUTO_MAP_NOTE

        if AUTO_MAP_NOTE in m.source:
            out.append(f"the config.json names custom code (auto_map): never run; priced as the {m.family} "
                       "architecture, which that code may change")
    if "checkpoint: logical parameters" in m.source:
        out.append("a quantised checkpoint: priced as its logical parameters trained in the training precision "
                   "(ZeRO fine-tuning loads it dequantised)")
    return out


def cmd_estimate(args: argparse.Namespace) -> int:
    from ..costmodel import estimate
    from ..costmodel.deepspeed_estimator import deepspeed_row_for
    from ..costmodel.explain_terms import offload_storage

    scenario = scenario_from_args(args)
    est = estimate(scenario)
    rows = "\n".join(f"  {t.name:<18} {t.bytes / GIB:8.2f} GiB" for t in est.terms)
    sp = est.sequence_parallel_size
    split = (f", Ulysses sequence_parallel_size {sp} (batch data-parallel degree {est.data_parallel_degree // sp}; "
             f"all-to-alls {est.sp_all_to_all_seconds_per_step:.3f} s per step)" if sp > 1 else "")
    sequence, assumptions = sequence_json(scenario), model_assumptions(scenario)
    text = (f"{scenario.model.name}: Ψ = {est.parameters:,} ({est.trainable_parameters:,} trainable), ZeRO-"
            f"{scenario.zero.stage}, data-parallel degree {est.data_parallel_degree}{split}\n"
            + sequence_text(sequence) + f"{rows}\n{est.summary()}\n"
            + "".join(f"warning: {w}\n" for w in est.warnings)
            + "".join(f"assumes: {a}\n" for a in assumptions))
    obj = {"inputs": inputs_json(args, scenario), **estimate_json(est), "sequence": sequence,
           "assumptions": assumptions}
    storage = offload_storage(scenario)
    obj.update(storage)
    text += _storage_lines(storage)
    ds = deepspeed_row_for(scenario)
    obj["deepspeed_estimator"] = None if ds is None else {
        **ds.model_dump(), "covers": "model states only (DeepSpeed 0.19.8 estimate_zero2/zero3_model_states_mem_needs)"}
    if ds is not None:
        text += (f"DeepSpeed's own estimator (model states only): {ds.per_gpu_bytes / GIB:.2f} GiB per GPU, "
                 f"{ds.per_cpu_bytes / GIB:.1f} GiB per CPU; zeroplanner's full total: "
                 f"{est.per_gpu_bytes.total / GIB:.2f} GiB per GPU\n")
    _emit(args, obj, text)
    return EXIT_FITS if est.fits else EXIT_DOES_NOT_FIT


def _choice_json(choice) -> dict:
    return {"label": choice.label, **choice.model_dump()}


def _imply(args: argparse.Namespace) -> None:
    """Set what a given option needs and the user left out (the input table's ``app_implies``: a ZeRO++ option
    means stage 3), so ``recommend --zero-quantized-weights`` searches ZeRO-3 instead of refusing stage 2. The
    implied option is not held (the held ZeRO++ setting already rules out stages 0-2)."""
    by_path = {i.path: i for i in BY_KEY.values() if i.path}
    for key in list(given_inputs(args)):
        for path, value in BY_KEY[key].app_implies:
            target = by_path[path]
            if getattr(args, target.key, None) is None:
                setattr(args, target.key, value)


def _storage_lines(storage: dict) -> str:
    """Host RAM and NVMe per node, each one figure and its parts (GiB), for offloading scenarios."""
    out = ""
    for key, name, limit, limit_name in (("host_memory", "host RAM", "available_bytes", "available"),
                                         ("nvme", "NVMe", "capacity_bytes", "capacity")):
        d = storage[key]
        if not d["required_bytes"]:
            continue
        verdict = "fits" if d["fits"] else "does NOT fit"
        parts = ", ".join(f"{label} {v / GIB:.1f}" for label, v in d["parts_bytes"].items())
        out += (f"{name} per node: {d['required_bytes'] / GIB:.1f} GiB needed, {d[limit] / GIB:.0f} GiB {limit_name} "
                f"({verdict}) = {parts} GiB\n")
    return out


def _with_picked_sp(scenario, p):
    """The scenario with the plan's Ulysses degree (the largest-model table then answers for the picked split)."""
    if not p.fits or p.choice.sequence_parallel_size == scenario.cluster.sequence_parallel_size:
        return scenario
    return scenario.model_copy(update={"cluster": scenario.cluster.model_copy(
        update={"sequence_parallel_size": p.choice.sequence_parallel_size})})


def cmd_recommend(args: argparse.Namespace) -> int:
    from ..planner import SEARCH_INPUTS, longest_sequence, plan

    given = given_inputs(args)
    held = sorted(set(given) & set(SEARCH_INPUTS))
    _imply(args)
    scenario = scenario_from_args(args)
    try:
        p = plan(scenario, held=held, given=given)
    except ValueError as exc:  # held values no candidate combines (the scenario's own rules catch most first)
        fail(BY_KEY[held[0]].cli_flag, str(exc))
    # what the search finds with every option free
    free = plan(scenario, advice=False, given=given) if not p.fits and held else None
    largest_for = _with_picked_sp(scenario, p)  # the largest-model table answers for the picked Ulysses degree
    obj = {
        "inputs": {**inputs_json(args, scenario), "given": given},
        "fits": p.fits,
        "choice": _choice_json(p.choice) if p.choice else None,
        "held": p.held,
        "varied": p.varied,
        "estimate": estimate_json(p.estimate),
        "reasons": p.reasons,
        "warnings": p.warnings,
        "alternatives": [{"label": a.label, "choice": _choice_json(a.choice), "estimate": estimate_json(a.estimate)}
                         for a in p.alternatives],
        "candidates_evaluated": p.candidates_evaluated,
        "without_held": None if free is None else {
            "fits": free.fits, "choice": _choice_json(free.choice) if free.choice else None},
        **_largest(largest_for),
        "longest_sequence": longest_sequence(scenario),
        "sequence": sequence_json(scenario),
        **advice_json(p),
    }
    about_model = model_assumptions(scenario)
    obj["assumptions"] = p.assumptions + about_model
    if p.fits:
        text = f"Recommended: {p.choice.label}\n"
    else:
        text = "Nothing fits" + (f" with the options held ({', '.join(f'{k}={v}' for k, v in p.held.items())})"
                                 if held else "") + ".\n"
        if free is not None:
            text += (f"With every option free the planner picks: {free.choice.label}\n" if free.fits else
                     "Nothing fits with every option free either.\n")
    # what the verdict rests on and what to change first come before the reasons
    text += advice_text(p)
    text += "".join(f"- {r}\n" for r in p.reasons)
    text += sequence_text(obj["sequence"])
    text += "".join(f"warning: {w}\n" for w in p.warnings)
    text += "".join(f"assumes: {a}\n" for a in about_model)
    if p.alternatives:
        from ..planner.rank import DEFAULT_TOLERANCE, PREFERENCE_ORDER
        from ..planner.reasons import PREFERENCE_TEXT

        # listed in the ranking's order, which is not tokens/s: say so (a new user read it as unsorted), each
        # preference by the head of its sentence ("no offload: fewer of ..." -> "no offload")
        order = "; ".join(PREFERENCE_TEXT[k].split(" (")[0].split(": ")[0] for k in PREFERENCE_ORDER)
        text += (f"alternatives (each other stage and offload's best) in the planner's order, not by speed: within "
                 f"{DEFAULT_TOLERANCE:.0%} of the fastest first, then {order}:\n")
    text += "".join(f"alternative: {a.label}: {a.estimate.tokens_per_second:,.0f} tokens/s\n" for a in p.alternatives)
    sp_note = (f", Ulysses sequence_parallel_size {p.choice.sequence_parallel_size} as picked"
               if p.fits and p.choice.sequence_parallel_size > 1 else "")
    from ..planner.sweeps import grid_step

    # the sizes searched step by grid_step(); with Ulysses, shapes whose heads its degree does not split are skipped
    skipped = (", shapes whose heads its Ulysses degree does not split skipped"
               if largest_for.cluster.sequence_parallel_size > 1 else "")
    text += (f"largest trainable model on this cluster (Llama-shaped, same training settings{sp_note}; each size "
             f"searched {grid_step():.1%} above the last{skipped}; a row is limited by what the next size searched "
             "does not fit in):\n") + "".join(
        f"  {label:<36} {n / 1e9:8.1f} B parameters (limited by {obj['largest_model_limited_by'][label]})\n"
        for label, n in obj["largest_model_parameters"].items())
    text += (f"longest trainable sequence for {scenario.model.name} on this cluster (same training settings; Ulysses "
             "degrees over the whole cluster):\n" + "".join(
                 f"  {label:<36} {r['seq_len']:>12,} tokens"
                 + (f" (sequence_parallel_size {r['sequence_parallel_size']})" if r["seq_len"] else " (none fits)")
                 + "\n" for label, r in obj["longest_sequence"].items()))
    _emit(args, obj, text)
    return EXIT_FITS if p.fits else EXIT_DOES_NOT_FIT


def _largest(scenario) -> dict:
    """The largest-model table's JSON: ``largest_model_parameters`` {variant: parameters} and
    ``largest_model_limited_by`` {variant: what the next size searched does not fit in, in words}
    (:func:`zeroplanner.planner.largest_model_limits`, one sweep for both)."""
    from ..planner import largest_limit_text, largest_model_limits

    limits = largest_model_limits(scenario)
    return {"largest_model_parameters": {k: v["parameters"] for k, v in limits.items()},
            "largest_model_limited_by": {k: largest_limit_text(v) for k, v in limits.items()}}


def cmd_deepspeed_estimate(args: argparse.Namespace) -> int:
    from ..costmodel import deepspeed_estimate_table

    rows = deepspeed_estimate_table(args.params, args.largest_layer_params, args.gpus_per_node, args.nodes)
    obj = {"rows": [r.model_dump() for r in rows], "source": "DeepSpeed 0.19.8 estimate_zero2/zero3_model_states_mem_needs"}
    text = "\n".join(
        f"stage {r.stage} offload_param={r.offload_param:<4} offload_optimizer={r.offload_optimizer:<4} "
        f"zero_init={'-' if r.zero_init is None else r.zero_init}: per CPU {r.per_cpu_bytes / GIB:8.2f} GiB, "
        f"per GPU {r.per_gpu_bytes / GIB:8.2f} GiB"
        for r in rows
    )
    _emit(args, obj, text)
    return 0


Cell = tuple[str, str]
"""One table cell: (text, alignment), alignment "<" (left: names, words) or ">" (right: numbers)."""


def _catalog_row(kind: str, name: str) -> tuple[dict, list[Cell]]:
    """(the JSON object of one catalog entry, its text row as cells for :func:`text_table`)."""
    if kind == "models":
        m = catalog.model(name)
        hub = {n: h for h, n in catalog.model_hub_ids().items()}
        d = {"name": m.name, "family": m.family, "parameters": m.parameter_count, "layers": m.n_layers,
             "hidden_size": m.hidden_size, "heads": m.n_heads, "kv_heads": m.kv_heads, "vocab_size": m.vocab_size,
             "experts": m.n_experts, "hub_id": hub.get(m.name), "source": m.source}
        return d, [(m.name, "<"), (f"{m.parameter_count / 1e9:.2f} B params", ">"), (f"{m.n_layers} layers", ">"),
                   (f"h={m.hidden_size}", "<")]
    if kind == "gpus":
        g = catalog.gpu(name)
        d = {"name": g.name, "memory_gib": g.memory_bytes / GIB, "memory_bytes": g.memory_bytes,
             "marketed_memory_gb": g.marketed_memory_gb, "peak_bf16_tflops": g.peak_bf16_tflops,
             "peak_fp16_tflops": g.peak_fp16_tflops, "intra_node_busbw_gb_per_s": g.intra_node_busbw_gb_per_s,
             "source": g.source}
        sold = f"(sold as {g.marketed_memory_gb:g} GB)" if g.marketed_memory_gb else ""
        return d, [(g.name, "<"), (f"{g.memory_bytes / GIB:.2f} GiB", ">"), (sold, "<"),
                   (f"{g.peak_tflops('bf16'):.1f} TFLOP/s", ">"), ("bf16/fp16 dense  intra-node busbw", "<"),
                   (f"{g.intra_node_busbw_gb_per_s:.0f} GB/s", ">")]
    n = catalog.network(name)
    d = {"name": n.name, "kind": n.kind, "link_gbps": n.link_gbps, "nics_per_node": n.nics_per_node,
         "efficiency": n.efficiency, "node_busbw_gb_per_s": n.node_busbw_bytes_per_second / 1e9,
         "latency_seconds": n.latency_seconds, "source": n.source}
    return d, [(n.name, "<"), (n.kind, "<"), (f"{n.nics_per_node} x {n.link_gbps:g} Gbit/s per node,", ">"),
               (f"~{n.node_busbw_bytes_per_second / 1e9:.1f} GB/s bus bandwidth,", ">"),
               (f"{n.latency_seconds * 1e6:.0f} us/step", ">")]


def text_table(rows: list[list[Cell]], gap: str = "  ") -> str:
    """Rows of cells as aligned text: each column as wide as its widest cell (so a long catalog name never pushes
    its row out of line), names left-aligned and numbers right-aligned, columns ``gap`` apart, no trailing
    spaces."""
    widths = [max(len(row[i][0]) for row in rows if i < len(row)) for i in range(max(map(len, rows), default=0))]
    return "\n".join(gap.join(f"{text:{align}{widths[i]}}" for i, (text, align) in enumerate(row)).rstrip()
                     for row in rows)


def cmd_catalog(args: argparse.Namespace) -> int:
    kind = args.kind
    names = {"models": catalog.model_names, "gpus": catalog.gpu_names, "networks": catalog.network_names}[kind]()
    rows = [_catalog_row(kind, n) for n in names]
    _emit(args, {kind: [r[0] for r in rows]}, text_table([r[1] for r in rows]))
    return 0


def register(sub, add_scenario_options) -> None:
    """Add the planning and catalog subcommands."""
    p = sub.add_parser("estimate", help="memory, communication and step time of one configuration",
                       epilog=EXIT_STATUSES_HELP)
    add_scenario_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_estimate)
    p = sub.add_parser("recommend", help="evaluate every candidate and recommend one (given options are held)",
                       description=RECOMMEND_DESCRIPTION, epilog=EXIT_STATUSES_HELP)
    add_scenario_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_recommend)
    p = sub.add_parser("deepspeed-estimate", help="DeepSpeed's own model-state estimator, reproduced")
    p.add_argument("--params", type=_positive_int("--params", 1, 10**15), required=True,
                   help="total parameters (DeepSpeed's total_params), 1-1e15")
    p.add_argument("--largest-layer-params", type=_positive_int("--largest-layer-params", 1, 10**15), required=True,
                   help="parameters of the largest layer (DeepSpeed's largest_layer_params), 1-1e15")
    p.add_argument("--gpus-per-node", type=_positive_int("--gpus-per-node", 1, 1024), default=1,
                   help="GPUs per node, 1-1024 (default 1)")
    p.add_argument("--nodes", type=_positive_int("--nodes", 1, int(BY_KEY["nodes"].high)), default=1,
                   help=f"nodes, 1-{int(BY_KEY['nodes'].high)} (default 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_deepspeed_estimate)
    for kind in ("models", "gpus", "networks"):
        p = sub.add_parser(kind, help=f"list catalog {kind}")
        p.add_argument("--json", action="store_true", help="print one JSON object")
        p.set_defaults(func=cmd_catalog, kind=kind)
