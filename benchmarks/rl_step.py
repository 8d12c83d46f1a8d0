"""One RL step of a shipped trial recipe on the backend as it shipped and on this tree, in the same run.

Run: python -m benchmarks.rl_step [--model google/gemma-3-270m | Qwen/Qwen2.5-Coder-0.5B-Instruct |
     Qwen/Qwen2.5-Coder-1.5B-Instruct] [--shipped REV] [--steps 2] [--max-backend-gib 20]

The step is the trial's own (`autoresearch.trials`, the client code of this tree), with the model's recipe:
- Gemma 3 270M (`experiments/trials/text2sql_gemma.yaml`: zero-shot prompts of about 275 tokens): 8 prompts × 4
  completions of at most 64 new tokens; shipped = 8945e16, main before issue 13 (RL steps 3x cheaper).
- Qwen2.5-Coder-0.5B-Instruct (`experiments/trials/text2sql_qwen.yaml`: chat prompts of about 300 tokens): 8 prompts
  × 8 completions of at most 96 new tokens; shipped = c486ff1, main before issue 26 (the engine's fast paths for
  every model, micro-batched training).
- Qwen2.5-Coder-1.5B-Instruct (`experiments/trials/text2sql_qwen15.yaml`: the same prompts and shape as the 0.5B's);
  no shipped server to compare with by default (it arrived after the engine's fast paths): this tree alone, unless
  `--shipped` names a commit.
At temperature 1, scored, one forward_backward (importance sampling) and one optim_step on a LoRA rank-16 adapter,
then the next sampler's weights saved. The only difference between the two runs is the server: `--shipped` is
checked out into a temporary directory and its `python -m trainer_backend serve` runs from there, on the model's
converted folder. A small length penalty is added to the reward to give every group a spread of rewards and the step
its full forward_backward.

Prints, per server: the last step's time, its sampling time and what the rest (scoring, forward_backward,
optim_step, saving) took, the tokens it sampled, and the backend's peak resident memory during the steps; then the
ratio of the two step times. A backend that grows past `--max-backend-gib` is stopped (the machine would otherwise
swap or kill), and its row says so.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from autoresearch.sdk_logging import quiet_sdk_logs
from autoresearch.trials.config import load_trial_config
from autoresearch.trials.rl_loop import run_trial
from benchmarks import ROOT
from benchmarks.against_commit import MemoryWatch, compared_trees, server_from
from tasks.text2sql.reward.rewards import RewardSpec
from trainer_backend.models.gemma import GEMMA_3_270M
from trainer_backend.models.qwen import QWEN_2_5_CODER_0_5B_INSTRUCT, QWEN_2_5_CODER_1_5B_INSTRUCT
from trainer_backend.models.registry import default_cache_root, resolve_base_model


@dataclass(frozen=True)
class Recipe:
    trial: Path
    shipped: str | None  # the commit whose server is measured against this tree; None: this tree alone
    group_size: int
    max_tokens: int


RECIPES = {
    GEMMA_3_270M: Recipe(ROOT / "experiments" / "trials" / "text2sql_gemma.yaml", "8945e16", 4, 64),
    QWEN_2_5_CODER_0_5B_INSTRUCT: Recipe(ROOT / "experiments" / "trials" / "text2sql_qwen.yaml", "c486ff1", 8, 96),
    QWEN_2_5_CODER_1_5B_INSTRUCT: Recipe(ROOT / "experiments" / "trials" / "text2sql_qwen15.yaml", None, 8, 96),
}
REWARD_WITH_SPREAD = RewardSpec.parse(
    {
        "components": [
            {"kind": "execution_match", "weight": 1.0},
            {"kind": "format", "weight": 0.1},
            {"kind": "length_penalty", "weight": 0.1, "free_chars": 0, "scale_chars": 400},
        ]
    }
)


def measure(tree: Path, workdir: Path, name: str, steps: int, recipe: Recipe, folder: Path, limit: int) -> dict:
    config = load_trial_config(recipe.trial).model_copy(
        update={
            "run_id": name,
            "base_model": str(folder),
            "steps": steps,
            "warmup_steps": 0,
            "batch_size": 8,
            "group_size": recipe.group_size,
            "max_tokens": recipe.max_tokens,
            "lora_rank": 16,
            "reward_spec": REWARD_WITH_SPREAD,
            "eval_size": 1,
            "eval_interval": 0,
            "checkpoint_interval": 1000,
        }
    )
    with server_from(tree, workdir / f"{name}-backend", folder) as (url, server), MemoryWatch(server, limit) as watch:
        # In a thread of its own: the SDK retries a vanished server for minutes, so a trial whose backend was stopped
        # for its memory is left behind rather than waited for.
        failures: list[BaseException] = []

        def trial() -> None:
            try:
                run_trial(config, url, workdir / "runs", progress=False)
            except BaseException as error:
                failures.append(error)

        runner = threading.Thread(target=trial, daemon=True)
        runner.start()
        while runner.is_alive() and not watch.exceeded:
            runner.join(1.0)
        if failures and not watch.exceeded:
            raise failures[0]
    if watch.exceeded:
        return {"exceeded": True, "peak_gib": watch.peak_bytes / 2**30}
    metrics = [json.loads(line) for line in (workdir / "runs" / name / "metrics.jsonl").read_text().splitlines()]
    last = metrics[-1]
    tokens = last["completion_tokens_mean"] * config.batch_size * config.group_size
    sampling_s = tokens / last["tokens_per_s"]
    return {
        "step_s": last["step_time_s"],
        "sampling_s": sampling_s,
        "tokens": tokens,
        "datums": last["datums"],
        "peak_gib": watch.peak_bytes / 2**30,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=GEMMA_3_270M, choices=sorted(RECIPES), help="base model and its recipe")
    parser.add_argument("--shipped", default=None, help="commit of the shipped server (default: the model's)")
    parser.add_argument("--steps", type=int, default=2, help="RL steps per server; the last one is reported")
    parser.add_argument("--max-backend-gib", type=float, default=20.0, help="stop a backend that grows past this")
    args = parser.parse_args()
    quiet_sdk_logs()
    recipe = RECIPES[args.model]
    shipped = args.shipped or recipe.shipped
    folder = resolve_base_model(args.model, default_cache_root()).folder
    limit = int(args.max_backend_gib * 2**30)

    from rich.console import Console
    from rich.table import Table

    console = Console(width=120)
    with tempfile.TemporaryDirectory() as scratch:
        workdir = Path(scratch)
        results = {}
        shape = f"8 prompts × {recipe.group_size} completions ≤ {recipe.max_tokens} tokens"
        with compared_trees(shipped, "shipped") as trees:
            for tree in trees:
                with console.status(f"{tree.name} server: {args.steps} RL steps of {shape} on {args.model}"):
                    results[tree.name] = measure(tree.folder, workdir, tree.name, args.steps, recipe, folder, limit)
    table = Table(title=f"one RL step, {args.model}, {shape}, LoRA rank 16")
    for column in ("server", "step s", "sampling s", "rest s", "tokens sampled", "datums", "backend peak GiB"):
        table.add_column(column, justify="right" if column != "server" else "left")
    for name, r in results.items():
        label = f"{name} ({shipped})" if name == "shipped" else "this tree"
        if r.get("exceeded"):
            table.add_row(label, f"stopped: past {args.max_backend_gib:g} GiB", "", "", "", "", f"{r['peak_gib']:.1f}")
            continue
        table.add_row(
            label,
            f"{r['step_s']:.1f}",
            f"{r['sampling_s']:.1f}",
            f"{r['step_s'] - r['sampling_s']:.1f}",
            f"{r['tokens']:.0f}",
            str(r["datums"]),
            f"{r['peak_gib']:.1f}",
        )
    console.print(table)
    if "shipped" in results and not any(r.get("exceeded") for r in results.values()):
        console.print(f"step time, new ÷ shipped: {results['new']['step_s'] / results['shipped']['step_s']:.2f}")
    shipped_flag = f" --shipped {shipped}" if shipped else ""
    console.print(
        f"command: python -m benchmarks.rl_step --model {args.model}{shipped_flag} --steps {args.steps} "
        f"--max-backend-gib {args.max_backend_gib:g}"
    )


if __name__ == "__main__":
    main()
