"""The CPU stand-ins for the linear-attention kernels (zeroplanner/calibrate/kernel_stand_ins.py): same results and
gradients as transformers' reference implementations, and exactly the saved tensors (shapes, dtypes) the kernels'
autograd Functions save (flash-linear-attention 0.6.0 ChunkGatedDeltaRuleFunction, causal_conv1d 1.7.0
CausalConv1dFn, mamba_ssm 2.3.2 MambaSplitConv1dScanCombinedFn; lists cited in the module)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402
from transformers.models.nemotron_h import modeling_nemotron_h as nh  # noqa: E402
from transformers.models.qwen3_next import modeling_qwen3_next as qn  # noqa: E402

from zeroplanner.calibrate import kernel_stand_ins as ks  # noqa: E402
from zeroplanner.calibrate.families import census_config  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def _gdn_inputs(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    b, s, nk, dk, nv, dv = 1, 100, 2, 8, 4, 12  # s not a multiple of the chunk: the reference pads, fla does not
    q, k = (torch.randn(b, s, nk, dk, generator=gen, dtype=dtype) for _ in range(2))
    v = torch.randn(b, s, nv, dv, generator=gen, dtype=dtype)
    g = -torch.rand(b, s, nv, generator=gen) * 0.5  # fp32 log-decay <= 0, as Qwen3NextGatedDeltaNet builds it
    beta = torch.rand(b, s, nv, generator=gen, dtype=dtype)
    return q, k, v, g, beta


def test_gated_delta_rule_stand_in_matches_the_reference_and_its_gradients():
    inputs = [x.requires_grad_(True) for x in _gdn_inputs(torch.float32)]
    ref_o, _ = qn.torch_chunk_gated_delta_rule(*inputs[:3], g=inputs[3], beta=inputs[4],
                                               use_qk_l2norm_in_kernel=True)
    do = torch.randn_like(ref_o)
    ref_grads = torch.autograd.grad(ref_o, inputs, do)
    fn = ks.gated_delta_rule(qn.torch_chunk_gated_delta_rule)
    o, state = fn(*inputs[:3], g=inputs[3], beta=inputs[4], initial_state=None, output_final_state=False,
                  use_qk_l2norm_in_kernel=True)
    assert state is None
    assert type(o.grad_fn).__name__ == "GatedDeltaRuleStandInBackward"
    torch.testing.assert_close(o, ref_o, rtol=1e-5, atol=1e-5)
    for got, want in zip(torch.autograd.grad(o, inputs, do), ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_gated_delta_rule_stand_in_saves_flas_tensors():
    q, k, v, g, beta = _gdn_inputs(torch.bfloat16)
    q.requires_grad_(True)
    fn = ks.gated_delta_rule(qn.torch_chunk_gated_delta_rule)
    o, _ = fn(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
    saved = [(tuple(t.shape), t.dtype) for t in o.grad_fn.saved_tensors]
    b, s, nk, dk = q.shape
    nv, dv = v.shape[2:]
    bf, f32 = torch.bfloat16, torch.float32
    # ChunkGatedDeltaRuleFunction: q, q_rstd, k, k_rstd, v, g (fp32 cumsum), beta (= beta_raw), A (B, T, HV, 64)
    assert saved == [((b, s, nk, dk), bf), ((b, s, nk), f32), ((b, s, nk, dk), bf), ((b, s, nk), f32),
                     ((b, s, nv, dv), bf), ((b, s, nv), f32), ((b, s, nv), bf), ((b, s, nv, 64), bf)]
    assert o.grad_fn.saved_tensors[6].untyped_storage().data_ptr() == beta.untyped_storage().data_ptr()


def test_other_gated_delta_rule_calls_go_to_the_reference():
    q, k, v, g, beta = _gdn_inputs(torch.float32)
    fn = ks.gated_delta_rule(qn.torch_chunk_gated_delta_rule)
    o, state = fn(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True, output_final_state=True)
    assert state is not None and o.grad_fn is None  # the reference, no stand-in node


def test_causal_conv1d_stand_in_saves_its_input_and_matches_the_reference():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 50, 24, generator=gen).transpose(1, 2).requires_grad_(True)  # (b, dim, s), channel-last
    w = torch.randn(24, 4, generator=gen).requires_grad_(True)
    ref = qn.causal_conv1d_fn(x, w, None, activation="silu")
    dout = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, (x, w), dout)
    out = ks.causal_conv1d(qn.causal_conv1d_fn)(x, w, None, activation="silu")
    saved = out.grad_fn.saved_tensors
    assert saved[0].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()  # x itself: stride(1) == 1
    assert len(saved) == 3 and saved[2] is None  # CausalConv1dFn: x, weight, bias
    torch.testing.assert_close(out, ref)
    for got, want in zip(torch.autograd.grad(out, (x, w), dout), ref_grads):
        torch.testing.assert_close(got, want)


def _model(label, dtype):
    cfg = dict(census_config(label))
    model_type = cfg.pop("model_type")
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **cfg)).to(dtype).train()


def test_mamba_stand_in_saves_mamba_ssms_tensors():
    model = _model("nemotron_h", torch.bfloat16)
    mixer = model.model.layers[0].mixer
    assert isinstance(mixer, nh.NemotronHMamba2Mixer)
    x = torch.randn(1, 128, mixer.hidden_size, dtype=torch.bfloat16)
    zxbcdt = mixer.in_proj(x)
    a = -torch.exp(mixer.A_log.float())
    fn = ks.mamba_split_conv1d_scan(nh.causal_conv1d_fn, nh.mamba2_chunk_scan)
    out = fn(zxbcdt, mixer.conv1d.weight.squeeze(1), mixer.conv1d.bias, mixer.dt_bias, a, D=mixer.D,
             chunk_size=mixer.chunk_size, activation=mixer.activation, rmsnorm_weight=mixer.norm.weight,
             rmsnorm_eps=mixer.norm.variance_epsilon, outproj_weight=mixer.out_proj.weight,
             outproj_bias=mixer.out_proj.bias, headdim=mixer.head_dim, ngroups=mixer.n_groups,
             norm_before_gate=False, dt_limit=mixer.time_step_limit)
    params = {p.untyped_storage().data_ptr() for p in mixer.parameters()}
    saved = [t for t in out.grad_fn.saved_tensors if t is not None and t.untyped_storage().data_ptr() not in params]
    heads, g = mixer.num_heads, mixer.n_groups
    # MambaSplitConv1dScanCombinedFn: zxbcdt, A, out_x (b, s, heads, head_dim), rstd (n_groups * b * s,) fp32
    assert [(tuple(t.shape), t.dtype) for t in saved] == [
        (tuple(zxbcdt.shape), torch.bfloat16), ((heads,), torch.float32),
        ((1, 128, heads, mixer.head_dim), torch.bfloat16), ((g * 128,), torch.float32)]
    assert saved[0] is zxbcdt or saved[0].untyped_storage().data_ptr() == zxbcdt.untyped_storage().data_ptr()


@pytest.mark.parametrize("label", ["qwen3_next", "nemotron_h"])
def test_model_loss_and_gradients_with_the_stand_ins_equal_the_references(label):
    """fp32, a whole small model: every parameter's gradient through the stand-ins equals the reference path's."""
    ref = _model(label, torch.float32)
    stood = copy.deepcopy(ref)
    ids = torch.randint(0, 512, (1, 128), generator=torch.Generator().manual_seed(1))
    loss = ref(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    with ks.gpu_kernel_stand_ins():
        out = stood(input_ids=ids, labels=ids, use_cache=False)
        names = {type(n).__name__ for n in _graph_nodes(out.loss.grad_fn)}
        out.loss.backward()
    stand_in = "GatedDeltaRuleStandInBackward" if label == "qwen3_next" else "MambaSplitConv1dScanStandInBackward"
    assert stand_in in names  # the stand-in really ran
    torch.testing.assert_close(out.loss, loss)
    checked = 0
    for (name, p), (_, q) in zip(ref.named_parameters(), stood.named_parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-5, msg=name)
            checked += 1
    assert checked > 20


def _graph_nodes(root):
    seen, todo = set(), [root]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        todo.extend(n for n, _ in node.next_functions)
    return seen


def test_the_stand_ins_are_removed_on_exit():
    before = (qn.torch_chunk_gated_delta_rule, qn.causal_conv1d_fn, nh.mamba2_split_conv1d_scan_combined)
    with ks.gpu_kernel_stand_ins():
        assert qn.torch_chunk_gated_delta_rule is not before[0]
    assert (qn.torch_chunk_gated_delta_rule, qn.causal_conv1d_fn, nh.mamba2_split_conv1d_scan_combined) == before
