"""The `build-data` command of `python -m tasks.text2sql`, and the report it prints."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tasks.text2sql.sources.synthesis.build import SEED, BuildConfig, build_data
from tasks.text2sql.sources.synthesis.llm import DEFAULT_BASE_URL, DEFAULT_MODEL, LlmConfig
from tasks.text2sql.sources.synthesis.manifest import QUESTIONS_FILE, Manifest

console = Console()


def build_data_command(
    base_url: Annotated[str, typer.Option(help="OpenAI-compatible endpoint of the question-writing LLM")] = (
        DEFAULT_BASE_URL
    ),
    model: Annotated[str, typer.Option(help="model the endpoint serves")] = DEFAULT_MODEL,
    api_key_env: Annotated[str, typer.Option(help="environment variable holding the endpoint's API key")] = (
        "OPENAI_API_KEY"
    ),
    concurrency: Annotated[int, typer.Option(min=1, max=512, help="LLM requests in flight")] = 16,
    timeout_s: Annotated[float, typer.Option(min=1, help="longest wait for one LLM answer")] = 900.0,
    repairs: Annotated[
        int, typer.Option(min=0, help="times SQL that fails to run goes back to the LLM with the error")
    ] = 1,
    seed: Annotated[int, typer.Option(help="seed of the databases and of the SQL sampled over them")] = SEED,
    queries_per_database: Annotated[int, typer.Option(min=1, help="SQL queries kept per database")] = 30,
    limit: Annotated[int | None, typer.Option(min=1, help="send only the first N queries to the LLM")] = None,
    databases: Annotated[int | None, typer.Option(min=1, help="use only the first N databases")] = None,
    out: Annotated[Path, typer.Option(help="question file to write (its manifest goes beside it)")] = QUESTIONS_FILE,
) -> None:
    """Synthesize training data: SQL sampled over 120+ generated databases, a question for each query from an LLM,
    kept when the LLM's own SQL for that question gives the same result. Cached per query: a rebuild asks the LLM
    nothing twice, and an interrupted build resumes."""
    llm = LlmConfig(
        base_url=base_url,
        model=model,
        api_key_env=api_key_env,
        concurrency=concurrency,
        timeout_s=timeout_s,
        repairs=repairs,
    )
    config = BuildConfig(
        seed=seed, queries_per_database=queries_per_database, limit=limit, databases=databases, out=out, llm=llm
    )
    manifest = build_data(config, console)
    print_report(manifest, out)


def print_report(manifest: Manifest, out: Path) -> None:
    """Size, yield by SQL feature, and time."""
    table = Table(title="round-trip yield by SQL feature (kept / sent to the LLM)")
    table.add_column("feature")
    table.add_column("sent", justify="right")
    table.add_column("kept", justify="right")
    table.add_column("yield", justify="right")
    for feature, counts in sorted(manifest.by_feature.items(), key=lambda pair: -pair[1].sampled):
        table.add_row(feature, str(counts.sampled), str(counts.kept), f"{counts.kept / counts.sampled:.0%}")
    total = f"{manifest.kept / manifest.sampled:.0%}" if manifest.sampled else "-"
    table.add_row("all", str(manifest.sampled), str(manifest.kept), total, style="bold")
    console.print(table)
    verdicts = ", ".join(f"{name} {count}" for name, count in manifest.verdicts.items())
    per_pair = f"{manifest.llm_seconds / manifest.kept:.1f} s per kept pair" if manifest.kept else "no pair kept"
    console.print(
        f"wrote {manifest.examples} examples over {len(manifest.databases)} databases to {out}\n"
        f"SQL: {manifest.sql_kept} queries kept of {manifest.sql_draws} drawn in {manifest.sql_seconds:.0f} s\n"
        f"LLM ({manifest.model}): {manifest.llm_requests} queries asked, {manifest.cached} from the cache, "
        f"{manifest.llm_seconds:.0f} s, {per_pair}\nverdicts: {verdicts}\n"
        f"difficulty: {', '.join(f'{k} {v}' for k, v in manifest.by_difficulty.items())}"
    )
