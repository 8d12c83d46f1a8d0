"""Putting a resolved base model on a device, frozen, with its tokenizer and the facts the server needs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from trainer_backend.errors import DeviceUnavailableError
from trainer_backend.models.registry import ResolvedModel

_DEVICE_FORMS = "auto, cpu, cuda, cuda:<index> or mps"


@dataclass(frozen=True)
class LoadedModel:
    name: str  # as the user gave it
    folder: Path
    model: PreTrainedModel  # eval mode, every base weight frozen
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    max_context_length: int  # prompt plus completion tokens, from the config's max_position_embeddings
    vocab_size: int  # width of the logits, which may exceed the tokenizer's length
    eos_token_ids: tuple[int, ...]  # any of them ends a sample


def select_device(flag: str = "auto") -> torch.device:
    """The device for `flag`: "auto" takes CUDA, else MPS, else the CPU; an explicit one must be usable.

    Raises DeviceUnavailableError for a malformed flag or a device this machine lacks.
    """
    if flag == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(flag)
    except RuntimeError:
        raise DeviceUnavailableError(f"device {flag!r} is not a device name; use {_DEVICE_FORMS}") from None
    if device.type == "cpu":
        return device
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise DeviceUnavailableError(
                f"device {flag!r}: CUDA is not available (torch {torch.__version__}, "
                f"built for CUDA {torch.version.cuda or 'none: a CPU-only build'})"
            )
        if (device.index or 0) >= count:
            raise DeviceUnavailableError(f"device {flag!r}: this machine has {count} CUDA device(s), 0 to {count - 1}")
        return device
    if device.type == "mps":
        if not torch.backends.mps.is_available():
            raise DeviceUnavailableError(f"device {flag!r}: MPS (Apple GPU) is not available on this machine")
        return device
    raise DeviceUnavailableError(f"device {flag!r} is not supported; use {_DEVICE_FORMS}")


# `--dtype`: "auto", or the name of the torch dtype the base model computes in (`torch.float32`, `torch.bfloat16`).
DtypeFlag = Literal["auto", "float32", "bfloat16"]
DTYPES = {name: getattr(torch, name) for name in get_args(DtypeFlag) if name != "auto"}


def dtype_name(dtype: torch.dtype) -> str:
    """The name `--dtype` (and vLLM's `--dtype`) gives `dtype`: "float32" for torch.float32."""
    return str(dtype).removeprefix("torch.")


def computes_bf16_natively(capabilities: Mapping[str, object]) -> bool:
    """Whether a CPU with these `torch.cpu.get_capabilities()` has bf16 dot-product instructions (AVX-512 BF16 or
    AMX): without them a bf16 matmul is emulated, several times slower than fp32."""
    return bool(capabilities.get("avx512_bf16") or capabilities.get("amx_bf16"))


def select_dtype(flag: str, device: torch.device) -> torch.dtype:
    """The dtype the base model computes in for `flag` ("auto", "float32" or "bfloat16") on `device`.

    "auto" takes bf16 where the device computes it natively: CUDA, and CPUs with bf16 instructions, where
    `python -m benchmarks.rl_step` measured Qwen's RL step at 0.65-0.84 of fp32's (docs/performance.md). Elsewhere
    (MPS, other CPUs) fp32. Adapters and log-probs stay fp32 whatever the base dtype.
    """
    if flag != "auto":
        if flag not in DTYPES:
            raise ValueError(f"dtype {flag!r} is not one of auto, {', '.join(DTYPES)}")
        return DTYPES[flag]
    if device.type == "cuda" or (device.type == "cpu" and computes_bf16_natively(torch.cpu.get_capabilities())):
        return torch.bfloat16
    return torch.float32


def _eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    # Generation config first: it may list several stop tokens (Gemma: <eos> and <end_of_turn>).
    candidates: list[int | list[int] | None] = [
        model.generation_config.eos_token_id,
        model.config.eos_token_id,
        tokenizer.eos_token_id,
    ]
    ids: list[int] = []
    for candidate in candidates:
        if isinstance(candidate, int):
            ids.append(candidate)
        elif candidate is not None:
            ids.extend(candidate)
    return tuple(dict.fromkeys(ids))


def load_base_model(resolved: ResolvedModel, device: torch.device, dtype: torch.dtype | None = None) -> LoadedModel:
    """Load the model and tokenizer in `resolved.folder` onto `device`, in eval mode with frozen weights.

    `dtype` defaults to `select_dtype("auto", device)`. Never reaches the Hugging Face Hub.
    """
    model = AutoModelForCausalLM.from_pretrained(
        resolved.folder, dtype=dtype or select_dtype("auto", device), local_files_only=True
    )
    model.to(device).eval().requires_grad_(False)
    return with_tokenizer(resolved, model, device)


def with_tokenizer(resolved: ResolvedModel, model: PreTrainedModel, device: torch.device) -> LoadedModel:
    """`model`, already on `device` with its weights in place, with the tokenizer in `resolved.folder` and the facts
    the server needs."""
    tokenizer = AutoTokenizer.from_pretrained(resolved.folder, local_files_only=True)
    # Multimodal folders (Gemma 3 4B and up) keep the language model's facts in a nested text config.
    text_config = model.config.get_text_config()
    return LoadedModel(
        name=resolved.name,
        folder=resolved.folder,
        model=model,
        tokenizer=tokenizer,
        device=device,
        max_context_length=text_config.max_position_embeddings,
        vocab_size=text_config.vocab_size,
        eos_token_ids=_eos_token_ids(model, tokenizer),
    )
