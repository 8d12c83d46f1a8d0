"""OpenAI-compatible inference over the training service: completions and chat of the base model or of any sampler
checkpoint the caller's key owns, through the same generation batches as Tinker's `sample`.

A request is translated at this edge into the engine's `SamplingRequest` (with a structured-output constraint when
`response_format` asks for JSON) and queued with `TrainingService.submit_sampling`, so it batches with every
tenant's Tinker sampling and counts against the same limits. Its answer is read back from the sampling future.
Completions and chat share that flow; each `Endpoint` says only how its prompt is made and how its choices look.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Generic, TypeVar

from pydantic import BaseModel
from transformers import PreTrainedTokenizerBase

from trainer_backend.checkpoints import CheckpointKind, CheckpointPath
from trainer_backend.engine.types import DEFAULT_MAX_TOKENS, SampledSequence, SamplingRequest
from trainer_backend.errors import NotFoundError, ServerError, UserInputError
from trainer_backend.models.loading import LoadedModel
from trainer_backend.service import Submitted, TrainingService
from trainer_backend.structured_output import JsonSchemaConstraint, JsonSchemaConstraints
from trainer_backend.wire import openai as oa

# (sample index, token) as each token is drawn, from the engine's thread.
TokenCallback = Callable[[int, int], None]

RequestT = TypeVar("RequestT", bound=oa.GenerationRequest)


class ChatTemplateMissingError(UserInputError):
    """A chat request to a model without a chat template."""


@dataclass(frozen=True)
class Prompt:
    """What a request asks for, read its endpoint's way: the prompt's tokens, how many tokens a choice may take, and
    whether the choices carry their tokens' logprobs."""

    tokens: list[int]
    max_tokens: int
    logprobs: bool


@dataclass(frozen=True)
class Generated:
    """One finished choice: its text (stop sequence and EOS left out, as OpenAI does) and its tokens."""

    text: str
    token_texts: list[str]
    token_logprobs: list[float]
    finish_reason: str


class Endpoint(ABC, Generic[RequestT]):
    """What `/v1/completions` and `/v1/chat/completions` each do their own way: how a request becomes a prompt, and how
    a choice looks in the answer and in a stream's chunks. The flow around them (submit, wait, answer, stream) is
    `OpenAIInference`'s, the same for both."""

    request_type: ClassVar[type[oa.GenerationRequest]]
    # The answer's id is this prefix and the request's id.
    id_prefix: ClassVar[str]
    answer_type: ClassVar[type[oa.Answer]]
    chunk_type: ClassVar[type[oa.Answer]]

    @abstractmethod
    def prompt(self, request: RequestT) -> Prompt:
        """The request's prompt; raises UserInputError for what this endpoint cannot honour."""

    @abstractmethod
    def choice(self, index: int, generated: Generated, logprobs: bool) -> BaseModel:
        """A finished choice as the answer shows it."""

    @abstractmethod
    def chunk_choice(self, index: int, text: str, finish_reason: str | None) -> BaseModel:
        """A stream's next piece of a choice: text newly drawn, or its end."""

    def opening_choice(self, index: int) -> BaseModel | None:
        """What a stream sends of each choice before its text, if anything."""
        return None


def _refuse_alternatives(field: str, asked: int | None) -> None:
    """Refuse a request for alternatives to each sampled token (`field` > 0): only the sampled token's is given."""
    if asked:
        raise UserInputError(
            f"{field}={asked}: this server gives the sampled token's logprob only ({field}=0), not alternatives"
        )


class Completions(Endpoint[oa.CompletionRequest]):
    """`/v1/completions`: a prompt of text or token ids, answered with text."""

    request_type = oa.CompletionRequest
    id_prefix = "cmpl-"
    answer_type = oa.Completion
    chunk_type = oa.Completion

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer

    def prompt(self, request: oa.CompletionRequest) -> Prompt:
        _refuse_alternatives("logprobs", request.logprobs)
        tokens = list(request.prompt) if isinstance(request.prompt, list) else self.tokenizer.encode(request.prompt)
        max_tokens = request.max_tokens or DEFAULT_MAX_TOKENS
        return Prompt(tokens, max_tokens, logprobs=request.logprobs is not None)

    def choice(self, index: int, generated: Generated, logprobs: bool) -> oa.CompletionChoice:
        return oa.CompletionChoice(
            index=index,
            text=generated.text,
            finish_reason=generated.finish_reason,
            logprobs=_completion_logprobs(generated) if logprobs else None,
        )

    def chunk_choice(self, index: int, text: str, finish_reason: str | None) -> oa.CompletionChoice:
        return oa.CompletionChoice(index=index, text=text, finish_reason=finish_reason)


class Chat(Endpoint[oa.ChatCompletionRequest]):
    """`/v1/chat/completions`: messages rendered by the chat template, answered with the assistant's message."""

    request_type = oa.ChatCompletionRequest
    id_prefix = "chatcmpl-"
    answer_type = oa.ChatCompletion
    chunk_type = oa.ChatCompletionChunk

    def __init__(self, loaded: LoadedModel, chat_template: str | None) -> None:
        self.loaded = loaded
        self.chat_template = chat_template

    def prompt(self, request: oa.ChatCompletionRequest) -> Prompt:
        _refuse_alternatives("top_logprobs", request.top_logprobs)
        if not self.chat_template:
            raise ChatTemplateMissingError(
                f"model {self.loaded.name!r} has no chat template: use /v1/completions with a prompt, or "
                "start the server with --chat-template FILE"
            )
        tokenizer = self.loaded.tokenizer
        text = tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.text()} for m in request.messages],
            chat_template=self.chat_template,
            add_generation_prompt=True,
            tokenize=False,
        )
        # The template writes the special tokens (BOS) itself.
        tokens = tokenizer.encode(text, add_special_tokens=False)
        # Chat takes whatever room the context leaves, as OpenAI does.
        room = self.loaded.max_context_length - len(tokens)
        max_tokens = request.max_completion_tokens or request.max_tokens or max(room, 1)
        return Prompt(tokens, max_tokens, logprobs=request.logprobs)

    def choice(self, index: int, generated: Generated, logprobs: bool) -> oa.ChatChoice:
        return oa.ChatChoice(
            index=index,
            message=oa.AssistantMessage(content=generated.text),
            finish_reason=generated.finish_reason,
            logprobs=_chat_logprobs(generated) if logprobs else None,
        )

    def chunk_choice(self, index: int, text: str, finish_reason: str | None) -> oa.ChatChunkChoice:
        return oa.ChatChunkChoice(index=index, delta=oa.Delta(content=text or None), finish_reason=finish_reason)

    def opening_choice(self, index: int) -> oa.ChatChunkChoice:
        return oa.ChatChunkChoice(index=index, delta=oa.Delta(role="assistant", content=""))


@dataclass(frozen=True)
class PendingGeneration:
    """A queued OpenAI request: its sampling future and what is needed to answer it."""

    submitted: Submitted
    endpoint: Endpoint
    model: str
    prompt: Prompt
    num_samples: int
    stop_strings: tuple[str, ...]
    created: int

    @property
    def id(self) -> str:
        return f"{self.endpoint.id_prefix}{self.submitted.record.request_id}"


class OpenAIInference:
    """Translates OpenAI requests to sampling calls and sampling results to OpenAI answers."""

    def __init__(self, service: TrainingService, chat_template: Path | None) -> None:
        self.service = service
        loaded = service.loaded
        self.tokenizer = loaded.tokenizer
        self.constraints = JsonSchemaConstraints(loaded.tokenizer, loaded.vocab_size)
        self.completions = Completions(loaded.tokenizer)
        template = chat_template.read_text() if chat_template is not None else loaded.tokenizer.chat_template
        self.chat = Chat(loaded, template)

    # --- models -------------------------------------------------------------------------------------------

    def models(self, owner: str) -> oa.ModelList:
        """The base model and every sampler checkpoint the key owns, by the names requests use."""
        base = oa.ModelCard(id=self.service.loaded.name, created=0, owned_by="trainer_backend")
        checkpoints = [
            oa.ModelCard(id=info.path, created=int(info.created_at), owned_by=owner)
            for info in self.service.checkpoints.list(owner)
            if info.kind is CheckpointKind.SAMPLER
        ]
        return oa.ModelList(data=[base, *checkpoints])

    def _weights_folder(self, owner: str, model: str) -> Path | None:
        if model == self.service.loaded.name:
            return None
        if not model.startswith("tinker://"):
            raise NotFoundError(
                f"model {model!r} is neither this server's base model {self.service.loaded.name!r} nor a tinker:// "
                "checkpoint path; GET /v1/models lists those this key can use"
            )
        return self.service.checkpoints.folder(self.service.owned_checkpoint(owner, model))

    # --- requests -----------------------------------------------------------------------------------------

    def submit(
        self,
        endpoint: Endpoint[RequestT],
        owner: str,
        request: RequestT,
        body: bytes,
        on_token: TokenCallback | None = None,
    ) -> PendingGeneration:
        """Queue `request` of `endpoint` as a sampling request; `on_token` hears each token as it is drawn."""
        prompt = endpoint.prompt(request)
        unsupported = request.unsupported_fields()
        if unsupported:
            raise UserInputError(f"not supported by this server: {', '.join(unsupported)}")
        # The constraint is made first: a bad response_format is named before an unknown model.
        constraint = self._constraint(request.response_format)
        folder = self._weights_folder(owner, request.model)
        sampling = SamplingRequest(
            prompt_tokens=tuple(prompt.tokens),
            num_samples=request.n,
            max_tokens=prompt.max_tokens,
            temperature=request.temperature,
            top_k=request.top_k,
            top_p=request.top_p,
            seed=request.seed,
            stop_at_eos=not request.ignore_eos,
            stop_strings=request.stop_strings(),
            constraint=constraint,
            on_token=on_token,
            weights_folder=folder,
        )
        # A checkpoint's sampling counts toward the run that saved it, as Tinker's `sample` does.
        run = None if folder is None else CheckpointPath.parse(request.model).model_id
        submitted = self.service.submit_sampling(
            owner, sampling, f"openai:{owner}", body, key=None, run=run, batch_invariant=request.batch_invariant
        )
        return PendingGeneration(
            submitted, endpoint, request.model, prompt, request.n, sampling.stop_strings, int(time.time())
        )

    def _constraint(self, response_format: oa.ResponseFormat | None) -> JsonSchemaConstraint | None:
        if response_format is None or response_format.type == "text":
            return None
        if response_format.type == "json_object":
            return self.constraints.for_schema(None, "response_format")
        if response_format.json_schema is None or response_format.json_schema.json_schema is None:
            raise UserInputError("response_format.json_schema.schema is required for type json_schema")
        return self.constraints.for_schema(response_format.json_schema.json_schema, "response_format.json_schema")

    # --- answers ------------------------------------------------------------------------------------------

    def generated(self, pending: PendingGeneration) -> list[Generated]:
        """The choices of a sampling future that completed."""
        sampled = pending.submitted.sampled
        if sampled is None or not sampled.done():
            raise ServerError("the sampling request completed without its result")
        return [self._choice(sequence, pending.stop_strings) for sequence in sampled.result().sequences]

    def _choice(self, sequence: SampledSequence, stop_strings: tuple[str, ...]) -> Generated:
        tokens, logprobs = list(sequence.tokens), list(sequence.logprobs)
        if sequence.stop_reason == "stop" and tokens and tokens[-1] in self.service.loaded.eos_token_ids:
            tokens, logprobs = tokens[:-1], logprobs[:-1]
        # Special tokens stay out of the text, as vLLM's default has it; each token's own text keeps them.
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        cut = min((i for i in (text.find(s) for s in stop_strings) if i >= 0), default=-1)
        if cut >= 0:
            text = text[:cut]
        token_texts = [self.tokenizer.decode([t], skip_special_tokens=False) for t in tokens]
        finish_reason = "stop" if sequence.stop_reason == "stop" else "length"
        return Generated(text, token_texts, logprobs, finish_reason)

    def answer(self, pending: PendingGeneration, choices: list[Generated]) -> oa.Answer:
        """The whole answer to a request that was not streamed."""
        endpoint = pending.endpoint
        return endpoint.answer_type(
            id=pending.id,
            created=pending.created,
            model=pending.model,
            choices=[endpoint.choice(i, c, pending.prompt.logprobs) for i, c in enumerate(choices)],
            usage=_usage(pending, choices),
        )

    def opening_chunks(self, pending: PendingGeneration) -> list[dict]:
        """What a stream sends before any text."""
        opening = (pending.endpoint.opening_choice(index) for index in range(pending.num_samples))
        return [self._chunk(pending, choice) for choice in opening if choice is not None]

    def chunk(self, pending: PendingGeneration, index: int, text: str, finish_reason: str | None) -> dict:
        """A stream's chunk of choice `index`: text newly drawn, or the choice's end."""
        return self._chunk(pending, pending.endpoint.chunk_choice(index, text, finish_reason))

    def _chunk(self, pending: PendingGeneration, choice: BaseModel) -> dict:
        chunk = pending.endpoint.chunk_type(
            id=pending.id, created=pending.created, model=pending.model, choices=[choice]
        )
        return chunk.model_dump(mode="json")

    def incremental_text(self, stop_strings: tuple[str, ...]) -> IncrementalText:
        return IncrementalText(self.tokenizer, stop_strings)


class IncrementalText:
    """One streamed choice's text as its tokens arrive: what may be sent now, holding back what a stop string still
    forming could cut, or an unfinished multi-byte character.

    Each token decodes only the few tokens since the last complete text (the prefix/read offsets of text-generation-
    inference's streaming): decoding the whole sequence each time would cost time quadratic in its length. Both
    decodes start at the same token, so a tokenizer that drops a leading space at the start of a decode drops it
    from both, and their difference is the new text.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop_strings: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.stop_strings = stop_strings
        # A stop string may be forming in the last characters: they wait for the next token.
        self.hold_back = max(map(len, stop_strings), default=1) - 1
        self.tokens: list[int] = []
        self.text = ""  # the decoded text of every complete character so far
        self.sent = ""
        self._prefix_offset = 0  # where the decodes start
        self._read_offset = 0  # tokens before this are in `text`

    def add(self, token: int) -> str:
        """The text newly safe to send after `token`."""
        self.tokens.append(token)
        self.text += self._new_text()
        text = self.text
        safe = len(text) - self.hold_back
        # One token can complete a stop string and run past it: the answer ends where the stop string starts. A stop
        # string cannot start inside what was sent (it would have been held back), so the search starts after it.
        found = (text.find(stop, len(self.sent)) for stop in self.stop_strings)
        cut = min((i for i in found if i >= 0), default=-1)
        if cut >= 0:
            safe = min(safe, cut)
        if safe <= len(self.sent):
            return ""
        delta = text[len(self.sent) : safe]
        self.sent += delta
        return delta

    def _new_text(self) -> str:
        """The complete characters the tokens since the read offset add; none while a character is unfinished."""
        decode = self.tokenizer.decode
        before = decode(self.tokens[self._prefix_offset : self._read_offset], skip_special_tokens=True)
        after = decode(self.tokens[self._prefix_offset :], skip_special_tokens=True)
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self.tokens)
        return after[len(before) :]

    def rest(self, final_text: str) -> str:
        """What is left to send of the choice's final text (stop sequence cut off)."""
        return final_text[len(self.sent) :] if final_text.startswith(self.sent) else ""


def _usage(pending: PendingGeneration, choices: list[Generated]) -> oa.Usage:
    prompt_tokens = len(pending.prompt.tokens)
    completion_tokens = sum(len(c.token_texts) for c in choices)
    return oa.Usage(
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=prompt_tokens + completion_tokens
    )


def _completion_logprobs(choice: Generated) -> oa.CompletionLogprobs:
    offsets, at = [], 0
    for text in choice.token_texts:
        offsets.append(at)
        at += len(text)
    return oa.CompletionLogprobs(
        tokens=choice.token_texts, token_logprobs=choice.token_logprobs, text_offset=offsets, top_logprobs=None
    )


def _chat_logprobs(choice: Generated) -> oa.ChoiceLogprobs:
    return oa.ChoiceLogprobs(
        content=[
            oa.TokenLogprob(token=text, logprob=logprob, bytes=list(text.encode()))
            for text, logprob in zip(choice.token_texts, choice.token_logprobs, strict=True)
        ]
    )
