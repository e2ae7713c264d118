"""CPU stand-ins for the CUDA kernels that transformers 5.24 runs for the linear-attention mixers on a GPU, so that
the activation census (``calibrate.measure_activation_bytes(..., gpu_kernel_stand_ins=True)``) counts what the GPU
path saves instead of what transformers' reference PyTorch implementations save.

On CPU, flash-linear-attention (``fla``), ``causal_conv1d`` and ``mamba_ssm`` are not importable, so
``use_kernel_func_from_hub_with_fallback`` (transformers/integrations/hub_kernels.py) leaves the reference
functions in place, and those save fp32 per-chunk matrices and scan states the kernels never keep. Each stand-in
here is a ``torch.autograd.Function`` whose forward computes the reference result under ``no_grad`` and saves
exactly the tensors (same shapes and dtypes) the kernel's autograd Function saves, as read from the kernels'
sources (the versions a GPU user installs next to transformers 5.24):

- Qwen3-Next's Gated DeltaNet core, ``fla`` 0.6.0 (fla-core 0.6.0) ``fla/ops/gated_delta_rule/chunk.py``
  ``ChunkGatedDeltaRuleFunction.forward`` with ``use_qk_l2norm_in_kernel=True`` (what
  Qwen3NextGatedDeltaNet.forward passes): ``ctx.save_for_backward(q, q_rstd, k, k_rstd, v, g, beta_raw, beta, A,
  initial_state, cu_seqlens, chunk_indices, g_input, A_log, dt_bias)`` where q and k are ``l2norm_fwd``'s outputs
  (``fla/modules/norm/l2norm.py``: y in the input dtype, rstd fp32 per row), v the ``input_guard`` contiguous
  value (``fla/utils/decorators.py``: every tensor argument made contiguous), g the fp32 chunk-local cumsum of the
  gate (``chunk_local_cumsum``, ``output_dtype=torch.float``), beta_raw = beta (no sigmoid in the kernel), A the
  (B, T, HV, 64) WY matrix in k's dtype (``chunk_fwd.py`` ``chunk_gated_delta_rule_fwd_intra``, chunk_size 64:
  ``torch.zeros(B, T, HV, BT, dtype=k.dtype)``); initial_state, cu_seqlens, chunk_indices, g_input, A_log and
  dt_bias are None in training without a cache;
- its short convolution, ``causal_conv1d`` 1.7.0 ``causal_conv1d/causal_conv1d_interface.py``
  ``CausalConv1dFn.forward``: ``ctx.save_for_backward(x, weight, bias, seq_idx, initial_states)`` (x made
  contiguous only when neither its channel nor its time stride is 1; the SiLU is fused, nothing else is saved);
- Nemotron-H's Mamba-2 mixer in training, ``mamba_ssm`` 2.3.2 ``mamba_ssm/ops/triton/ssd_combined.py``
  ``MambaSplitConv1dScanCombinedFn.forward`` (conv, SSD scan, gated RMSNorm and out_proj fused):
  ``ctx.save_for_backward(zxbcdt, conv1d_weight, conv1d_bias, out_x, A, D, dt_bias, initial_states, seq_idx,
  rmsnorm_weight, rstd, outproj_weight, outproj_bias)``, where out_x is the scan output before the gate
  (``_mamba_chunk_scan_combined_fwd`` with z=None returns it first: (b, s, heads, head_dim) in x's dtype) and rstd
  the fp32 (n_groups * b * s,) of ``layernorm_gated.py`` ``_layer_norm_fwd``.

Each backward recomputes through the reference with grad enabled from the saved tensors alone (the Gated DeltaNet
queries and keys through the exact L2-norm backward from the normalised tensors and their rstd, as fla's
``l2norm_bwd`` does), under a no-op saved-tensor hook pair so the census does not count the recomputation.
tests/evidence/test_kernel_stand_ins.py checks the gradients against the reference's. Saved placeholders whose
contents the backward does not read (the WY matrix A) are allocated with the kernel's shape and dtype.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F

GDN_CHUNK_SIZE = 64
"""fla's chunk length for the gated delta rule (``chunk_gated_delta_rule``: ``kwargs.pop('chunk_size', 64)``; the
last dimension of the saved WY matrix A)."""

L2NORM_EPS = 1e-6
"""``l2norm_fwd``'s default eps (fla/modules/norm/l2norm.py), as transformers' reference ``l2norm``."""


@contextlib.contextmanager
def _uncounted() -> Iterator[None]:
    """Grad enabled under a no-op saved-tensor hook pair: the innermost hooks are the ones applied, so the census's
    hooks do not see what the backward's recomputation saves (the kernels' backward saves nothing)."""
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        yield


def _l2norm(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fla ``l2norm_fwd``: y = x / sqrt(sum x^2 + eps) in x's dtype (computed in fp32), rstd fp32 per row."""
    xf = x.float()
    rstd = torch.rsqrt((xf * xf).sum(-1) + L2NORM_EPS)
    return (xf * rstd.unsqueeze(-1)).to(x.dtype), rstd


def _l2norm_backward(y: torch.Tensor, rstd: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """fla ``l2norm_bwd``: dx = rstd * (dy - y * sum(dy * y)) for y = x * rstd."""
    yf, dyf = y.float(), dy.float()
    return (rstd.unsqueeze(-1) * (dyf - yf * (dyf * yf).sum(-1, keepdim=True))).to(y.dtype)


class GatedDeltaRuleStandIn(torch.autograd.Function):
    """``fla.ops.gated_delta_rule.chunk_gated_delta_rule`` with ``use_qk_l2norm_in_kernel=True``: the reference
    ``torch_chunk_gated_delta_rule``'s result, fla's saved tensors (module docstring)."""

    @staticmethod
    def forward(ctx, reference, q, k, v, g, beta):
        q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))  # fla input_guard
        qn, q_rstd = _l2norm(q)
        kn, k_rstd = _l2norm(k)
        with torch.no_grad():
            o, _ = reference(qn, kn, v, g=g, beta=beta, use_qk_l2norm_in_kernel=False)
        b, t, hv = v.shape[0], v.shape[1], v.shape[2]
        wy = torch.empty(b, t, hv, GDN_CHUNK_SIZE, dtype=k.dtype, device=k.device)  # A: shape and dtype only
        # g: the kernel saves its fp32 chunk-local cumsum, a new (B, T, HV) fp32 tensor; the gate itself has that
        # shape and dtype and nothing else saves it, so saving it (which the backward needs) counts the same bytes
        ctx.save_for_backward(qn, q_rstd, kn, k_rstd, v, g, beta, wy)
        ctx.reference = reference
        return o.to(q.dtype)

    @staticmethod
    def backward(ctx, do):
        qn, q_rstd, kn, k_rstd, v, g, beta, _wy = ctx.saved_tensors
        with _uncounted():
            leaves = [x.detach().requires_grad_(True) for x in (qn, kn, v, g, beta)]
            o, _ = ctx.reference(*leaves[:3], g=leaves[3], beta=leaves[4], use_qk_l2norm_in_kernel=False)
            dqn, dkn, dv, dg, dbeta = torch.autograd.grad(o, leaves, do)
        return (None, _l2norm_backward(qn, q_rstd, dqn), _l2norm_backward(kn, k_rstd, dkn), dv, dg, dbeta)


def gated_delta_rule(reference):
    """A drop-in for transformers' ``torch_chunk_gated_delta_rule`` (same call as Qwen3NextGatedDeltaNet.forward
    makes in training) that runs :class:`GatedDeltaRuleStandIn`; other calls (a cache, packed sequences, no
    in-kernel L2 norm) go to ``reference``."""

    def chunk_gated_delta_rule(query, key, value, g, beta, chunk_size=GDN_CHUNK_SIZE, initial_state=None,
                               output_final_state=False, use_qk_l2norm_in_kernel=False, **kwargs):
        plain = (initial_state is None and not output_final_state and use_qk_l2norm_in_kernel
                 and chunk_size == GDN_CHUNK_SIZE and kwargs.get("cu_seqlens") is None)
        if not plain:
            return reference(query, key, value, g=g, beta=beta, chunk_size=chunk_size, initial_state=initial_state,
                             output_final_state=output_final_state,
                             use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs)
        return GatedDeltaRuleStandIn.apply(reference, query, key, value, g, beta), None

    return chunk_gated_delta_rule


class CausalConv1dStandIn(torch.autograd.Function):
    """``causal_conv1d.causal_conv1d_fn`` (CausalConv1dFn): depthwise causal conv + fused SiLU, saving x, weight,
    bias (module docstring); the result from ``reference`` (transformers' ``causal_conv1d_fn``)."""

    @staticmethod
    def forward(ctx, reference, activation, x, weight, bias):
        if x.stride(2) != 1 and x.stride(1) != 1:
            x = x.contiguous()
        with torch.no_grad():
            out = reference(x, weight, bias, activation=activation)
        ctx.save_for_backward(x, weight, bias)
        ctx.reference, ctx.activation = reference, activation
        return out

    @staticmethod
    def backward(ctx, dout):
        x, weight, bias = ctx.saved_tensors
        with _uncounted():
            leaves = [None if t is None else t.detach().requires_grad_(True) for t in (x, weight, bias)]
            out = ctx.reference(leaves[0], leaves[1], leaves[2], activation=ctx.activation)
            need = [t for t in leaves if t is not None]
            grads = iter(torch.autograd.grad(out, need, dout))
        return (None, None) + tuple(None if t is None else next(grads) for t in leaves)


def causal_conv1d(reference):
    """A drop-in for transformers' ``causal_conv1d_fn`` that runs :class:`CausalConv1dStandIn`."""

    def causal_conv1d_fn(hidden_states, weight, bias=None, activation=None, **kwargs):
        return CausalConv1dStandIn.apply(reference, activation, hidden_states, weight, bias)

    return causal_conv1d_fn


def mamba2_reference(zxbcdt, conv_weight, conv_bias, dt_bias, A, D, norm_weight, out_weight, out_bias, *,
                     conv1d, chunk_scan, norm_eps: float, head_dim: int, n_groups: int, chunk_size: int,
                     dt_limit, activation: str):
    """The Mamba-2 mixer after in_proj as transformers' NemotronHMamba2Mixer.forward runs it without kernels
    (split into gate, xBC and dt; ``causal_conv1d_fn``; ``mamba2_chunk_scan``; NemotronHRMSNormGated with the gate,
    grouped over d_inner / n_groups; out_proj), on explicit tensors so a backward can take their gradients."""
    b, s, _ = zxbcdt.shape
    heads = dt_bias.shape[0]
    inner = heads * head_dim
    state = (conv_weight.shape[0] - inner) // (2 * n_groups)
    gate, xbc, dt = zxbcdt.split([inner, inner + 2 * n_groups * state, heads], dim=-1)
    xbc = conv1d(xbc.transpose(1, 2), conv_weight, conv_bias, activation=activation).transpose(1, 2)
    x, B, C = xbc.split([inner, n_groups * state, n_groups * state], dim=-1)
    y = chunk_scan(x.view(b, s, heads, head_dim), dt, A, B.view(b, s, n_groups, state),
                   C.view(b, s, n_groups, state), chunk_size=chunk_size, D=D, z=None, dt_bias=dt_bias,
                   dt_softplus=True, dt_limit=dt_limit).reshape(b, s, -1)
    dtype = y.dtype
    h = y.float() * F.silu(gate.float())  # NemotronHRMSNormGated.forward: gate before the norm (norm_before_gate=False)
    hg = h.view(b, s, n_groups, inner // n_groups)
    hg = hg * torch.rsqrt(hg.pow(2).mean(-1, keepdim=True) + norm_eps)
    normed = norm_weight * hg.view(b, s, inner).to(dtype)
    return F.linear(normed.to(zxbcdt.dtype), out_weight, out_bias)


class MambaSplitConv1dScanStandIn(torch.autograd.Function):
    """``mamba_ssm``'s ``mamba_split_conv1d_scan_combined`` (MambaSplitConv1dScanCombinedFn): the reference
    result (:func:`mamba2_reference`), the kernel's saved tensors (module docstring): zxbcdt, out_x (the ungated
    scan output, x's dtype), the fp32 per-group rstd, A and the parameters."""

    @staticmethod
    def forward(ctx, spec, zxbcdt, conv_weight, conv_bias, dt_bias, A, D, norm_weight, out_weight, out_bias):
        args = (zxbcdt, conv_weight, conv_bias, dt_bias, A, D, norm_weight, out_weight, out_bias)
        with torch.no_grad():
            out = mamba2_reference(*args, **spec)
        b, s, _ = zxbcdt.shape
        heads = dt_bias.shape[0]
        out_x = torch.empty(b, s, heads, spec["head_dim"], dtype=zxbcdt.dtype, device=zxbcdt.device)
        rstd = torch.empty(spec["n_groups"] * b * s, dtype=torch.float32, device=zxbcdt.device)
        ctx.save_for_backward(*args, out_x, rstd)
        ctx.spec = spec
        return out

    @staticmethod
    def backward(ctx, dout):
        *args, _out_x, _rstd = ctx.saved_tensors
        with _uncounted():
            leaves = [None if t is None else t.detach().requires_grad_(t.requires_grad or t.is_floating_point())
                      for t in args]
            out = mamba2_reference(*leaves, **ctx.spec)
            need = [t for t in leaves if t is not None]
            grads = iter(torch.autograd.grad(out, need, dout, allow_unused=True))
        return (None,) + tuple(None if t is None else next(grads) for t in leaves)


def mamba_split_conv1d_scan(conv1d, chunk_scan):
    """A drop-in for transformers' ``mamba2_split_conv1d_scan_combined`` (the call NemotronHMamba2Mixer.forward makes
    in training: rmsnorm and out_proj fused, norm_before_gate=False) that runs
    :class:`MambaSplitConv1dScanStandIn` with the reference ``conv1d`` and ``chunk_scan``."""

    def mamba2_split_conv1d_scan_combined(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
                                          initial_states=None, dt_limit=(0.0, float("inf")),
                                          return_final_states=False, activation="silu", rmsnorm_weight=None,
                                          rmsnorm_eps=1e-6, outproj_weight=None, outproj_bias=None, headdim=None,
                                          ngroups=1, norm_before_gate=True, **kwargs):
        if (initial_states is not None or return_final_states or rmsnorm_weight is None or outproj_weight is None
                or norm_before_gate or kwargs.get("seq_idx") is not None):
            return None  # not the training call: transformers then runs its own path
        spec = dict(conv1d=conv1d, chunk_scan=chunk_scan, norm_eps=rmsnorm_eps, head_dim=headdim, n_groups=ngroups,
                    chunk_size=chunk_size, dt_limit=dt_limit, activation=activation)
        return MambaSplitConv1dScanStandIn.apply(spec, zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D,
                                                 rmsnorm_weight, outproj_weight, outproj_bias)

    return mamba2_split_conv1d_scan_combined


@contextlib.contextmanager
def gpu_kernel_stand_ins() -> Iterator[None]:
    """Within this block transformers' Qwen3-Next Gated DeltaNet core and short convolution and Nemotron-H's fused
    Mamba-2 training path run the stand-ins above (module globals of modeling_qwen3_next / modeling_nemotron_h
    replaced, restored on exit)."""
    from transformers.models.nemotron_h import modeling_nemotron_h as nh
    from transformers.models.qwen3_next import modeling_qwen3_next as qn

    patches = [
        (qn, "torch_chunk_gated_delta_rule", gated_delta_rule(qn.torch_chunk_gated_delta_rule)),
        (qn, "causal_conv1d_fn", causal_conv1d(qn.causal_conv1d_fn)),
        (nh, "mamba2_split_conv1d_scan_combined",
         mamba_split_conv1d_scan(nh.causal_conv1d_fn, nh.mamba2_chunk_scan)),
    ]
    originals = [(mod, name, getattr(mod, name)) for mod, name, _ in patches]
    try:
        for mod, name, fn in patches:
            setattr(mod, name, fn)
        yield
    finally:
        for mod, name, fn in originals:
            setattr(mod, name, fn)
