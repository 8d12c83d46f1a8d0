"""`python -m tasks.text2sql …`: rebuild the bundled data, show it, and evaluate models on it."""

from __future__ import annotations

from collections import Counter
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from tasks.errors import SplitError, TaskError
from tasks.report import HeldOutReport
from tasks.text2sql.dataset import Difficulty, Example, Text2SqlDataset
from tasks.text2sql.evaluation import Model, OpenAICompatibleModel, evaluate, garbage_model, gold_model
from tasks.text2sql.prompts import tables_used
from tasks.text2sql.reward.rewards import DEFAULT_REWARD_SPEC, RewardSpec
from tasks.text2sql.sources.bundled import load_bundled
from tasks.text2sql.sources.data_source import DataSource, SourceKind
from tasks.text2sql.sources.generation.build import QUESTIONS_DIR, write_question_files
from tasks.text2sql.sources.synthesis.command import build_data_command
from tasks.text2sql.task import Text2SqlTask
from validation_errors import describe_validation_error

# Click's plain help, not rich's: rich's option table cuts long flag names at 80 columns (issue 41).
app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__, rich_markup_mode=None)
app.command(name="build-data")(build_data_command)
console = Console()


class Reference(StrEnum):
    gold = "gold"
    garbage = "garbage"
    endpoint = "endpoint"


def _load(source: SourceKind, path: Path | None) -> Text2SqlDataset:
    """The data set as a trial config's `data: {source: …, path: …}` names it; a bad folder is a usage error."""
    if source in (SourceKind.spider, SourceKind.bird) and path is None:
        raise typer.BadParameter(f"--path is required with --source {source.value}")
    try:
        data = DataSource(source=source, path=path)
    except ValidationError as error:
        raise typer.BadParameter(describe_validation_error(error, DataSource)) from None
    dataset = data.load()
    for note in dataset.notes:
        console.print(f"[yellow]{note}[/yellow]")
    return dataset


def _counts_table(dataset: Text2SqlDataset) -> Table:
    table = Table(title=f"{dataset.name}: examples per split, difficulty and form")
    table.add_column("split")
    for difficulty in Difficulty:
        table.add_column(difficulty.value, justify="right")
    table.add_column("total", justify="right")
    table.add_column("unseen form", justify="right")
    table.add_column("databases", justify="right")
    for name, examples in dataset.splits.items():
        counts = Counter(e.difficulty for e in examples)
        databases = len({e.db_id for e in examples})
        unseen = "-" if all(e.form is None for e in examples) else str(sum(e.form == "unseen" for e in examples))
        table.add_row(name, *(str(counts[d]) for d in Difficulty), str(len(examples)), unseen, str(databases))
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
    for form, accuracy in report.accuracy_by_form.items():
        correct, total = report.counts_by_form(form)
        row = (f"{form} form", str(correct), str(total), "-" if accuracy is None else f"{accuracy:.1%}")
        table.add_row(*row, style="italic")
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
    source: SourceKind = SourceKind.bundled,
    path: Annotated[Path | None, typer.Option(help="Spider/BIRD folder")] = None,
) -> None:
    """Count examples per split, difficulty and question form."""
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
    eval_size: Annotated[
        int | None, typer.Option(help="evaluate the held-out subset a trial of this eval_size evaluates")
    ] = None,
    eval_seed: Annotated[int, typer.Option(help="with --eval-size: the trial's eval_seed")] = 0,
    max_tokens: Annotated[int, typer.Option(help="longest answer, with --model endpoint")] = 256,
    stop: Annotated[list[str] | None, typer.Option(help="stop string (repeatable), with --model endpoint")] = None,
    report_path: Annotated[Path | None, typer.Option("--report", help="also write the report as JSON here")] = None,
    source: SourceKind = SourceKind.bundled,
    path: Annotated[Path | None, typer.Option(help="Spider/BIRD folder, with --source spider/bird")] = None,
) -> None:
    """Execution accuracy of a model on a split, by difficulty and by question form (seen in training or not)."""
    dataset = _load(source, path)
    chosen: Model
    if model is Reference.endpoint:
        stops = tuple(stop) if stop else OpenAICompatibleModel.stop
        chosen = OpenAICompatibleModel(base_url=base_url, model=model_name, api=api, max_tokens=max_tokens, stop=stops)
    else:
        chosen = gold_model if model is Reference.gold else garbage_model
    held_out = None if eval_size is None else (eval_size, eval_seed)
    with Text2SqlTask(dataset) as task:
        try:
            report = evaluate(task, split, chosen, limit=limit, few_shot=few_shot, held_out=held_out)
        except SplitError as error:
            raise typer.BadParameter(str(error)) from None
    console.print(_report_table(report, f"{model.value} on {dataset.name}/{split}"))
    if report_path is not None:
        report_path.write_text(report.model_dump_json(indent=2))


# The agentic demo's reward: the answer, and how the episode went (SkyRL-SQL's -1 for no answer).
AGENTIC_DEMO_SPEC = (
    '{"components": [{"kind": "execution_match"}, {"kind": "executes", "weight": 0.1}, '
    '{"kind": "turn_penalty", "weight": 0.05}, {"kind": "failed_exploration", "weight": 0.1}, '
    '{"kind": "unanswered", "weight": 1.0}]}'
)


def _agentic_demo(task: Text2SqlTask, example: Example, spec: RewardSpec) -> None:
    """Scripted policies through the agentic environment: their transcripts and rewards."""
    max_turns = 3
    console.rule("an agentic prompt (one solved example, which explores once)")
    console.print(task.prompt(example, task.few_shot_examples(1, "train"), max_turns), markup=False)
    table = sorted(tables_used(example.gold_sql))[0]
    policies = {
        "explores, then answers": [f"Explore: SELECT * FROM {table} LIMIT 3;", f"Answer: {example.gold_sql};"],
        "a refused and a broken exploration, then a wrong answer": [
            "Explore: SELECT * FROM read_csv('/etc/passwd');",
            f"Explore: SELECT no_such_column FROM {table};",
            "Answer: SELECT 1;",
        ],
        "never answers": [f"Explore: SELECT COUNT(*) FROM {table};"] * max_turns,
        "malformed": ["I would look at the data first."],
    }
    rewards = Table("policy", "reward", "correct", "turns", *(c.kind for c in spec.components))
    for name, turns in policies.items():
        episode = task.episode(example, max_turns)
        for turn in turns:
            if episode.done:
                break
            episode.step(turn)
        console.rule(f"transcript: {name}")
        console.print(episode.transcript(), markup=False)
        [score] = task.score_episodes([episode], spec)
        rewards.add_row(
            name,
            f"{score.reward:.3f}",
            str(score.correct),
            str(len(episode.turns)),
            *(f"{score.components[c.kind]:.3f}" for c in spec.components),
        )
    console.print(f"question: {example.question}\ngold: {example.gold_sql}")
    console.print(rewards)


@app.command()
def demo(
    reward_spec: Annotated[str | None, typer.Option(help="reward spec as JSON")] = None,
    agentic: Annotated[bool, typer.Option(help="the agentic environment: explorations, then an answer")] = False,
) -> None:
    """Tour of the task: the data, a prompt, rewards for a few completions, and the reference baselines (with
    --agentic: scripted episodes of the agentic environment, their transcripts and rewards)."""
    default = AGENTIC_DEMO_SPEC if agentic else DEFAULT_REWARD_SPEC.to_json()
    spec = RewardSpec.parse(reward_spec or default)
    dataset = load_bundled()
    if agentic:
        with Text2SqlTask(dataset) as task:
            _agentic_demo(task, dataset.split("dev")[0], spec)
        return
    console.print(_counts_table(dataset))
    example = dataset.split("dev")[0]
    with Text2SqlTask(dataset) as task:
        console.rule("a prompt (one few-shot example)")
        console.print(task.prompt(example, task.few_shot_examples(1, "train")), markup=False)
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
