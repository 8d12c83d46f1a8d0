"""Proposals from an OpenAI-compatible endpoint (a scripted local server standing in for the LLM)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.loopback import free_port
from support.scripted_llm import ScriptedLlm

from autoresearch.errors import CandidateError, ProposalError
from autoresearch.hybrid_sampler import TrialSnapshot
from autoresearch.proposer import ANALYSIS_MAX_TOKENS, LlmProposer
from autoresearch.search import check_candidate
from autoresearch.spec import LlmSettings, load_study_spec

SPEC = load_study_spec(Path(__file__).resolve().parents[2] / "experiments" / "text2sql_tiny.yaml")
WEIGHTS = {"format": 0.2, "length_penalty": 0.0}
GOOD = {
    "candidates": [
        {
            "params": {"learning_rate": 0.002, "batch_size": 1, "loss": "ppo"},
            "reward_weights": WEIGHTS,
            "rationale": "PPO",
        },
        {
            "params": {"learning_rate": 0.001, "batch_size": 2, "loss": "importance_sampling"},
            "reward_weights": WEIGHTS,
            "rationale": "bigger batches",
        },
    ]
}


def proposer(url: str) -> LlmProposer:
    return LlmProposer(LlmSettings(base_url=url, model="scripted", api_key_env="SCRIPTED_LLM_KEY", max_retries=0))


def test_a_structured_proposal_is_parsed_and_the_prompt_carries_the_space_and_history(llm: ScriptedLlm) -> None:
    llm.say(GOOD)
    history = [TrialSnapshot(0, "COMPLETE", 0.25, {"learning_rate": 0.01}, {0: 0.0, 3: 0.25}, {"rationale": "high lr"})]
    candidates = proposer(llm.url).propose(SPEC, history, count=2, baseline=0.0625)
    assert [c.rationale for c in candidates] == ["PPO", "bigger batches"]
    assert candidates[0].params == {"learning_rate": 0.002, "batch_size": 1, "loss": "ppo"}
    assert candidates[0].reward_weights == WEIGHTS
    request = llm.requests[0]
    assert request["response_format"]["type"] == "json_schema"
    # The schema is the study's search space: a constrained model cannot write a value outside it.
    schema = request["response_format"]["json_schema"]["schema"]
    params, weights = schema["$defs"]["Params"], schema["$defs"]["RewardWeights"]
    assert params["properties"]["learning_rate"] == {
        "maximum": 0.01, "minimum": 0.0001, "title": "Learning Rate", "type": "number"
    }  # fmt: skip
    assert params["properties"]["loss"]["enum"] == ["importance_sampling", "ppo"]
    assert params["additionalProperties"] is False and weights["additionalProperties"] is False
    assert set(weights["required"]) == {"format", "length_penalty"}
    prompt = request["messages"][-1]["content"]
    assert "learning_rate" in prompt and "length_penalty" in prompt and "acc=0.250" in prompt and "Propose 2" in prompt
    assert "base model scores 0.062" in prompt


def test_a_server_without_json_schema_is_asked_again_in_json_mode(llm: ScriptedLlm) -> None:
    llm.say(400, GOOD, GOOD)
    scripted = proposer(llm.url)
    assert len(scripted.propose(SPEC, [], count=2)) == 2
    assert llm.requests[1]["response_format"] == {"type": "json_object"}
    scripted.propose(SPEC, [], count=1)
    assert llm.requests[2]["response_format"] == {"type": "json_object"}


def test_a_refusal_for_another_reason_is_not_taken_for_missing_json_schema_support(llm: ScriptedLlm) -> None:
    """The backend's own 400 when the prompt and max_tokens overflow the model's context."""
    llm.say((400, "prompt length 1761 + max_tokens 2048 = 3809 exceeds the model's context length 2048"))
    with pytest.raises(ProposalError, match="refused the request"):
        proposer(llm.url).propose(SPEC, [], count=1)
    assert len(llm.requests) == 1


@pytest.mark.parametrize("reply", ["{not json", '{"candidates": []}', '{"candidates": [{"params": {}}]}'])
def test_a_malformed_reply_is_refused_with_the_reason(llm: ScriptedLlm, reply: str) -> None:
    llm.say(reply)
    with pytest.raises(ProposalError, match="not valid"):
        proposer(llm.url).propose(SPEC, [], count=2)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"params": {"learning_rate": 5.0, "batch_size": 1, "loss": "ppo"}}, "learning_rate"),
        ({"reward_weights": {**WEIGHTS, "style_points": 1.0}}, "style_points"),
        ({"params": {"learning_rate": 0.002, "loss": "ppo"}}, "batch_size"),
        # It cites a trial it was not shown (here none was).
        ({"based_on": [7]}, "based_on"),
    ],
)
def test_a_server_that_does_not_constrain_its_reply_gets_a_candidate_outside_the_space_refused(
    llm: ScriptedLlm, change: dict, problem: str
) -> None:
    llm.say({"candidates": [{**GOOD["candidates"][0], **change}]})
    with pytest.raises(ProposalError, match=f"not valid.*{problem}"):
        proposer(llm.url).propose(SPEC, [], count=1)


def test_what_the_schema_cannot_say_is_still_checked_against_the_space() -> None:
    with pytest.raises(CandidateError, match=r"learning_rate=5\.0 is outside"):
        check_candidate(SPEC, {"learning_rate": 5.0}, {})


def test_the_analysis_is_the_models_text(llm: ScriptedLlm) -> None:
    llm.say("Lower learning rates helped; try PPO next.")
    assert proposer(llm.url).analyze(SPEC, []) == "Lower learning rates helped; try PPO next."
    assert llm.requests[0]["max_completion_tokens"] == ANALYSIS_MAX_TOKENS


def test_an_analysis_that_loops_keeps_its_first_distinct_sentences(llm: ScriptedLlm) -> None:
    """A small model repeats a sentence until its tokens run out: the note keeps each sentence once, five at most."""
    llm.say("PPO at 2e-4 scored 0.56. 1. Format helped.\n" + "It ran the system many times. " * 40 + "Try 1e-4!")
    assert proposer(llm.url).analyze(SPEC, []) == (
        "PPO at 2e-4 scored 0.56. 1. Format helped. It ran the system many times. Try 1e-4!"
    )
    llm.say(" ".join(f"Sentence {n} of many." for n in range(9)))
    assert proposer(llm.url).analyze(SPEC, []).endswith("Sentence 4 of many.")


def test_a_missing_key_or_an_unreachable_endpoint_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCRIPTED_LLM_KEY", raising=False)
    with pytest.raises(ProposalError, match="set the environment variable SCRIPTED_LLM_KEY"):
        proposer("http://127.0.0.1:9/v1")
    monkeypatch.setenv("SCRIPTED_LLM_KEY", "sk-test")
    with pytest.raises(ProposalError, match="unreachable"):
        proposer(f"http://127.0.0.1:{free_port()}/v1").propose(SPEC, [], count=1)
