"""Ground truth for Ulysses sequence parallelism: DeepSpeed's ALST path for HF models on CPU ranks, measured per rank.

What runs is DeepSpeed 0.19.8's own integration for HF Transformers, the way accelerate 1.15 drives it
(``accelerate/accelerator.py`` ``_prepare_deepspeed``; the loss as in accelerate's
``test_utils/scripts/external_deps/test_ds_alst_ulysses_sp.py``):

1. ``UlyssesSPAttentionHF.register_with_transformers(model, core_attn_implementation="sdpa", sequence_parallel_size=P,
   micro_batch_size=b, seq_length=s, seq_length_is_variable=False)`` replaces transformers' ``sdpa`` attention
   function with DeepSpeed's wrapper and returns the ``mpu`` (``runtime/sequence_parallel/parallel_state_sp.py``);
2. ``deepspeed.initialize(model=..., config=..., mpu=mpu)`` (ZeRO stage 1, bf16, torch AdamW: the stage does not
   change activations or the all-to-alls; stage 3 would add parameter all-gathers the census would have to exclude);
3. one batch through ``UlyssesSPDataLoaderAdapter`` (it gathers each SP rank's sample and hands rank r the r-th
   sequence chunk, with ``shift_labels``), forward, HF's ``loss_function(logits, labels=None, shift_labels=...)``,
   the token-weighted loss aggregation over the SP group (``torch.distributed.nn.functional.all_gather``),
   ``engine.backward``, ``engine.step``.

Every rank measures (nothing here is predicted):

* ``saved_bytes``: storages autograd saves for backward during the forward and the loss
  (``torch.autograd.graph.saved_tensors_hooks``, deduplicated by ``untyped_storage().data_ptr()``, parameter and
  buffer storages excluded) -- the same census as :func:`zeroplanner.calibrate.measure_activation_bytes`;
  ``logits_bytes``: the logits tensor the model returns when it is not itself saved (alive until backward);
  ``saved_by_kind``: the same bytes per (shape, dtype) so each tensor of the formula can be traced;
* ``comms_forward`` / ``comms_backward``: DeepSpeed's comms logger (``"comms_logger": {"enabled": true,
  "prof_all": true}``; ``deepspeed.comm.comm.comms_logger.comms_dict``, message size = bytes of the op's input
  tensor, ``deepspeed/comm/utils.py`` ``get_msg_size_from_args``) per op name: count, bytes, sizes;
* ``checkpointed``: the same census and comms for a second micro-step with full activation checkpointing
  (``gradient_checkpointing_enable``, reentrant; the backward recomputes each layer, its all-to-alls included);
* ``loss``: the SP-aggregated loss of the first micro-step, and ``reference_loss``: the same model (same random seed,
  same weights, bf16) on the whole sequence in one process with transformers' own attention, before Ulysses is
  registered, plus
  ``reference_saved_bytes`` / ``reference_logits_bytes`` (the sp = 1 census of the same forward).

Run as a script on every rank (``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` set, as torchrun sets them)::

    python -m zeroplanner.calibrate.ulysses --plan plan.json --out DIR

or from Python with :func:`run_ulysses`, which spawns the ranks. Torch, DeepSpeed and transformers are imported
inside functions only.

CUDA: nothing on this path needs CUDA with DeepSpeed 0.19.8 / torch 2.13 CPU. gloo implements ``all_to_all_single``
(the comms logger records every call); the wrapper's exchange is a ``torch.library.custom_op``
(``deepspeed/sequence/layer.py:327-329`` ``_dim_zero_all_to_all_op`` -> ``deepspeed.comm.all_to_all_single``, its
backward one more all-to-all, ``layer.py:342``); ``sdpa`` runs torch's CPU kernel. Device-dependent, and said
where it matters: FlashAttention-2 (``core_attn_implementation="flash_attention_2"``, the ALST default) needs the
CUDA-only ``flash_attn`` package (not installed here; ``transformers/utils/import_utils.py``
``is_flash_attn_2_available``), so the attention kernel measured is CPU sdpa (it saves the same q, k, v, output and
fp32 log-sum-exp as flash); ``UlyssesSPDataLoaderAdapter`` moves each rank's chunk with ``.cpu()``
(``ulysses_sp.py:724``), a compacting copy on CUDA but a no-op on CPU, where the chunk stays a view of the whole
sequence (with ``micro_batch > 1`` a non-contiguous one that transformers' loss refuses): :func:`_run` clones the
chunk, the layout CUDA ranks get. ``eager`` is refused on every device (``ulysses_sp.py:468``). ALST's TiledMLP,
tiled loss and checkpoint offload are not exercised here.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..files import MAX_RESULT_FILE_BYTES, read_regular_file
from . import end_rank, rank_results, wait_or_kill

TINY_ULYSSES_LLAMA: dict[str, Any] = {
    "model_type": "llama", "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
    "tie_word_embeddings": False, "rms_norm_eps": 1e-5, "attention_dropout": 0.0,
}
"""The tiny Llama of the Ulysses ground truth: 4 query heads, 2 KV heads (GQA), so sp 2 splits the KV heads and
sp 4 exercises DeepSpeed's KV-head replication (``kv_replication_factor = sp // kv_heads = 2``)."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ds_config(micro_batch: int) -> dict[str, Any]:
    """DeepSpeed config of the run: ZeRO-1, bf16, torch's AdamW (FusedAdam is JIT-compiled on first use, minutes on
    CPU), the comms logger on for every op. DeepSpeed's key names."""
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "comms_logger": {"enabled": True, "verbose": False, "prof_all": True, "debug": False},
        "steps_per_print": 1_000_000,
    }


class _SavedCensus:
    """``saved_tensors_hooks`` pack hook that sums the storages autograd saves, once each, minus ``excluded``."""

    def __init__(self, excluded: set[int]):
        self.excluded = excluded
        self.bytes_by_ptr: dict[int, int] = {}
        self.kind: dict[str, int] = {}
        self.keep: list[Any] = []  # saved tensors stay referenced so no address is reused and counted twice

    def pack(self, t):
        s = t.untyped_storage()
        ptr = s.data_ptr()
        if ptr and ptr not in self.excluded and t.device.type != "meta" and ptr not in self.bytes_by_ptr:
            self.bytes_by_ptr[ptr] = int(s.nbytes())
            k = f"{tuple(t.shape)}|{str(t.dtype).replace('torch.', '')}|{int(s.nbytes())}"
            self.kind[k] = self.kind.get(k, 0) + int(s.nbytes())
            self.keep.append(t)
        return t

    @staticmethod
    def unpack(t):
        return t

    @property
    def total(self) -> int:
        return int(sum(self.bytes_by_ptr.values()))


def _reference(model, ids, vocab: int) -> dict[str, Any]:
    """sp = 1: the same bf16 model on the whole sequence in this process (transformers' own sdpa attention)."""
    import torch

    excluded = {t.untyped_storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
    census = _SavedCensus(excluded)
    position_ids = torch.arange(ids.shape[1]).unsqueeze(0).expand(ids.shape[0], -1)
    with torch.autograd.graph.saved_tensors_hooks(census.pack, census.unpack):
        out = model(input_ids=ids, position_ids=position_ids, labels=ids, use_cache=False)
    lp = out.logits.untyped_storage().data_ptr()
    logits = 0 if lp in census.bytes_by_ptr else int(out.logits.untyped_storage().nbytes())
    result = {"reference_loss": float(out.loss.detach().float().item()), "reference_saved_bytes": census.total,
              "reference_logits_bytes": logits}
    del out, census
    model.zero_grad(set_to_none=True)
    return result


def _run(plan: dict[str, Any], out_dir: str) -> None:
    import deepspeed
    import deepspeed.comm as dist
    import torch
    from deepspeed.comm.comm import comms_logger
    from deepspeed.runtime.sequence_parallel.ulysses_sp import (
        UlyssesSPAttentionHF,
        UlyssesSPDataLoaderAdapter,
    )

    from ._worker import _build_model, _comms_snapshot

    rank, world = dist.get_rank(), dist.get_world_size()
    sp = int(plan["sp_size"])
    b, s = int(plan["micro_batch"]), int(plan["seq_len"])
    hf_config = dict(plan["hf_config"], attn_implementation="sdpa")
    torch.manual_seed(int(plan.get("seed", 1234)))
    model = _build_model(hf_config).to(torch.bfloat16)
    model.train()
    vocab = int(hf_config["vocab_size"])
    gen = torch.Generator().manual_seed(int(plan.get("data_seed", 77)))
    ids = torch.randint(0, vocab, (b, s), generator=gen)  # the same sequence on every rank
    result: dict[str, Any] = {"rank": rank, "world_size": world, "sp_size": sp, "seq_len": s, "micro_batch": b,
                              "hf_config": plan["hf_config"], "parameters": sum(p.numel() for p in model.parameters())}
    result.update(_reference(model, ids, vocab))

    mpu = UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=model, core_attn_implementation="sdpa", sequence_parallel_size=sp, micro_batch_size=b,
        seq_length=s, seq_length_is_variable=False)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config(b),
                                           mpu=mpu)
    sp_group = mpu.get_sequence_parallel_group()
    sp_rank = mpu.get_sequence_parallel_rank()
    result["engine_sequence_parallel_size"] = int(getattr(engine, "sequence_parallel_size", 0))
    result["optimizer_class"] = type(engine.optimizer).__name__

    position_ids = torch.arange(s).unsqueeze(0).expand(b, -1).contiguous()

    def collate(batch):
        return {"input_ids": ids, "position_ids": position_ids, "labels": ids.clone()}

    dl = torch.utils.data.DataLoader([0], batch_size=1, collate_fn=collate)
    dl = UlyssesSPDataLoaderAdapter(dl, sp_rank=sp_rank, sp_group=sp_group, sp_world_size=sp, device=engine.device)
    batch = next(iter(dl))
    # On CUDA the adapter's .cpu() (ulysses_sp.py:724) copies each rank's chunk to the host and .to(device) copies it
    # back: compact tensors of the rank's own tokens. On CPU both are no-ops and the chunk stays a view of the whole
    # sequence: it keeps the full ids/labels storage alive and, with micro_batch > 1, is non-contiguous, which
    # transformers' ForCausalLMLoss rejects (shift_labels.view(-1): "view size is not compatible", measured).
    # clone() gives every rank the layout it has on CUDA.
    batch = {k: (v.to(engine.device).clone(memory_format=torch.contiguous_format) if torch.is_tensor(v) else v)
             for k, v in batch.items()}
    result["local_input_shape"] = list(batch["input_ids"].shape)
    dist.barrier()
    comms_logger.comms_dict.clear()

    excluded = {t.untyped_storage().data_ptr() for t in list(engine.module.parameters()) +
                list(engine.module.buffers())}
    census = _SavedCensus(excluded)
    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(census.pack, census.unpack):
        outputs = engine(**batch, use_cache=False)
        shift_labels = batch["shift_labels"]
        loss = engine.module.loss_function(logits=outputs.logits, labels=None, shift_labels=shift_labels,
                                           vocab_size=vocab)
        # token-weighted mean over the SP group, differentiable (accelerate's test_ds_alst_ulysses_sp.py)
        losses = torch.distributed.nn.functional.all_gather(loss, group=sp_group)
        good = (shift_labels != -100).view(-1).sum()
        goods = torch.distributed.nn.functional.all_gather(good, group=sp_group)
        total = sum(losses[r] * goods[r] for r in range(sp) if goods[r] > 0)
        loss = total / max(sum(goods), 1)
    t1 = time.perf_counter()
    lp = outputs.logits.untyped_storage().data_ptr()
    result["saved_bytes"] = census.total
    result["logits_bytes"] = 0 if lp in census.bytes_by_ptr else int(outputs.logits.untyped_storage().nbytes())
    result["saved_by_kind"] = dict(sorted(census.kind.items(), key=lambda kv: -kv[1]))
    result["logits_shape"] = list(outputs.logits.shape)
    result["comms_forward"] = _comms_snapshot(comms_logger)
    del census, outputs
    engine.backward(loss)
    t2 = time.perf_counter()
    result["comms_backward"] = _comms_snapshot(comms_logger)
    engine.step()
    result["comms_step"] = _comms_snapshot(comms_logger)
    result["loss"] = float(loss.detach().float().item())
    result["timings"] = {"forward_seconds": t1 - t0, "backward_seconds": t2 - t1}
    del loss, losses, goods, total
    if plan.get("checkpointed_step", True):
        # A second micro-step with full activation checkpointing (HF's gradient_checkpointing_enable, reentrant, as
        # measure_activation_bytes does, so the saved layer inputs reach the census): the backward recomputes each
        # layer's forward, its all-to-alls included.
        engine.module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        census = _SavedCensus(excluded)
        with torch.autograd.graph.saved_tensors_hooks(census.pack, census.unpack):
            outputs = engine(**batch, use_cache=False)
            loss = engine.module.loss_function(logits=outputs.logits, labels=None, shift_labels=shift_labels,
                                               vocab_size=vocab)
            losses = torch.distributed.nn.functional.all_gather(loss, group=sp_group)
            goods = torch.distributed.nn.functional.all_gather(good, group=sp_group)
            loss = sum(losses[r] * goods[r] for r in range(sp) if goods[r] > 0) / max(sum(goods), 1)
        lp = outputs.logits.untyped_storage().data_ptr()
        result["checkpointed"] = {
            "saved_bytes": census.total,
            "logits_bytes": 0 if lp in census.bytes_by_ptr else int(outputs.logits.untyped_storage().nbytes()),
            "saved_by_kind": dict(sorted(census.kind.items(), key=lambda kv: -kv[1])),
            "comms_forward": _comms_snapshot(comms_logger)}
        # what the recomputation saves during backward (all layers; each is freed after its own backward, so the
        # live peak is one layer): storages not saved in forward, parameters excluded
        recomputed = _SavedCensus(excluded | set(census.bytes_by_ptr))
        del census, outputs
        with torch.autograd.graph.saved_tensors_hooks(recomputed.pack, recomputed.unpack):
            engine.backward(loss)
        result["checkpointed"]["recomputed_saved_bytes"] = recomputed.total
        result["checkpointed"]["recomputed_by_kind"] = dict(sorted(recomputed.kind.items(), key=lambda kv: -kv[1]))
        del recomputed
        result["checkpointed"]["comms_backward"] = _comms_snapshot(comms_logger)
        engine.step()
        comms_logger.comms_dict.clear()
    with open(os.path.join(out_dir, f"ulysses_sp{sp}.rank{rank}.json"), "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    dist.barrier()


def main(argv: list[str] | None = None) -> int:
    """Script entry on every rank: ``--plan`` JSON ``{"hf_config", "sp_size", "seq_len", "micro_batch", "seed"}``,
    ``--out`` directory for ``ulysses_sp<P>.rank<r>.json`` (or ``.error.json`` with the traceback)."""
    import traceback

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    plan = json.loads(read_regular_file(args.plan, MAX_RESULT_FILE_BYTES, "--plan"))  # written by run_ulysses
    import deepspeed
    import torch

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    rank = int(os.environ.get("RANK", "0"))
    os.makedirs(args.out, exist_ok=True)
    try:
        _run(plan, args.out)
    except Exception as exc:  # noqa: BLE001 - the launcher reports it
        Path(args.out, f"ulysses_sp{plan['sp_size']}.rank{rank}.error.json").write_text(json.dumps(
            {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}, indent=1))
        return 1
    return 0


class UlyssesRunError(RuntimeError):
    """The Ulysses engine run did not finish (timeout, a rank failed, or a rank wrote no result)."""


def run_ulysses(
    sp_size: int,
    out_dir: str | Path,
    *,
    hf_config: dict[str, Any] | None = None,
    seq_len: int = 256,
    micro_batch: int = 1,
    seed: int = 1234,
    timeout_seconds: float = 180.0,
) -> list[dict[str, Any]]:
    """Spawn ``sp_size`` CPU ranks (gloo; world = sp_size, data-parallel degree 1) running :func:`main` and return
    their results, rank order (keys: see the module docstring).

    ``sp_size`` must be >= 2 (DeepSpeed's ``initialize_sequence_parallel`` refuses 1) and divide the query heads
    and, or be divided by, the KV heads; ``seq_len`` must divide by ``sp_size`` (``UlyssesSPDataLoaderAdapter``).
    Those are checked here with a ``ValueError`` naming the field. Raises :class:`UlyssesRunError` when a rank fails
    or the run exceeds ``timeout_seconds`` (its processes are killed).
    """
    cfg = dict(TINY_ULYSSES_LLAMA if hf_config is None else hf_config)
    heads, kv = int(cfg["num_attention_heads"]), int(cfg.get("num_key_value_heads", cfg["num_attention_heads"]))
    if sp_size < 2:
        raise ValueError(f"sp_size={sp_size}: must be >= 2 (sp_size 1 is the reference run inside every rank)")
    if heads % sp_size:
        raise ValueError(f"sp_size={sp_size} must divide num_attention_heads={heads}")
    if kv % sp_size and sp_size % kv:
        raise ValueError(f"sp_size={sp_size} and num_key_value_heads={kv}: one must divide the other")
    if seq_len < sp_size or seq_len % sp_size:
        raise ValueError(f"seq_len={seq_len} must be a positive multiple of sp_size={sp_size}")
    if micro_batch < 1:
        raise ValueError(f"micro_batch={micro_batch} must be >= 1")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plan_path = out / f"plan_sp{sp_size}.json"
    plan_path.write_text(json.dumps({"hf_config": cfg, "sp_size": sp_size, "seq_len": seq_len,
                                     "micro_batch": micro_batch, "seed": seed}))
    port = _free_port()
    procs = []
    for rank in range(sp_size):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(sp_size),
                   LOCAL_WORLD_SIZE=str(sp_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", CUDA_VISIBLE_DEVICES="",
                   PYTHONWARNINGS="ignore")
        log = open(out / f"sp{sp_size}.rank{rank}.log", "w")  # noqa: SIM115 - closed in the finally below
        procs.append((subprocess.Popen(
            [sys.executable, "-m", "zeroplanner.calibrate.ulysses", "--plan", str(plan_path), "--out", str(out)],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True), log))
    timed_out = wait_or_kill(procs, timeout_seconds)
    results, failed = rank_results(out, f"ulysses_sp{sp_size}", sp_size, "traceback")
    errors = [f"rank {rank}: " + str(message)[-2000:] if message is not None else
              f"rank {rank}: no result; log tail:\n" + (out / f"sp{sp_size}.rank{rank}.log").read_text()[-2000:]
              for rank, message in failed]
    if timed_out or errors:
        why = f"timed out after {timeout_seconds:.0f} s; " if timed_out else ""
        raise UlyssesRunError(f"Ulysses run sp_size={sp_size} failed: {why}" + "\n".join(errors[:2]))
    return results


if __name__ == "__main__":
    end_rank(main())
