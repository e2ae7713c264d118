"""Judge every public DeepSpeed config in tests/data/public_ds_configs on the real engine (one CPU rank each) and store
the verdicts in tests/data/public_ds_configs/judged.json.

    python benchmarks/judge_public_configs.py          # about 5 minutes on 2 cores (two judges at a time)

Each config is run the way its project launches it (SOURCES.json ``launched_by``: the HF Trainer's whole path or
raw ``deepspeed.initialize`` + one step; zeroplanner/calibrate/config_judge.py). tests/evidence/
test_public_ds_configs.py holds ``zeroplanner check`` to these verdicts.
"""

from __future__ import annotations

import datetime
import json
import platform
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zeroplanner.calibrate.config_judge import for_one_rank, judge_config  # noqa: E402

DATA = ROOT / "tests" / "data" / "public_ds_configs"


def main() -> int:
    import deepspeed
    import torch
    import transformers

    sources = json.loads((DATA / "SOURCES.json").read_text())

    def one(src):
        config, world = for_one_rank(json.loads((DATA / src["file"]).read_text()))
        verdict = judge_config(config, src["launched_by"])
        print(f"{src['file'][:70]:70s} {src['launched_by']:10s} {verdict['verdict']:11s} {verdict['error'][:90]}",
              flush=True)
        return src["file"], {"mode": src["launched_by"], "config_gpus": world, **verdict}

    with ThreadPoolExecutor(max_workers=2) as pool:
        verdicts = dict(pool.map(one, sources))
    meta = {"measured_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.machine()} Linux, 1 CPU rank (gloo) per config",
            "deepspeed": deepspeed.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "method": "zeroplanner/calibrate/config_judge.py (HF Trainer.train() 1 step, or deepspeed.initialize + "
                      "1 step)"}
    (DATA / "judged.json").write_text(json.dumps({"meta": meta, "configs": verdicts}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {(DATA / 'judged.json').relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
