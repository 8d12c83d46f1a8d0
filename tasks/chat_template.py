"""A tokenizer's chat template read turn by turn: the one chat renderer of the project.

Trials render their chat prompts and warm-up targets with it, and `tasks.chat_template_renderer` wraps it as a
tinker-cookbook renderer, so both write a turn and end it the same way. Each message's turn is what the template adds
when that message is appended to the conversation, and an assistant turn ends at the special token the template
closes it with (found by probing the template, not assumed to be the tokenizer's end-of-sequence token).

A turn is split for loss masking as the cookbook's renderers split it: the header (the role's markers) is never
trained; the output is the content and the end-of-turn token, which is exactly what a model samples; and what the
template writes after that token (Qwen's and Gemma's newline) opens the next turn's header, since no sample ever
contains it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from tasks.errors import TaskError

# Stand-in contents for probing the template's shape: plain words that no template rewrites.
_PROBE_QUESTION = "Which tables are there?"
_PROBE_ANSWER = "SELECT 1;"

# A message as chat templates read it: {"role": ..., "content": ...}.
ChatMessage = Mapping[str, str]


class ChatTemplateError(TaskError, ValueError):
    """The tokenizer has no chat template, or its template cannot be read turn by turn."""


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer that renders prompts (the SDK's `get_tokenizer()` returns one)."""

    chat_template: str | None
    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: object) -> object: ...


@dataclass(frozen=True)
class RenderedTurn:
    """One message's turn as tokens: the header before its content, and the content through the end of the turn."""

    header: tuple[int, ...]
    output: tuple[int, ...]


@dataclass(frozen=True)
class _Turn:
    header: str
    output: str


class ChatTemplate:
    """Renders a conversation with the tokenizer's chat template, turn by turn.

    Raises ChatTemplateError when the tokenizer has no chat template, or when the template cannot be read turn by
    turn: a turn that rewrites earlier ones, or an assistant turn that ends without a special token to stop at.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError("the tokenizer has no chat template")
        probe = {"role": "user", "content": _PROBE_QUESTION}
        after_answer = self._turn_text([probe], {"role": "assistant", "content": _PROBE_ANSWER})
        if _PROBE_ANSWER not in after_answer:
            raise ChatTemplateError(
                "the chat template rewrites an assistant's answer, so samples cannot be parsed back from it"
            )
        closing = self._encode(after_answer.split(_PROBE_ANSWER, 1)[1])
        special = set(getattr(tokenizer, "all_special_ids", ())) | set(getattr(tokenizer, "added_tokens_decoder", {}))
        if not closing or closing[0] not in special:
            raise ChatTemplateError(
                f"the chat template ends an assistant turn with {tokenizer.decode(closing)!r}, not with a special "
                "token a sample can stop at"
            )
        self.end_of_turn = closing[0]
        # A model may also end with its end-of-sequence token (Qwen2.5's <|endoftext|> beside <|im_end|>).
        eos = tokenizer.eos_token_id
        self.stop_tokens = (self.end_of_turn, *((eos,) if eos is not None and eos != self.end_of_turn else ()))

    def turn(self, message: ChatMessage, previous: ChatMessage | None, first: bool) -> RenderedTurn:
        """`message`'s turn after `previous` (None, or `first`, for the conversation's first turn)."""
        context = [] if first else _context_before(previous)
        text = self._turn_text(context, message)
        content = message["content"].strip()
        # The last occurrence: a first turn may carry a default system turn before it (Qwen2.5's).
        start = text.rfind(content) if content else self._header_length(context, message, text)
        if start < 0:
            raise ChatTemplateError(f"the chat template rewrites a {message['role']} message's content")
        body = text[start:]
        turn = _Turn(header=self._trailing(previous) + text[:start], output=body[: self._end_of_output(body)])
        return RenderedTurn(header=self._encode(turn.header), output=self._encode(turn.output))

    def generation_suffix(self, previous: ChatMessage) -> tuple[int, ...]:
        """What opens the assistant's reply after `previous`: the rest of `previous`'s turn, then the template's
        generation prompt."""
        context = _context_before(previous)
        prompt = self._render(context, add_generation_prompt=True)
        return self._encode(self._trailing(previous) + _suffix_after(self._render(context), prompt, "the reply"))

    def generation_prompt(self, messages: Sequence[ChatMessage]) -> tuple[int, ...]:
        """The conversation's turns with the assistant's reply opened after them."""
        tokens: list[int] = []
        for index, message in enumerate(messages):
            turn = self.turn(message, messages[index - 1] if index else None, first=index == 0)
            tokens += [*turn.header, *turn.output]
        return (*tokens, *self.generation_suffix(messages[-1]))

    def reply(self, previous: ChatMessage, content: str) -> tuple[int, ...]:
        """An assistant's reply with `content` after `previous`, as a model samples it after the generation prompt:
        the content through the end-of-turn token.

        Raises:
            ChatTemplateError: the template opens an assistant turn otherwise than its generation prompt does, so
                the reply would not continue the prompt.
        """
        turn = self.turn({"role": "assistant", "content": content}, previous, first=False)
        if turn.header != self.generation_suffix(previous):
            raise ChatTemplateError(
                "the chat template opens an assistant's turn otherwise than its generation prompt, so a reply does "
                "not continue the prompt"
            )
        return turn.output

    def _header_length(self, context: list[ChatMessage], message: ChatMessage, text: str) -> int:
        """Where an empty message's content would start: after the role's header, which for the assistant is the
        template's generation prompt."""
        if message["role"] != "assistant":
            return len(text)
        prompt = _suffix_after(self._render(context), self._render(context, add_generation_prompt=True), "the reply")
        return len(prompt) if text.startswith(prompt) else len(text)

    def _end_of_output(self, body: str) -> int:
        """The end of a turn's output: through its end-of-turn token; what the template writes after it belongs to
        the next turn."""
        marker = self.tokenizer.decode([self.end_of_turn])
        index = body.rfind(marker)
        return len(body) if index < 0 else index + len(marker)

    def _trailing(self, message: ChatMessage | None) -> str:
        """What the template writes after `message`'s end-of-turn token; it opens the next turn."""
        if message is None:
            return ""
        text = self._turn_text(_context_before_message(message), message)
        marker = self.tokenizer.decode([self.end_of_turn])
        index = text.rfind(marker)
        return "" if index < 0 else text[index + len(marker) :]

    def _turn_text(self, context: list[ChatMessage], message: ChatMessage) -> str:
        return _suffix_after(self._render(context), self._render([*context, message]), f"a {message['role']} turn")

    def _render(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = False) -> str:
        if not messages:
            return ""
        conversation = [{"role": m["role"], "content": m["content"]} for m in messages]
        rendered = self.tokenizer.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        return rendered if isinstance(rendered, str) else str(rendered)

    def _encode(self, text: str) -> tuple[int, ...]:
        encoded = self.tokenizer.encode(text, add_special_tokens=False)
        # Tokenizers of transformers 5 may answer with a BatchEncoding, earlier ones with the ids.
        ids = encoded["input_ids"] if isinstance(encoded, Mapping) else encoded
        return tuple(int(token) for token in ids)


def _context_before(previous: ChatMessage | None) -> list[ChatMessage]:
    """A shortest conversation that ends with `previous` and that templates requiring alternating turns from a user
    accept; a turn's text depends on its role and content, not on the words of earlier turns."""
    if previous is None:
        return []
    return [*_context_before_message(previous), previous]


def _context_before_message(message: ChatMessage) -> list[ChatMessage]:
    if message["role"] in ("user", "system"):
        return []
    return [{"role": "user", "content": _PROBE_QUESTION}]


def _suffix_after(prefix: str, whole: str, what: str) -> str:
    if not whole.startswith(prefix):
        raise ChatTemplateError(
            f"the chat template rewrites earlier turns when it adds {what}, so it cannot be rendered turn by turn"
        )
    return whole[len(prefix) :]
