"""The LLM side of the controller: proposals of trials to run, and a short analysis after each round.

Any OpenAI-compatible endpoint through `langchain-openai`'s `ChatOpenAI`. Proposals come back as structured
output (JSON schema); a server without JSON-schema support is asked again in JSON mode and the reply parsed here.
What comes back is untrusted: every candidate is checked against the search space by the caller, and a reply
that is not the expected JSON raises `ProposalError` with the reason, for the caller to record.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import httpx
import openai
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic.json_schema import SkipJsonSchema

from autoresearch.errors import MalformedProposalError, ProposalError, SlowProposalError
from autoresearch.hybrid_sampler import TrialSnapshot
from autoresearch.search import Candidate
from autoresearch.spec import Choices, FloatRange, IntRange, LlmSettings, StudySpec
from tasks.registry import task_class
from tasks.reward_code.admission import CodeRewardTask

# The most candidates one reply may hold (Budget.candidates_per_round's bound).
MAX_CANDIDATES = 16
# The most earlier trials one candidate may say it builds on.
MAX_BASED_ON = 5
# The longest reward function one candidate may write, in characters (a bound for constrained decoding).
MAX_REWARD_CODE_CHARS = 4000
# An analysis is a note of a few sentences: this many, in at most this many tokens of the LLM's reply.
ANALYSIS_SENTENCES = 5
ANALYSIS_MAX_TOKENS = 256
# Where a sentence ends: ., ! or ? and a space, not after a digit (a numbered list's "1. ").
_SENTENCE_END = re.compile(r"(?<=[^\d\s][.!?])\s+")


# A candidate as the LLM writes it, part of the reply's JSON schema (so no docstring: it would be sent as the schema's
# description); `proposal_model` gives it the study's own params, reward weights and trial numbers, `candidate()` is
# what it runs. The trials it builds on come before its rationale, so that a model decoding in order picks them first
# and then explains its change from them, rather than writing a preamble about the task.
class ProposedCandidate(BaseModel):
    model_config = ConfigDict(json_schema_extra=lambda schema: _require(schema, "based_on"))

    params: BaseModel
    reward_weights: BaseModel
    based_on: list[int] = Field(default_factory=list)
    # In the schema only where the study's search space allows reward code (`search_space.reward.code`).
    reward_code: SkipJsonSchema[BaseModel | None] = None
    # Bounded, so that under constrained decoding a reply ends within a budget of tokens whatever the model.
    rationale: str = Field(
        min_length=1,
        max_length=300,
        description="this candidate's own reason: what it changes from the trials in based_on and why, citing their "
        "scores; one or two sentences, no preamble",
    )

    def candidate(self, history: Sequence[TrialSnapshot] = ()) -> Candidate:
        """The candidate to run; its rationale names the trials it builds on with their scores, as the LLM read them."""
        code = self.reward_code.model_dump() if self.reward_code is not None else {}
        return Candidate(
            self.params.model_dump(), self.reward_weights.model_dump(), _tied(self.rationale, self.based_on, history),
            "llm", code.get("source"), code.get("weight", 0.0),
        )  # fmt: skip


class Proposal(BaseModel):
    candidates: list[ProposedCandidate]


def proposal_model(spec: StudySpec, shown: Sequence[int] = ()) -> type[Proposal]:
    """The reply's JSON schema for this study: each candidate gives every searched hyperparameter and every optional
    reward component's weight, each inside its range or among its choices, and nothing else, and the trials it builds
    on among those `shown` to the LLM. Under constrained decoding (the backend's own /v1 and vLLM, both through
    llguidance) a model cannot write a candidate outside the search space, nor cite a trial it was not shown; the
    caller still checks each one (a step of an integer range, a trial config that is invalid)."""
    strict = ConfigDict(extra="forbid")
    space = spec.search_space
    params: Any = create_model(
        "Params", __config__=strict, **{name: _field(param) for name, param in space.params.items()}
    )
    weights: Any = create_model(
        "RewardWeights",
        __config__=strict,
        **{kind: _field(weight) for kind, weight in space.reward.components.items()},
    )
    numbers: Any = Literal[tuple(sorted(set(shown)))] if shown else int
    based_on = (
        list[numbers],
        Field(
            default_factory=list,
            max_length=MAX_BASED_ON if shown else 0,
            description="numbers of the earlier trials (in the history) this candidate learns from",
        ),
    )
    code: dict[str, Any] = {}
    if space.reward.code is not None:
        source = Field(
            min_length=1,
            max_length=MAX_REWARD_CODE_CHARS,
            description="Python source that defines reward(completion, example, execution) -> float",
        )
        reward_code = create_model(
            "RewardCode", __config__=strict, weight=_field(space.reward.code), source=(str, source)
        )
        description = "optional: a new reward component written as code, at a weight"
        code["reward_code"] = (reward_code | None, Field(None, description=description))
    candidate: Any = create_model(
        "ProposedCandidate",
        __base__=ProposedCandidate,
        params=(params, ...),
        reward_weights=(weights, ...),
        based_on=based_on,
        **code,
    )
    candidates = (list[candidate], Field(min_length=1, max_length=MAX_CANDIDATES))
    return create_model("Proposal", __base__=Proposal, candidates=candidates)


def _require(schema: dict[str, Any], name: str) -> None:
    """Mark `name` required in a model's JSON schema though the model has a default for it: a constrained model
    always writes it, and a reply without it (from a server that does not constrain) still parses."""
    schema["required"] = [*schema.get("required", []), name]


def _field(param: FloatRange | IntRange | Choices) -> tuple[Any, Any]:
    if isinstance(param, Choices):
        return Literal[param.choices], ...
    kind = int if isinstance(param, IntRange) else float
    return kind, Field(ge=param.low, le=param.high)


_JUDGED_ON = {
    "held_out_accuracy": "held-out accuracy",
    "unseen_form_accuracy": "held-out accuracy on the questions whose form (template and wording) training never "
    "shows, so a trial must transfer to new kinds of questions",
}


def system_prompt(spec: StudySpec) -> str:
    """What the LLM is asked to be: a designer of the study's experiments, told what its task is."""
    return (
        "You design experiments for LoRA reinforcement-learning post-training of a small language model on a task. "
        f"{task_class(spec.task).description} Each trial trains with the hyperparameters and reward you choose and "
        f"is judged only on {_JUDGED_ON[spec.objective.metric]}, never on its training reward. Propose candidates "
        "inside the search space. Give each candidate its own rationale: the trials it builds on (based_on) and, in "
        "one or two sentences, what it changes from them and why. Learn from the history: vary what scored well, "
        "avoid what failed, and never repeat a trial's exact values (a repeat is rejected: the same values "
        "rerun the same trial)."
    )


class LlmProposer:
    """Asks an OpenAI-compatible chat model for candidates and analyses."""

    def __init__(
        self, settings: LlmSettings, http_client: httpx.Client | None = None, api_key: str | None = None
    ) -> None:
        """`api_key` is the key to send; by default the one in the environment variable the settings name.

        Raises ProposalError when there is no key.
        """
        key = api_key or os.environ.get(settings.api_key_env)
        if not key:
            raise ProposalError(
                f"no API key: set the environment variable {settings.api_key_env} for {settings.base_url}"
            )
        self.settings = settings
        self.chat = ChatOpenAI(
            base_url=settings.base_url,
            model=settings.model,
            api_key=key,
            temperature=settings.temperature,
            timeout=settings.timeout_s,
            max_retries=settings.max_retries,
            max_tokens=settings.max_tokens,
            http_client=http_client,
        )
        self._json_schema = True

    def propose(
        self,
        spec: StudySpec,
        history: Sequence[TrialSnapshot],
        count: int,
        baseline: float | None = None,
        best: Sequence[TrialSnapshot] = (),
    ) -> list[Candidate]:
        """`count` candidates at most, given the trials so far (`history`; with `best`, the latest ones), the best
        trials, and the base model's held-out score (`baseline`).

        Raises:
            SlowProposalError: no answer within the timeout.
            MalformedProposalError: an answer that is not a proposal of the study's schema, or was cut off.
            ProposalError: the endpoint is unreachable or refused the request.
        """
        shown = [*best, *history]
        proposed = self._proposed(spec, history, count, baseline, best)
        return [candidate.candidate(shown) for candidate in proposed[:count]]

    def _proposed(
        self,
        spec: StudySpec,
        history: Sequence[TrialSnapshot],
        count: int,
        baseline: float | None,
        best: Sequence[TrialSnapshot],
    ) -> list[ProposedCandidate]:
        prompt = _proposal_prompt(spec, history, count, baseline, best)
        messages = [SystemMessage(system_prompt(spec)), HumanMessage(prompt)]
        reply = proposal_model(spec, [record.number for record in (*best, *history)])
        if self._json_schema:
            structured = self.chat.with_structured_output(reply, method="json_schema")
            try:
                with self._calling():
                    try:
                        return structured.invoke(messages).candidates
                    except openai.BadRequestError as error:
                        if "response_format" not in str(error) and "json_schema" not in str(error):
                            raise
                        # The server does not take a JSON schema; ask again in JSON mode from now on.
                        self._json_schema = False
            except (ValidationError, ValueError) as error:
                raise MalformedProposalError(f"the LLM's proposal is not valid: {_reason(error)}") from None
        return self._propose_in_json_mode(messages, reply)

    def _propose_in_json_mode(self, messages: list, reply_model: type[Proposal]) -> list[ProposedCandidate]:
        schema = json.dumps(reply_model.model_json_schema())
        messages = [*messages, HumanMessage(f"Answer with one JSON object only, matching this JSON schema: {schema}")]
        with self._calling():
            reply = self.chat.bind(response_format={"type": "json_object"}).invoke(messages)
        try:
            return reply_model.model_validate_json(str(reply.content)).candidates
        except ValidationError as error:
            raise MalformedProposalError(f"the LLM's reply is not a valid proposal: {_reason(error)}") from None

    @contextmanager
    def _calling(self) -> Iterator[None]:
        """The endpoint's errors, raised inside the block, as the proposer's: SlowProposalError for a timeout,
        MalformedProposalError for a reply cut off at llm.max_tokens, ProposalError for the rest."""
        url = self.settings.base_url
        try:
            yield
        except openai.APITimeoutError:
            raise SlowProposalError(
                f"the LLM at {url} did not answer within {self.settings.timeout_s:g} s (llm.timeout_s)"
            ) from None
        except openai.APIConnectionError as error:
            raise ProposalError(f"the LLM at {url} is unreachable: {error}") from None
        except openai.APIError as error:
            raise ProposalError(f"the LLM at {url} refused the request: {error}") from None
        except openai.LengthFinishReasonError:
            raise MalformedProposalError(
                f"the LLM's proposal was cut off at {self.settings.max_tokens} tokens (llm.max_tokens)"
            ) from None

    def analyze(self, spec: StudySpec, history: list[TrialSnapshot], baseline: float | None = None) -> str:
        """A few sentences on what worked and what to try next, for a note on the study."""
        prompt = (
            f"{_history_text(history, baseline)}\n\nIn at most {ANALYSIS_SENTENCES} sentences: what worked, what did "
            "not, and what to try next. Plain text."
        )
        chat = self.chat.bind(max_tokens=min(ANALYSIS_MAX_TOKENS, self.settings.max_tokens))
        with self._calling():
            reply = chat.invoke([SystemMessage(system_prompt(spec)), HumanMessage(prompt)])
        return _first_sentences(str(reply.content), ANALYSIS_SENTENCES)


def _first_sentences(text: str, count: int) -> str:
    """The first `count` distinct sentences of `text`. A small model asked for a few sentences may repeat one until
    its tokens run out (Qwen2.5-Coder-0.5B did in the main study); the note keeps what it said once."""
    sentences = (s for s in _SENTENCE_END.split(text.strip()) if s)
    return " ".join(list(dict.fromkeys(sentences))[:count])


def _reason(error: Exception) -> str:
    """What is wrong, in a line: each bad field of a reply with the reason (the first three), else the error's first
    line."""
    if isinstance(error, ValidationError):
        problems = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors()[:3]]
        return "; ".join(problems)
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _tied(rationale: str, based_on: Sequence[int], history: Sequence[TrialSnapshot]) -> str:
    """The rationale, followed by the trials it builds on as the LLM read them: number and held-out accuracy (or
    state)."""
    scores = {r.number: r.state.lower() if r.value is None else f"{r.value:.3f}" for r in history}
    cited = [f"#{n} ({scores[n]})" for n in dict.fromkeys(based_on) if n in scores]
    return f"{rationale} [builds on {', '.join(cited)}]" if cited else rationale


def _proposal_prompt(
    spec: StudySpec,
    history: Sequence[TrialSnapshot],
    count: int,
    baseline: float | None,
    best: Sequence[TrialSnapshot] = (),
) -> str:
    space = spec.search_space
    base = task_class(spec.task).base_reward_component
    params = "\n".join(f"- {name}: {param.model_dump()}" for name, param in space.params.items()) or "- (none)"
    rewards = (
        "\n".join(f"- {kind}: weight in [{r.low}, {r.high}]" for kind, r in space.reward.components.items())
        or "- (none)"
    )
    samples = (
        ""
        if space.samples_per_step is None
        else f"Each step samples {space.samples_per_step} completions: batch_size (prompts per step) = "
        f"{space.samples_per_step} / group_size.\n"
    )
    return (
        f"Study {spec.study}: base model {spec.base_model}, {spec.budget.steps_per_trial} RL steps per trial, "
        f"held-out split {spec.eval_split} ({spec.eval_size} questions).\n"
        f"Fixed trial settings: {json.dumps(spec.trial, default=str)}\n{samples}"
        f"Searched hyperparameters (params):\n{params}\n"
        f"Reward: {base} at weight 1 always; optional components (reward_weights, 0 leaves one out):\n"
        f"{rewards}\n{_reward_code_text(spec)}\n{_history_text(history, baseline, best)}\n\nPropose {count} "
        "candidates, each with its own based_on and rationale."
    )


def _reward_code_text(spec: StudySpec) -> str:
    """How to write a reward component as code, where the study allows it."""
    weight = spec.search_space.reward.code
    task = task_class(spec.task)
    if weight is None or not isinstance(task, CodeRewardTask):
        return ""
    return (
        f"A candidate may also add a reward component written as code (reward_code: weight in [{weight.low}, "
        f"{weight.high}] and source), a Python function:\n{task.reward_code_signature}\n"
    )


def _history_text(history: Sequence[TrialSnapshot], baseline: float | None, best: Sequence[TrialSnapshot] = ()) -> str:
    """The trials as the LLM reads them: all of them, or with `best`, the best ones and then the latest (`history`)."""
    lines = [] if baseline is None else [f"The untrained base model scores {baseline:.3f} on the held-out questions."]
    if not history and not best:
        return "\n".join([*lines, "No trials have run yet."])
    columns = "(number, state, held-out accuracy, curve by step, RL gain, params, rationale, failure)"
    if best:
        lines += [f"The best trials so far {columns}:", *map(_record_line, best), "The latest trials:"]
    else:
        lines += [f"Trials so far {columns}:"]
    lines += map(_record_line, history)
    return "\n".join(lines)


def _record_line(record: TrialSnapshot) -> str:
    accuracy = "-" if record.value is None else f"{record.value:.3f}"
    rl_gain, rationale, failure = (record.attrs.get(name) for name in ("rl_gain", "rationale", "failure"))
    curve = ", ".join(f"{step}:{value:.2f}" for step, value in sorted(record.curve.items())) or "-"
    return (
        f"#{record.number} {record.state} acc={accuracy} curve=[{curve}]"
        + ("" if rl_gain is None else f" rl_gain={rl_gain:+.3f}")
        + f" params={json.dumps(record.params)}"
        + (f" rationale={rationale!r}" if rationale else "")
        + (f" failure={failure[:200]!r}" if failure else "")
    )
