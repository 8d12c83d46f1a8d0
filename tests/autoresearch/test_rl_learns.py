"""RL that learns: the trial's own GRPO loop, RL only, raises a reward the tiny random model can learn, under each
built-in loss; and a client-side loss through `forward_backward_custom` does the same.

The reward is the length penalty alone (free_chars 0): the shorter the completion, the higher the reward, in
[-1, 0]. The random model stops early now and then (EOS, or a ';' the stop strings catch), so every group has a
spread of rewards and the policy can learn to stop sooner. Measured: the mean reward goes from about -0.77 over the
first steps to about -0.05 over the last ones under every loss (20 steps of 8 prompts × 8 completions).

The margin: each step's mean is over 64 completions whose rewards lie in [-1, 0] (std at most 0.5), so the mean of 5
steps has a standard error of at most 0.5 / sqrt(320) = 0.028, and the difference of two such means at most 0.04.
The tests ask for a gain of 0.3 (more than 7 of those standard errors) and, from the data, more than 6 measured
standard errors. A sign error in the advantages (the policy would learn to ramble on), advantages on the wrong
positions, a loss that ignores its inputs or an optimizer step that does nothing each leave the reward where it
started or push it down, and fail these tests.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import tinker
import torch
from tinker import types

from autoresearch.trials.advantages import group_advantages
from autoresearch.trials.backend import api_key
from autoresearch.trials.config import TrialConfig
from autoresearch.trials.rl_loop import run_trial
from tasks.text2sql.reward.rewards import RewardSpec

SHORTER_IS_BETTER = RewardSpec.parse(
    {"components": [{"kind": "length_penalty", "weight": 1.0, "free_chars": 0, "scale_chars": 40}]}
)
STEPS = 20
COMPARED_STEPS = 5
MIN_GAIN = 0.3
MIN_GAIN_IN_STANDARD_ERRORS = 6.0


def assert_learned(step_means: Sequence[float], step_stds: Sequence[float], completions_per_step: int) -> None:
    first, last = step_means[:COMPARED_STEPS], step_means[-COMPARED_STEPS:]
    gain = statistics.mean(last) - statistics.mean(first)
    # Standard error of each 5-step mean from the per-step spreads, then of their difference.
    n = COMPARED_STEPS * completions_per_step
    first_se = math.sqrt(statistics.mean(s**2 for s in step_stds[:COMPARED_STEPS]) / n)
    last_se = math.sqrt(statistics.mean(s**2 for s in step_stds[-COMPARED_STEPS:]) / n)
    standard_error = math.hypot(first_se, last_se)
    curve = " ".join(f"{m:.2f}" for m in step_means)
    assert gain >= MIN_GAIN, f"reward gain {gain:.3f} < {MIN_GAIN}; curve: {curve}"
    assert gain > MIN_GAIN_IN_STANDARD_ERRORS * standard_error, (
        f"reward gain {gain:.3f} is within {MIN_GAIN_IN_STANDARD_ERRORS} standard errors ({standard_error:.3f})"
    )


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["importance_sampling", "ppo", "cispo", "dro"])
def test_the_trial_loop_learns_a_learnable_reward_under_each_loss(loss: str, backend_url: str, tmp_path: Path) -> None:
    config = TrialConfig(
        run_id=f"learns-{loss}",
        base_model="tiny-gemma3",
        lora_rank=8,
        learning_rate=5e-3,
        loss=loss,
        batch_size=8,
        group_size=8,
        max_tokens=16,
        steps=STEPS,
        warmup_steps=0,
        reward_spec=SHORTER_IS_BETTER,
        few_shot=0,
        eval_size=4,
        eval_interval=0,
        checkpoint_interval=STEPS,
    )
    run_trial(config, backend_url, tmp_path, progress=False)
    metrics = [json.loads(line) for line in (tmp_path / config.run_id / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert_learned([m["reward_mean"] for m in metrics], [m["reward_std"] for m in metrics], 64)


def importance_weighted_loss(
    advantages: Sequence[float], sampled_logprobs: Sequence[torch.Tensor], completion_starts: Sequence[int]
) -> Callable[[list[types.Datum], list[torch.Tensor]], tuple[torch.Tensor, dict[str, float]]]:
    """-sum(exp(logp - q) * A) over each completion's tokens, as a loss for `forward_backward_custom`."""

    def loss_fn(data: list[types.Datum], logprobs_list: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        loss = torch.zeros(())
        for logprobs_T, advantage, sampled_T, start in zip(
            logprobs_list, advantages, sampled_logprobs, completion_starts, strict=True
        ):
            loss = loss - (torch.exp(logprobs_T[start:] - sampled_T) * advantage).sum()
        return loss, {"pg_loss:sum": float(loss)}

    return loss_fn


@pytest.mark.slow
def test_a_client_side_loss_through_forward_backward_custom_learns(backend_url: str) -> None:
    """GRPO written by hand over the SDK: the policy-gradient loss runs on the client, the server only sees the
    cross-entropy weights the SDK derives from it. Reward: -tokens / max_tokens, so stopping sooner pays."""
    prompts, group_size, max_tokens = 8, 8, 16
    with tinker.ServiceClient(base_url=backend_url, api_key=api_key()) as service:
        training = service.create_lora_training_client(base_model="tiny-gemma3", rank=8, seed=0).result()
        tokenizer = training.get_tokenizer()
        prompt_tokens = [tokenizer.encode(f"Question {i}: how many rows? SQL:") for i in range(prompts)]
        means, stds = [], []
        for step in range(STEPS):
            sampler = training.save_weights_and_get_sampling_client().result()
            futures = [
                sampler.sample(
                    types.ModelInput.from_ints(tokens),
                    group_size,
                    types.SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=1000 * step + i),
                )
                for i, tokens in enumerate(prompt_tokens)
            ]
            datums, advantages, sampled_logprobs, starts = [], [], [], []
            rewards_all = []
            for tokens, future in zip(prompt_tokens, futures, strict=True):
                sequences = future.result().sequences
                rewards = [-len(s.tokens) / max_tokens for s in sequences]
                rewards_all += rewards
                group = group_advantages(rewards, normalize_std=False)
                if group is None:
                    continue
                for sequence, advantage in zip(sequences, group, strict=True):
                    full = [*tokens, *sequence.tokens]
                    datums.append(
                        types.Datum(
                            model_input=types.ModelInput.from_ints(full[:-1]),
                            loss_fn_inputs={"target_tokens": full[1:]},
                        )
                    )
                    advantages.append(advantage)
                    sampled_logprobs.append(torch.tensor(sequence.logprobs))
                    starts.append(len(tokens) - 1)
            means.append(statistics.mean(rewards_all))
            stds.append(statistics.pstdev(rewards_all))

            if datums:
                loss_fn = importance_weighted_loss(advantages, sampled_logprobs, starts)
                training.forward_backward_custom(datums, loss_fn).result()
                training.optim_step(types.AdamParams(learning_rate=5e-3)).result()
    assert_learned(means, stds, prompts * group_size)
