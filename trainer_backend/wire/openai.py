"""OpenAI's request and response shapes for `/v1/completions`, `/v1/chat/completions` and `/v1/models`.

Requests keep OpenAI's field names and ranges. A field this server cannot honour exactly is refused by name
(`unsupported_fields`) unless it holds its neutral value (a presence penalty of 0 changes nothing), so a client never
gets a silently different answer. `top_k` is accepted as vLLM accepts it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# Fields OpenAI defines that change nothing at these values; any other value is refused.
_NEUTRAL: dict[str, tuple[object, ...]] = {
    "frequency_penalty": (0, 0.0, None),
    "presence_penalty": (0, 0.0, None),
    "logit_bias": (None, {}),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "echo": (False, None),
    "parallel_tool_calls": (None, False, True),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "n": (None,),
}
# Fields that do not change the answer at all.
_IGNORED = frozenset({"user", "stream_options", "metadata", "store", "service_tier", "prompt_cache_key"})


class JsonSchemaFormat(BaseModel):
    name: str = "response"
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class GenerationRequest(BaseModel):
    """What completions and chat completions share."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)
    n: int = Field(1, ge=1)
    stream: bool = False
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)
    response_format: ResponseFormat | None = None
    # vLLM's extension: go on past EOS until max_tokens or a stop string.
    ignore_eos: bool = False
    # This server's extension: answered as if alone on the server, the same bit for bit whatever else it runs
    # (trainer_backend/batch_invariance.py); the openai client sends it with extra_body={"batch_invariant": True}.
    batch_invariant: bool = False

    def unsupported_fields(self) -> list[str]:
        """The fields given that this server cannot honour: unknown ones, and known ones away from neutral."""
        extra = self.model_extra or {}
        return sorted(
            name
            for name, value in extra.items()
            if name not in _IGNORED and (name not in _NEUTRAL or value not in _NEUTRAL[name])
        )

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionRequest(GenerationRequest):
    prompt: str | list[int]
    # OpenAI's `logprobs` asks for that many alternatives a position besides the sampled token's logprob; this server
    # gives the sampled token's (logprobs=0) and refuses alternatives by name.
    logprobs: int | None = Field(None, ge=0, le=5)


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None = None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: Literal["stop", "length"] | None
    logprobs: CompletionLogprobs | None = None


class Answer(BaseModel):
    """What every answer and stream chunk starts with; each kind names its `object` and adds its choices."""

    id: str
    object: str
    created: int
    model: str


class Completion(Answer):
    """An answer of /v1/completions, and each chunk of its stream (without usage)."""

    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[dict[str, Any]] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length"]
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(Answer):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: Delta
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(Answer):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
