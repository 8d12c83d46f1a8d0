"""A training checkpoint is a plain PEFT adapter: peft loads it onto the served base model and computes the same
log-probs as the server."""

from __future__ import annotations

import pytest
import tinker
import torch
from peft import PeftModel
from support.backends import TINY
from support.trainer import LOGPROB_ROUNDING, SQL, next_token_datum
from tinker import types
from transformers import AutoModelForCausalLM

from trainer_backend.checkpoints import CheckpointPath
from trainer_backend.server import RunningServer


def logprobs_with_transformers(model: torch.nn.Module, ids: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids[:-1]])).logits.float()
    logprobs = torch.log_softmax(logits[0], dim=-1)
    return logprobs[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].tolist()


def test_a_saved_state_loads_with_peft_and_gives_the_servers_logprobs(server: RunningServer) -> None:
    with tinker.ServiceClient(base_url=server.url, api_key="tml-peft") as client:
        # Attention, MLP and unembedding all trained (the SDK's defaults), so every adapted module is checked.
        training = client.create_lora_training_client(base_model=TINY, rank=4, seed=7).result()
        ids = training.get_tokenizer().encode(SQL)
        datum = next_token_datum(ids)
        for _ in range(2):
            training.forward_backward([datum], "cross_entropy")
            training.optim_step(types.AdamParams(learning_rate=5e-2))
        path = training.save_state("peft-format").result().path
        served = training.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()

    folder = server.service.checkpoints.folder(CheckpointPath.parse(path))
    base = AutoModelForCausalLM.from_pretrained(server.service.loaded.folder, dtype=torch.float32).eval()
    base_logprobs = logprobs_with_transformers(base, ids)
    adapted = PeftModel.from_pretrained(base, folder).eval()

    assert logprobs_with_transformers(adapted, ids) == pytest.approx(served, abs=LOGPROB_ROUNDING)
    # The adapter is not a no-op: the base model alone is far from the trained log-probs.
    assert max(abs(a - b) for a, b in zip(base_logprobs, served, strict=True)) > 1e-2
