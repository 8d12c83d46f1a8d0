"""A running generation takes in more requests between its decode steps (continuous batching): each joined request
gets what it gets alone, its outcome comes as soon as its own rows are done, and the batch's steps serve both.

Tiny random Gemma 3 and Qwen2 models with two LoRA adapters; each answer is compared with the same request alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from support.tiny_models import TINY_ARCHITECTURES, peaked_tiny_model, randomise_lora_b
from support.trainer import assert_answered_alike

from trainer_backend.engine import sampling
from trainer_backend.engine.sampling import BoundSamplingRequest, Joining, JoinRoom, sample_batch
from trainer_backend.engine.types import SamplingInputError, SamplingRequest, SamplingResult

VOCAB = 97
CONTEXT = 256
PROMPT = (2, 11, 5, 40, 7, 93, 3, 18, 60, 1)
LONG_PROMPT = tuple((7 * i + 3) % VOCAB for i in range(30))


def letters(ids: Sequence[int]) -> str:
    return "".join(chr(ord("a") + token % 26) for token in ids)


@pytest.fixture(scope="module", params=TINY_ARCHITECTURES)
def model(request: pytest.FixtureRequest) -> PeftModel:
    """Two adapters ("default", "other") over a tiny model whose sliding window (Gemma) covers every generation."""
    torch.manual_seed(1)
    peft_model = get_peft_model(
        peaked_tiny_model(request.param, VOCAB, CONTEXT, sliding_window=128),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    peft_model.add_adapter("other", LoraConfig(r=2, lora_alpha=8, target_modules=["q_proj", "o_proj", "down_proj"]))
    randomise_lora_b(peft_model)
    return peft_model.eval()


class Forwards:
    """Counts the model's forward passes (a prefill or a decode step each) while it is in use."""

    def __init__(self, model: PeftModel) -> None:
        self.count = 0
        self._handle = model.get_base_model().model.register_forward_hook(self._counted)

    def _counted(self, *_: object) -> None:
        self.count += 1

    def close(self) -> None:
        self._handle.remove()


RUNNING = BoundSamplingRequest(SamplingRequest(prompt_tokens=PROMPT, temperature=0, max_tokens=30), None, ())
JOINING = [
    # Its prompt is longer than what the running rows have filled when it joins: the running rows move right.
    BoundSamplingRequest(
        SamplingRequest(prompt_tokens=LONG_PROMPT, num_samples=3, max_tokens=8, seed=4), "default", ()
    ),
    BoundSamplingRequest(SamplingRequest(prompt_tokens=PROMPT[:4], temperature=0.7, max_tokens=6, seed=9), "other", ()),
]


def joined_at(step: int, jobs: Sequence[BoundSamplingRequest], rooms: list[JoinRoom]) -> Joining:
    """Lets `jobs` in (those the room accepts) before decode step `step`; records outcomes in `rooms`' order."""
    calls = iter(range(1, 1000))

    def admit(room: JoinRoom) -> list[BoundSamplingRequest]:
        if next(calls) != step:
            return []
        rooms.append(room)
        return [job for job in jobs if room.accepts(job.request)]

    return Joining(admit, lambda index, outcome: None)


def test_a_request_that_joins_a_running_generation_gets_what_it_gets_alone(model: PeftModel) -> None:
    rooms: list[JoinRoom] = []
    outcomes = sample_batch(model, [RUNNING], letters, CONTEXT, joining=joined_at(3, JOINING, rooms))

    assert len(outcomes) == 1 + len(JOINING)
    for job, outcome in zip([RUNNING, *JOINING], outcomes, strict=True):
        (alone,) = sample_batch(model, [job], letters, CONTEXT)
        assert_answered_alike(outcome, alone)


def test_a_joined_requests_outcome_comes_as_soon_as_its_rows_are_done(model: PeftModel) -> None:
    finished: list[int] = []
    admitted = iter([[], [], JOINING[1:]])

    def admit(room: JoinRoom) -> list[BoundSamplingRequest]:
        jobs = next(admitted, [])
        return [job for job in jobs if room.accepts(job.request)]

    def done(index: int, outcome: SamplingResult | SamplingInputError) -> None:
        assert isinstance(outcome, SamplingResult)
        finished.append(index)

    sample_batch(model, [RUNNING], letters, CONTEXT, joining=Joining(admit, done))
    # The joined request (index 1: after the batch's own) ends after its 6 tokens, long before the 30 of the first.
    assert finished == [1, 0]


def test_joined_rows_share_the_running_batchs_decode_steps(model: PeftModel) -> None:
    forwards = Forwards(model)
    try:
        for job in [RUNNING, *JOINING]:
            sample_batch(model, [job], letters, CONTEXT)
        one_after_another = forwards.count
        forwards.count = 0
        sample_batch(model, [RUNNING], letters, CONTEXT, joining=joined_at(3, JOINING, []))
        together = forwards.count
    finally:
        forwards.close()
    # Alone: a prefill and up to max_tokens - 1 steps each (30 + 8 + 6). Joined: one prefill for those who join, and
    # their steps are the running batch's.
    assert together <= one_after_another - 8 - 6 + 1


def test_a_generation_takes_in_only_what_fits_its_cache(model: PeftModel) -> None:
    rooms: list[JoinRoom] = []
    too_long = BoundSamplingRequest(SamplingRequest(prompt_tokens=PROMPT, max_tokens=CONTEXT - 20, seed=1), None, ())
    scored = BoundSamplingRequest(SamplingRequest(prompt_tokens=PROMPT, max_tokens=4, prompt_logprobs=True), None, ())
    invalid = BoundSamplingRequest(SamplingRequest(prompt_tokens=(1, VOCAB + 5), max_tokens=4), None, ())
    outcomes = sample_batch(
        model, [RUNNING], letters, CONTEXT, joining=joined_at(2, [too_long, scored, invalid, *JOINING], rooms)
    )

    # Past the room the batch kept for joining, asking for prompt scores (unless TAKE_IN_PROMPT_SCORES), or not a
    # valid request: left to run elsewhere; the others joined.
    (room,) = rooms
    assert room.capacity == 2 * (len(PROMPT) + RUNNING.request.max_tokens)
    assert len(outcomes) == 1 + len(JOINING)


def test_a_request_for_prompt_scores_taken_in_is_served_between_two_steps_as_it_is_alone(
    model: PeftModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A KL penalty's reference log-probs: the base model's scores of a prompt and its sampled completion, one token
    # more. They need every prompt position's logits, so they are served on a cache of their own, not as joined rows.
    monkeypatch.setattr(sampling, "TAKE_IN_PROMPT_SCORES", True)  # the variant scores-taken-in
    scored = [
        BoundSamplingRequest(
            SamplingRequest(
                prompt_tokens=LONG_PROMPT, max_tokens=1, seed=3, prompt_logprobs=True, topk_prompt_logprobs=3
            ),
            adapter,
            (),
        )
        for adapter in (None, "other")
    ]
    finished: list[int] = []
    admitted = iter([[], [scored[0], JOINING[1]], [scored[1]]])

    def admit(room: JoinRoom) -> list[BoundSamplingRequest]:
        return [job for job in next(admitted, []) if room.accepts(job.request)]

    outcomes = sample_batch(
        model, [RUNNING], letters, CONTEXT, joining=Joining(admit, lambda index, outcome: finished.append(index))
    )

    # Both taken in (indices 1 and 3), each answered before the running request's 30 tokens end.
    assert finished[:2] == [1, 3]
    assert finished[-1] == 0
    for job, outcome in zip([RUNNING, scored[0], JOINING[1], scored[1]], outcomes, strict=True):
        (alone,) = sample_batch(model, [job], letters, CONTEXT)
        assert_answered_alike(outcome, alone)
        if job in scored:
            assert outcome.prompt_logprobs is not None and outcome.prompt_logprobs[0] is None
            assert len(outcome.prompt_logprobs) == len(LONG_PROMPT)
            torch.testing.assert_close(outcome.prompt_logprobs[1:], alone.prompt_logprobs[1:], atol=1e-5, rtol=0)
            assert outcome.topk_prompt_logprobs == alone.topk_prompt_logprobs


def test_positions_no_running_row_reads_are_dropped_so_later_requests_still_fit(model: PeftModel) -> None:
    # The running rows fill 40 positions of a room of 80. A request joins at step 20 (right-aligned at 30 positions,
    # 20 of them padding in front of its prompt) and runs past the first request's end (step 30). At step 35 the
    # batch spans 45 positions, the first 20 read by no row; a request of 30 + 40 positions fits only once they go.
    later = BoundSamplingRequest(
        SamplingRequest(prompt_tokens=PROMPT, max_tokens=30, seed=2, temperature=0.9), "other", ()
    )
    last = BoundSamplingRequest(SamplingRequest(prompt_tokens=LONG_PROMPT, max_tokens=40, temperature=0), "default", ())
    schedule = {20: [later], 35: [last]}
    rooms: list[JoinRoom] = []
    steps = iter(range(1, 1000))

    def admit(room: JoinRoom) -> list[BoundSamplingRequest]:
        jobs = schedule.get(next(steps), [])
        if jobs:
            rooms.append(room)
        return [job for job in jobs if room.accepts(job.request)]

    outcomes = sample_batch(model, [RUNNING], letters, CONTEXT, joining=Joining(admit, lambda index, outcome: None))

    assert [room.capacity for room in rooms] == [80, 80]
    assert rooms[1].length < 20 + 15  # the unread positions went before the room was offered
    assert len(outcomes) == 3
    for job, outcome in zip([RUNNING, later, last], outcomes, strict=True):
        (alone,) = sample_batch(model, [job], letters, CONTEXT)
        assert_answered_alike(outcome, alone)


def test_requests_over_two_schemas_join_through_one_shared_prefix_prefill(
    model: PeftModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The longer schema's questions are short and the shorter one's long, so the two-pass prefill (a row per schema,
    # then a row per question) fills more positions (55 + 16) than the longest prompt (60) or the running rows: it
    # must still be taken, the joined rows then being the wider ones.
    schema_a = tuple((5 * i + 1) % VOCAB for i in range(40))
    schema_b = tuple((11 * i + 7) % VOCAB for i in range(55))
    questions = [(*schema_b, 3, 4, 5, 6), (*schema_b, 8, 9, 10, 11, 12)]
    questions += [schema_a + tuple(range(20, 36)), schema_a + tuple(range(40, 55))]
    joining = [
        BoundSamplingRequest(SamplingRequest(prompt_tokens=prompt, temperature=0, max_tokens=5), "default", ())
        for prompt in questions
    ]
    running = BoundSamplingRequest(SamplingRequest(prompt_tokens=LONG_PROMPT, temperature=0, max_tokens=40), None, ())
    prefill_widths: list[tuple[int, int]] = []
    forward = sampling._next_token_scores

    def recorded(*args: object, **kwargs: torch.Tensor) -> object:
        if kwargs["input_ids"].shape[1] > 1:
            prefill_widths.append(tuple(kwargs["input_ids"].shape))
        return forward(*args, **kwargs)

    monkeypatch.setattr(sampling, "_next_token_scores", recorded)
    rooms: list[JoinRoom] = []
    outcomes = sample_batch(model, [running], letters, CONTEXT, joining=joined_at(2, joining, rooms))
    monkeypatch.undo()

    (room,) = rooms
    assert room.length == 60
    # The running prompt's prefill, then the joiners': each schema once, then each question's own tokens, 174
    # positions where one padded pass computes 4 × 60 = 240.
    assert prefill_widths == [(1, len(LONG_PROMPT)), (2, 55), (4, 16)]
    assert len(outcomes) == 1 + len(joining)
    for job, outcome in zip([running, *joining], outcomes, strict=True):
        (alone,) = sample_batch(model, [job], letters, CONTEXT)
        assert_answered_alike(outcome, alone)


def test_the_caller_hears_once_the_requests_taken_in_are_prefilled(model: PeftModel) -> None:
    events: list[str] = []
    schedule = {3: JOINING[:1], 6: JOINING[1:]}
    steps = iter(range(1, 1000))

    def admit(room: JoinRoom) -> list[BoundSamplingRequest]:
        jobs = [job for job in schedule.get(next(steps), []) if room.accepts(job.request)]
        events.append(f"admit {len(jobs)}")
        return jobs

    joining = Joining(admit, lambda index, outcome: None, prefilled=lambda: events.append("prefilled"))
    sample_batch(model, [RUNNING], letters, CONTEXT, joining=joining)

    # Right after each admission that took a request in (before the next step's admission), and only then.
    taken = [index for index, event in enumerate(events) if event == "admit 1"]
    assert len(taken) == 2 and all(events[index + 1] == "prefilled" for index in taken)
    assert events.count("prefilled") == 2
