"""Where a trial's RL went: its checkpoints on new databases and on new questions of the training databases.

Run: python -m benchmarks.rl_transfer --run-dir .data/trials/<run_id> --backend-url URL \
        --checkpoint start=tinker://…/weights/warmup-000080 --checkpoint final=tinker://…/sampler_weights/final-000030

A trial's held-out score is on the dev split, whose databases it never trains on; its training reward is on new
questions over the training databases, sampled at the training temperature. This scores each named checkpoint
(training weights or sampler weights on the backend that holds them) on both, to tell apart what RL can have
learned:
- `dev`: the trial's own held-out questions (its config's eval split and seed; `--dev-size` of them), greedy;
- `train-new`: the next `--questions` questions of the trial's training order after those it consumed (never
  trained or rewarded on; the same databases), greedy;
- with `--split NAME` (repeatable), the whole of another split, greedy: `--split test` scores the split no recipe
  was ever chosen on, the unbiased check of a recipe picked by its dev score;
- with `--samples K`, the same sets again, K completions each at the trial's temperature, scored as the mean
  accuracy of the samples: what the training reward sees. A gain there without one in greedy accuracy is RL
  making the sampled answers more like the greedy one (sharper), not making the greedy answer better.
Every checkpoint is compared with the first, question by question (McNemar's exact test on the greedy answers).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import tinker
from rich.table import Table
from tinker import types

from autoresearch.sdk_logging import quiet_sdk_logs
from autoresearch.trials.backend import api_key
from autoresearch.trials.config import TrialConfig, load_trial_config
from autoresearch.trials.data import PromptRenderer, TrainingOrder, held_out_subset, split_of, training_examples
from autoresearch.trials.evaluation import evaluate_sampler
from autoresearch.trials.paired import compare
from autoresearch.trials.run_dir import RunDirectory
from benchmarks import command_line
from tasks.interface import TaskExample
from tasks.registry import open_task
from tasks.report import HeldOutReport

# A checkpoint "path" that names the untrained base model.
BASE = "base"


def sampler_for(service: tinker.ServiceClient, path: str, base_model: str) -> tinker.SamplingClient:
    """A sampling client of sampler weights, of training weights (through a training client loaded from them), or of
    the base model itself for the path `base` (where a trial without a warm-up starts)."""
    if path == BASE:
        return service.create_sampling_client(base_model=base_model).result()
    if "/sampler_weights/" in path:
        return service.create_sampling_client(model_path=path).result()
    training = service.create_training_client_from_state(path).result()
    return training.save_weights_and_get_sampling_client().result()


def _form_table(
    greedy: dict[str, dict[str, HeldOutReport]], first: str, question_sets: dict[str, list], title: str
) -> tuple[Table, dict[str, dict]] | None:
    """Seen-form and unseen-form accuracy apart, for the question sets whose questions say their form."""
    first_reports = greedy[first]
    forms = {
        set_name: [form for form, accuracy in first_reports[set_name].accuracy_by_form.items() if accuracy is not None]
        for set_name in question_sets
    }
    forms = {set_name: names for set_name, names in forms.items() if names}
    if not forms:
        return None
    table = Table(title=title)
    table.add_column("checkpoint")
    for set_name, names in forms.items():
        for form in names:
            questions = first_reports[set_name].counts_by_form(form)[1]
            table.add_column(f"{set_name} {form} form ({questions})", justify="right")
            table.add_column(f"vs {first}: gained/lost, p", justify="right")
    record = {}
    for name, reports in greedy.items():
        cells = [name]
        for set_name, names in forms.items():
            for form in names:
                paired = compare(first_reports[set_name], reports[set_name], form)
                cells += [
                    f"{paired.accuracy_after:.1%}",
                    "" if name == first else paired.summary(),
                ]
                record[f"{name}/{set_name}/{form}"] = {
                    "greedy": paired.accuracy_after,
                    "gained": paired.gained,
                    "lost": paired.lost,
                    "p_value": paired.p_value,
                }
        table.add_row(*cells)
    return table, record


def sampled_accuracy(
    sampler: tinker.SamplingClient,
    renderer: PromptRenderer,
    examples: list[TaskExample],
    config: TrialConfig,
    samples: int,
) -> float:
    """Mean execution accuracy of `samples` completions per question at the trial's training temperature."""
    params = types.SamplingParams(max_tokens=config.max_tokens, temperature=config.temperature, stop=list(config.stop))
    futures = [
        sampler.sample(types.ModelInput.from_ints(list(renderer.prompt(e).tokens)), samples, params) for e in examples
    ]
    episodes = [
        renderer.task.one_step(example, renderer.decode(sequence.tokens))
        for example, future in zip(examples, futures, strict=True)
        for sequence in future.result().sequences
    ]
    marks = renderer.task.judge_episodes(episodes)
    return sum(marks) / len(marks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", type=Path, required=True, help="the trial's run directory")
    parser.add_argument("--backend-url", required=True, help="the backend that holds the checkpoints")
    parser.add_argument(
        "--checkpoint",
        action="append",
        required=True,
        help="NAME=tinker://… or NAME=base (the untrained base model); the first is compared against",
    )
    parser.add_argument("--dev-size", type=int, help="held-out questions (default: the trial's eval_size; 0: none)")
    parser.add_argument("--questions", type=int, default=200, help="new questions of the training databases (0: none)")
    parser.add_argument("--samples", type=int, default=0, help="also the mean accuracy of K samples per question")
    parser.add_argument("--split", action="append", default=[], help="also the whole of this split (e.g. test)")
    args = parser.parse_args()
    quiet_sdk_logs()

    from rich.console import Console

    directory = RunDirectory(args.run_dir)
    config = load_trial_config(directory.config_path)
    state = directory.load_state()
    consumed = state.data_position if state is not None else 0
    task = open_task(config.task, config.data)
    order = TrainingOrder(training_examples(task, config, excluded=()), config.seed)
    dev_size = config.eval_size if args.dev_size is None else args.dev_size
    question_sets = {
        "dev": list(held_out_subset(task, config.eval_split, dev_size, config.eval_seed)) if dev_size else [],
        "train-new": order.batch(consumed, args.questions),
        **{name: list(split_of(task, name, "--split")) for name in args.split},
    }
    question_sets = {name: examples for name, examples in question_sets.items() if examples}
    checkpoints = dict(entry.split("=", 1) for entry in args.checkpoint)
    console = Console(width=120)
    greedy: dict[str, dict[str, HeldOutReport]] = {}
    sampled: dict[str, dict[str, float]] = {}
    with tinker.ServiceClient(base_url=args.backend_url, api_key=api_key()) as service, task:
        tokenizer = service.create_lora_training_client(base_model=config.base_model, rank=1).result().get_tokenizer()
        renderer = PromptRenderer(
            task, tokenizer, config.few_shot, config.train_split, prompt_format=config.prompt_format
        )
        for name, path in checkpoints.items():
            sampler = sampler_for(service, path, config.base_model)
            for set_name, examples in question_sets.items():
                with console.status(f"{name}: {set_name}, {len(examples)} questions"):
                    greedy.setdefault(name, {})[set_name] = evaluate_sampler(
                        sampler, renderer, examples, set_name, config.max_tokens, config.stop, 0
                    )
                    if args.samples:
                        sampled.setdefault(name, {})[set_name] = sampled_accuracy(
                            sampler, renderer, examples, config, args.samples
                        )
    first = next(iter(checkpoints))
    table = Table(title=f"{args.run_dir.name}: greedy accuracy (and mean sampled accuracy) by question set")
    table.add_column("checkpoint")
    for set_name, examples in question_sets.items():
        table.add_column(f"{set_name} ({len(examples)}) greedy", justify="right")
        if args.samples:
            table.add_column(f"{set_name} sampled ×{args.samples}, T={config.temperature:g}", justify="right")
        table.add_column(f"{set_name} vs {first}: gained/lost, p", justify="right")
    record = {}
    for name in checkpoints:
        cells = [name]
        for set_name in question_sets:
            report = greedy[name][set_name]
            cells.append(f"{report.accuracy:.1%}")
            if args.samples:
                cells.append(f"{sampled[name][set_name]:.1%}")
            paired = compare(greedy[first][set_name], report)
            cells.append("" if name == first else paired.summary())
            record[f"{name}/{set_name}"] = {
                "greedy": report.accuracy,
                "sampled": sampled.get(name, {}).get(set_name),
                "gained": paired.gained,
                "lost": paired.lost,
                "p_value": paired.p_value,
            }
        table.add_row(*cells)
    console.print(table)
    by_form = _form_table(greedy, first, question_sets, title=f"{args.run_dir.name}: greedy accuracy by question form")
    if by_form is not None:
        table, form_record = by_form
        console.print(table)
        record |= form_record
    console.print(json.dumps(record))
    console.print(command_line("benchmarks.rl_transfer"))


if __name__ == "__main__":
    main()
