"""An OpenAI-compatible chat model as the LLM of a `HybridSampler`, for any Optuna study: it is sent the optimizer's
state as text and answers in JSON mode; what it answers is checked by the sampler against the search space."""

from __future__ import annotations

import os
from typing import Any

import openai
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ConfigDict, Field

from autoresearch.hybrid_sampler import LlmError, OptimizerState, Suggestion

SYSTEM_PROMPT = (
    "You propose the next trials of a hyperparameter search. Learn from the trials so far: vary what scored well, "
    "avoid what failed, stay inside the bounds. Each candidate's rationale says, in a sentence, what it changes from "
    "which earlier trials (by number) and why."
)


class _Candidate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    params: dict[str, Any]
    rationale: str = Field(min_length=1, max_length=500)


class _Reply(BaseModel):
    candidates: list[_Candidate] = Field(min_length=1)


class ChatLlm:
    """Asks `model` at `base_url` (…/v1) for candidates; the key is `api_key`, else the variable `api_key_env`."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        temperature: float = 0.7,
        timeout_s: float = 120.0,
        max_tokens: int = 1024,
    ) -> None:
        key = api_key or os.environ.get(api_key_env)
        if not key:
            raise ValueError(f"no API key: pass api_key or set the environment variable {api_key_env}")
        self.base_url = base_url
        self.chat = ChatOpenAI(
            base_url=base_url,
            model=model,
            api_key=key,
            temperature=temperature,
            timeout=timeout_s,
            max_retries=0,
            max_tokens=max_tokens,
        ).bind(response_format={"type": "json_object"})

    def __call__(self, state: OptimizerState) -> list[Suggestion]:
        """Raises LlmError: `slow` (timed out), `down` (unreachable or refused), `malformed` (not the JSON asked)."""
        try:
            reply = self.chat.invoke([SystemMessage(SYSTEM_PROMPT), HumanMessage(state.prompt())])
        except openai.APITimeoutError:
            raise LlmError("slow", f"the LLM at {self.base_url} timed out") from None
        except openai.APIError as error:
            raise LlmError("down", f"the LLM at {self.base_url} did not answer: {error}") from None
        try:
            candidates = _Reply.model_validate_json(str(reply.content)).candidates
        except ValueError as error:
            first = str(error).strip().splitlines()
            raise LlmError("malformed", f"the LLM's reply is not the JSON asked for: {' '.join(first[:3])}") from None
        return [Suggestion(c.params, c.rationale) for c in candidates]
