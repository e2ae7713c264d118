"""Worker: does the real engine accept one DeepSpeed config? One CPU rank (gloo), a tiny HF model, one training step.

Run by :func:`zeroplanner.calibrate.config_judge.judge_config` through DeepSpeed's launcher::

    deepspeed --num_gpus 1 --no_local_rank zeroplanner/calibrate/_config_judge.py --config c.json --mode M --out r.json

``--mode hf_trainer``: the HF Trainer's own path, end to end: ``TrainingArguments(deepspeed=config, use_cpu=True,
max_steps=1, ...)`` and ``Trainer.train()`` on a 4-sample dataset, so transformers fills "auto"
(``HfTrainerDeepSpeedConfig``), builds the optimizer and scheduler the config names (``deepspeed_optim_sched``) and
calls ``deepspeed.initialize``. The TrainingArguments take the config's concrete micro-batch, accumulation, precision
and learning rate (the user's arguments are assumed to agree with their config), else one sample, one step, bf16.
``--mode deepspeed``: ``deepspeed.initialize(model, model_parameters, config)`` then one forward, backward and step.

Writes ``{"accepted": bool, "error": "Type: first line", "phase": "init" | "step"}``. Measurements only: nothing
here is predicted. Torch, DeepSpeed and transformers are imported inside ``main``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128}
"""The model every config is judged with (shapes only matter for the "auto" fills: hidden_size 64)."""


def _concrete(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _block_on(config, *names):
    for name in names:
        block = config.get(name)
        if isinstance(block, dict) and block.get("enabled") in (True, "auto"):
            return True
    return False


def _hf_trainer(config, model, torch):
    from transformers import Trainer, TrainingArguments

    micro = _concrete(config.get("train_micro_batch_size_per_gpu")) or 1
    accum = _concrete(config.get("gradient_accumulation_steps")) or 1
    total = _concrete(config.get("train_batch_size"))
    if total and not _concrete(config.get("gradient_accumulation_steps")) and total % micro == 0:
        accum = int(total // micro)
    fp16 = _block_on(config, "fp16") and not _block_on(config, "bf16", "bfloat16")
    lr = _concrete(((config.get("optimizer") or {}).get("params") or {}).get("lr")) or 5e-5
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=int(micro),
                             gradient_accumulation_steps=int(accum), max_steps=1, bf16=not fp16, fp16=fp16,
                             learning_rate=lr, deepspeed=config, report_to=[], save_strategy="no", logging_steps=1,
                             dataloader_num_workers=0, use_cpu=True)
    ids = torch.randint(0, TINY["vocab_size"], (16,))
    data = [{"input_ids": ids, "labels": ids} for _ in range(4 * int(micro) * int(accum))]
    Trainer(model=model, args=args, train_dataset=data).train()


def _deepspeed(config, model, torch, state):
    import deepspeed

    # a raw DeepSpeed script without an optimizer block passes its own (torch's AdamW, as the HF Trainer does)
    client = None if "optimizer" in config else torch.optim.AdamW(model.parameters(), lr=1e-4)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), optimizer=client,
                                           config=config)
    state["phase"] = "step"
    micro = engine.train_micro_batch_size_per_gpu()
    ids = torch.randint(0, TINY["vocab_size"], (micro, 16))
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--mode", choices=("hf_trainer", "deepspeed"), required=True)
    parser.add_argument("--out", required=True)
    args, _ = parser.parse_known_args(argv)
    with open(args.config) as f:
        config = json.load(f)
    state = {"phase": "init"}
    result = {"accepted": True, "error": "", "phase": ""}
    try:
        import deepspeed
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        torch.set_num_threads(1)
        deepspeed.init_distributed(dist_backend="gloo")
        torch.manual_seed(0)
        cfg = dict(TINY)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg))
        if args.mode == "hf_trainer":
            _hf_trainer(config, model, torch)
        else:
            _deepspeed(config, model, torch, state)
    except BaseException as exc:  # noqa: BLE001 - the refusal is the measurement (SystemExit included)
        text = str(exc).strip().splitlines()
        result = {"accepted": False, "error": f"{type(exc).__name__}: {text[0][:400] if text else ''}",
                  "phase": state["phase"]}
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
