"""What /metrics says of the checks of sampler weights' loads (trainer_backend/engine/weights_proof.py), and sampler
weights saved after training steps, for the tests that break a load on purpose."""

from __future__ import annotations

import httpx
import tinker
from prometheus_client.parser import text_string_to_metric_families
from tinker import types

from support.trainer import next_token_datum
from trainer_backend.server import RunningServer


def checked(server: RunningServer, engine: str) -> float:
    """Loads of sampler weights `engine` showed applied, as /metrics counts them."""
    return _sample(server, "trainer_sampler_weights_checked_total", engine=engine)


def refused(server: RunningServer, engine: str, reason: str) -> float:
    """Loads of sampler weights `engine` refused for `reason`, as /metrics counts them."""
    return _sample(server, "trainer_sampler_weights_refused_total", engine=engine, reason=reason)


def _sample(server: RunningServer, name: str, **labels: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def train_steps(training: tinker.TrainingClient, text: str, steps: int, learning_rate: float = 5e-2) -> None:
    """`steps` Adam steps of cross-entropy on `text`: weights saved after them answer otherwise than before."""
    datum = next_token_datum(training.get_tokenizer().encode(text))
    for _ in range(steps):
        training.forward_backward([datum], "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=learning_rate)).result(timeout=60)
