"""DeepSpeed configs: generate one from a scenario, read a user's own back into a scenario, check it.

- :mod:`.keys` -- the vocabulary every part shares: DeepSpeed 0.19.8's key tables, limits, the HF Trainer's
  ``"auto"`` keys, :class:`Finding`.
- :mod:`.emit` -- :func:`to_deepspeed_config` (raw ``deepspeed.initialize`` or HF Trainer ``"auto"`` variant),
  :func:`hf_auto_values`, :func:`hf_training_arguments`, :func:`to_accelerate_config`, :func:`generation_notes`,
  and for Ulysses :func:`parallelism_config_kwargs` / :func:`parallelism_config_snippet` (accelerate's
  ``ParallelismConfig``) and :func:`deepspeed_train_batch_size`.
- :mod:`.read` -- :func:`load_config_text` (the safe reader) and :func:`from_deepspeed_config` (config ->
  ``(Scenario, findings)``).
- :mod:`.lint` -- ``lint(config, scenario, mode)``: findings with a fix each; the run-level rules come from
  :mod:`zeroplanner.pitfalls`, shared with ``estimate``.
- :mod:`.library` -- where DeepSpeed / transformers are installed, the config filled and validated by their own
  classes.

Nothing here imports torch or deepspeed at import time.
"""

from __future__ import annotations

from .emit import (
    deepspeed_train_batch_size,
    explain_config,
    generation_notes,
    hf_auto_values,
    hf_training_arguments,
    parallelism_config_kwargs,
    parallelism_config_snippet,
    to_accelerate_config,
    to_deepspeed_config,
)
from .keys import (
    AUTO,
    MAX_CONFIG_BYTES,
    MAX_DEPTH,
    ConfigError,
    Finding,
    Mode,
    clip_key,
)
from .read import (
    batch_world_size,
    config_autotp_size,
    from_deepspeed_config,
    load_config_text,
)

__all__ = [
    "AUTO", "MAX_CONFIG_BYTES", "MAX_DEPTH", "ConfigError", "Finding", "Mode", "batch_world_size", "clip_key",
    "config_autotp_size", "deepspeed_train_batch_size", "explain_config", "from_deepspeed_config", "generation_notes", "hf_auto_values",
    "hf_training_arguments", "load_config_text", "parallelism_config_kwargs", "parallelism_config_snippet",
    "to_accelerate_config", "to_deepspeed_config",
]
