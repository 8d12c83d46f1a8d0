"""Base-model names users may ask for, and the local folder each one resolves to."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from trainer_backend.errors import UnknownBaseModelError
from trainer_backend.models.gemma import GEMMA_3_270M, ensure_gemma_3_270m
from trainer_backend.models.gguf import ensure_converted
from trainer_backend.models.qwen import QWEN_2_5_CODER_GGUFS
from trainer_backend.models.tiny import TINY_MODEL_NAME, TINY_QWEN2_NAME, ensure_tiny_model, ensure_tiny_qwen2

_ENSURE_FOLDER: dict[str, Callable[[Path], Path]] = {
    GEMMA_3_270M: ensure_gemma_3_270m,
    **{shipped.name: partial(ensure_converted, shipped.gguf_model) for shipped in QWEN_2_5_CODER_GGUFS},
    TINY_MODEL_NAME: ensure_tiny_model,
    TINY_QWEN2_NAME: ensure_tiny_qwen2,
}
KNOWN_BASE_MODELS: tuple[str, ...] = tuple(_ENSURE_FOLDER)


@dataclass(frozen=True)
class ResolvedModel:
    name: str  # as the user gave it, and as the API reports it back
    folder: Path  # a Hugging Face model folder (config.json, weights, tokenizer) on local disk


def default_cache_root() -> Path:
    """Where converted and built models live: `$TRAINER_BACKEND_CACHE`, else `~/.cache/rl-posttrain/models`."""
    configured = os.environ.get("TRAINER_BACKEND_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "rl-posttrain" / "models"


def resolve_base_model(name: str, cache_root: Path) -> ResolvedModel:
    """The local folder for `name`, building or converting a known model into `cache_root` on first use.

    Raises UnknownBaseModelError when `name` is neither a known model nor a folder with a `config.json`.
    """
    if name in _ENSURE_FOLDER:
        return ResolvedModel(name=name, folder=_ENSURE_FOLDER[name](cache_root))
    folder = Path(name).expanduser()
    if (folder / "config.json").is_file():
        return ResolvedModel(name=name, folder=folder.resolve())
    known = ", ".join(KNOWN_BASE_MODELS)
    if folder.is_dir():
        raise UnknownBaseModelError(
            f"base model {name!r} is a folder without config.json, so not a Hugging Face model folder; "
            f"known models: {known}"
        )
    raise UnknownBaseModelError(
        f"unknown base model {name!r}; known models: {known}; "
        "the path of a local Hugging Face causal-LM folder works too"
    )
