"""Our backend against TRL's GRPOTrainer, the in-process peer a user would otherwise pick, on the same RL job.

Run: python -m benchmarks.against_trl [--model google/gemma-3-270m] [--steps 3]   (needs: pip install -e ".[trl]")

Both sides: the same base model (fp32, CPU), LoRA rank 8 on attention and MLP, 2 text-to-SQL prompts × 4
completions per step, at most 48 new tokens stopping only at EOS, temperature 1, no KL term, learning rate 1e-5,
and the same reward function (the task's default reward spec, scored on DuckDB).

1. One job: TRL's seconds per step (median after the first) against ours (`python -m autoresearch.trials` against
   a local backend; the step time from its metrics). Target: ours ≤ 0.7× TRL's.
2. Three jobs: three of our trials at once on one backend (makespan from launch to the last exit, the backend
   already loaded) against TRL running the three one after another (3 × its training time). Target: ≥ 2×.

Each side runs in its own process, one after the other, so neither competes with the other for the CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from autoresearch.trials.backend import local_backend
from benchmarks import command_line
from benchmarks.against_commit import run_module
from benchmarks.duty_cycle import launch, wait

TRL_FLAG = "--trl-measure"
PROMPTS_PER_STEP = 2
GROUP = 4
MAX_NEW_TOKENS = 48
LORA_RANK = 8
LEARNING_RATE = 1e-5


def measure_trl(model: str, steps: int) -> dict:
    """TRL's GRPOTrainer for `steps` steps in this process: per-step seconds and the total training time."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from autoresearch.trials.data import PromptRenderer, split_of
    from tasks.text2sql.reward.rewards import DEFAULT_REWARD_SPEC
    from tasks.text2sql.task import Text2SqlTask
    from trainer_backend.models.registry import default_cache_root, resolve_base_model

    torch.manual_seed(0)
    folder = resolve_base_model(model, default_cache_root()).folder
    tokenizer = AutoTokenizer.from_pretrained(folder)
    task = Text2SqlTask.bundled()
    renderer = PromptRenderer(task, tokenizer, few_shot=0, shots_split="train")
    examples = {e.id: e for e in split_of(task, "train", "train_split")[: PROMPTS_PER_STEP * (steps + 1)]}
    prompts = Dataset.from_list(
        [
            {"prompt": tokenizer.decode(renderer.prompt(e).tokens, skip_special_tokens=True), "example_id": e.id}
            for e in examples.values()
        ]
    )

    def text_to_sql_reward(prompts: list[str], completions: list[str], example_id: list[str], **_: object) -> list:
        episodes = [task.one_step(examples[i], c) for i, c in zip(example_id, completions, strict=True)]
        return [score.reward for score in task.score_episodes(episodes, DEFAULT_REWARD_SPEC)]

    step_seconds: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            step_seconds.append(time.perf_counter() - self.started)

    with tempfile.TemporaryDirectory(prefix="trl-") as output:
        config = GRPOConfig(
            output_dir=output,
            per_device_train_batch_size=PROMPTS_PER_STEP * GROUP,
            num_generations=GROUP,
            max_completion_length=MAX_NEW_TOKENS,
            learning_rate=LEARNING_RATE,
            beta=0.0,
            temperature=1.0,
            max_steps=steps,
            use_cpu=True,
            bf16=False,
            report_to="none",
            logging_steps=1,
            save_strategy="no",
            seed=0,
        )
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32),
            reward_funcs=text_to_sql_reward,
            args=config,
            train_dataset=prompts,
            processing_class=tokenizer,
            peft_config=LoraConfig(
                r=LORA_RANK,
                lora_alpha=32,
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            ),
            callbacks=[StepTimer()],
        )
        started = time.perf_counter()
        trainer.train()
        total = time.perf_counter() - started
    task.close()
    return {"step_seconds": step_seconds, "total_seconds": total}


def our_config(model: str, steps: int, folder: Path) -> Path:
    config = {
        "base_model": model,
        "lora_rank": LORA_RANK,
        "train_unembed": False,
        "learning_rate": LEARNING_RATE,
        "batch_size": PROMPTS_PER_STEP,
        "group_size": GROUP,
        "temperature": 1.0,
        "max_tokens": MAX_NEW_TOKENS,
        "stop": [],
        "steps": steps,
        "warmup_steps": 0,
        "few_shot": 0,
        "eval_size": 1,
        "eval_interval": 0,
        "checkpoint_interval": steps,
    }
    path = folder / "ours.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def step_times(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step_time_s"] for line in lines]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(TRL_FLAG, action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="google/gemma-3-270m")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    if args.trl_measure:
        print(json.dumps(measure_trl(args.model, args.steps)))
        return

    from rich.console import Console

    console = Console(width=120)
    with console.status("TRL GRPOTrainer (own process)"):
        trl = run_module("benchmarks.against_trl", [TRL_FLAG, "--model", args.model, "--steps", str(args.steps)])
    trl_step = statistics.median(trl["step_seconds"][1:] or trl["step_seconds"])

    with tempfile.TemporaryDirectory(prefix="ours-") as scratch:
        folder = Path(scratch)
        config = our_config(args.model, args.steps, folder)
        with local_backend(args.model, folder / "backend") as url:
            with console.status("ours: one trial"):
                wait(launch(config, url, folder, "one"), folder, "one")
            ours = step_times(folder / "one")
            with console.status("ours: three trials at once"):
                started = time.monotonic()
                processes = [launch(config, url, folder, f"three-{i}") for i in range(3)]
                finished = max(wait(p, folder, f"three-{i}") for i, p in enumerate(processes))
            three_makespan = finished - started
    our_step = statistics.median(ours[1:] or ours)

    console.print(
        f"{args.model}, LoRA r={LORA_RANK}, {PROMPTS_PER_STEP} prompts × {GROUP} completions × ≤{MAX_NEW_TOKENS} "
        f"tokens, {args.steps} steps, CPU fp32"
    )
    console.print(
        f"one job: TRL {trl_step:.1f} s/step (steps {', '.join(f'{s:.1f}' for s in trl['step_seconds'])}); ours "
        f"{our_step:.1f} s/step (steps {', '.join(f'{s:.1f}' for s in ours)}); ratio ours ÷ TRL "
        f"{our_step / trl_step:.2f} (target ≤ 0.70)"
    )
    console.print(
        f"three jobs: TRL one after another {3 * trl['total_seconds']:.0f} s (3 × {trl['total_seconds']:.0f} s); "
        f"ours at once {three_makespan:.0f} s; speed-up {3 * trl['total_seconds'] / three_makespan:.2f}× "
        "(target ≥ 2)"
    )
    console.print(command_line("benchmarks.against_trl"))


if __name__ == "__main__":
    main()
