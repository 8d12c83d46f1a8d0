"""Proof that a sampler applies the weights that were saved, checked each time sampler weights are loaded.

A save writes `adapter_proof.json` beside the adapter: the sha256 of the adapter's weights file, whether the adapter
is zero by construction (every LoRA B matrix exactly 0: fresh, never trained), and what the trainer's own model
answered on a fixed probe (the log-probability of each next token of a short token sequence) with the adapter and
without it. A load, on the built-in engine or in vLLM, is then served only if

- the weights now applied hash to the saved sha256 (the built-in engine hashes the adapter as it is in memory after
  the load; vLLM's memory cannot be read, so the file it is pointed at is hashed, and its answers must match below);
- the probe through the loaded adapter moves away from the base model's by at least `MIN_EFFECT_NATS` (a zero
  adapter is exempt: it is the base model);
- the probe's move matches the trainer's own at save, within `MATCH_ABS_NATS + MATCH_REL * |move|`: an engine that
  applied other weights (an older version, another adapter) moves it elsewhere.

Otherwise the request is refused (`SamplerWeightsError`, a server error: the weights are the server's to apply, the
caller did nothing wrong), the refusal is counted by reason (`/metrics`) and logged.

Thresholds, measured 2026-12-05 (docs/server.md, "Sampler weights are checked"):
- Not applied, the probe's move is exactly 0 on both engines (fp32; the adapter's path adds zeros, or is not
  taken), and an adapter after one Adam step at learning rate 1e-5 moves it by 1e-3 nats and more on Gemma 3 270M;
  `MIN_EFFECT_NATS` = 1e-4 sits 10x under the second and far above the first.
- vLLM's move against the trainer's differs by at most 2e-5 nats on the tiny model, 4e-4 on Gemma 3 270M (other
  kernels); `MATCH_ABS_NATS` = 2e-3 leaves 5x headroom for that, and `MATCH_REL` (a quarter of the move) lets a
  device with coarser arithmetic (bf16) pass while a version that moves the probe otherwise by more does not.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import NoReturn

from pydantic import BaseModel, ConfigDict, ValidationError
from safetensors.torch import load as safetensors_load
from transformers import PreTrainedTokenizerBase

from trainer_backend.errors import ServerError

log = logging.getLogger(__name__)

PROOF_FILE = "adapter_proof.json"
# PEFT's name of the weights file (engine/adapters.py writes it).
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
# Text-to-SQL, what the adapters are trained on; cut to `PROBE_TOKENS` so that the check costs one short prefill.
PROBE_TEXT = "Question: How many customers live in Berlin?\nSELECT COUNT(*) FROM customers WHERE city = 'Berlin';"
PROBE_TOKENS = 16
MIN_EFFECT_NATS = 1e-4
# How far two engines' moves of the probe may lie apart, by the dtype the base model computes in: they round
# differently (other kernels, other orders of sums). Weights saved and loaded in different dtypes take the larger.
MATCH_ABS_NATS = {"float32": 2e-3, "bfloat16": 0.3}
MATCH_REL = 0.25


class Refusal(StrEnum):
    """Why sampler weights were refused: the label of the refusal counter."""

    HASH = "hash_mismatch"  # the weights applied (or the file read) are not the ones saved
    NO_EFFECT = "no_effect"  # a trained adapter that leaves the probe where the base model puts it
    WEAK = "too_weak"  # weights that, as saved, move the probe too little for any load to show them applied
    MISMATCH = "probe_mismatch"  # the probe moved, but not where the saved weights move it
    DAMAGED = "damaged_proof"  # the proof file cannot be read
    STALE = "stale_cache"  # an adapter held under the weights' name holds other weights than the ones saved now


class SamplerWeightsError(ServerError):
    """Sampler weights were loaded but could not be shown to be the ones saved, applied; nothing was served.

    A server error (HTTP 500 where a status is sent, category "server" in a future): the caller's request and
    checkpoint are fine, the server failed to apply them. The weights are unloaded, so a retry loads them again.
    """


class AdapterProof(BaseModel):
    """What a save records about its weights (`PROOF_FILE`); `probe_logprobs` is None for weights saved before
    proofs existed, whose expected answers are unknown."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    weights_sha256: str
    zero: bool
    probe_tokens: tuple[int, ...]
    dtype: str | None = None  # what the trainer's base model computed the answers in
    probe_logprobs: tuple[float, ...] | None = None
    base_probe_logprobs: tuple[float, ...] | None = None


def weights_digest(data: bytes) -> str:
    """The sha256 of an adapter's weights as serialised (safetensors of its LoRA tensors)."""
    return hashlib.sha256(data).hexdigest()


def probe_tokens(tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    """The probe: the first `PROBE_TOKENS` tokens of `PROBE_TEXT`, as the base model's tokenizer encodes it."""
    return tuple(tokenizer.encode(PROBE_TEXT)[:PROBE_TOKENS])


def write_proof(folder: Path, proof: AdapterProof) -> None:
    (folder / PROOF_FILE).write_text(proof.model_dump_json())


def unproven(folder: Path, tokens: tuple[int, ...]) -> AdapterProof:
    """What can be known of weights saved before proofs existed, from their file as it is now: its hash (a load must
    still apply exactly what it read) and whether it is zero; their answers on the probe are unknown.

    Raises:
        OSError, SafetensorError: the file is gone or damaged.
    """
    data = (folder / ADAPTER_WEIGHTS_FILE).read_bytes()
    zero = all(not tensor.any() for key, tensor in safetensors_load(data).items() if "lora_B" in key)
    return AdapterProof(weights_sha256=weights_digest(data), zero=zero, probe_tokens=tokens)


@dataclass(frozen=True)
class ProbeAnswer:
    """What one engine answered on the probe: with the loaded adapter, and the base model."""

    adapter: Sequence[float]
    base: Sequence[float]


def largest_move(one: Sequence[float], other: Sequence[float]) -> float:
    """The largest difference of two probe answers, in nats."""
    return max((abs(a - b) for a, b in zip(one, other, strict=True)), default=0.0)


class WeightChecks:
    """Checks loaded sampler weights against their proof, and counts the outcomes by engine (for /metrics).

    Shared by the engines of one server; called from the device's worker and vLLM's request threads.
    """

    def __init__(self, dtype: str) -> None:
        """`dtype`: what this server's base model computes in (and vLLM's, which runs in the same)."""
        self.dtype = dtype
        self._lock = threading.Lock()
        self._passed: Counter[str] = Counter()
        self._refused: Counter[tuple[str, str]] = Counter()
        self._seconds: Counter[str] = Counter()

    def check(
        self,
        engine: str,
        label: str,
        proof: AdapterProof,
        applied_sha256: str,
        answer: ProbeAnswer | None,
        seconds: float,
    ) -> None:
        """Refuse (raise) unless the weights applied are the saved ones and move the probe as saved.

        `label`: the weights as the caller knows them (a checkpoint path), for the message and the log.
        `applied_sha256`: the hash of the weights as applied (built in) or as read by the engine (vLLM).
        `answer`: the probe through the engine; None skips the probe (a zero adapter needs none).
        `seconds`: what the check took, counted for /metrics.

        Raises:
            SamplerWeightsError: naming what does not hold.
        """
        with self._lock:
            self._seconds[engine] += seconds
        if applied_sha256 != proof.weights_sha256:
            self.refuse(
                engine,
                Refusal.HASH,
                f"the sampler weights {label} loaded on {engine} are not the ones saved (their sha256 is "
                f"{applied_sha256[:12]}…, the save's {proof.weights_sha256[:12]}…)",
            )
        if answer is not None and not proof.zero:
            moved = largest_move(answer.adapter, answer.base)
            saved_move = (
                None
                if proof.probe_logprobs is None or proof.base_probe_logprobs is None
                else largest_move(proof.probe_logprobs, proof.base_probe_logprobs)
            )
            if moved < MIN_EFFECT_NATS and saved_move is not None and saved_move < MIN_EFFECT_NATS:
                self.refuse(
                    engine,
                    Refusal.WEAK,
                    f"the sampler weights {label} change the model too little to be shown applied on {engine}: as "
                    f"saved, they move the probe's log-probabilities by {saved_move:.1e} nats from the base model's, "
                    f"under the {MIN_EFFECT_NATS:.0e} a load must show (train them further; an adapter never trained "
                    "is served as the base model)",
                )
            if moved < MIN_EFFECT_NATS:
                self.refuse(
                    engine,
                    Refusal.NO_EFFECT,
                    f"the sampler weights {label} were loaded on {engine} but change nothing: the probe's "
                    f"log-probabilities move by {moved:.1e} nats from the base model's, less than the "
                    f"{MIN_EFFECT_NATS:.0e} a trained adapter moves them (the adapter was not applied)",
                )
            if proof.probe_logprobs is not None and proof.base_probe_logprobs is not None:
                expected = [a - b for a, b in zip(proof.probe_logprobs, proof.base_probe_logprobs, strict=True)]
                measured = [a - b for a, b in zip(answer.adapter, answer.base, strict=True)]
                off = largest_move(measured, expected)
                allowed = self.allowed_apart(proof)
                if off > allowed:
                    self.refuse(
                        engine,
                        Refusal.MISMATCH,
                        f"the sampler weights {label} loaded on {engine} answer the probe unlike the weights saved: "
                        f"its log-probabilities move {off:.1e} nats away from where the save moves them (at most "
                        f"{allowed:.1e} allowed), so other weights were applied (an older version?)",
                    )
        with self._lock:
            self._passed[engine] += 1

    def allowed_apart(self, proof: AdapterProof) -> float:
        """How far a load's move of the probe may lie from the save's: the engines' rounding in the dtypes of both,
        and a quarter of the move."""
        dtypes = {self.dtype, proof.dtype or self.dtype}
        rounding = max(MATCH_ABS_NATS.get(dtype, max(MATCH_ABS_NATS.values())) for dtype in dtypes)
        return rounding + MATCH_REL * largest_move(proof.probe_logprobs or (), proof.base_probe_logprobs or ())

    def read(self, engine: str, folder: Path, label: str) -> AdapterProof | None:
        """The proof saved with the weights in `folder`; None when they were saved before proofs existed.

        Raises:
            SamplerWeightsError: the proof is there but damaged (a refusal, counted).
            OSError: the folder is gone.
        """
        try:
            text = (folder / PROOF_FILE).read_text()
        except FileNotFoundError:
            if not folder.is_dir():
                raise
            return None
        try:
            return AdapterProof.model_validate_json(text)
        except ValidationError:
            self.refuse(
                engine,
                Refusal.DAMAGED,
                f"the proof saved with the sampler weights {label} ({PROOF_FILE}) is damaged, so they cannot be "
                "checked; save them again",
            )

    def stale(self, engine: str, label: str, held_sha256: str, proof: AdapterProof) -> NoReturn:
        """Refuse weights whose name finds an adapter loaded earlier that holds other weights than those saved now:
        names carry the weights' content, so only a fault makes one stale, and the cache must not hide it."""
        self.refuse(
            engine,
            Refusal.STALE,
            f"the adapter {engine} holds for the sampler weights {label} is stale (sha256 {held_sha256[:12]}…, the "
            f"weights saved now {proof.weights_sha256[:12]}…)",
        )

    def refuse(self, engine: str, reason: Refusal, message: str) -> NoReturn:
        """Count and log a refusal, then raise it."""
        with self._lock:
            self._refused[(engine, reason.value)] += 1
        log.error("refused to serve sampler weights (%s): %s", reason.value, message)
        raise SamplerWeightsError(f"{message}; nothing was sampled, and the weights were unloaded (retry loads them)")

    def snapshot(self) -> WeightCheckCounts:
        with self._lock:
            return WeightCheckCounts(dict(self._passed), dict(self._refused), dict(self._seconds))


@dataclass(frozen=True)
class WeightCheckCounts:
    """Loads whose weights were shown applied, refusals by (engine, reason), and seconds spent checking, by engine."""

    passed: dict[str, int]
    refused: dict[tuple[str, str], int]
    seconds: dict[str, float]
