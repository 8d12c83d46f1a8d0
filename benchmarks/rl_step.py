"""One RL step of the shipped Gemma trial on the backend as it shipped and on this tree, in the same run.

Run: python benchmarks/rl_step.py [--shipped 8945e16] [--steps 2]

The step is the trial's own (`autoresearch.trials`, the client code of this tree): 8 prompts of the shipped Gemma
trial (`experiments/trials/text2sql_gemma.yaml`: zero-shot prompts of about 275 tokens) × 4 completions of at most
64 new tokens at temperature 1, scored, one forward_backward (importance sampling) and one optim_step on a LoRA
rank-16 adapter, then the next sampler's weights saved. The only difference between the two runs is the server:
`--shipped` is checked out into a temporary git worktree and its `python -m trainer_backend serve` runs from there.
A fresh adapter is the base model, whose answers are all wrong, so a small length penalty is added to the reward to
give every group a spread of rewards and the step its full forward_backward.

Prints, per server: the last step's time, its sampling time and what the rest (scoring, forward_backward,
optim_step, saving) took, and the tokens it sampled; then the ratio of the two step times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autoresearch.sdk_logging import quiet_sdk_logs  # noqa: E402
from autoresearch.trials.backend import free_port, wait_until_healthy  # noqa: E402
from autoresearch.trials.config import load_trial_config  # noqa: E402
from autoresearch.trials.rl_loop import run_trial  # noqa: E402
from tasks.text2sql.rewards import RewardSpec  # noqa: E402

# main before the work of issue 13 (RL steps 3x cheaper): the code path the trial shipped with.
SHIPPED_COMMIT = "8945e16"
GEMMA_TRIAL = ROOT / "experiments" / "trials" / "text2sql_gemma.yaml"
REWARD_WITH_SPREAD = RewardSpec.parse(
    {
        "components": [
            {"kind": "execution_match", "weight": 1.0},
            {"kind": "format", "weight": 0.1},
            {"kind": "length_penalty", "weight": 0.1, "free_chars": 0, "scale_chars": 400},
        ]
    }
)


@contextmanager
def server_from(tree: Path, storage: Path) -> Iterator[str]:
    """`python -m trainer_backend serve` for Gemma 3 270M with the code of `tree`, on a free loopback port."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    storage.mkdir(parents=True, exist_ok=True)
    log_path = storage / "server.log"
    command = [sys.executable, "-m", "trainer_backend", "serve", "--base-model", "google/gemma-3-270m"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--storage-root", str(storage)]
    environment = {**os.environ, "PYTHONPATH": str(tree)}
    with log_path.open("ab") as log:
        server = subprocess.Popen(command, cwd=tree, env=environment, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until_healthy(server, url, log_path, 900.0)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=60)


@contextmanager
def worktree_at(commit: str, folder: Path) -> Iterator[Path]:
    """This repository's `commit`, checked out (detached) into `folder` for as long as the block runs."""
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), commit], check=True, capture_output=True
    )
    try:
        yield folder
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(folder)], check=False)


def measure(tree: Path, workdir: Path, name: str, steps: int) -> dict:
    config = load_trial_config(GEMMA_TRIAL).model_copy(
        update={
            "run_id": name,
            "steps": steps,
            "warmup_steps": 0,
            "batch_size": 8,
            "group_size": 4,
            "max_tokens": 64,
            "lora_rank": 16,
            "reward_spec": REWARD_WITH_SPREAD,
            "eval_size": 1,
            "eval_interval": 0,
            "checkpoint_interval": 1000,
        }
    )
    with server_from(tree, workdir / f"{name}-backend") as url:
        run_trial(config, url, workdir / "runs", progress=False)
    metrics = [json.loads(line) for line in (workdir / "runs" / name / "metrics.jsonl").read_text().splitlines()]
    last = metrics[-1]
    tokens = last["completion_tokens_mean"] * config.batch_size * config.group_size
    sampling_s = tokens / last["tokens_per_s"]
    return {"step_s": last["step_time_s"], "sampling_s": sampling_s, "tokens": tokens, "datums": last["datums"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shipped", default=SHIPPED_COMMIT, help="commit of the shipped server")
    parser.add_argument("--steps", type=int, default=2, help="RL steps per server; the last one is reported")
    args = parser.parse_args()
    quiet_sdk_logs()

    from rich.console import Console
    from rich.table import Table

    console = Console(width=120)
    with tempfile.TemporaryDirectory() as scratch:
        workdir = Path(scratch)
        results = {}
        with worktree_at(args.shipped, workdir / "shipped") as shipped_tree:
            for name, tree in (("shipped", shipped_tree), ("new", ROOT)):
                with console.status(f"{name} server: {args.steps} RL steps of 8 × 4 on Gemma 3 270M"):
                    results[name] = measure(tree, workdir, name, args.steps)
    table = Table(title="one RL step, Gemma 3 270M, 8 prompts × 4 completions ≤ 64 tokens, LoRA rank 16")
    for column in ("server", "step s", "sampling s", "rest s", "tokens sampled", "datums"):
        table.add_column(column, justify="right" if column != "server" else "left")
    for name, r in results.items():
        table.add_row(
            f"{name} ({args.shipped})" if name == "shipped" else "this tree",
            f"{r['step_s']:.1f}",
            f"{r['sampling_s']:.1f}",
            f"{r['step_s'] - r['sampling_s']:.1f}",
            f"{r['tokens']:.0f}",
            str(r["datums"]),
        )
    console.print(table)
    console.print(f"step time, new ÷ shipped: {results['new']['step_s'] / results['shipped']['step_s']:.2f}")
    console.print(f"command: python benchmarks/rl_step.py --shipped {args.shipped} --steps {args.steps}")


if __name__ == "__main__":
    main()
