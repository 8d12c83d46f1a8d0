"""`serve --max-training-activation-bytes`: a server's training passes run as micro-batches within the budget it is
given, with the log-probs, loss and update of one pass."""

from __future__ import annotations

from pathlib import Path

import tinker
import torch
from tinker import types

from tests.support.backends import TINY, tiny_server_config
from tests.support.trainer import LOGPROB_ROUNDING, datum_for
from trainer_backend.engine.microbatches import activation_bytes_per_token
from trainer_backend.server import running_server

TEXTS = [f"SELECT name FROM employees WHERE salary > {50_000 + 1_000 * i} ORDER BY name;" for i in range(6)]


def train_once(url: str) -> tuple[list[list[float]], float, list[float]]:
    """One forward_backward and optimizer step on TEXTS, then the log-probs of the first text after the step."""
    with tinker.ServiceClient(base_url=url, api_key="tml-budget-test") as client:
        training = client.create_lora_training_client(base_model=TINY, rank=4, seed=3).result()
        data = [datum_for(training.get_tokenizer(), text) for text in TEXTS]
        output = training.forward_backward(data, "cross_entropy").result(timeout=60)
        training.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=60)
        after = training.forward(data[:1], "cross_entropy").result(timeout=60)
    logprobs = [o["logprobs"].tolist() for o in output.loss_fn_outputs]
    return logprobs, output.metrics["loss:sum"], after.loss_fn_outputs[0]["logprobs"].tolist()


def test_a_small_activation_budget_splits_the_pass_and_trains_as_one_pass_does(tmp_path: Path) -> None:
    with running_server(tiny_server_config(tmp_path / "default")) as server:
        whole = train_once(server.url)
        default_piece = server.service.engine.training.piece_tokens
    loaded = server.service.loaded
    # Room for about one text per micro-batch.
    budget = 24 * activation_bytes_per_token(loaded.model.config, next(loaded.model.parameters()).element_size())
    with running_server(tiny_server_config(tmp_path / "small", max_training_activation_bytes=budget)) as server:
        split = train_once(server.url)
        assert server.service.engine.training.piece_tokens == 24 < default_piece
    for got, want in zip(split[0], whole[0], strict=True):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=LOGPROB_ROUNDING, rtol=0)
    assert abs(split[1] - whole[1]) < 1e-3 * abs(whole[1])
    torch.testing.assert_close(torch.tensor(split[2]), torch.tensor(whole[2]), atol=LOGPROB_ROUNDING, rtol=0)
