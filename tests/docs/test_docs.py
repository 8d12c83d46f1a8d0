"""The documentation: the site builds with every link, page, anchor and included file in place, the README's links
resolve, and every command the docs quote names a module, script, subcommand, flag and file that exist.

The command check is a cheap text check (what a renamed flag or a moved script breaks), not a run of the commands.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# Every document a user reads: the README, the site's pages and the Kubernetes guide the site includes.
DOCUMENTS = [ROOT / "README.md", ROOT / "k8s" / "README.md", *sorted(DOCS.glob("*.md"))]
# Modules and scripts of this repository; `python -m` of anything else must at least be importable here.
OUR_PACKAGES = ("trainer_backend", "autoresearch", "tasks", "benchmarks")
# Packages whose every module is a command of its own, its flags defined in that module alone.
COMMAND_PACKAGES = ("benchmarks",)
REPOSITORY_PATH = re.compile(r"(experiments|benchmarks|docs|k8s|tasks|autoresearch|trainer_backend)/\S+")
SHELL_SEPARATORS = re.compile(r"\s(?:&&|\|\||\||;)\s")
PLACEHOLDER = re.compile(r"[<>…]|^[A-Z_]+$|^\$|^URL$")


@dataclass(frozen=True)
class QuotedCommand:
    document: Path
    text: str


def test_site_builds_strictly(tmp_path: Path) -> None:
    """`mkdocs build --strict` fails on a broken link, a missing page or anchor, or a missing included file."""
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "site" / "kubernetes" / "index.html").read_text().count("What runs") >= 1, (
        "k8s/README.md was not included in the Kubernetes page"
    )


def test_readme_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", readme)
    local = [target for target in targets if not re.match(r"[a-z]+://", target)]
    assert local, "the README links no page of the docs"
    for target in local:
        path, _, anchor = target.partition("#")
        file = ROOT / (path or "README.md")  # "#anchor" alone is a heading of the README itself
        assert file.exists(), f"README links {target}, which does not exist"
        if anchor:
            assert anchor in heading_anchors(file), f"README links {target}: {path} has no heading #{anchor}"


def test_every_quoted_command_names_what_exists() -> None:
    commands = [command for document in DOCUMENTS for command in quoted_commands(document)]
    assert len(commands) > 40, f"found only {len(commands)} commands in the docs"
    problems = [problem for command in commands for problem in command_problems(command)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("command", "problem"),
    [
        ("python -m autoresearch experiments/no_such_study.yaml", "experiments/no_such_study.yaml"),
        ("python -m trainer_backend serve --no-such-flag 3", "--no-such-flag"),
        ("python -m tasks.text2sql no-such-subcommand", "no-such-subcommand"),
        ("python -m benchmarks.no_such_benchmark", "benchmarks.no_such_benchmark"),
        ("python benchmarks/rl_step.py --steps 1", "python -m benchmarks.rl_step"),
        ("python -m benchmarks.rl_step --heavy-queue 40", "--heavy-queue"),
        ("python -m no_such_module_anywhere", "no_such_module_anywhere"),
    ],
)
def test_the_command_check_catches(command: str, problem: str) -> None:
    found = command_problems(QuotedCommand(ROOT / "README.md", command))
    assert any(problem in line for line in found), found


def test_the_command_check_accepts_real_commands() -> None:
    for command in [
        "python -m trainer_backend serve --base-model google/gemma-3-270m --device auto --port 8000",
        "TINKER_BASE_URL=http://localhost:8000 python -m autoresearch.trials experiments/trials/text2sql_qwen.yaml"
        " --run-id x",
        "python -m benchmarks.rl_step --model Qwen/Qwen2.5-Coder-0.5B-Instruct --steps 1",
        "python -m benchmarks.fairness --engine --before 8945e16",
        "python -m autoresearch /specs/text2sql.yaml --run-root /runs --no-progress",
    ]:
        assert command_problems(QuotedCommand(ROOT / "README.md", command)) == [], command


def quoted_commands(document: Path) -> list[QuotedCommand]:
    """Every `python …` command in the document's code blocks and inline code, one per shell segment."""
    text = document.read_text()
    blocks = re.findall(r"^```(?:bash|sh|shell|console)?\n(.*?)^```", text, flags=re.M | re.S)
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    inline = [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", prose)]
    lines = [line for block in blocks for line in block.splitlines()] + inline
    commands = []
    for line in lines:
        line = re.sub(r"\s#\s.*$", "", line)
        for segment in SHELL_SEPARATORS.split(f" {line} "):
            if re.search(r"(^|\s)python3? ", segment):
                commands.append(QuotedCommand(document, segment.strip()))
    return commands


def command_problems(command: QuotedCommand) -> list[str]:
    try:
        words = shlex.split(command.text)
    except ValueError:
        words = command.text.split()
    where = f"{command.document.relative_to(ROOT)}: `{command.text}`"
    start = next(i for i, word in enumerate(words) if word in ("python", "python3"))
    words = [word for word in words[start + 1 :] if word not in ("[", "]")]
    words = [word.strip("[]") for word in words]
    if not words:
        return []
    if words[0] == "-m":
        module, arguments = words[1], words[2:]
        if module.split(".")[0] not in OUR_PACKAGES:
            found = importlib.util.find_spec(module) is not None
            return [] if found else [f"{where}: no module {module}"]
        sources = module_sources(module)
        if not sources:
            return [f"{where}: no module {module} in this repository"]
    elif words[0].endswith(".py") and words[0].split("/")[0] in OUR_PACKAGES:
        script = ROOT / words[0]
        if not script.exists():
            return [f"{where}: no script {words[0]}"]
        if (script.parent / "__init__.py").exists():
            # A module of a package imports its package absolutely: it runs with -m from the repository root.
            module = ".".join(script.with_suffix("").relative_to(ROOT).parts)
            return [f"{where}: {words[0]} is a module of a package: run it as python -m {module}"]
        sources, arguments = [script, *script.parent.glob("_*.py")], words[1:]
    else:
        return []  # a user's own script, or python -c
    text = "\n".join(path.read_text() for path in sources)
    problems = []
    for position, word in enumerate(arguments):
        if PLACEHOLDER.search(word):
            continue
        if word.startswith("--"):
            flag = word.split("=")[0]
            if not flag_defined(flag, text):
                problems.append(f"{where}: flag {flag} is defined nowhere in {module_or_script(words)}")
        elif position == 0 and re.fullmatch(r"[a-z][a-z-]*", word):
            if not subcommand_defined(word, text):
                problems.append(f"{where}: no subcommand {word} in {module_or_script(words)}")
        elif REPOSITORY_PATH.fullmatch(word) and not (ROOT / word).exists():
            problems.append(f"{where}: {word} does not exist")
    return problems


def module_or_script(words: list[str]) -> str:
    return words[1] if words[0] == "-m" else words[0]


@cache
def module_sources(module: str) -> tuple[Path, ...]:
    """The Python files a module's flags may be defined in: its whole top-level package (typer options and pydantic
    settings derive flags from field names, so a field's name counts as its flag), or in a package of commands the
    command's own module or package."""
    path = ROOT / module.replace(".", "/")
    if not (path.with_suffix(".py").exists() or (path / "__main__.py").exists()):
        return ()
    if module.split(".")[0] in COMMAND_PACKAGES:
        # A command of its own: one module, or a package of them (`python -m benchmarks.proposers`).
        return (path.with_suffix(".py"),) if path.with_suffix(".py").exists() else tuple(sorted(path.rglob("*.py")))
    return tuple(sorted((ROOT / module.split(".")[0]).rglob("*.py")))


def flag_defined(flag: str, source: str) -> bool:
    name = flag.removeprefix("--")
    fields = {name.replace("-", "_"), name.removeprefix("no-").replace("-", "_")}
    return f'"{flag}' in source or f"'{flag}" in source or any(re.search(rf"\b{f}\b", source) for f in fields)


def subcommand_defined(word: str, source: str) -> bool:
    function = word.replace("-", "_")
    return re.search(rf"def {function}\(", source) is not None or f'"{word}"' in source


@cache
def heading_anchors(document: Path) -> frozenset[str]:
    text = re.sub(r"^```.*?^```", "", document.read_text(), flags=re.M | re.S)
    headings = re.findall(r"^#+ (.+)$", text, flags=re.M)
    return frozenset(slugify(heading.replace("`", ""), "-") for heading in headings)
