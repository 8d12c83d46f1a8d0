"""Random two-layer models, built in memory for tests of the engine: Gemma 3 and Qwen2 models whose next-token
distributions are peaked, and LoRA adapters on them that change their answers. Their configs are the tiny models'
(trainer_backend/models/tiny.py), half as wide."""

from __future__ import annotations

import torch
from peft import PeftModel
from transformers import Gemma3ForCausalLM, PreTrainedModel, Qwen2ForCausalLM

from trainer_backend.models.tiny import tiny_gemma3_config, tiny_qwen2_config

# Half the tiny models' width: engine tests build many models and run them many times.
WIDTH = 32


def peaked_tiny_gemma(vocab_size: int, context: int, sliding_window: int) -> Gemma3ForCausalLM:
    """A two-layer random Gemma 3 (one sliding, one full attention layer) for engine tests, in eval mode.

    Its initialisation is larger than the default 0.02, so next-token distributions are peaked, not near uniform; it
    is untied, or the large embeddings make the tied head repeat the last token for ever.
    """
    torch.manual_seed(0)
    config = tiny_gemma3_config(
        vocab_size,
        WIDTH,
        max_position_embeddings=context,
        sliding_window=sliding_window,
        initializer_range=0.3,
        tie_word_embeddings=False,
    )
    return Gemma3ForCausalLM(config).eval()


def peaked_tiny_qwen2(vocab_size: int, context: int) -> Qwen2ForCausalLM:
    """A two-layer random Qwen2 (biases on q/k/v, an untied head, no sliding window) for engine tests, in eval mode;
    peaked as `peaked_tiny_gemma` is."""
    torch.manual_seed(0)
    config = tiny_qwen2_config(vocab_size, WIDTH, max_position_embeddings=context, initializer_range=0.3)
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
