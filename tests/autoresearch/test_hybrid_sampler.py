"""The hybrid sampler in a plain Optuna study on a toy objective, nothing of this project's studies around it.

The LLM is a remote API a test cannot reach, so a deterministic stand-in answers for it: a local OpenAI-compatible
server replying from a script (`support.scripted_llm`, spoken to by the real `ChatLlm` client over HTTP), or a Python
callable where a test needs the LLM to hang."""

from __future__ import annotations

import time

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from support.loopback import free_port
from support.scripted_llm import ScriptedLlm

from autoresearch.chat_llm import ChatLlm
from autoresearch.hybrid_sampler import HybridSampler, Llm, OptimizerState, Suggestion, fallback_counts

SPACE = {
    "x": FloatDistribution(-5.0, 5.0),
    "n": IntDistribution(1, 9),
    "kind": CategoricalDistribution(["a", "b"]),
}
TRIALS = 20


def objective(trial: optuna.Trial) -> float:
    x = trial.suggest_float("x", -5.0, 5.0)
    n = trial.suggest_int("n", 1, 9)
    kind = trial.suggest_categorical("kind", ["a", "b"])
    return (x - 1) ** 2 + (n - 3) ** 2 + (kind == "b")


def walk(step: int) -> dict:
    """The scripted LLM's candidate at its `step`-th call: a walk toward the optimum, each one new."""
    return {"x": 1 + 2.0 / step, "n": 3 + step % 2, "kind": "a"}


class WalkingLlm:
    """A callable stand-in for the LLM: records each state it is given and proposes the walk's next point."""

    def __init__(self) -> None:
        self.states: list[OptimizerState] = []

    def __call__(self, state: OptimizerState) -> list[Suggestion]:
        self.states.append(state)
        return [Suggestion(walk(len(self.states)), f"step {len(self.states)} toward x=1")]


def run(llm: Llm, seed: int = 3, trials: int = TRIALS, **options: object) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=HybridSampler(llm, seed=seed, search_space=SPACE, **options))
    study.optimize(objective, n_trials=trials)
    return study


def llm_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("source") == "llm"]


def chat(url: str, **options: object) -> ChatLlm:
    return ChatLlm(url, "scripted", api_key_env="SCRIPTED_LLM_KEY", **options)


def test_the_llm_proposes_its_share_of_the_trials_and_is_shown_the_best_trials_and_the_bounds(
    llm: ScriptedLlm,
) -> None:
    for step in range(1, 7):
        llm.say({"candidates": [{"params": walk(step), "rationale": f"step {step}: closer to x=1 than #0"}]})
    study = run(chat(llm.url))

    proposed = llm_trials(study)
    # 30% of 20 trials; the first trial is always the LLM's.
    assert len(proposed) == 6 and proposed[0].number == 0
    assert [t.params for t in proposed] == [walk(step) for step in range(1, 7)]
    assert [t.user_attrs["rationale"] for t in proposed] == [f"step {s}: closer to x=1 than #0" for s in range(1, 7)]
    assert all(t.user_attrs["source"] == "sampler" for t in study.trials if t not in proposed)
    assert fallback_counts(study) == {} and study.user_attrs["llm_valid"] == 6

    # The last call was shown the bounds and the best trial finished before it, with its parameters.
    prompt = llm.requests[-1]["messages"][-1]["content"]
    assert "- x: float in [-5, 5]" in prompt and "- n: integer in [1, 9] step 1" in prompt
    assert '- kind: one of ["a", "b"]' in prompt
    before = [t for t in study.trials if t.number < proposed[-1].number]
    best = min(before, key=lambda t: t.value)
    assert f"#{best.number} COMPLETE value={best.value:.4g} curve=[] params=" in prompt.split("Latest trials")[0]


def test_which_trials_are_the_llms_is_fixed_by_the_seed() -> None:
    first, again, other = run(WalkingLlm(), seed=7), run(WalkingLlm(), seed=7), run(WalkingLlm(), seed=6)
    numbers = [t.number for t in llm_trials(first)]
    assert numbers == [t.number for t in llm_trials(again)]
    assert [t.params for t in first.trials] == [t.params for t in again.trials]
    assert numbers != [t.number for t in llm_trials(other)]
    assert len(numbers) == len(llm_trials(other)) == 6


def test_the_llm_sees_the_latest_trials_with_their_curves_and_the_user_attributes_it_is_shown() -> None:
    def reporting(trial: optuna.Trial) -> float:
        value = objective(trial)
        trial.report(value * 2, step=0)
        trial.set_user_attr("rl_gain", -value)
        return value

    scripted = WalkingLlm()
    shown_attrs = ("rationale", "rl_gain")
    sampler = HybridSampler(scripted, seed=3, search_space=SPACE, llm_share=0.5, shown_attrs=shown_attrs)
    study = optuna.create_study(sampler=sampler)
    study.optimize(reporting, n_trials=6)
    last = scripted.states[-1]
    shown = {t.number: t for t in last.recent}
    assert shown and all(t.curve == {0: t.value * 2} and t.attrs["rl_gain"] == -t.value for t in shown.values())
    assert "rl_gain=" in last.prompt() and "curve=[0:" in last.prompt()


class HangingLlm:
    """A stand-in for an LLM that does not answer in time."""

    def __call__(self, state: OptimizerState) -> list[Suggestion]:
        time.sleep(2)
        return [Suggestion(walk(1), "too late")]


@pytest.mark.parametrize("kind", ["down", "slow", "malformed"])
def test_an_llm_that_is_down_slow_or_malformed_falls_back_to_tpe_and_each_fallback_is_counted(
    llm: ScriptedLlm, kind: str
) -> None:
    if kind == "down":
        answering: Llm = chat(f"http://127.0.0.1:{free_port()}/v1")
    elif kind == "slow":
        answering = HangingLlm()
    else:
        llm.default_proposal = '{"candidates": [{"params": {"x": 1.0}}]}'  # no rationale
        answering = chat(llm.url)
    # Only the hanging LLM meets the short limit: a scripted reply on a loaded machine may take longer than 0.3 s, and
    # would then be counted as slow instead of malformed.
    study = run(answering, trials=10, timeout_s=0.3 if kind == "slow" else 30.0)

    trials = study.get_trials(deepcopy=False)
    assert all(t.state is optuna.trial.TrialState.COMPLETE for t in trials)
    assert llm_trials(study) == []
    fallen = [t for t in trials if t.user_attrs.get("llm_fallback")]
    assert len(fallen) == 3 and fallback_counts(study) == {kind: 3}
    assert all(t.user_attrs["llm_fallback"].startswith(f"{kind}: ") for t in fallen)
    assert len(study.user_attrs["rejected_proposals"]) == 3
    assert all(SPACE["x"]._contains(t.params["x"]) for t in fallen)


def test_a_proposal_outside_the_bounds_is_refused_and_the_next_candidate_of_the_reply_is_used(
    llm: ScriptedLlm,
) -> None:
    outside = {"params": {"x": 50.0, "n": 3, "kind": "a"}, "rationale": "far out"}
    unknown = {"params": {"x": 1.0, "y": 2}, "rationale": "a new knob"}
    inside = {"params": walk(1), "rationale": "inside"}
    llm.say({"candidates": [outside, inside]}, {"candidates": [outside, unknown]})
    study = run(chat(llm.url), trials=5, candidates_per_call=2)  # the LLM's turns: trials 0 and 4

    (proposed,) = llm_trials(study)
    assert proposed.number == 0 and proposed.params == walk(1) and proposed.user_attrs["rationale"] == "inside"
    rejected = study.user_attrs["rejected_proposals"]
    assert "'far out' rejected: x=50.0 is outside the search space (float in [-5, 5])" in rejected[0]
    assert "'a new knob' rejected: 'y' is not searched" in rejected[2]
    refused = [t for t in study.trials if t.user_attrs.get("llm_fallback")]
    assert [t.user_attrs["llm_fallback"].split(":")[0] for t in refused] == ["refused"]
    assert all(SPACE["x"]._contains(t.params["x"]) for t in study.trials)


def test_without_a_given_space_the_llm_proposes_once_a_finished_trial_shows_it() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    scripted = WalkingLlm()
    study = optuna.create_study(sampler=HybridSampler(scripted, seed=3, llm_share=0.5))
    study.optimize(objective, n_trials=4)
    assert study.trials[0].user_attrs["llm_fallback"].startswith("no space: ")
    assert [t.number for t in llm_trials(study)] and set(scripted.states[0].bounds) == set(SPACE)


def test_a_repeat_is_refused_unless_a_distinguishing_user_attribute_makes_it_a_new_run() -> None:
    """The same values with other reward code (here a `variant` attribute) are a run of their own; with the same
    attribute they retrace a trial and are refused."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    tried = {"x": 1.0, "n": 3, "kind": "a"}
    replies = iter(
        [
            [Suggestion(tried, "the same values, new code", {"variant": "b"})],
            [Suggestion(tried, "the same values, same code", {"variant": "b"})],
        ]
    )
    sampler = HybridSampler(
        lambda state: next(replies), llm_share=1.0, search_space=SPACE, distinguishing_attrs=("variant",)
    )
    study = optuna.create_study(sampler=sampler)
    study.enqueue_trial(tried, user_attrs={"variant": "a"})
    study.optimize(objective, n_trials=3)
    trials = study.get_trials(deepcopy=False)
    assert [t.params == tried for t in trials] == [True, True, False]
    assert trials[1].user_attrs["variant"] == "b" and trials[1].user_attrs["source"] == "llm"
    assert (
        "'the same values, same code' rejected: it repeats trial 1's parameters"
        in study.user_attrs["rejected_proposals"][0]
    )
    assert trials[2].user_attrs["llm_fallback"].startswith("refused")
