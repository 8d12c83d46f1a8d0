"""A tinker-cookbook renderer that writes turns exactly as the tokenizer's own chat template does.

The cookbook's renderers are written by hand per model family, and tinker-cookbook 0.6.1 has none for Qwen2.5 (its
`qwen3_instruct` is ChatML without Qwen2.5's default system turn) or for a Gemma base model given a template. This
one is `tasks.chat_template.ChatTemplate`, the renderer trials use for their chat prompts, behind the cookbook's
`Renderer` interface: a sample stops at the special token that ends an assistant turn in the template.

Needs the optional `cookbook` extra; only the cookbook environments import it.
"""

from __future__ import annotations

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

from tasks.chat_template import ChatMessage, ChatTemplate, ChatTemplateError

CHAT_TEMPLATE_RENDERER = "rl-posttrain/chat_template"


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
        try:
            self.template = ChatTemplate(tokenizer)
        except ChatTemplateError as error:
            raise RendererError(f"{CHAT_TEMPLATE_RENDERER}: {error}; use one of the cookbook's own renderers") from None
        self.end_of_turn = self.template.end_of_turn
        self.stop_tokens = list(self.template.stop_tokens)

    @property
    def has_extension_property(self) -> bool:
        """A turn does not depend on later ones, so each prompt of an episode extends the one before."""
        return True

    def get_stop_sequences(self) -> list[int]:
        return list(self.stop_tokens)

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        turn = self.template.turn(_chat_message(message), _chat_message(ctx.prev_message), first=ctx.idx == 0)
        return RenderedMessage(
            header=tinker.types.EncodedTextChunk(tokens=list(turn.header)),
            output=[tinker.types.EncodedTextChunk(tokens=list(turn.output))],
        )

    def _get_generation_suffix(self, role: str, ctx: RenderContext) -> list[int]:
        if role != "assistant":
            raise RendererError(f"{CHAT_TEMPLATE_RENDERER}: a chat template prompts only the assistant, not {role!r}")
        previous = _chat_message(ctx.prev_message)
        if previous is None:
            raise RendererError(f"{CHAT_TEMPLATE_RENDERER}: a generation prompt needs at least one message")
        return list(self.template.generation_suffix(previous))

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


def _chat_message(message: Message | None) -> ChatMessage | None:
    return None if message is None else {"role": message["role"], "content": ensure_text(message["content"])}


def _chat_template_renderer(tokenizer: Tokenizer, image_processor: object = None) -> ChatTemplateRenderer:
    return ChatTemplateRenderer(tokenizer)


register_renderer(CHAT_TEMPLATE_RENDERER, _chat_template_renderer)
