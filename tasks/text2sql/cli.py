"""`python -m tasks.text2sql …`: rebuild the bundled data, show it, and evaluate models on it."""

from __future__ import annotations

from collections import Counter
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tasks.errors import TaskError
from tasks.report import HeldOutReport
from tasks.text2sql.bundled import load_bundled
from tasks.text2sql.dataset import Difficulty, Text2SqlDataset
from tasks.text2sql.evaluation import Model, OpenAICompatibleModel, evaluate, garbage_model, gold_model
from tasks.text2sql.generation.build import QUESTIONS_DIR, write_question_files
from tasks.text2sql.rewards import DEFAULT_REWARD_SPEC, RewardSpec
from tasks.text2sql.spider import load_bird, load_spider
from tasks.text2sql.task import Text2SqlTask

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
console = Console()


class Source(StrEnum):
    bundled = "bundled"
    spider = "spider"
    bird = "bird"


class Reference(StrEnum):
    gold = "gold"
    garbage = "garbage"
    endpoint = "endpoint"


def _load(source: Source, path: Path | None) -> Text2SqlDataset:
    if source is Source.bundled:
        return load_bundled()
    if path is None:
        raise typer.BadParameter(f"--path is required with --source {source.value}")
    dataset, _ = (load_spider if source is Source.spider else load_bird)(path)
    for note in dataset.notes:
        console.print(f"[yellow]{note}[/yellow]")
    return dataset


def _counts_table(dataset: Text2SqlDataset) -> Table:
    table = Table(title=f"{dataset.name}: examples per split and difficulty")
    table.add_column("split")
    for difficulty in Difficulty:
        table.add_column(difficulty.value, justify="right")
    table.add_column("total", justify="right")
    table.add_column("databases", justify="right")
    for name, examples in dataset.splits.items():
        counts = Counter(e.difficulty for e in examples)
        databases = len({e.db_id for e in examples})
        table.add_row(name, *(str(counts[d]) for d in Difficulty), str(len(examples)), str(databases))
    return table


def _report_table(report: HeldOutReport, title: str) -> Table:
    table = Table(title=title)
    table.add_column("difficulty")
    table.add_column("correct", justify="right")
    table.add_column("total", justify="right")
    table.add_column("accuracy", justify="right")
    for difficulty, accuracy in report.accuracy_by_difficulty.items():
        correct, total = report.counts(difficulty)
        table.add_row(difficulty, str(correct), str(total), "-" if accuracy is None else f"{accuracy:.1%}")
    correct = sum(answer.correct for answer in report.answers)
    table.add_row("all", str(correct), str(len(report.answers)), f"{report.accuracy:.1%}", style="bold")
    return table


@app.command()
def rebuild(out: Annotated[Path, typer.Option(help="where to write train/dev/test.json")] = QUESTIONS_DIR) -> None:
    """Regenerate the bundled databases and question files from the seed."""
    splits = write_question_files(out)
    console.print(f"wrote {', '.join(f'{len(v)} {k}' for k, v in splits.items())} examples to {out}")


@app.command()
def stats(
    source: Source = Source.bundled, path: Annotated[Path | None, typer.Option(help="Spider/BIRD folder")] = None
) -> None:
    """Count examples per split and difficulty."""
    console.print(_counts_table(_load(source, path)))


@app.command(name="evaluate")
def evaluate_command(
    split: str = "dev",
    model: Annotated[
        Reference, typer.Option(help="gold/garbage references, or an OpenAI-compatible endpoint")
    ] = Reference.gold,
    base_url: Annotated[str, typer.Option(help="endpoint URL, with --model endpoint")] = "http://127.0.0.1:8000/v1",
    model_name: Annotated[str, typer.Option(help="model name the endpoint serves")] = "",
    api: Annotated[str, typer.Option(help="'completions' (base models) or 'chat'")] = "completions",
    few_shot: Annotated[int, typer.Option(help="solved training examples shown before each question")] = 3,
    limit: Annotated[int | None, typer.Option(help="evaluate only the first N examples")] = None,
    source: Source = Source.bundled,
    path: Annotated[Path | None, typer.Option(help="Spider/BIRD folder, with --source spider/bird")] = None,
) -> None:
    """Execution accuracy of a model on a split, by difficulty."""
    dataset = _load(source, path)
    chosen: Model
    if model is Reference.endpoint:
        chosen = OpenAICompatibleModel(base_url=base_url, model=model_name, api=api)
    else:
        chosen = gold_model if model is Reference.gold else garbage_model
    with Text2SqlTask(dataset) as task:
        report = evaluate(task, split, chosen, limit=limit, few_shot=few_shot)
    console.print(_report_table(report, f"{model.value} on {dataset.name}/{split}"))


@app.command()
def demo(
    reward_spec: Annotated[str, typer.Option(help="reward spec as JSON")] = DEFAULT_REWARD_SPEC.to_json(),
) -> None:
    """Tour of the task: the data, a prompt, rewards for a few completions, and the reference baselines."""
    spec = RewardSpec.parse(reward_spec)
    dataset = load_bundled()
    console.print(_counts_table(dataset))
    example = dataset.split("dev")[0]
    with Text2SqlTask(dataset) as task:
        console.rule("a prompt (one few-shot example)")
        console.print(task.render_prompt(example, task.few_shot_examples(1, "train")), markup=False)
        console.rule(f"rewards under {spec.to_json()}")
        candidates = {
            "gold": f"{example.gold_sql};",
            "gold, then rambling": f"{example.gold_sql};\nQuestion: what else?",
            "wrong filter": example.gold_sql.replace("=", "<>", 1) + ";",
            "not SQL": "The answer is 42.",
            "hostile": "SELECT * FROM read_csv('/etc/passwd');",
        }
        table = Table("completion", "reward", "correct", "status", *(c.kind for c in spec.components))
        scores = task.score_group(example, list(candidates.values()), spec)
        for name, score in zip(candidates, scores, strict=True):
            table.add_row(
                name,
                f"{score.reward:.3f}",
                str(score.correct),
                score.status.value,
                *(f"{score.components[c.kind]:.3f}" for c in spec.components),
            )
        console.print(f"question: {example.question}\ngold: {example.gold_sql}")
        console.print(table)
        for reference, model in (("gold", gold_model), ("garbage", garbage_model)):
            report = evaluate(task, "dev", model)
            console.print(_report_table(report, f"reference '{reference}' on bundled/dev"))


def main() -> None:
    """Entry point: errors the user can fix are printed as one line, not a traceback."""
    try:
        app(prog_name="text2sql")
    except TaskError as error:
        console.print(f"[red]error:[/red] {error}")
        raise SystemExit(1) from None
