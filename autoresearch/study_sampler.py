"""The hybrid sampler of a study spec: the spec's LLM proposer as its LLM (which reads the task, the reward's
components and the base model's score besides the optimizer's state), and the spec's own check of each candidate.
Reward code a candidate carries is admitted (or refused, with the reason) before the candidate reaches the sampler;
refused code leaves the rest of the candidate to run."""

from __future__ import annotations

import optuna

from autoresearch.attributes import SHOWN_TO_LLM, StudyAttributes, TrialAttributes
from autoresearch.errors import CandidateError, MalformedProposalError, ProposalError, SlowProposalError
from autoresearch.hybrid_sampler import HybridSampler, LlmError, OptimizerState, Suggestion
from autoresearch.proposer import LlmProposer
from autoresearch.reward_code import RewardCodeAdmission
from autoresearch.search import Candidate, candidate_from_params, check_trial_config, distributions
from autoresearch.spec import StudySpec
from autoresearch.study import TPE_SEED, tpe_sampler


def study_sampler(
    spec: StudySpec,
    study: optuna.Study,
    proposer: LlmProposer,
    reward_code: RewardCodeAdmission | None = None,
    seed: int = TPE_SEED,
) -> HybridSampler:
    """The LLM on the proposer's `llm.share` of the study's trials, asked for `budget.candidates_per_round` candidates
    a call; `reward_code` admits the reward functions its candidates write (without it, any they write is refused).
    `seed` fixes which trials are the LLM's turns and seeds the TPE (a benchmark repeats a study over seeds)."""

    def llm(state: OptimizerState) -> list[Suggestion]:
        baseline = StudyAttributes.of(study).baseline_accuracy
        try:
            proposed = proposer.propose(spec, state.recent, state.count, baseline, state.best)
        except SlowProposalError as error:
            raise LlmError("slow", str(error)) from None
        except MalformedProposalError as error:
            raise LlmError("malformed", str(error)) from None
        except ProposalError as error:
            raise LlmError("down", str(error)) from None
        return [_suggestion(candidate, reward_code) for candidate in proposed]

    def check(suggestion: Suggestion) -> None:
        candidate = candidate_from_params(suggestion.params, suggestion.rationale, "llm")
        try:
            # The hybrid sampler has checked the values against the search space (`within`).
            check_trial_config(spec, candidate.params, candidate.reward_weights)
        except CandidateError as error:
            raise ValueError(str(error)) from None

    return HybridSampler(
        llm,
        llm_share=proposer.settings.share,
        seed=seed,
        base_sampler=tpe_sampler(study, seed),
        # The proposer's client bounds each request (llm.timeout_s, with its retries).
        timeout_s=None,
        candidates_per_call=spec.budget.candidates_per_round,
        search_space=distributions(spec),
        check=check,
        shown_attrs=SHOWN_TO_LLM,
        # The same hyperparameters with new reward code are a new run.
        distinguishing_attrs=("reward_code_sha256", "reward_code_weight"),
    )


def _suggestion(candidate: Candidate, reward_code: RewardCodeAdmission | None) -> Suggestion:
    """The candidate as the sampler takes it, with its reward code's verdict among its trial's attributes."""
    if candidate.reward_code is None:
        return Suggestion(candidate.optuna_params(), candidate.rationale)
    if reward_code is None:
        refused = "refused: this study takes no reward code (search_space.reward.code)"
        attributes = TrialAttributes(reward_code_refused=refused)
    else:
        attributes = reward_code.admit(candidate.reward_code, candidate.reward_code_weight)
    return Suggestion(candidate.optuna_params(), candidate.rationale, attributes.user_attrs())
