"""A tinker-cookbook renderer that writes turns exactly as the tokenizer's own chat template does.

The cookbook's renderers are written by hand per model family, and tinker-cookbook 0.6.1 has none for Qwen2.5 (its
`qwen3_instruct` is ChatML without Qwen2.5's default system turn) or for a Gemma base model given a template. This
one reads the template instead: each message's turn is what the template adds when that message is appended to
the conversation, and a sample stops at the special token that ends an assistant turn in the template.

A turn is split for loss masking as the cookbook's renderers split it: the header (the role's markers) is never
trained; the output is the content and the end-of-turn token, which is exactly what a model samples; and what the
template writes after that token (Qwen's and Gemma's newline) opens the next turn's header, since no sample ever
contains it.

Needs the optional `cookbook` extra; only the cookbook environments import it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import tinker
from tinker_cookbook.renderers import (
    Message,
    ParseTermination,
    RenderContext,
    Renderer,
    RendererError,
    Tokenizer,
    ensure_text,
    register_renderer,
)
from tinker_cookbook.renderers.base import RenderedMessage

CHAT_TEMPLATE_RENDERER = "rl-posttrain/chat_template"

# Stand-in contents for probing the template's shape: plain words that no template rewrites.
_PROBE_QUESTION = "Which tables are there?"
_PROBE_ANSWER = "SELECT 1;"


@dataclass(frozen=True)
class _Turn:
    """One message's turn as text: the header before its content, and the content through the end of the turn."""

    header: str
    output: str


class ChatTemplateRenderer(Renderer):
    """Renders a conversation with the tokenizer's chat template, turn by turn, and parses samples at its
    end-of-turn token.

    Raises RendererError when the tokenizer has no chat template, or when the template cannot be read turn by
    turn: a turn that rewrites earlier ones, or an assistant turn that ends without a special token to stop at.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        super().__init__(tokenizer)
        if not getattr(tokenizer, "chat_template", None):
            raise RendererError(
                f"{CHAT_TEMPLATE_RENDERER}: the tokenizer has no chat template; base models use 'role_colon'"
            )
        probe = [Message(role="user", content=_PROBE_QUESTION)]
        answered = _with(probe, Message(role="assistant", content=_PROBE_ANSWER))
        after_answer = self._turn_text(probe, answered[-1])
        if _PROBE_ANSWER not in after_answer:
            raise RendererError(
                f"{CHAT_TEMPLATE_RENDERER}: the chat template rewrites an assistant's answer, so samples cannot be "
                "parsed back from it"
            )
        closing = self._encode(after_answer.split(_PROBE_ANSWER, 1)[1])
        special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
        if not closing or closing[0] not in special:
            raise RendererError(
                f"{CHAT_TEMPLATE_RENDERER}: the chat template ends an assistant turn with "
                f"{tokenizer.decode(closing)!r}, not with a special token a sample can stop at"
            )
        self.end_of_turn = closing[0]
        # A model may also end with its end-of-sequence token (Qwen2.5's <|endoftext|> beside <|im_end|>).
        eos = tokenizer.eos_token_id
        self.stop_tokens = [self.end_of_turn] + ([eos] if eos is not None and eos != self.end_of_turn else [])

    @property
    def has_extension_property(self) -> bool:
        """A turn does not depend on later ones, so each prompt of an episode extends the one before."""
        return True

    def get_stop_sequences(self) -> list[int]:
        return list(self.stop_tokens)

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        turn = self._turn(message, ctx.prev_message, first=ctx.idx == 0)
        return RenderedMessage(
            header=tinker.types.EncodedTextChunk(tokens=self._encode(turn.header)),
            output=[tinker.types.EncodedTextChunk(tokens=self._encode(turn.output))],
        )

    def _get_generation_suffix(self, role: str, ctx: RenderContext) -> list[int]:
        if role != "assistant":
            raise RendererError(f"{CHAT_TEMPLATE_RENDERER}: a chat template prompts only the assistant, not {role!r}")
        if ctx.prev_message is None:
            raise RendererError(f"{CHAT_TEMPLATE_RENDERER}: a generation prompt needs at least one message")
        context = _context_before(ctx.prev_message)
        prompt = self._render(context, add_generation_prompt=True)
        header = self._trailing(ctx.prev_message) + _suffix_after(self._render(context), prompt, "the reply")
        return self._encode(header)

    def parse_response(self, response: list[int]) -> tuple[Message, ParseTermination]:
        """The content before the first stop token; MALFORMED when the sample never stopped (it hit max_tokens)."""
        stop = next((index for index, token in enumerate(response) if token in self.stop_tokens), None)
        content = self.tokenizer.decode(response if stop is None else response[:stop])
        if stop is None:
            termination = ParseTermination.MALFORMED
        elif response[stop] == self.end_of_turn:
            termination = ParseTermination.STOP_SEQUENCE
        else:
            termination = ParseTermination.EOS
        return Message(role="assistant", content=content), termination

    def _turn(self, message: Message, previous: Message | None, first: bool) -> _Turn:
        context = [] if first else _context_before(previous)
        text = self._turn_text(context, message)
        content = ensure_text(message["content"]).strip()
        # The last occurrence: a first turn may carry a default system turn before it (Qwen2.5's).
        start = text.rfind(content) if content else self._header_length(context, message, text)
        if start < 0:
            raise RendererError(
                f"{CHAT_TEMPLATE_RENDERER}: the chat template rewrites a {message['role']} message's content"
            )
        body = text[start:]
        end = self._end_of_output(body)
        return _Turn(header=self._trailing(previous) + text[:start], output=body[:end])

    def _header_length(self, context: list[Message], message: Message, text: str) -> int:
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

    def _trailing(self, message: Message | None) -> str:
        """What the template writes after `message`'s end-of-turn token; it opens the next turn."""
        if message is None:
            return ""
        text = self._turn_text(_context_before_message(message), message)
        marker = self.tokenizer.decode([self.end_of_turn])
        index = text.rfind(marker)
        return "" if index < 0 else text[index + len(marker) :]

    def _turn_text(self, context: list[Message], message: Message) -> str:
        return _suffix_after(self._render(context), self._render(_with(context, message)), f"a {message['role']} turn")

    def _render(self, messages: Sequence[Message], add_generation_prompt: bool = False) -> str:
        if not messages:
            return ""
        conversation = [{"role": m["role"], "content": ensure_text(m["content"])} for m in messages]
        rendered = self.tokenizer.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        return rendered if isinstance(rendered, str) else str(rendered)

    def _encode(self, text: str) -> list[int]:
        encoded = self.tokenizer.encode(text, add_special_tokens=False)
        ids = encoded["input_ids"] if isinstance(encoded, Mapping) else encoded
        return [int(token) for token in ids]


def _with(messages: Sequence[Message], message: Message) -> list[Message]:
    return [*messages, message]


def _context_before(previous: Message | None) -> list[Message]:
    """A shortest conversation that ends with `previous` and that templates requiring alternating turns from a user
    accept; a turn's text depends on its role and content, not on the words of earlier turns."""
    if previous is None:
        return []
    return _with(_context_before_message(previous), previous)


def _context_before_message(message: Message) -> list[Message]:
    if message["role"] in ("user", "system"):
        return []
    return [Message(role="user", content=_PROBE_QUESTION)]


def _suffix_after(prefix: str, whole: str, what: str) -> str:
    if not whole.startswith(prefix):
        raise RendererError(
            f"{CHAT_TEMPLATE_RENDERER}: the chat template rewrites earlier turns when it adds {what}, so it cannot be "
            "rendered turn by turn; use one of the cookbook's own renderers"
        )
    return whole[len(prefix) :]


def _chat_template_renderer(tokenizer: Tokenizer, image_processor: object = None) -> ChatTemplateRenderer:
    return ChatTemplateRenderer(tokenizer)


register_renderer(CHAT_TEMPLATE_RENDERER, _chat_template_renderer)
