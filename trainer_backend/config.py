"""Server configuration, validated at the edge: command-line flags or TRAINER_BACKEND_* environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, FilePath, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from trainer_backend.engine.microbatches import ACTIVATION_BUDGET_BYTES
from trainer_backend.models.gemma import GEMMA_3_270M
from trainer_backend.models.loading import DtypeFlag

# The Tinker SDK sends only keys that start with `tml-`; a short key is one an attacker could guess.
API_KEY_PREFIX = "tml-"
MIN_API_KEY_SECRET_CHARS = 8


def default_storage_root() -> Path:
    return Path.home() / ".local" / "share" / "rl-posttrain" / "backend"


class ServerConfig(BaseSettings):
    """Everything `python -m trainer_backend serve` can be told."""

    model_config = SettingsConfigDict(env_prefix="TRAINER_BACKEND_", extra="forbid")

    base_model: str = Field(GEMMA_3_270M, description="served base model: a known name or a local HF folder")
    device: str = Field("auto", description="auto, cpu, cuda, cuda:N or mps")
    dtype: DtypeFlag = Field(
        "auto",
        description="what the base model computes in; auto: bfloat16 on CUDA and on CPUs with bf16 instructions "
        "(AVX-512 BF16, AMX), float32 elsewhere. Adapters and log-probs are float32 either way",
    )
    host: str = Field("127.0.0.1", description="address to bind")
    port: int = Field(8000, ge=0, le=65535, description="port to bind (0 picks a free one)")
    storage_root: Path = Field(default_factory=default_storage_root, description="checkpoints, ledger and runs")
    model_cache: Path | None = Field(None, description="where converted base models are cached")
    api_keys: list[str] = Field(default_factory=list, description="accepted keys; none means open mode (loopback)")
    long_poll_s: float = Field(25.0, gt=0, le=40, description="how long retrieve_future waits before try_again")
    max_queued: int = Field(1024, ge=1, description="queued operations before clients are told to back off")
    gap_timeout_s: float = Field(60.0, gt=0, description="how long a request waits for a missing lower seq_id")
    max_loaded_adapters: int = Field(
        32, ge=1, description="training adapters kept loaded; the least recently used others wait on disk"
    )
    max_generation_batch_tokens: int = Field(
        32768,
        ge=1,
        description="prompt plus planned completion tokens of one generation batch (it also holds at most 64 rows): "
        "bounds its KV cache and how long other tenants' requests wait behind it",
    )
    max_training_activation_bytes: int = Field(
        ACTIVATION_BUDGET_BYTES,
        ge=1,
        description="memory the activations of one training micro-batch may take (weights and adapters come on "
        "top): a forward_backward is run as micro-batches within it, with the same gradients",
    )
    # What one API key may hold, so no tenant can stall or fill the server for the others.
    max_queued_per_key: int | None = Field(
        None, ge=1, description="operations one API key may have queued; past it that key alone is told to back off"
    )
    abandoned_session_s: float = Field(
        120.0,
        gt=0,
        description="a session whose heartbeats stopped this many seconds before the latest session's is taken for "
        "gone (a killed client) and its queued samples are failed, so they do not take device time from live ones",
    )
    max_storage_bytes_per_key: int | None = Field(
        None, ge=1, description="bytes of checkpoints one API key may keep; a save past it fails, naming this limit"
    )
    keep_checkpoints_per_run: int | None = Field(
        None,
        ge=1,
        description="checkpoints of each kind a run keeps, the most recent, unless it asks otherwise "
        "(user_metadata keep_checkpoints); none: all",
    )
    # How many series a Prometheus can hold is the operator's call, hence a flag: each named tenant adds five series,
    # so the default costs 55 whatever the number of keys.
    metrics_top_tenants: int = Field(
        10,
        ge=1,
        description="tenants /metrics names, the busiest by recent device time; the others are summed as 'other'",
    )
    # Bounds on what one request may ask for, checked before any work: each answers 413 or 400 naming itself.
    max_request_bytes: int = Field(
        64 * 2**20, ge=1024, description="largest request body, compressed or not (a forward_backward chunk is ~5 MB)"
    )
    max_tensor_elements: int = Field(2**24, ge=1, description="most elements of one loss_fn_inputs tensor, made dense")
    max_lora_rank: int = Field(256, ge=1, description="highest LoRA rank a training run may ask for")
    max_num_samples: int = Field(256, ge=1, description="most completions one sample request may ask for")
    chat_template: FilePath | None = Field(
        None, description="Jinja chat template for /v1/chat/completions, for a model whose tokenizer has none"
    )
    sampler: Literal["builtin", "vllm"] = Field(
        "builtin", description="sampling engine: the built-in one, or vLLM in a process of its own"
    )
    vllm_python: FilePath | None = Field(
        None, description="with --sampler vllm: the python of vLLM's own environment, to start vLLM with"
    )
    vllm_url: str | None = Field(
        None, description="with --sampler vllm: a vLLM server already running (LoRA and runtime loading on) instead"
    )
    shards: int = Field(
        1,
        ge=1,
        description="processes the base model's decoder layers are sharded over (FSDP2): one GPU each on a GPU node, "
        "gloo processes on a CPU; under torchrun, its WORLD_SIZE",
    )
    max_loras: int = Field(8, ge=1, description="with --sampler vllm: adapters vLLM holds at once")
    vllm_gpu_memory_share: float = Field(
        0.4,
        gt=0,
        lt=1,
        description="with --sampler vllm on a GPU: the share of its memory vLLM takes; training the rest",
    )

    @model_validator(mode="after")
    def _vllm_reachable(self) -> ServerConfig:
        if self.sampler == "vllm" and (self.vllm_python is None) == (self.vllm_url is None):
            raise ValueError("--sampler vllm needs one of --vllm-python (to start vLLM) or --vllm-url (one running)")
        return self

    @field_validator("api_keys")
    @classmethod
    def _usable_keys(cls, keys: list[str]) -> list[str]:
        for position, key in enumerate(keys, start=1):
            # The key itself is not echoed: error messages end up in logs.
            if not key.startswith(API_KEY_PREFIX):
                raise ValueError(f"API key #{position} does not start with {API_KEY_PREFIX!r}, which the SDK requires")
            if len(key) - len(API_KEY_PREFIX) < MIN_API_KEY_SECRET_CHARS:
                raise ValueError(
                    f"API key #{position} is too short: at least {MIN_API_KEY_SECRET_CHARS} characters after "
                    f"{API_KEY_PREFIX!r}"
                )
        return keys
