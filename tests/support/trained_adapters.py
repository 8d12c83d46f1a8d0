"""LoRA adapters a few training steps away from the base model, for tests that sample, serve or evaluate trained
weights: their answers differ from the base model's, so a request sent to the wrong weights shows."""

from __future__ import annotations

import tinker
from tinker import types

from support.backends import TINY
from support.trainer import datum_for, next_token_datum


def trained_adapter(
    client: tinker.ServiceClient,
    text: str,
    *,
    seed: int,
    steps: int,
    rank: int = 4,
    learning_rate: float = 5e-2,
    train_unembed: bool = True,
    weighted: bool = False,
    base_model: str = TINY,
) -> tinker.TrainingClient:
    """A fresh LoRA adapter after `steps` Adam steps of cross-entropy on `text`, every position weighted 1 when
    `weighted` (the datum of `datum_for`); the caller saves its weights for the sampler as the test needs them
    (`save_weights_for_sampler` or `save_weights_and_get_sampling_client`)."""
    training = client.create_lora_training_client(
        base_model=base_model, rank=rank, seed=seed, train_unembed=train_unembed
    ).result()
    tokenizer = training.get_tokenizer()
    datum = datum_for(tokenizer, text) if weighted else next_token_datum(tokenizer.encode(text))
    for _ in range(steps):
        training.forward_backward([datum], "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=learning_rate)).result()
    return training
