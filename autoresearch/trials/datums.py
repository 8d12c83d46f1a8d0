"""Training datums in tinker-cookbook's layout: the full sequence shifted by one, prompt positions inert.

For a prompt P (length p) and a completion C (length c) with sampling log-probs L and per-token advantages A,
the full sequence is S = P + C and (tinker_cookbook/rl/data_processing.py, `trajectory_to_data`):

    model_input   = S[:-1]                      length p + c - 1
    target_tokens = S[1:]                       position i predicts S[i + 1]
    logprobs      = ([0] * p + L)[1:]           the sampler's log-prob of each target
    advantages    = ([0] * p + A)[1:]           0 on prompt targets: no policy gradient there

The cookbook's extra `mask` key is dropped before sending (`_remove_mask` in its rl/train.py), so the datum
carries exactly the inputs Tinker's RL losses document: target_tokens, logprobs, advantages.
"""

from __future__ import annotations

from collections.abc import Sequence

from tinker import types


def rl_datum(
    prompt_tokens: Sequence[int],
    completion_tokens: Sequence[int],
    completion_logprobs: Sequence[float],
    completion_advantages: Sequence[float],
    prompt_logprobs: Sequence[float | None] | None = None,
) -> types.Datum:
    """A policy-gradient datum for one sampled completion.

    `prompt_logprobs` (the sampler's log-probs of the prompt tokens, the first None) replace the cookbook's zeros
    on prompt targets. The loss must then see no change there: a zero advantage already silences
    importance_sampling, ppo and cispo, but DRO's penalty `(logp - logprobs)^2` does not, and with zeros it would
    pull every prompt token's log-prob towards 0, i.e. train on the prompt.
    """
    if not completion_tokens:
        raise ValueError("a datum needs at least one completion token")
    if not len(completion_tokens) == len(completion_logprobs) == len(completion_advantages):
        raise ValueError(
            f"completion of {len(completion_tokens)} tokens with {len(completion_logprobs)} log-probs and "
            f"{len(completion_advantages)} advantages"
        )
    tokens = [*prompt_tokens, *completion_tokens]
    if prompt_logprobs is None:
        prompt_logprobs = [0.0] * len(prompt_tokens)
    elif len(prompt_logprobs) != len(prompt_tokens):
        raise ValueError(f"{len(prompt_logprobs)} prompt log-probs for a prompt of {len(prompt_tokens)} tokens")
    logprobs = [0.0 if lp is None else lp for lp in prompt_logprobs] + list(completion_logprobs)
    advantages = [0.0] * len(prompt_tokens) + list(completion_advantages)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "logprobs": logprobs[1:], "advantages": advantages[1:]},
    )


def supervised_datum(prompt_tokens: Sequence[int], completion_tokens: Sequence[int]) -> types.Datum:
    """A cross-entropy datum that trains only the completion: weight 0 on prompt targets, 1 on the completion."""
    tokens = [*prompt_tokens, *completion_tokens]
    weights = [0.0] * len(prompt_tokens) + [1.0] * len(completion_tokens)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights[1:]},
    )
