"""Does the model use the loop, and does it help? Agentic against single-turn on the same questions, and inside each
agentic episode its first query against its final answer.

Run: python -m benchmarks.agentic_loop --config experiments/trials/text2sql_qwen_agentic.yaml --backend-url URL \
        [--checkpoint NAME=tinker://…/sampler_weights/… ...] [--questions N] [--split dev]

For each checkpoint (by default `base`, the untrained model), greedy on the config's held-out questions (its eval
split, size and seed, or the first `--questions` of them), with the config's prompt format, stop and max_tokens:
- `single-turn`: one completion per question (the config with `mode: single_turn`);
- `agentic`: the config's episodes; the table says how many replies they took, how often the model ran more than
  one query and changed its query, and how often its first query alone would have been right;
- McNemar's exact test of agentic against single-turn (on seen and unseen question forms apart too, in the JSON
  line), and of the final answers against the first queries.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import tinker
from rich.console import Console
from rich.table import Table
from tinker import types

from autoresearch.sdk_logging import quiet_sdk_logs
from autoresearch.trials.backend import api_key
from autoresearch.trials.config import TrialConfig, load_trial_config
from autoresearch.trials.data import PromptRenderer, held_out_subset
from autoresearch.trials.paired import compare, compare_by_form
from autoresearch.trials.rollouts import sample_groups
from benchmarks import command_line
from benchmarks.rl_transfer import BASE, sampler_for
from tasks.interface import Episode, TaskExample
from tasks.registry import open_task
from tasks.text2sql.agentic.episode import Episode as AgenticEpisode
from tasks.text2sql.agentic.turns import TurnKind
from tasks.text2sql.task import Text2SqlTask

# The table's columns after the checkpoint's name.
COLUMNS = (
    "single-turn",
    "agentic",
    "agentic vs single: +/−, p",
    "first query",
    "final vs first: +/−, p",
    "replies",
    "≥2 queries",
    "changed query",
)


def greedy_episodes(
    sampler: tinker.SamplingClient, renderer: PromptRenderer, examples: Sequence[TaskExample], config: TrialConfig
) -> list[Episode]:
    """One greedy episode per question, as a trial's evaluation plays them."""
    params = types.SamplingParams(max_tokens=config.max_tokens, temperature=0.0, stop=list(config.stop))
    prompts = [renderer.prompt(example) for example in examples]
    return [group.episodes[0] for group in sample_groups(sampler, prompts, 1, [params] * len(prompts), renderer)]


def first_queries(task: Text2SqlTask, episodes: Sequence[AgenticEpisode]) -> list[Episode]:
    """Each agentic episode's first query as a single-turn answer (an empty one where it wrote none)."""
    answers = []
    for episode in episodes:
        queries = [turn.parsed.sql for turn in episode.turns if turn.parsed.kind is not TurnKind.MALFORMED]
        answers.append(task.one_step(episode.example, f" {queries[0]};" if queries else ""))
    return answers


def loop_use(episodes: Sequence[AgenticEpisode]) -> dict[str, float]:
    """How the episodes used the loop: replies taken, queries run, and whether the answer differs from the first."""
    replies = [len(e.turns) for e in episodes]
    ran = [sum(t.parsed.kind is TurnKind.EXPLORE for t in e.turns) for e in episodes]
    first = [next((t.parsed.sql for t in e.turns if t.parsed.kind is not TurnKind.MALFORMED), None) for e in episodes]
    changed = [
        e.answer is not None and q is not None and e.answer.split() != q.split()
        for e, q in zip(episodes, first, strict=True)
    ]
    return {
        "replies_mean": sum(replies) / len(episodes),
        "ran_a_query": sum(n >= 1 for n in ran) / len(episodes),
        "ran_two_or_more": sum(n >= 2 for n in ran) / len(episodes),
        "changed_query": sum(changed) / len(episodes),
        "answered": sum(e.answer is not None for e in episodes) / len(episodes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, required=True, help="an agentic trial config")
    parser.add_argument("--backend-url", required=True, help="a backend serving the config's base model")
    parser.add_argument(
        "--checkpoint", action="append", help="NAME=tinker://… or NAME=base (the untrained model; the default)"
    )
    parser.add_argument("--questions", type=int, help="the first N of the held-out questions (default: all)")
    parser.add_argument("--split", help="another held-out split (default: the config's eval_split)")
    args = parser.parse_args()
    quiet_sdk_logs()
    config = load_trial_config(args.config)
    if config.mode != "agentic":
        parser.error(f"{args.config}: mode is {config.mode!r}; give an agentic config")
    split = args.split or config.eval_split
    single_turn = config.model_copy(update={"mode": "single_turn"})
    checkpoints = dict(entry.split("=", 1) for entry in args.checkpoint or [f"{BASE}={BASE}"])
    console = Console(width=120)
    record: dict[str, dict[str, object]] = {}
    table = Table(title=f"{args.config.name} on {split}: greedy, agentic against single-turn")
    table.add_column("checkpoint")
    for column in COLUMNS:
        table.add_column(column, justify="right")
    with (
        tinker.ServiceClient(base_url=args.backend_url, api_key=api_key()) as service,
        open_task(config.task, config.data) as task,
    ):
        examples = list(held_out_subset(task, split, config.eval_size, config.eval_seed))[: args.questions]
        tokenizer = service.create_lora_training_client(base_model=config.base_model, rank=1).result().get_tokenizer()
        agentic_renderer = PromptRenderer.of_trial(task, tokenizer, config)
        single_renderer = PromptRenderer.of_trial(task, tokenizer, single_turn)
        for name, path in checkpoints.items():
            sampler = sampler_for(service, path, config.base_model)
            with console.status(f"{name}: single-turn, {len(examples)} questions"):
                single = task.report(split, greedy_episodes(sampler, single_renderer, examples, config))
            with console.status(f"{name}: agentic ({agentic_renderer.format}), {len(examples)} questions"):
                episodes = greedy_episodes(sampler, agentic_renderer, examples, config)
            agentic = task.report(split, episodes)
            first = task.report(split, first_queries(task, episodes))
            versus, loop = compare(single, agentic), compare(first, agentic)
            use = loop_use(episodes)
            record[name] = {
                "single_turn": single.accuracy,
                "agentic": agentic.accuracy,
                "first_query": first.accuracy,
                "agentic_vs_single": versus.model_dump(),
                "final_vs_first": loop.model_dump(),
                **use,
                # Seen and unseen question forms apart, where the data says (agentic against single-turn).
                "by_form": {form: c.model_dump() for form, c in compare_by_form(single, agentic).items()},
            }
            table.add_row(
                name,
                f"{single.accuracy:.1%}",
                f"{agentic.accuracy:.1%}",
                versus.summary(),
                f"{first.accuracy:.1%}",
                loop.summary(),
                f"{use['replies_mean']:.2f}",
                f"{use['ran_two_or_more']:.0%}",
                f"{use['changed_query']:.0%}",
            )
    console.print(table)
    console.print(json.dumps({"split": split, "questions": len(examples), **record}))
    console.print(command_line("benchmarks.agentic_loop"))


if __name__ == "__main__":
    main()
