"""Per-request routing between a preferred sampler (vLLM) and the built-in engine: the preferred one answers every
request it can serve exactly, the built-in engine the rest, so a client never sees a refusal for the engine's sake
(an unmodified Tinker script trains the unembedding by default, which vLLM cannot load)."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

from trainer_backend.config import ServerConfig
from trainer_backend.engine.types import LoraSettings, SamplingRequest
from trainer_backend.models.loading import LoadedModel, dtype_name
from trainer_backend.samplers.answers import SampleAnswers
from trainer_backend.samplers.builtin import BuiltinSampler
from trainer_backend.samplers.interface import RecordedSamplingRequest, Sampler
from trainer_backend.samplers.vllm import VllmSampler
from trainer_backend.samplers.vllm_client import VllmClient
from trainer_backend.samplers.vllm_process import VllmSettings
from trainer_backend.wire.status import SamplerStatus

# Why a request went to the built-in engine although vLLM runs: it asked to be answered as if alone.
BATCH_INVARIANT = "batch-invariant (answered as if alone on the server)"


class RoutedSampler:
    """`preferred` for what it serves, `builtin` for the rest, counted by reason in the status."""

    def __init__(self, preferred: Sampler, builtin: BuiltinSampler) -> None:
        self.preferred = preferred
        self.builtin = builtin
        self.name = preferred.name
        self._fallbacks: Counter[str] = Counter()
        self._lock = threading.Lock()

    def serves(self, request: SamplingRequest) -> str | None:
        return None

    def engine_for(self, request: SamplingRequest) -> Sampler:
        reason = self.preferred.serves(request)
        if reason is None:
            return self.preferred
        with self._lock:
            self._fallbacks[reason] += 1
        return self.builtin

    def submit(self, job: RecordedSamplingRequest) -> None:
        if job.batch_invariant:
            # vLLM batches whatever it holds; only the built-in engine runs a request in a batch of its own.
            with self._lock:
                self._fallbacks[BATCH_INVARIANT] += 1
            self.builtin.submit(job)
            return
        self.engine_for(job.request).submit(job)

    def weights_saved(self, folder: Path, lora: LoraSettings) -> None:
        self.preferred.weights_saved(folder, lora)

    def status(self) -> SamplerStatus | None:
        status = self.preferred.status()
        if status is None:
            return None
        with self._lock:
            return status.model_copy(update={"builtin_requests": dict(self._fallbacks)})

    def close(self) -> None:
        self.preferred.close()
        self.builtin.close()


def build_sampler(
    config: ServerConfig, builtin: BuiltinSampler, loaded: LoadedModel, answers: SampleAnswers
) -> Sampler:
    """The server's sampler: the built-in engine, or with `--sampler vllm` vLLM routed beside it."""
    if config.sampler == "builtin":
        return builtin
    client = VllmClient(
        vllm_settings(config, loaded),
        lambda ids: loaded.tokenizer.decode(ids, skip_special_tokens=False),
        builtin.engine.weight_checks,
        builtin.engine.applied_weights.probe,
    )
    return RoutedSampler(VllmSampler(client, answers), builtin)


def vllm_settings(config: ServerConfig, loaded: LoadedModel) -> VllmSettings:
    """How this server starts (or reaches) vLLM: the trainer's model in its dtype; on a sharded backend's GPUs, split
    over all of them (tensor parallelism), beside the trainer's shards."""
    return VllmSettings(
        model_folder=loaded.folder,
        served_name=loaded.name,
        python=config.vllm_python,
        url=config.vllm_url,
        max_loras=config.max_loras,
        max_lora_rank=config.max_lora_rank,
        log_path=config.storage_root / "vllm.log",
        device=loaded.device.type,
        dtype=dtype_name(loaded.model.dtype),
        gpu_memory_share=config.vllm_gpu_memory_share,
        tensor_parallel_size=config.shards,
    )
