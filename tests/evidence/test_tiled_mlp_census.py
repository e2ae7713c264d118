"""TiledMLP (ALST; DeepSpeed 0.19.8 ``deepspeed/runtime/sequence_parallel/ulysses_sp.py`` ``TiledMLP``) measured:
what the forward keeps and what one recomputed tile saves, against the cost model's activation term.

Method: the tiny Llama of the Ulysses engine test, bf16 on CPU, transformers' ``LlamaMLP.forward`` replaced by the
tiled forward of TiledMLP's own docstring (``num_shards = ceil(seqlen / hidden)``; the cross-rank max of the shard
count is not needed on one process), then ``calibrate.measure_activation_bytes`` (saved-tensor census of one
training forward) and, inside the recomputation, a census of each tile's saved tensors.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("deepspeed")

from zeroplanner.calibrate import measure_activation_bytes  # noqa: E402
from zeroplanner.costmodel import Candidates, make_context  # noqa: E402
from zeroplanner.costmodel.activations import activation_term, tiled_mlp_tile_bytes  # noqa: E402
from zeroplanner.scenarios import build_scenario  # noqa: E402

pytestmark = pytest.mark.timeout(300)

HF = {"model_type": "llama", "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "max_position_embeddings": 2048, "tie_word_embeddings": False}


def _measure(seq_len: int, micro_batch: int):
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP
    from transformers.models.llama import modeling_llama

    tiles: list[int] = []

    def tiled_forward(self, x):
        shards = math.ceil(x.shape[-2] / x.shape[-1])

        def mlp_forward(self, x):
            if not torch.is_grad_enabled():  # the no_grad forward pass
                return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
            skip = {p.untyped_storage().data_ptr() for p in self.parameters()} | {x.untyped_storage().data_ptr()}
            seen: dict[int, int] = {}

            def pack(t):
                s = t.untyped_storage()
                if s.data_ptr() not in skip:
                    seen.setdefault(s.data_ptr(), s.nbytes())
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
            tiles.append(sum(seen.values()))
            return out

        params = [self.down_proj.weight, self.gate_proj.weight, self.up_proj.weight]
        return TiledMLP.apply(mlp_forward, self, x, shards, params)

    plain = measure_activation_bytes(HF, seq_len=seq_len, micro_batch=micro_batch)
    orig = modeling_llama.LlamaMLP.forward
    modeling_llama.LlamaMLP.forward = tiled_forward
    try:
        tiled = measure_activation_bytes(HF, seq_len=seq_len, micro_batch=micro_batch)
    finally:
        modeling_llama.LlamaMLP.forward = orig
    return plain, tiled, tiles


@pytest.mark.parametrize("seq_len, micro_batch", [(1024, 1), (1024, 2)])
def test_tiled_mlp_keeps_only_its_input_and_one_tile(seq_len, micro_batch):
    plain, tiled, tiles = _measure(seq_len, micro_batch)
    kw = dict(hf_config=HF, seq_len=seq_len, micro_batch=micro_batch, grad_accum=1, checkpointing="none",
              gpus_per_node=1)
    sc_plain, sc_tiled = build_scenario(**kw), build_scenario(tiled_mlp=True, **kw)

    def parts(sc):
        return activation_term(make_context(sc), Candidates.from_scenario(sc))

    saved_plain = float(parts(sc_plain).sum_of(["saved layer activations"]).item())
    saved_tiled = float(parts(sc_tiled).sum_of(["saved layer activations"]).item())
    # the forward no longer keeps the SwiGLU intermediates: measured and modelled differences agree exactly
    assert plain["saved"] - tiled["saved"] == saved_plain - saved_tiled == 2 * 4 * 2 * seq_len * micro_batch * 256
    # every recomputed tile (2 layers x ceil(1024 / 128) = 8 tiles) saves the modelled tile bytes
    assert len(tiles) == 2 * 8
    tile = float(tiled_mlp_tile_bytes(make_context(sc_tiled), Candidates.from_scenario(sc_tiled)).item())
    assert set(tiles) == {int(tile)}
