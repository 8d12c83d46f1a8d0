"""Random two-layer models, built in memory for tests of the engine and the losses: a bare Gemma 3 config at toy
width, Gemma 3 and Qwen2 models whose next-token distributions are peaked, and LoRA adapters on them that change
their answers."""

from __future__ import annotations

import torch
from peft import PeftModel
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM


def tiny_gemma3_config(vocab_size: int, **changes: object) -> Gemma3TextConfig:
    """Two Gemma 3 layers 32 wide, two query heads of 16 sharing one key/value head; `changes` set the rest."""
    return Gemma3TextConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        **changes,
    )


def peaked_tiny_gemma(vocab_size: int, context: int, sliding_window: int) -> Gemma3ForCausalLM:
    """A two-layer random Gemma 3 (one sliding, one full attention layer) for engine tests, in eval mode.

    Its initialisation is larger than the default 0.02, so next-token distributions are peaked, not near uniform; it
    is untied, or the large embeddings make the tied head repeat the last token for ever.
    """
    torch.manual_seed(0)
    config = tiny_gemma3_config(
        vocab_size,
        max_position_embeddings=context,
        sliding_window=sliding_window,
        layer_types=["sliding_attention", "full_attention"],
        initializer_range=0.3,
        tie_word_embeddings=False,
    )
    return Gemma3ForCausalLM(config).eval()


def peaked_tiny_qwen2(vocab_size: int, context: int) -> Qwen2ForCausalLM:
    """A two-layer random Qwen2 (biases on q/k/v, an untied head, no sliding window) for engine tests, in eval mode;
    peaked as `peaked_tiny_gemma` is."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=context,
        initializer_range=0.3,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(config).eval()
    # Nonzero q/k/v biases, so a path that dropped them would show.
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
                parameter.normal_(std=0.3)
    return model


# The two architectures of the engine's tests: Gemma 3 (softcap, sliding window) and Qwen2 (biases, untied head).
TINY_ARCHITECTURES = ("gemma3", "qwen2")


def peaked_tiny_model(architecture: str, vocab_size: int, context: int, sliding_window: int) -> PreTrainedModel:
    """`peaked_tiny_gemma` or `peaked_tiny_qwen2` by name; Qwen2 has no sliding window, so it ignores that one."""
    if architecture == "qwen2":
        return peaked_tiny_qwen2(vocab_size, context)
    return peaked_tiny_gemma(vocab_size, context, sliding_window)


def randomise_lora_b(model: PeftModel, adapter: str | None = None) -> None:
    """Draw the LoRA B matrices of `adapter` (of every adapter when None) from N(0, 0.5²): peft starts them at zero,
    which leaves an adapter without effect on the answers."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name and (adapter is None or f".{adapter}." in name):
                parameter.normal_(std=0.5)
