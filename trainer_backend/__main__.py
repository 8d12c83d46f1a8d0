"""`python -m trainer_backend serve …`: run the Tinker-compatible training server."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from trainer_backend.config import ServerConfig
from trainer_backend.errors import BackendError, UserInputError, describe_validation_error
from trainer_backend.logs import configure_logging
from trainer_backend.server import serve

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)


@app.callback()
def commands() -> None:
    """Keeps `serve` a named subcommand: typer runs a lone command without its name otherwise."""


@app.command(name="serve")
def serve_command(
    base_model: Annotated[
        str | None, typer.Option(help="google/gemma-3-270m, tiny-gemma3, or a local HF folder")
    ] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu, cuda, cuda:N or mps")] = None,
    host: Annotated[str | None, typer.Option(help="address to bind")] = None,
    port: Annotated[int | None, typer.Option(help="port to bind")] = None,
    storage_root: Annotated[Path | None, typer.Option(help="checkpoints, ledger and runs live here")] = None,
    api_key: Annotated[list[str] | None, typer.Option(help="an accepted API key (repeat for several)")] = None,
    max_queued: Annotated[int | None, typer.Option(help="queued requests before clients get 429")] = None,
    max_loaded_adapters: Annotated[
        int | None, typer.Option(help="training adapters kept loaded; the least recently used others wait on disk")
    ] = None,
    log_format: Annotated[str, typer.Option(help="text, or json for log collectors")] = "text",
) -> None:
    """Serve one base model to many LoRA training clients over the Tinker API."""
    given = {
        "base_model": base_model,
        "device": device,
        "host": host,
        "port": port,
        "storage_root": storage_root,
        "api_keys": api_key or None,
        "max_queued": max_queued,
        "max_loaded_adapters": max_loaded_adapters,
    }
    try:
        config = ServerConfig(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as error:
        raise UserInputError(describe_validation_error(error, "config")) from None
    configure_logging(log_format)
    serve(config)


def main() -> None:
    try:
        app(prog_name="trainer_backend")
    except (BackendError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
