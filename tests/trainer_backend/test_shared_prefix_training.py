"""A training pass computes a shared prefix once (the prompt of a group of completions), its completions in batches
of similar length, and its data in micro-batches within a memory budget, and still gives every datum the log-probs,
loss and gradients it gets alone; on a Gemma 3 and on a Qwen2."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from trainer_backend.engine.microbatches import plan_pieces
from trainer_backend.engine.model_engine import ModelEngine
from trainer_backend.engine.prefixes import GROUP_OVERHEAD_TOKENS, PrefixGroup, length_buckets, shared_prefix_groups
from trainer_backend.engine.types import (
    AdamSettings,
    DecodedDatum,
    ForwardBackwardCall,
    LoraSettings,
    SamplingRequest,
)
from trainer_backend.errors import UserInputError
from trainer_backend.models.loading import load_base_model
from trainer_backend.models.registry import resolve_base_model

# The tiny model's sliding window is 64 tokens: a 90-token prompt makes the suffixes attend through a truncated
# sliding-window cache, the case where a wrong mask would show.
PROMPT_TOKENS = 90


@pytest.fixture(scope="module", params=["tiny-gemma3", "tiny-qwen2"])
def engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ModelEngine:
    models = tmp_path_factory.mktemp("models")
    loaded = load_base_model(resolve_base_model(request.param, models), torch.device("cpu"), torch.float32)
    engine = ModelEngine(loaded)
    for name, seed in (("alice", 1), ("bob", 2)):
        engine.create_adapter(name, LoraSettings(rank=4, seed=seed))
        # One step so that LoRA B is not zero: the adapter then changes every hidden state, the prefix's included.
        ids = list(range(5, 45))
        datum = DecodedDatum(ids[:-1], {"target_tokens": torch.tensor(ids[1:]), "weights": torch.ones(len(ids) - 1)})
        engine.forward_backward(name, [datum], "cross_entropy", None, False)
        engine.optim_step(name, AdamSettings(learning_rate=0.05))
    return engine


def rl_group(seed: int, completions: int, loss_with_weights: bool = False) -> list[DecodedDatum]:
    """One prompt and several sampled completions of different lengths, advantages on the completion only."""
    rng = random.Random(seed)
    prompt = [rng.randrange(4, 500) for _ in range(PROMPT_TOKENS)]
    datums = []
    for c in range(completions):
        completion = [rng.randrange(4, 500) for _ in range(3 + 4 * c)]
        ids = prompt + completion
        n = len(ids) - 1
        advantages = torch.zeros(n)
        advantages[len(prompt) - 1 :] = rng.uniform(-1, 1)
        inputs = {
            "target_tokens": torch.tensor(ids[1:]),
            "logprobs": -torch.rand(n, generator=torch.Generator().manual_seed(seed + c)) * 4,
            "advantages": advantages,
        }
        if loss_with_weights:
            inputs["weights"] = (torch.arange(n) % 3 != 0).float()
        datums.append(DecodedDatum(ids[:-1], inputs))
    return datums


def adapter_gradients(engine: ModelEngine, name: str) -> list[torch.Tensor]:
    grads = [p.grad.clone() for p in engine.adapters.parameters(name)]
    engine.adapters.optimizers[name].zero_grad(set_to_none=True)
    return grads


def run(engine: ModelEngine, calls: list[ForwardBackwardCall]) -> list:
    outcomes = engine.forward_backward_batch(calls)
    assert all(not isinstance(o, Exception) for o in outcomes), outcomes
    return outcomes


def alone(engine: ModelEngine, call: ForwardBackwardCall) -> tuple[list[torch.Tensor], float, list[torch.Tensor]]:
    """Each datum in a call of its own: nothing is shared. Log-probs, summed loss and summed gradients."""
    logprobs, loss = [], 0.0
    for datum in call.datums:
        (result,) = run(engine, [ForwardBackwardCall(call.model_id, [datum], call.loss_fn, call.loss_fn_config, False)])
        logprobs.append(result.loss_fn_outputs[0]["logprobs"])
        loss += result.metrics["loss:sum"]
    return logprobs, loss, adapter_gradients(engine, call.model_id)


def assert_same(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    # fp32 sums over a few hundred terms in another order: a few ulps of values of order 1-10.
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("loss_fn", ["importance_sampling", "ppo", "cispo", "dro", "cross_entropy"])
def test_a_group_through_its_shared_prompt_matches_each_completion_alone(engine: ModelEngine, loss_fn: str) -> None:
    datums = rl_group(0, 4, loss_with_weights=loss_fn == "cross_entropy")
    if loss_fn == "cross_entropy":
        datums = [
            DecodedDatum(d.model_input_tokens, {k: d.loss_fn_inputs[k] for k in ("target_tokens", "weights")})
            for d in datums
        ]
    groups, alone_indices = shared_prefix_groups([d.model_input_tokens for d in datums])
    assert [g.members for g in groups] == [(0, 1, 2, 3)] and not alone_indices
    call = ForwardBackwardCall("alice", datums, loss_fn, None, False)
    (result,) = run(engine, [call])
    shared_grads = adapter_gradients(engine, "alice")
    want_logprobs, want_loss, want_grads = alone(engine, call)
    assert_same([o["logprobs"] for o in result.loss_fn_outputs], want_logprobs)
    assert result.metrics["loss:sum"] == pytest.approx(want_loss, rel=1e-4, abs=1e-5)
    assert_same(shared_grads, want_grads)
    assert any(float(g.abs().max()) > 0 for g in shared_grads)


def test_groups_of_two_clients_in_one_pass_each_get_their_own_gradients(engine: ModelEngine) -> None:
    calls = [
        ForwardBackwardCall("alice", rl_group(1, 3), "importance_sampling", None, False),
        ForwardBackwardCall("bob", rl_group(2, 3) + rl_group(3, 2), "importance_sampling", None, False),
    ]
    results = run(engine, calls)
    shared = {name: adapter_gradients(engine, name) for name in ("alice", "bob")}
    for call, result in zip(calls, results, strict=True):
        want_logprobs, want_loss, want_grads = alone(engine, call)
        assert_same([o["logprobs"] for o in result.loss_fn_outputs], want_logprobs)
        assert result.metrics["loss:sum"] == pytest.approx(want_loss, rel=1e-4, abs=1e-5)
        assert_same(shared[call.model_id], want_grads)


def test_several_targets_per_position_through_a_shared_prefix(engine: ModelEngine) -> None:
    datums = []
    for d in rl_group(4, 3):
        targets = d.loss_fn_inputs["target_tokens"]
        two_T2 = torch.stack([targets, (targets + 7) % 500], dim=1)
        datums.append(
            DecodedDatum(
                d.model_input_tokens, {"target_tokens": two_T2, "weights": torch.ones_like(two_T2, dtype=torch.float32)}
            )
        )
    call = ForwardBackwardCall("alice", datums, "cross_entropy", None, False)
    (result,) = run(engine, [call])
    shared_grads = adapter_gradients(engine, "alice")
    want_logprobs, _, want_grads = alone(engine, call)
    assert [tuple(o["logprobs"].shape) for o in result.loss_fn_outputs] == [
        tuple(d.loss_fn_inputs["target_tokens"].shape) for d in datums
    ]
    assert_same([o["logprobs"] for o in result.loss_fn_outputs], want_logprobs)
    assert_same(shared_grads, want_grads)


def test_micro_batches_within_a_small_budget_give_the_gradients_of_one_pass(engine: ModelEngine) -> None:
    datums = rl_group(5, 5) + rl_group(6, 3) + [rl_group(7, 1)[0]]
    call = ForwardBackwardCall("bob", datums, "importance_sampling", None, False)
    (whole,) = run(engine, [call])
    whole_grads = adapter_gradients(engine, "bob")
    budget = engine.training.piece_tokens
    # Less than one group: each group is split into parts of a few completions, in micro-batches of their own.
    engine.training.piece_tokens = PROMPT_TOKENS + 20
    embedded: list[tuple[int, ...]] = []
    hook = engine.loaded.model.get_input_embeddings().register_forward_hook(
        lambda _module, args, _output: embedded.append(tuple(args[0].shape))
    )
    try:
        (pieces,) = run(engine, [call])
    finally:
        engine.training.piece_tokens = budget
        hook.remove()
    # Each group's prompt went through the decoder once, whatever the number of its parts.
    groups, _ = shared_prefix_groups([d.model_input_tokens for d in datums])
    prompts = {(1, group.prefix_length) for group in groups}
    assert len(groups) == 2 and len([shape for shape in embedded if shape in prompts]) == 2
    assert_same([o["logprobs"] for o in pieces.loss_fn_outputs], [o["logprobs"] for o in whole.loss_fn_outputs])
    assert pieces.metrics["loss:sum"] == pytest.approx(whole.metrics["loss:sum"], rel=1e-4, abs=1e-5)
    assert_same(adapter_gradients(engine, "bob"), whole_grads)


def test_a_pass_that_pauses_between_micro_batches_for_other_adapters_work_gives_the_gradients_of_one_pass(
    engine: ModelEngine, tmp_path: Path
) -> None:
    """The scheduler runs other runs' work between a pass's micro-batches: a generation that makes another adapter
    active (and frozen), another adapter's pass. The paused pass's own results are those of one pass all the same."""
    datums = rl_group(5, 5) + rl_group(6, 3) + [rl_group(7, 1)[0]]
    call = ForwardBackwardCall("bob", datums, "importance_sampling", None, False)
    (whole,) = run(engine, [call])
    whole_grads = adapter_gradients(engine, "bob")
    weights = tmp_path / "alice-sampler"
    weights.mkdir()
    engine.save("alice", weights, include_optimizer=False)
    others = ForwardBackwardCall("alice", rl_group(8, 2), "importance_sampling", None, False)
    pauses = 0

    def others_work() -> None:
        nonlocal pauses
        pauses += 1
        (sampled,) = engine.sample_batch([SamplingRequest((5, 6, 7), max_tokens=3, weights_folder=weights)])
        assert not isinstance(sampled, Exception), sampled
        run(engine, [others])

    budget = engine.training.piece_tokens
    engine.training.piece_tokens = PROMPT_TOKENS + 20
    try:
        (paused,) = engine.forward_backward_batch([call], others_work)
    finally:
        engine.training.piece_tokens = budget
    assert pauses >= 2
    assert not isinstance(paused, Exception), paused
    assert_same([o["logprobs"] for o in paused.loss_fn_outputs], [o["logprobs"] for o in whole.loss_fn_outputs])
    assert paused.metrics["loss:sum"] == pytest.approx(whole.metrics["loss:sum"], rel=1e-4, abs=1e-5)
    assert_same(adapter_gradients(engine, "bob"), whole_grads)
    engine.adapters.optimizers["alice"].zero_grad(set_to_none=True)


def test_a_micro_batch_goes_through_the_output_head_once_besides_its_prompts(
    engine: ModelEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    datums = rl_group(10, 5) + rl_group(11, 3) + [rl_group(12, 1)[0]]
    call = ForwardBackwardCall("alice", datums, "importance_sampling", None, False)
    positions: list[int] = []
    head = engine.training._logprobs

    def counted(hidden_states: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        positions.append(hidden_states.shape[0] * hidden_states.shape[1])
        return head(hidden_states, *args, **kwargs)

    monkeypatch.setattr(engine.training, "_logprobs", counted)
    (result,) = run(engine, [call])
    adapter_gradients(engine, "alice")

    # The two prompts, then every bucket of completions and the lone datum in one call.
    groups, singles = shared_prefix_groups([d.model_input_tokens for d in datums])
    buckets = [length_buckets([len(datums[i].model_input_tokens) for i in g.members]) for g in groups]
    assert len(groups) == 2 and len(singles) == 1 and sum(map(len, buckets)) + len(singles) > 1
    assert len(positions) == len(groups) + 1
    assert len(result.loss_fn_outputs) == len(datums)


def test_a_bad_call_leaves_no_gradient_even_where_micro_batches_ran_before_it(engine: ModelEngine) -> None:
    good = ForwardBackwardCall("alice", rl_group(8, 3), "importance_sampling", None, False)
    broken = rl_group(9, 3)
    del broken[-1].loss_fn_inputs["advantages"]
    bad = ForwardBackwardCall("bob", broken, "importance_sampling", None, False)
    budget = engine.training.piece_tokens
    engine.training.piece_tokens = PROMPT_TOKENS + 20
    try:
        good_result, bad_result = engine.forward_backward_batch([good, bad])
    finally:
        engine.training.piece_tokens = budget
    assert isinstance(bad_result, UserInputError) and "advantages" in str(bad_result)
    assert all(p.grad is None for p in engine.adapters.parameters("bob"))
    assert not isinstance(good_result, Exception)
    adapter_gradients(engine, "alice")


def test_completions_of_a_group_are_batched_by_length() -> None:
    lengths = [3, 90, 5, 88, 4, 91, 2, 6]
    buckets = length_buckets(lengths)
    assert sorted(i for bucket in buckets for i in bucket) == list(range(len(lengths)))
    # The short and the long completions apart: padding all to 91 would compute 728 positions, this 2 × 91 + ...
    assert [sorted(lengths[i] for i in bucket) for bucket in buckets] == [[2, 3, 4, 5, 6], [88, 90, 91]]
    assert length_buckets([10, 11, 12]) == [[0, 1, 2]]


def test_pieces_hold_whole_groups_within_the_budget_and_split_a_group_larger_than_it() -> None:
    groups = [(0, PrefixGroup((0, 1, 2, 3), 50)), (1, PrefixGroup((0, 1), 50))]
    lengths = {(0, 0): 60, (0, 1): 60, (0, 2): 60, (0, 3): 60, (1, 0): 55, (1, 1): 58, (1, 2): 30, (1, 3): 20}
    alone = [(1, 2), (1, 3)]
    pieces = plan_pieces(alone, groups, lengths, token_budget=100)
    work = sorted((c, m) for p in pieces for c, g in p.groups for m in g.members) + sorted(
        k for p in pieces for k in p.alone
    )
    assert work == sorted((c, m) for c, g in groups for m in g.members) + sorted(alone)
    # The group of four (50 + 4 × 10 = 90) fits whole; with a budget of 70 it is split in two of 50 + 2 × 10.
    assert any(g.members == (0, 1, 2, 3) for p in pieces for _, g in p.groups)
    split = plan_pieces([], groups[:1], lengths, token_budget=70)
    assert [g.members for p in split for _, g in p.groups] == [(0, 1), (2, 3)]


def test_prefix_groups_keep_each_prompt_whole_when_all_prompts_share_a_header() -> None:
    rng = random.Random(0)
    header = [1] * 40
    prompts = [header + [rng.randrange(4, 500) for _ in range(60)] for _ in range(3)]
    sequences = [p + [rng.randrange(4, 500) for _ in range(5 + c)] for p in prompts for c in range(4)]
    sequences.append([7] * 30)
    groups, alone_indices = shared_prefix_groups(sequences)
    assert [g.members for g in groups] == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11)]
    assert all(g.prefix_length == 100 for g in groups)
    assert alone_indices == [12]


def test_a_prefix_is_shorter_than_every_member_and_short_prefixes_are_not_shared() -> None:
    base = list(range(10, 60))
    groups, alone_indices = shared_prefix_groups([base, [*base, 3], [*base[:GROUP_OVERHEAD_TOKENS], 1, 2]])
    assert [(g.members, g.prefix_length) for g in groups] == [((0, 1), len(base) - 1)]
    assert alone_indices == [2]
