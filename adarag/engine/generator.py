"""The torch-engine generator: adarag's own layer-by-layer engine over Hugging Face weights."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import torch

from adarag.config import AdaRagConfig
from adarag.engine.batch import PrefillOutput
from adarag.engine.generator_base import FusionGenerator
from adarag.engine.loader import load_model, resolve_checkpoint
from adarag.engine.prompt import load_tokenizer
from adarag.engine.sampler import make_generator, sample_token
from adarag.engine.spec import ModelSpec, model_fingerprint, read_hf_config
from adarag.schema import GenerationParams, PromptLayout

logger = logging.getLogger(__name__)


class TorchGenerator(FusionGenerator):
    """adarag's own engine: runs a Hugging Face checkpoint layer by layer on torch.

    Example:
        >>> generator = TorchGenerator(AdaRagConfig())
        >>> layout = generator.layout("Who wrote Hamlet?", ["Hamlet is a play by Shakespeare."])
        >>> output = generator.prefill(layout, max_new_tokens=16)
        >>> "".join(generator.stream(layout, output, GenerationParams(max_new_tokens=16)))
    """

    def __init__(self, config: AdaRagConfig) -> None:
        engine_config = config.engine
        if engine_config.num_threads is not None:
            torch.set_num_threads(engine_config.num_threads)
        started = time.perf_counter()
        checkpoint = resolve_checkpoint(engine_config.model, config.home)
        spec = ModelSpec.from_hf_config(read_hf_config(checkpoint))
        model = load_model(
            checkpoint, spec, getattr(torch, engine_config.dtype), engine_config.device
        )
        super().__init__(
            config,
            checkpoint,
            spec,
            model_fingerprint(checkpoint),
            model,
            load_tokenizer(checkpoint),
        )
        logger.info(
            "loaded %s (%s, %d layers) in %.1f s",
            checkpoint.name,
            spec.family,
            spec.num_layers,
            time.perf_counter() - started,
        )

    def decode_tokens(
        self, layout: PromptLayout, output: PrefillOutput, params: GenerationParams
    ) -> Iterator[int]:
        """Yield generated token ids after a prefill, stopping at EOS or ``max_new_tokens``.

        Decoding writes after the prompt's rows of ``output.kv``; the same prefill can be decoded
        again (its prompt rows are never changed).
        """
        kv = output.kv
        kv.length = layout.num_tokens
        budget = min(params.max_new_tokens, kv.capacity - kv.length + 1)
        generator = make_generator(params)
        logits = output.logits
        for step in range(budget):
            token = sample_token(logits, params, generator)
            if token in self.eos_token_ids:
                return
            yield token
            if step + 1 < budget:
                logits = self.runner.decode(token, kv)
