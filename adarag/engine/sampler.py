"""Next-token choice: greedy, or temperature with nucleus (top-p) sampling."""

from __future__ import annotations

import torch

from adarag.schema import GenerationParams


def make_rng(params: GenerationParams) -> torch.Generator | None:
    """A seeded torch.Generator for sampling, or None for greedy or unseeded runs."""
    if params.temperature == 0.0 or params.seed is None:
        return None
    rng = torch.Generator()
    rng.manual_seed(params.seed)
    return rng


def sample_token(
    logits: torch.Tensor, params: GenerationParams, rng: torch.Generator | None
) -> int:
    """Pick the next token from ``logits [vocab]``.

    Any temperature above 0 is exact: the logits are shifted so the largest is 0 and divided in
    float64, so a tiny temperature (down to the smallest float, 5e-324) sends every other token
    to probability 0, greedy decoding in the limit, instead of overflowing into inf or NaN; a
    tiny ``top_p`` keeps the most likely token.
    """
    if params.temperature == 0.0:
        return int(torch.argmax(logits))
    scores = logits.double().cpu()  # may be the caller's own tensor: never changed in place
    probs = torch.softmax((scores - scores.max()) / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # keep the smallest prefix whose mass reaches top_p (always at least one token)
        outside = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= params.top_p
        sorted_probs[outside] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=rng))
