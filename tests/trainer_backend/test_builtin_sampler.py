"""Which of one lane's sampling requests the built-in sampler says cost little prefilled in one pass together, so that
beside another run's generation they join it together rather than one at a time (the scheduler's side:
`test_scheduler.py::test_beside_another_run_a_lanes_requests_that_cost_little_together_join_in_one_pass`)."""

from __future__ import annotations

from pathlib import Path

from trainer_backend.engine.types import SamplingRequest
from trainer_backend.samplers.builtin import prefilled_together
from trainer_backend.samplers.interface import RecordedSamplingRequest

SCHEMA = tuple(range(100, 160))


def recorded(prompt: tuple[int, ...], scored: bool = False, weights: Path | None = None) -> RecordedSamplingRequest:
    request = SamplingRequest(prompt_tokens=prompt, max_tokens=1, prompt_logprobs=scored, weights_folder=weights)
    return RecordedSamplingRequest(request_id="req", owner="alice", lane="lane", run=None, request=request)


def test_a_prompts_completions_scored_one_by_one_go_together() -> None:
    # A KL penalty's reference scores: the same prompt, then each completion.
    assert prefilled_together(recorded((*SCHEMA, 1, 2, 3), scored=True), recorded((*SCHEMA, 1, 2, 4, 5), scored=True))


def test_questions_over_one_schema_go_together_and_over_another_do_not() -> None:
    assert prefilled_together(recorded((*SCHEMA, 7, 8)), recorded((*SCHEMA, 9)))
    assert not prefilled_together(recorded((*SCHEMA, 7, 8)), recorded(tuple(range(300, 362))))


def test_requests_the_engine_serves_apart_do_not_go_together() -> None:
    # Scored and not scored run apart; two sets of weights are two passes.
    assert not prefilled_together(recorded((*SCHEMA, 1), scored=True), recorded((*SCHEMA, 2)))
    assert not prefilled_together(recorded((*SCHEMA, 1)), recorded((*SCHEMA, 2), weights=Path("/w/step-1")))


def test_a_short_shared_start_is_not_enough() -> None:
    # A chat template's first tokens are shared by every prompt; they are not worth a pass together.
    assert not prefilled_together(recorded((1, 2, 3, *range(10, 70))), recorded((1, 2, 3, *range(200, 260))))
