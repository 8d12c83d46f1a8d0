"""The built-in engine's side of the proof that sampler weights are applied (`weights_proof.py`): a save records the
weights' hash and the probe's answers through the trainer's adapter; a load of sampler weights is checked against
them, through the same sampling path that serves requests."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from trainer_backend.checkpoints import checkpoint_label
from trainer_backend.engine.adapters import AdapterPool, SavedWeights
from trainer_backend.engine.sampling import BoundSamplingRequest, sample_batch
from trainer_backend.engine.types import SamplingRequest, SamplingResult
from trainer_backend.engine.weights_proof import AdapterProof, ProbeAnswer, WeightChecks, unproven

ENGINE = "builtin"


@dataclass(eq=False)
class AppliedWeights:
    """Proves saved adapters and checks loaded sampler weights on the engine's model; the device's worker calls it."""

    adapters: AdapterPool
    probe: tuple[int, ...]
    decode: Callable[[Sequence[int]], str]
    max_context_length: int
    checks: WeightChecks
    # The base model's answers by prompt, computed once: the base model never changes.
    _base: dict[tuple[int, ...], tuple[float, ...]] = field(default_factory=dict, init=False, repr=False)

    def prove(self, name: str, saved: SavedWeights) -> AdapterProof:
        """The proof of adapter `name`, just saved: its hash, and the probe's answers through it and without it."""
        return AdapterProof(
            weights_sha256=saved.sha256,
            zero=saved.zero,
            probe_tokens=self.probe,
            probe_logprobs=self._answers(name, self.probe),
            base_probe_logprobs=self._base_answers(self.probe),
            dtype=self.checks.dtype,
        )

    def read(self, folder: Path) -> AdapterProof | None:
        """The proof saved with the weights in `folder` (`WeightChecks.read`)."""
        return self.checks.read(ENGINE, folder, checkpoint_label(folder))

    def stale(self, folder: Path, held_sha256: str, proof: AdapterProof) -> NoReturn:
        """Refuse weights whose name found an adapter that holds other weights (`WeightChecks.stale`)."""
        self.checks.stale(ENGINE, checkpoint_label(folder), held_sha256, proof)

    def check(self, name: str, folder: Path, proof: AdapterProof | None) -> str:
        """Refuse sampler weights just loaded as adapter `name` from `folder` unless they are the saved ones and
        change the probe as they did when saved (`proof`; None for weights saved before proofs existed).

        Returns:
            The sha256 of the weights as applied.

        Raises:
            SamplerWeightsError: what does not hold (counted and logged).
        """
        started = time.perf_counter()
        if proof is None:
            proof = unproven(folder, self.probe)
        applied = self.adapters.digest(name)
        answer = None
        if not proof.zero:
            tokens = proof.probe_tokens
            answer = ProbeAnswer(self._answers(name, tokens), self._base_answers(tokens))
        self.checks.check(ENGINE, checkpoint_label(folder), proof, applied, answer, time.perf_counter() - started)
        return applied

    def _base_answers(self, tokens: tuple[int, ...]) -> tuple[float, ...]:
        """The base model's answers: computed once, the base weights never change."""
        if tokens not in self._base:
            self._base[tokens] = self._answers(None, tokens)
        return self._base[tokens]

    def _answers(self, adapter: str | None, tokens: tuple[int, ...]) -> tuple[float, ...]:
        """The log-probability of each probe token after the ones before it, through the engine's sampling path (a
        request for the prompt's log-probs), as a request would be served."""
        trainable = [] if adapter is None else [p for p in self.adapters.parameters(adapter) if p.requires_grad]
        model = self.adapters.peft_model or self.adapters.base_model
        request = SamplingRequest(prompt_tokens=tokens, max_tokens=1, temperature=0.0, prompt_logprobs=True)
        (result,) = sample_batch(model, [BoundSamplingRequest(request, adapter)], self.decode, self.max_context_length)
        # Sampling makes the adapter PEFT's active one in inference mode, which freezes it; a training adapter
        # proved at save goes on training.
        for param in trainable:
            param.requires_grad_(True)
        if not isinstance(result, SamplingResult) or result.prompt_logprobs is None:
            raise RuntimeError(f"the probe could not be scored: {result}")
        return tuple(float(score) for score in result.prompt_logprobs[1:] if score is not None)
