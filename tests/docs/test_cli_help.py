"""Every command line's help, each subcommand too, shows every flag name whole in an 80-column terminal (issue 41:
rich's option table cut `--max-storage-bytes-p…`, which a user can neither read nor copy)."""

from __future__ import annotations

import re

import pytest
import typer
from typer.core import TyperCommand, TyperGroup, TyperOption
from typer.testing import CliRunner

from autoresearch.__main__ import app as autoresearch_app
from autoresearch.trials.__main__ import app as trials_app
from tasks.text2sql.cli import app as text2sql_app
from trainer_backend.__main__ import app as trainer_backend_app

APPS = {
    "trainer_backend": trainer_backend_app,
    "tasks.text2sql": text2sql_app,
    "autoresearch": autoresearch_app,
    "autoresearch.trials": trials_app,
}
WIDTH = 80


def _command_paths(command: TyperCommand | TyperGroup, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The argument path to each command of a CLI: the CLI itself, then each subcommand, depth first."""
    paths = [path]
    if isinstance(command, TyperGroup):
        for name, sub in command.commands.items():
            paths += _command_paths(sub, (*path, name))
    return paths


CASES = [
    pytest.param(cli, path, id=" ".join((cli, *path)))
    for cli, app in APPS.items()
    for path in _command_paths(typer.main.get_command(app))
]


@pytest.mark.parametrize(("cli", "path"), CASES)
def test_help_at_80_columns_shows_every_flag_name_whole(cli: str, path: tuple[str, ...]) -> None:
    root = typer.main.get_command(APPS[cli])
    command = root
    for name in path:
        assert isinstance(command, TyperGroup)
        command = command.commands[name]
    # COLUMNS as a terminal sets it: both click's formatter and rich's console take their width from it.
    result = CliRunner().invoke(APPS[cli], [*path, "--help"], env={"COLUMNS": str(WIDTH)}, terminal_width=WIDTH)
    assert result.exit_code == 0, result.output
    help_text = result.output
    names = [
        flag
        for param in command.get_params(typer.Context(command))
        if isinstance(param, TyperOption) and not param.hidden
        for flag in (*param.opts, *param.secondary_opts)
    ]
    assert names, help_text
    cut = [flag for flag in names if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text)]
    assert not cut, f"flag names not shown whole: {cut}\n{help_text}"
    wide = [line for line in help_text.splitlines() if len(line) > WIDTH]
    assert not wide, f"lines past {WIDTH} columns: {wide}"
