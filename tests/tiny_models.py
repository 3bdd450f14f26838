"""Tiny random-weight checkpoints of each supported family, saved as real HF checkpoints."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)

VOCAB_SIZE = 320
TOKENIZER_VOCAB_SIZE = 300
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "paris is the capital of france and berlin is the capital of germany",
    "question answer passages system user assistant",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,:;!?'\"()-",
]


def _common() -> dict[str, object]:
    return {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "eos_token_id": 2,
        "bos_token_id": 1,
    }


TINY_FAMILIES: dict[str, PretrainedConfig] = {
    "llama": LlamaConfig(**_common(), tie_word_embeddings=True),
    "llama-untied": LlamaConfig(**_common(), tie_word_embeddings=False),
    "qwen2": Qwen2Config(**_common(), tie_word_embeddings=False),
    "qwen3": Qwen3Config(**_common(), head_dim=16, tie_word_embeddings=True),
    # head_dim 32: the smallest head vLLM-CPU's attention kernel takes, so its CPU path is tested
    "llama-hd32": LlamaConfig(**_common(), head_dim=32, tie_word_embeddings=True),
}


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on a few sentences, with a ChatML-style template."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS, trainer)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_checkpoint(family: str, path: Path) -> Path:
    """Save a seeded random model of ``family`` and the tiny tokenizer under ``path``."""
    torch.manual_seed(1234)
    model = AutoModelForCausalLM.from_config(TINY_FAMILIES[family])
    with torch.no_grad():  # larger weights than the default init make outputs token-sensitive
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.2)
    model.save_pretrained(path, safe_serialization=True)
    build_tiny_tokenizer().save_pretrained(path)
    return path


def load_hf_model(path: Path) -> torch.nn.Module:
    """The same checkpoint through transformers, as the reference."""
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
