"""`python -m trainer_backend serve …`: run the Tinker-compatible training server.

Its flags are `ServerConfig`'s fields, each with the field's description as help, so the two cannot drift apart; a
flag left out takes the field's TRAINER_BACKEND_* environment variable, else its default.
"""

from __future__ import annotations

import inspect
import types
from typing import Annotated, Any, Union, get_args, get_origin

import typer
from pydantic import ValidationError
from pydantic.fields import FieldInfo

from trainer_backend.config import ServerConfig
from trainer_backend.errors import BackendError, UserInputError
from trainer_backend.logs import configure_logging
from trainer_backend.server import serve

# Click's plain help, not rich's: rich's option table cuts long flag names at 80 columns (issue 41).
app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__, rich_markup_mode=None)

# A list field is a repeatable flag named for one of its items.
FLAG_NAMES = {"api_keys": "--api-key"}


@app.callback()
def commands() -> None:
    """Keeps `serve` a named subcommand: typer runs a lone command without its name otherwise."""


def _without_none(annotation: Any) -> Any:
    """`X` for an annotation `X | None` or `Annotated[X, …]`; the flag's own None already means "not given"."""
    if get_origin(annotation) in (Union, types.UnionType):
        rest = [arg for arg in get_args(annotation) if arg is not type(None)]
        annotation = rest[0] if len(rest) == 1 else annotation
    # A constrained type (FilePath) is checked by the config; the flag takes its plain type.
    return get_args(annotation)[0] if get_origin(annotation) is Annotated else annotation


def _option(name: str, field: FieldInfo) -> inspect.Parameter:
    default = field.get_default(call_default_factory=True)
    shown = "" if default in (None, []) else f" (default: {default})"
    option = typer.Option(
        FLAG_NAMES.get(name, "--" + name.replace("_", "-")), help=f"{field.description}{shown}", show_default=False
    )
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[_without_none(field.annotation) | None, option],
    )


def serve_command(log_format: str = "text", **given: Any) -> None:
    """Serve one base model to many LoRA training clients over the Tinker API."""
    try:
        config = ServerConfig(**{name: value for name, value in given.items() if value not in (None, [])})
    except ValidationError as error:
        raise UserInputError(_flag_errors(error)) from None
    configure_logging(log_format)
    serve(config)


def _flag_errors(error: ValidationError) -> str:
    """Each bad setting named as the flag a user gives it (or its environment variable), with what is wrong."""
    problems = []
    for problem in error.errors():
        name = str(problem["loc"][0]) if problem["loc"] else ""
        if name in ServerConfig.model_fields:
            flag = FLAG_NAMES.get(name, "--" + name.replace("_", "-"))
            name = f"{flag} (TRAINER_BACKEND_{name.upper()})"
        problems.append(f"{name or 'config'}: {problem['msg']}")
    return "; ".join(problems)


serve_command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [
        *(_option(name, field) for name, field in ServerConfig.model_fields.items()),
        inspect.Parameter(
            "log_format",
            inspect.Parameter.KEYWORD_ONLY,
            default="text",
            annotation=Annotated[str, typer.Option(help="text, or json for log collectors")],
        ),
    ]
)
app.command(name="serve")(serve_command)


def main() -> None:
    try:
        app(prog_name="trainer_backend")
    except (BackendError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
