"""The real Gemma 3 270M behind the server: load (from the cached conversion), train a step, sample."""

from __future__ import annotations

from pathlib import Path

import pytest
import tinker
from support.trainer import datum_for
from tinker import types

from trainer_backend.config import ServerConfig
from trainer_backend.models.gemma import GEMMA_3_270M
from trainer_backend.server import running_server


@pytest.mark.slow
def test_gemma_trains_a_step_and_samples_through_the_sdk(tmp_path: Path) -> None:
    config = ServerConfig(base_model=GEMMA_3_270M, device="cpu", storage_root=tmp_path, port=0, long_poll_s=10.0)
    with running_server(config) as server, tinker.ServiceClient(base_url=server.url, api_key="tml-gemma") as client:
        training = client.create_lora_training_client(base_model=GEMMA_3_270M, rank=8, seed=0).result()
        tokenizer = training.get_tokenizer()
        assert len(tokenizer) == 262_144 or tokenizer.vocab_size == 262_144
        datum = datum_for(tokenizer, "SELECT COUNT(*) FROM customers WHERE city = 'Berlin';")
        before = training.forward([datum], "cross_entropy").result().metrics["loss:sum"]
        training.forward_backward([datum], "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        after = training.forward([datum], "cross_entropy").result().metrics["loss:sum"]
        assert after < before

        sampler = training.save_weights_and_get_sampling_client().result()
        prompt = types.ModelInput.from_ints(tokenizer.encode("The Eiffel Tower is located in the city of"))
        result = sampler.sample(
            prompt=prompt, num_samples=1, sampling_params=types.SamplingParams(max_tokens=4, temperature=0.0)
        ).result()
        assert "Paris" in tokenizer.decode(result.sequences[0].tokens)
