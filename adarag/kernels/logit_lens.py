"""Logit-lens uncertainty signals of the last token over the last l layers.

For hidden states ``h_1..h_l`` (the last token after each of the last l layers), with the final
RMSNorm ``n`` and the LM head ``W``::

    log p_i = log_softmax(W n(h_i))
    kl_i    = KL(p_l || p_i) = sum_v p_l(v) (log p_l(v) - log p_i(v)),   i = 1..l-1
    entropy = -sum_v p_l(v) log p_l(v)

Inputs: ``hidden [l, hidden_size]``, ``norm_weight [hidden_size]``, ``lm_head_weight
[vocab, hidden_size]``. Outputs: ``kl [l - 1]`` and ``entropy []``, float32, in nats. Source:
AdaCache section 3.2 (confidence from the last l layers); logit lens (nostalgebraist, 2020).
"""

from __future__ import annotations

import torch

from adarag.kernels._dispatch import Backend, use_triton


def logit_lens_ref(
    hidden: torch.Tensor, norm_weight: torch.Tensor, eps: float, lm_head_weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure-torch twin (see module docstring); computed in float32."""
    x = hidden.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.to(torch.float32)
    log_probs = torch.log_softmax(x @ lm_head_weight.to(torch.float32).T, dim=-1)
    final = log_probs[-1]
    final_probs = final.exp()
    kl = (final_probs[None, :] * (final[None, :] - log_probs[:-1])).sum(-1)
    entropy = -(final_probs * final).sum()
    return kl, entropy


def logit_lens(
    hidden: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    lm_head_weight: torch.Tensor,
    *,
    backend: Backend = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """KL of each earlier lens layer to the final one, and the final entropy.

    Args:
        hidden: [l, hidden_size] last-token residual stream after each of the last l layers.
        norm_weight: [hidden_size] final RMSNorm weight.
        eps: RMSNorm epsilon.
        lm_head_weight: [vocab, hidden_size].
        backend: Kernel backend ("auto", "triton" or "torch").

    Returns:
        ``(kl [l - 1], entropy [])`` in float32 nats.
    """
    if use_triton(backend, hidden, norm_weight, lm_head_weight):
        from adarag.kernels.logit_lens_triton import logit_lens_triton

        return logit_lens_triton(hidden, norm_weight, eps, lm_head_weight)
    return logit_lens_ref(hidden, norm_weight, eps, lm_head_weight)
