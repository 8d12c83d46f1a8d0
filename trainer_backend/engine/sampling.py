"""Token sampling with exact log-probabilities: the engine behind the Tinker API's `sample`.

`sample_batch` serves several requests, of one adapter or of several, as one generation batch: their prompts
are prefilled together (left-padded; prompts that begin alike, such as questions over one database schema, have
their common prefix computed once), each prompt's KV cache is copied across its `num_samples` rows, and every
step decodes one token for each row still running, each row through its own adapter: a batch of one adapter runs
it as PEFT's active adapter, a batch of the base model alone with adapters disabled, and a batch that mixes them
routes each row to its own (`adapters.routed_rows`); a row that stops leaves the batch (and the cache) at once.
Between steps a running batch may take in more requests (`Joining`: another tenant's RL step joins a long evaluation's
batch, so both share its decode steps, each handed its completions as soon as its own rows are done; with
`TAKE_IN_PROMPT_SCORES`, a request for prompt scores it takes in is served on its own between two steps). `sample` is
the one-request case.

Semantics, matched to the Tinker SDK 0.38 and the tinker-cookbook:

- The logprob of a sampled token is its log-probability under the distribution it was drawn from: the
  model's logits divided by the temperature, cut to the top-k, cut to the top-p nucleus, renormalised.
  The cookbook's `tests/validate_temperature_logprobs.py` checks that Tinker's sampled logprobs scale with
  1/temperature, and its `importance_sampling` loss reads them as the sampling policy q. At temperature 0
  the token is the argmax and its logprob is the model's own (temperature 1, unfiltered), as a point mass
  would report only 0.0.
- Prompt logprobs are the model's own (temperature 1, unfiltered), as the SDK's `compute_logprobs` presents
  them; position 0 has no context and gets None (`SampleResponse.prompt_logprobs`).
- A stop token (an EOS id or one of `stop_token_ids`) is kept as the last returned token: the cookbook's
  `parse_response_for_stop_token` expects exactly one in every response that stopped. A stop string ends the
  sequence at the token that completes it, which is kept too, so the tokens are exactly what was sampled.
- `stop_reason` is "stop" when a stop token or string ended the sequence, else "length" (`StopReason`).
- `top_k` of -1 (the SDK's "no limit") or 0 disables top-k.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from peft import PeftModel
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import Tensor
from transformers import Cache, PretrainedConfig, PreTrainedModel

from trainer_backend.engine.adapters import routed_rows
from trainer_backend.engine.drawing import draw_from_hidden, draw_from_logits
from trainer_backend.engine.kv_cache import (
    append_rows,
    copied_cache,
    drop_leading_positions,
    joinable_capacity,
    preallocated_cache,
)
from trainer_backend.engine.output_head import cap, linear_output_head
from trainer_backend.engine.prefixes import plan_shared_prefill, shared_prefix_groups
from trainer_backend.engine.types import (
    SampledSequence,
    SamplingInputError,
    SamplingRequest,
    SamplingResult,
    StopReason,
    TokenConstraint,
    TopkLogprobs,
)
from trainer_backend.engine.unembedding import unembedding_logits

# The prompt is scored a chunk of positions at a time so that its fp32 logits stay near this size: Gemma 3's
# 262,144-entry vocabulary makes a whole 4k-token prompt's logits 4 GiB.
_PROMPT_LOGITS_BYTES = 256 * 2**20
# Tokens decoded when looking for a stop string, per character of the longest one: byte-fallback tokenizers
# can spend up to four tokens on one character, and the margin keeps the window's first, possibly partial,
# character away from the match.
_STOP_WINDOW_TOKENS_PER_CHAR = 4
_STOP_WINDOW_MARGIN = 8
# A generation calls its pause callback every this many decode steps, so that other tenants' operations (an optimizer
# step, a generation of their own) wait for a token, not for the whole generation. Every step: with 8, another
# tenant's operations waited about 3 s each for a pause of a 30-row evaluation batch of Gemma 3 270M
# (benchmarks.fairness), and a pause with nothing to run only takes the scheduler's lock and looks at each lane's next
# operation.
PAUSE_EVERY_STEPS = 1


# PEFT's adapter name for rows of a mixed batch that go through no adapter (the base model).
BASE_ROWS = "__base__"


@dataclass(frozen=True)
class BoundSamplingRequest:
    """A request bound to what the engine resolved for it: the loaded adapter its rows go through (its
    `weights_folder`'s) and the EOS ids that end its sequences (its `stop_at_eos`'s).

    `adapter` is the name of an adapter loaded in the `PeftModel`, or None for the base model. `eos_token_ids`
    end a sequence besides the request's own `stop_token_ids`; () when the client disabled stopping.
    """

    request: SamplingRequest
    adapter: str | None = None
    eos_token_ids: tuple[int, ...] = ()


# What a generation may hold beside its own rows' reach, to take in more: this many times the positions its first
# jobs need (prompt and completion), within the model's context and any sliding window (a cache past a window is
# transformers' own, which takes in nothing). Positions a generation never fills cost no memory (`kv_cache.py`).
JOIN_HEADROOM = 2
# A running generation drops the positions no row reads any more once they are this share of its cache's room: often
# enough that the room does not fill, rarely enough that copying the cache costs little beside the decode steps.
UNREAD_SHARE_TO_DROP = 1 / 8
# Whether a running generation takes in requests for prompt scores, served between two of its steps; off, they run
# nested in its pauses. On is the variant `scores-taken-in` (benchmarks/scheduler_variants.py): tried for a KL
# penalty's reference scores, which waited up to 118 s for pauses beside a study's Qwen trial, it gained nothing
# on two Gemma trials with a KL penalty (757 s together against 709 s, one run each; docs/performance.md), and is
# left to measure on Qwen's long prompts.
TAKE_IN_PROMPT_SCORES = False


class JoinRoom:
    """What a running generation can take in now, asked one request at a time: a valid request whose prompt and
    completion fit its cache beside its own rows, or with `TAKE_IN_PROMPT_SCORES` one that asks for prompt scores
    (served on its own cache between two steps). Each accepted request to join counts for the next: the rows taken in
    together are right-aligned at the longest of their prompts and the running rows."""

    def __init__(self, length: int, capacity: int, remaining: int, vocab_size: int, max_context_length: int) -> None:
        """`length`: the positions every running row has filled; `remaining`: the most tokens one may still add."""
        self.length, self.capacity, self.remaining = length, capacity, remaining
        self._vocab_size, self._max_context_length = vocab_size, max_context_length

    def accepts(self, request: SamplingRequest) -> bool:
        """Whether `request` can join with those accepted before it; if so it counts as taken in."""
        try:
            request.check(self._vocab_size, self._max_context_length)
        except SamplingInputError:
            return False
        if request.scores_prompt:
            return TAKE_IN_PROMPT_SCORES
        length = max(self.length, len(request.prompt_tokens))
        remaining = max(self.remaining, request.max_tokens)
        if length + remaining > self.capacity:
            return False
        self.length, self.remaining = length, remaining
        return True


@dataclass(frozen=True)
class Joining:
    """How a running generation takes in more jobs between its decode steps and hands back each job's outcome as soon
    as its rows are done (continuous batching).

    `admit(room)` is called before every decode step and returns the jobs to take in, each accepted by
    `room.accepts`. `finished(index, outcome)` is called once for every job, as soon as its outcome exists; `index`
    counts the jobs `sample_batch` was given, then the admitted ones in the order they were admitted.
    """

    admit: Callable[[JoinRoom], Sequence[BoundSamplingRequest]]
    finished: Callable[[int, SamplingResult | SamplingInputError], None]
    # Called once the jobs an `admit` returned are prefilled, before the next decode step: the time since that
    # `admit` was theirs alone (the running rows waited), which the caller may count to them.
    prefilled: Callable[[], None] = lambda: None


def sample(
    model: PreTrainedModel | PeftModel,
    request: SamplingRequest,
    eos_token_ids: tuple[int, ...],
    decode: Callable[[Sequence[int]], str],
    max_context_length: int,
    adapter: str | None = None,
) -> SamplingResult:
    """Sample `request.num_samples` completions of one prompt; `sample_batch` with a single job.

    Raises:
        SamplingInputError: an empty prompt, out-of-vocabulary ids, a parameter out of range, or a prompt
            plus `max_tokens` longer than `max_context_length`.
    """
    (outcome,) = sample_batch(
        model, [BoundSamplingRequest(request, adapter, eos_token_ids)], decode, max_context_length
    )
    if isinstance(outcome, SamplingInputError):
        raise outcome
    return outcome


def sample_batch(
    model: PreTrainedModel | PeftModel,
    jobs: Sequence[BoundSamplingRequest],
    decode: Callable[[Sequence[int]], str],
    max_context_length: int,
    pause: Callable[[], None] = lambda: None,
    joining: Joining | None = None,
) -> list[SamplingResult | SamplingInputError]:
    """Sample every job's completions in one generation batch, each row through its own job's adapter.

    The prompts are left-padded into one prefill; then every running row of every job decodes one token per
    step, and a row that stops leaves the batch. Each job draws from its own generator with its own parameters,
    so a seeded job gets the tokens it would get alone (up to float rounding of the batched matmuls). A job
    that asks for prompt log-probs is prefilled and decoded on its own: its prompt's scores need logits at
    every prompt position, which a batched prefill does not keep; such jobs that begin alike share the pass of
    their common prefix (`_sample_with_prompt_scores`).

    Args:
        model: a causal LM, or a `PeftModel` holding every adapter the jobs name. It runs in eval mode and is
            put back in its previous mode afterwards.
        jobs: the requests, each with its adapter and stop ids.
        decode: token ids to text, used only to look for stop strings.
        max_context_length: the most tokens, prompt and completion together, the model may see.
        pause: called every `PAUSE_EVERY_STEPS` decode steps, outside inference mode; it may run other work on
            the model (a training step of another adapter) as long as it leaves the adapters the jobs use alone.
        joining: lets the batch of the jobs without prompt scores take in more jobs between its steps (with
            `TAKE_IN_PROMPT_SCORES`, those with prompt scores too, served then one after another as their own
            batches), and hands every job's outcome back as soon as it exists.

    Returns:
        One outcome per job, in order (the jobs given, then those admitted): its completions (and prompt log-probs
        if asked), or the `SamplingInputError` that names what is wrong with the request (the other jobs still run).
    """
    vocab_size = model.get_output_embeddings().weight.shape[0]
    outcomes: list[SamplingResult | SamplingInputError | None] = [None] * len(jobs)

    def deliver(index: int, outcome: SamplingResult | SamplingInputError) -> None:
        outcomes.extend([None] * (index + 1 - len(outcomes)))
        outcomes[index] = outcome
        if joining is not None:
            joining.finished(index, outcome)

    batched: list[int] = []
    for index, job in enumerate(jobs):
        try:
            job.request.check(vocab_size, max_context_length)
        except SamplingInputError as error:
            deliver(index, error)
            continue
        batched.append(index)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            scored = [i for i in batched if jobs[i].request.scores_prompt]
            for job, result in _sample_with_prompt_scores(model, [jobs[i] for i in scored], decode, pause):
                deliver(scored[job], result)
            together = [i for i in batched if not jobs[i].request.scores_prompt]
            if together:
                admission = _Admission(joining, list(together), len(jobs), vocab_size, max_context_length, deliver)
                _generate(model, [jobs[i] for i in together], decode, pause, admission)
    finally:
        model.train(was_training)
    if any(outcome is None for outcome in outcomes):
        raise RuntimeError("a sampling job ended without an outcome")
    return outcomes


def _adapter_scope(model: PreTrainedModel | PeftModel, adapters: Sequence[str | None]) -> AbstractContextManager:
    """Within it, a forward sends batch row i through adapter `adapters[i]` (None: the base model).

    A batch of one adapter (an evaluation, one tenant's RL step) runs that adapter as PEFT's active one; only a
    mixed batch pays for PEFT's mixed-batch LoRA, which gathers and scatters every LoRA layer's rows by adapter.
    Checked for each forward, since a pause between decode steps may run another adapter's training; set only when
    another is active (PEFT's set_adapter visits every module: 5 ms on Gemma 3 270M, every decode step).
    """
    if not isinstance(model, PeftModel):
        if any(adapter is not None for adapter in adapters):
            raise ValueError("jobs name adapters, but the model has none")
        # A generation begun before the first adapter holds the bare model; creating or loading one in its pause
        # wraps that same model in PEFT, in place, and the new LoRA layers must not reach this generation's rows.
        return _tuner_layers_off(model)
    distinct = set(adapters)
    if distinct == {None}:
        return model.disable_adapter()
    if len(distinct) == 1:
        (adapter,) = distinct
        if model.active_adapter != adapter:
            model.set_adapter(adapter, inference_mode=True)
        return contextlib.nullcontext()
    return routed_rows(model, [BASE_ROWS if adapter is None else adapter for adapter in adapters])


@contextlib.contextmanager
def _tuner_layers_off(model: PreTrainedModel) -> Iterator[None]:
    """Within it, the LoRA layers PEFT has injected into `model` are off (there are none before its first adapter)."""
    layers = [
        module for module in model.modules() if isinstance(module, BaseTunerLayer) and not module.disable_adapters
    ]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


@dataclass(frozen=True)
class _NextTokenScores:
    """What the rows' next tokens are drawn from: their logits, or their last hidden states and the unembedding.

    The second form lets a draw without top-k or top-p go through `draw_from_hidden`, which never holds the rows'
    whole logits; `logits()` computes them for the other draws.
    """

    logits_RV: Tensor | None = None
    hidden_RH: Tensor | None = None
    unembedding_VH: Tensor | None = None
    softcap: float | None = None

    def rows(self, index_R: Tensor) -> _NextTokenScores:
        if self.logits_RV is not None:
            return _NextTokenScores(logits_RV=self.logits_RV[index_R])
        return replace(self, hidden_RH=self.hidden_RH[index_R])

    def logits(self) -> Tensor:
        if self.logits_RV is not None:
            return self.logits_RV
        return cap(unembedding_logits(self.hidden_RH, self.unembedding_VH), self.softcap)

    def joined(self, other: _NextTokenScores) -> _NextTokenScores:
        """These rows' scores, then `other`'s."""
        if self.logits_RV is None and other.logits_RV is None:
            return replace(self, hidden_RH=torch.cat([self.hidden_RH, other.hidden_RH]))
        return _NextTokenScores(logits_RV=torch.cat([self.logits(), other.logits()]))


def _next_token_scores(
    model: PreTrainedModel | PeftModel, adapters: Sequence[str | None], **inputs: object
) -> tuple[_NextTokenScores, Cache]:
    """The scores of each row's last position, and the cache; each row through its own adapter.

    For a model whose logits are a linear head over its decoder's hidden states (`output_head.py`), the decoder runs
    on its own and the scores are the rows' last hidden states with the head's weight, unless an adapter of the batch
    trains the head: then the rows' logits come through the head with its low-rank term. Other models run their own
    forward, keeping the logits of the last position only.
    """
    causal_lm = model.get_base_model() if isinstance(model, PeftModel) else model
    # Before the adapter scope: the first call checks the head with a forward of its own, which routed rows would
    # not fit.
    output = linear_output_head(causal_lm)
    with _adapter_scope(model, adapters):
        if output is None:
            forward = model(**inputs, use_cache=True, logits_to_keep=1)
            return _NextTokenScores(logits_RV=forward.logits[:, -1]), forward.cache
        decoded = output.decoder(**inputs, use_cache=True)
        hidden_RH = decoded.last_hidden_state[:, -1]
        if any(output.trained_by(adapter) for adapter in adapters):
            return _NextTokenScores(logits_RV=output.logits(hidden_RH)), decoded.cache
    return _NextTokenScores(hidden_RH=hidden_RH, unembedding_VH=output.weight, softcap=output.softcap), decoded.cache


def _generator(request: SamplingRequest, device: torch.device) -> torch.Generator:
    generator = torch.Generator(device=device)
    if request.seed is None:
        generator.seed()
    else:
        # manual_seed takes [-2**63, 2**64); any Python int maps into it.
        generator.manual_seed(request.seed % 2**64)
    return generator


def _sample_with_prompt_scores(
    model: PreTrainedModel | PeftModel,
    jobs: Sequence[BoundSamplingRequest],
    decode: Callable[[Sequence[int]], str],
    pause: Callable[[], None],
) -> Iterator[tuple[int, SamplingResult]]:
    """Each job's prompt scored and its completions sampled, one job at a time; yields (index, result) as each is done.

    Jobs of one adapter and one top-k that begin alike share their common prefix's pass (`prefixes.py`): the base
    model's log-probs of an RL step's completions (`compute_logprobs` for a KL penalty) are a few prompts with several
    completions each, and a prompt is most of each sequence, so the prefix's pass is most of the work.
    """
    by_kind: dict[tuple[str | None, int], list[int]] = {}
    for index, job in enumerate(jobs):
        by_kind.setdefault((job.adapter, job.request.topk_prompt_logprobs), []).append(index)
    for indices in by_kind.values():
        groups, alone = shared_prefix_groups([jobs[i].request.prompt_tokens for i in indices])
        for index in (indices[i] for i in alone):
            yield index, _sample_scored(model, jobs[index], _ScoredPrompt.start(model, jobs[index]), decode, pause)
        for group in groups:
            members = [indices[m] for m in group.members]
            first = jobs[members[0]]
            prefix = _ScoredPrompt.start(model, *(jobs[m] for m in members))
            _prefill_scoring(model, first.request.prompt_tokens[: group.prefix_length], first, prefix)
            for index in members:
                yield index, _sample_scored(model, jobs[index], prefix.copy(), decode, pause)


def _sample_scored(
    model: PreTrainedModel | PeftModel,
    job: BoundSamplingRequest,
    scored: _ScoredPrompt,
    decode: Callable[[Sequence[int]], str],
    pause: Callable[[], None],
) -> SamplingResult:
    """`job`'s prompt scored on from what `scored` holds of it, then its completions sampled from the same cache."""
    request = job.request
    _prefill_scoring(model, request.prompt_tokens, job, scored)
    device = model.get_input_embeddings().weight.device
    prompt_1P = torch.tensor([request.prompt_tokens], dtype=torch.long, device=device)
    rows = _Rows.for_jobs([job], torch.ones_like(prompt_1P), torch.tensor([len(request.prompt_tokens) - 1]))
    scored.cache.batch_select_indices(rows.prompt_index_R)
    next_R = _NextTokenScores(logits_RV=scored.last_logits_1V).rows(rows.prompt_index_R)
    (sequences,) = _decode(model, scored.cache, next_R, [job], rows, decode, device, pause)
    return SamplingResult(
        sequences=sequences,
        prompt_logprobs=tuple(scored.logprobs) if request.prompt_logprobs else None,
        topk_prompt_logprobs=tuple(scored.topk_logprobs) if request.topk_prompt_logprobs > 0 else None,
    )


@dataclass(frozen=True)
class _Admitted:
    """What one admission lets into a running generation: jobs that join its rows, and jobs that ask for prompt scores
    (each with the index `sample_batch` delivers it to), which need every prompt position's logits, so a prefill of
    their own."""

    joining: list[BoundSamplingRequest]
    scored: list[tuple[int, BoundSamplingRequest]]


@dataclass
class _Admission:
    """The jobs of one generation batch as `sample_batch` numbers them: the batch's own, then those it takes in."""

    joining: Joining | None
    # sample_batch's index of each job of the batch, in the batch's order.
    indices: list[int]
    next_index: int
    vocab_size: int
    max_context_length: int
    deliver: Callable[[int, SamplingResult | SamplingInputError], None]

    def room(self, length: int, capacity: int, remaining: int) -> JoinRoom:
        return JoinRoom(length, capacity, remaining, self.vocab_size, self.max_context_length)

    def admit(self, room: JoinRoom) -> _Admitted:
        """The jobs `joining` lets in: those that join the batch's rows (numbered on in `indices`), and those that
        ask for prompt scores with the index each is delivered to."""
        admitted = _Admitted([], [])
        for job in self.joining.admit(room) if self.joining is not None else []:
            if job.request.scores_prompt:
                admitted.scored.append((self.next_index, job))
            else:
                self.indices.append(self.next_index)
                admitted.joining.append(job)
            self.next_index += 1
        return admitted

    def prefilled(self) -> None:
        if self.joining is not None:
            self.joining.prefilled()

    def done(self, job: int, sequences: tuple[SampledSequence, ...]) -> None:
        self.deliver(
            self.indices[job], SamplingResult(sequences=sequences, prompt_logprobs=None, topk_prompt_logprobs=None)
        )


def _generate(
    model: PreTrainedModel | PeftModel,
    jobs: Sequence[BoundSamplingRequest],
    decode: Callable[[Sequence[int]], str],
    pause: Callable[[], None],
    admission: _Admission,
) -> None:
    """Prefill the jobs' prompts together, then decode all their samples together; each job's outcome goes to
    `admission` as soon as its rows are done."""
    device = model.get_input_embeddings().weight.device
    new_tokens = max(job.request.max_tokens for job in jobs)
    capacity = None
    if admission.joining is not None:
        # Room for joining rows' prompts and completions beside the batch's own.
        capacity = min(
            JOIN_HEADROOM * (max(len(job.request.prompt_tokens) for job in jobs) + new_tokens),
            admission.max_context_length,
            _window_limit(model.config),
        )
    next_J, cache, mask_JP, last_position_J = _prefill(model, jobs, device, capacity=capacity)
    rows = _Rows.for_jobs(jobs, mask_JP, last_position_J)
    cache.batch_select_indices(rows.prompt_index_R)
    _decode(model, cache, next_J.rows(rows.prompt_index_R), jobs, rows, decode, device, pause, admission)


def _window_limit(config: PretrainedConfig) -> float:
    """The most positions a preallocated cache may hold: any number, or fewer than the sliding window."""
    window = getattr(config.get_text_config(), "sliding_window", None)
    return math.inf if window is None else window - 1


def _prefill(
    model: PreTrainedModel | PeftModel,
    jobs: Sequence[BoundSamplingRequest],
    device: torch.device,
    capacity: int | None = None,
    max_length: int | None = None,
) -> tuple[_NextTokenScores, Cache, Tensor, Tensor]:
    """Each job's next-token scores after its prompt, the cache, each job's attention mask over the cache, and the
    position of its prompt's last token.

    Prompts that share a prefix (an evaluation's questions over one database schema) have it computed once, then
    their own tokens on top of it through the cache; otherwise the prompts are one left-padded batch. `capacity`:
    the positions the cache holds if more than the prompts and their completions need; `max_length`: the most
    positions the prefill may fill (two passes pad more than one).
    """
    adapters = [job.adapter for job in jobs]
    new_tokens = max(job.request.max_tokens for job in jobs)
    plan = plan_shared_prefill([job.request.prompt_tokens for job in jobs], adapters)
    if plan is not None:
        filled = max(map(len, plan.prefixes)) + max(map(len, plan.suffixes))
        if not _attends_to_the_whole_context(model.config, max(filled + new_tokens, capacity or 0)) or (
            max_length is not None and filled > max_length
        ):
            plan = None
    if plan is None:
        tokens_JP, mask_JP, positions_JP = _left_padded([job.request.prompt_tokens for job in jobs], device)
        next_J, cache = _next_token_scores(
            model,
            adapters,
            input_ids=tokens_JP,
            attention_mask=mask_JP,
            position_ids=positions_JP,
            cache=preallocated_cache(model.config, max(tokens_JP.shape[1] + new_tokens, capacity or 0)),
        )
        return next_J, cache, mask_JP, positions_JP[:, -1]
    prefix_GQ, prefix_mask_GQ, prefix_positions_GQ = _left_padded(plan.prefixes, device)
    prefix_of_J = torch.tensor(plan.prefix_of, dtype=torch.long, device=device)
    # A prompt's own tokens take the positions after its prefix.
    suffix_JS, suffix_mask_JS, positions_JS = _left_padded(
        plan.suffixes, device, first_position_N=prefix_mask_GQ.sum(dim=-1)[prefix_of_J]
    )
    _, cache = _next_token_scores(
        model,
        plan.prefix_adapters,
        input_ids=prefix_GQ,
        attention_mask=prefix_mask_GQ,
        position_ids=prefix_positions_GQ,
        cache=preallocated_cache(
            model.config, max(prefix_GQ.shape[1] + suffix_JS.shape[1] + new_tokens, capacity or 0)
        ),
    )
    cache.batch_select_indices(prefix_of_J)
    # Each row reads [padding, its prefix, padding, its own tokens]: the padding is masked out of attention.
    mask_JP = torch.cat([prefix_mask_GQ[prefix_of_J], suffix_mask_JS], dim=1)
    next_J, cache = _next_token_scores(
        model, adapters, input_ids=suffix_JS, attention_mask=mask_JP, position_ids=positions_JS, cache=cache
    )
    return next_J, cache, mask_JP, positions_JS[:, -1]


def _left_padded(
    sequences: Sequence[Sequence[int]], device: torch.device, first_position_N: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """`[N, longest]` token ids, attention mask and positions, each sequence at the right end of its row.

    Positions count real tokens only, from `first_position_N` (0 by default), so a padded sequence sees the
    positions it would see alone; padding takes the position of the row's first token.
    """
    longest = max(map(len, sequences))
    tokens_NL = torch.zeros((len(sequences), longest), dtype=torch.long)
    mask_NL = torch.zeros((len(sequences), longest), dtype=torch.long)
    for n, sequence in enumerate(sequences):
        tokens_NL[n, longest - len(sequence) :] = torch.tensor(sequence)
        mask_NL[n, longest - len(sequence) :] = 1
    tokens_NL, mask_NL = tokens_NL.to(device), mask_NL.to(device)
    positions_NL = (mask_NL.cumsum(dim=-1) - 1).clamp(min=0)
    if first_position_N is not None:
        positions_NL = positions_NL + first_position_N[:, None]
    return tokens_NL, mask_NL, positions_NL


def _attends_to_the_whole_context(config: PretrainedConfig, length: int) -> bool:
    """Whether every layer attends to all of `length` positions (no sliding window cuts it).

    A sliding window counts cache slots, padding included: padding between a prefix and the tokens after it would
    push real tokens out of the window of a row that has them, so such rows are only prefilled in two passes when
    the window covers everything.
    """
    window = getattr(config.get_text_config(), "sliding_window", None)
    return window is None or length < window


@dataclass
class _Rows:
    """What each row of the decoding batch belongs to; rows leave (all lists and tensors at once) as they stop."""

    job: list[int]
    sample: list[int]
    # Row r of the prefill batch that the row's prompt came from.
    prompt_index_R: Tensor
    mask_RT: Tensor
    last_position_R: Tensor

    @classmethod
    def for_jobs(cls, jobs: Sequence[BoundSamplingRequest], mask_JP: Tensor, last_position_J: Tensor) -> _Rows:
        job = [j for j, job in enumerate(jobs) for _ in range(job.request.num_samples)]
        sample = [s for job in jobs for s in range(job.request.num_samples)]
        index_R = torch.tensor(job, dtype=torch.long, device=mask_JP.device)
        return cls(job, sample, index_R, mask_JP[index_R], last_position_J.to(mask_JP.device)[index_R])

    def append(self, other: _Rows, first_job: int, length: int) -> None:
        """Take in `other`'s rows (their jobs numbered from `first_job`), every row's mask right-aligned at `length`
        positions as the cache's rows are (`kv_cache.append_rows`)."""
        self.job += [first_job + j for j in other.job]
        self.sample += other.sample
        self.mask_RT = torch.cat([_left_zeros(self.mask_RT, length), _left_zeros(other.mask_RT, length)])
        self.last_position_R = torch.cat([self.last_position_R, other.last_position_R])

    def keep(self, rows: list[int]) -> Tensor:
        rows_R = torch.tensor(rows, dtype=torch.long, device=self.mask_RT.device)
        self.job = [self.job[r] for r in rows]
        self.sample = [self.sample[r] for r in rows]
        self.mask_RT = self.mask_RT[rows_R]
        self.last_position_R = self.last_position_R[rows_R]
        return rows_R


def _left_zeros(mask_NT: Tensor, length: int) -> Tensor:
    """`mask_NT` with zero columns in front, to `length` columns."""
    return F.pad(mask_NT, (length - mask_NT.shape[1], 0))


@dataclass
class _ScoredPrompt:
    """The first `length` positions of a prompt prefilled: their cache (room for the prompt and its completions),
    each position's log-prob (None for the first) and top-k, and the logits of the last, which score the next."""

    cache: Cache
    length: int
    logprobs: list[float | None]
    topk_logprobs: list[TopkLogprobs | None]
    last_logits_1V: Tensor | None = None

    @classmethod
    def start(cls, model: PreTrainedModel | PeftModel, *jobs: BoundSamplingRequest) -> _ScoredPrompt:
        """Nothing prefilled yet, with room for any of `jobs`' prompts and completions."""
        capacity = max(len(job.request.prompt_tokens) + job.request.max_tokens for job in jobs)
        return cls(preallocated_cache(model.config, capacity), 0, [None], [None])

    def copy(self) -> _ScoredPrompt:
        """A copy to prefill further, leaving this one as it is."""
        return replace(
            self, cache=copied_cache(self.cache), logprobs=list(self.logprobs), topk_logprobs=list(self.topk_logprobs)
        )


def _prefill_scoring(
    model: PreTrainedModel | PeftModel, tokens: Sequence[int], job: BoundSamplingRequest, scored: _ScoredPrompt
) -> None:
    """Prefill `tokens` past the `scored.length` already in `scored`, chunk by chunk through its cache, through `job`'s
    adapter, scoring each position by the logits of the one before it before a chunk's logits are freed."""
    device = model.get_input_embeddings().weight.device
    tokens_P = torch.tensor(tokens, dtype=torch.long, device=device)
    vocab_size = model.get_output_embeddings().weight.shape[0]
    chunk = max(1, _PROMPT_LOGITS_BYTES // (4 * vocab_size))
    topk = min(job.request.topk_prompt_logprobs, vocab_size)
    if scored.last_logits_1V is not None and scored.length < len(tokens):
        _score_positions(scored.last_logits_1V, tokens_P[scored.length : scored.length + 1], topk, scored)
    for start in range(scored.length, len(tokens), chunk):
        with _adapter_scope(model, [job.adapter]):
            output = model(input_ids=tokens_P[None, start : start + chunk], cache=scored.cache, use_cache=True)
        scored.cache = output.cache
        # Row j of this chunk's logits predicts position start + j + 1; the last row predicts the position after
        # `tokens`, which has no target here.
        targets_C = tokens_P[start + 1 : start + chunk + 1]
        _score_positions(output.logits[0, : targets_C.shape[0]], targets_C, topk, scored)
        # A copy: a view would hold the whole chunk's logits for as long as the prefix is kept.
        scored.last_logits_1V = output.logits[:, -1].clone()
    scored.length = len(tokens)


def _score_positions(logits_CV: Tensor, targets_C: Tensor, topk: int, scored: _ScoredPrompt) -> None:
    logprobs_CV = F.log_softmax(logits_CV.float(), dim=-1)
    scored.logprobs.extend(logprobs_CV.gather(1, targets_C[:, None])[:, 0].tolist())
    if topk > 0:
        values_CK, ids_CK = logprobs_CV.topk(topk, dim=-1)
        scored.topk_logprobs.extend(
            tuple(zip(ids_row, values_row, strict=True))
            for ids_row, values_row in zip(ids_CK.tolist(), values_CK.tolist(), strict=True)
        )


@dataclass
class _JobDraws:
    """What one job of a decoding batch has drawn so far, and what ends its samples."""

    job: BoundSamplingRequest
    generator: torch.Generator
    stop_ids: frozenset[int]
    # Tokens decoded when looking for a stop string.
    window: int
    tokens: list[list[int]]
    logprobs: list[list[float]]
    reasons: list[StopReason]
    constraints: list[TokenConstraint | None]
    rows_left: int

    @classmethod
    def start(cls, job: BoundSamplingRequest, device: torch.device) -> _JobDraws:
        request, samples = job.request, job.request.num_samples
        return cls(
            job=job,
            generator=_generator(request, device),
            stop_ids=frozenset(job.eos_token_ids) | frozenset(request.stop_token_ids),
            window=max(map(len, request.stop_strings), default=0) * _STOP_WINDOW_TOKENS_PER_CHAR + _STOP_WINDOW_MARGIN,
            tokens=[[] for _ in range(samples)],
            logprobs=[[] for _ in range(samples)],
            reasons=["length"] * samples,
            constraints=[request.constraint() if request.constraint is not None else None for _ in range(samples)],
            rows_left=samples,
        )

    def sequences(self) -> tuple[SampledSequence, ...]:
        return tuple(
            SampledSequence(tokens=tuple(t), logprobs=tuple(lp), stop_reason=reason)
            for t, lp, reason in zip(self.tokens, self.logprobs, self.reasons, strict=True)
        )


def _decode(
    model: PreTrainedModel | PeftModel,
    cache: Cache,
    next_R: _NextTokenScores,
    jobs: Sequence[BoundSamplingRequest],
    rows: _Rows,
    decode: Callable[[Sequence[int]], str],
    device: torch.device,
    pause: Callable[[], None],
    admission: _Admission | None = None,
) -> list[tuple[SampledSequence, ...]]:
    """Decode every row until it stops or reaches its job's max_tokens; the sequences of each job, in order (with
    `admission`: the jobs it lets in before a step after the first ones, each handed its sequences as soon as its rows
    are done)."""
    draws = [_JobDraws.start(job, device) for job in jobs]
    for step in itertools.count(1):
        if admission is not None and admission.joining is not None:
            next_R = _take_in(model, cache, next_R, rows, draws, admission, decode, device)
        constraint_R = [draws[j].constraints[s] for j, s in zip(rows.job, rows.sample, strict=True)]
        allowed_R = [None if constraint is None else constraint.allowed() for constraint in constraint_R]
        token_R, token_logprob_R = _draw(
            next_R, [d.job for d in draws], rows.job, [d.generator for d in draws], allowed_R
        )
        kept = []
        for row, (j, s, token, logprob) in enumerate(
            zip(rows.job, rows.sample, token_R.tolist(), token_logprob_R.tolist(), strict=True)
        ):
            job = draws[j]
            request = job.job.request
            sequence = job.tokens[s]
            sequence.append(token)
            job.logprobs[s].append(logprob)
            constraint = constraint_R[row]
            if constraint is not None:
                constraint.advance(token)
            if request.on_token is not None:
                request.on_token(s, token)
            if (
                token in job.stop_ids
                or (constraint is not None and constraint.finished())
                or (
                    request.stop_strings
                    and any(stop in decode(sequence[-job.window :]) for stop in request.stop_strings)
                )
            ):
                job.reasons[s] = "stop"
            elif len(sequence) < request.max_tokens:
                kept.append(row)
                continue
            job.rows_left -= 1
            if job.rows_left == 0 and admission is not None:
                admission.done(j, job.sequences())
        if not kept:
            break
        if len(kept) < len(rows.job):
            kept_R = rows.keep(kept)
            cache.batch_select_indices(kept_R)
            token_R = token_R[kept_R]
        if step % PAUSE_EVERY_STEPS == 0:
            with torch.inference_mode(False):
                pause()
        rows.mask_RT = torch.cat([rows.mask_RT, rows.mask_RT.new_ones((len(kept), 1))], dim=1)
        rows.last_position_R = rows.last_position_R + 1
        next_R, cache = _next_token_scores(
            model,
            [draws[j].job.adapter for j in rows.job],
            input_ids=token_R[:, None],
            attention_mask=rows.mask_RT,
            position_ids=rows.last_position_R[:, None],
            cache=cache,
        )
    return [job.sequences() for job in draws]


def _take_in(
    model: PreTrainedModel | PeftModel,
    cache: Cache,
    next_R: _NextTokenScores,
    rows: _Rows,
    draws: list[_JobDraws],
    admission: _Admission,
    decode: Callable[[Sequence[int]], str],
    device: torch.device,
) -> _NextTokenScores:
    """Before a decode step: the jobs `admission` lets in, prefilled on their own and then taken into the batch's
    cache and rows (`draws` gains theirs); the rows' next-token scores, theirs after the batch's. Those asking for
    prompt scores are served to their end first, each on a cache of its own."""
    capacity = joinable_capacity(cache)
    if capacity is None:
        return next_R
    _drop_unread_positions(cache, rows, capacity)
    length = rows.mask_RT.shape[1]
    remaining = max(
        draws[j].job.request.max_tokens - len(draws[j].tokens[s]) for j, s in zip(rows.job, rows.sample, strict=True)
    )
    room = admission.room(length, capacity, remaining)
    # Outside inference mode, as a pause: taking a request in may load its sampler weights as an adapter.
    with torch.inference_mode(False):
        admitted = admission.admit(room)
    # Served here rather than left for a pause of the scheduler (with TAKE_IN_PROMPT_SCORES): they wait one decode
    # step, as joining rows do, not for the pause share.
    scored = [job for _, job in admitted.scored]
    for job, result in _sample_with_prompt_scores(model, scored, decode, lambda: None):
        admission.deliver(admitted.scored[job][0], result)
    jobs = admitted.joining
    if not jobs:
        if scored:
            admission.prefilled()
        return next_R
    # The rows taken in may be wider than the running ones (`append_rows` right-aligns both at the wider) as long as
    # every row still has room for its tokens. Bounded by the running rows' width instead, a shared-prefix prefill
    # was refused whenever the longest prefix and the longest question came from different prompts, and the whole
    # admission was prefilled as padded rows: in a study's Spider trials, one admission of an evaluation's requests
    # held the other trial's rows for over five minutes (issue 48).
    next_J, joining_cache, mask_JP, last_position_J = _prefill(
        model, jobs, device, max_length=room.capacity - room.remaining
    )
    joining = _Rows.for_jobs(jobs, mask_JP, last_position_J)
    joining_cache.batch_select_indices(joining.prompt_index_R)
    rows.append(joining, len(draws), append_rows(cache, joining_cache))
    draws += [_JobDraws.start(job, device) for job in jobs]
    admission.prefilled()
    return next_R.joined(next_J.rows(joining.prompt_index_R))


def _drop_unread_positions(cache: Cache, rows: _Rows, capacity: int) -> None:
    """Drop the cache's first positions once no running row reads them and they are worth a copy of the cache.

    Rows that join are right-aligned at the batch's length, so without this the batch's length only grows: a long
    run of joining requests filled the cache's room within a few hundred steps, and every request after that ran in
    a batch of its own (on Gemma 3 270M, whose sliding window bounds the room to 511 positions, 261 of an
    evaluation's 332 requests, beside another tenant's RL steps: docs/performance.md).
    """
    read_T = rows.mask_RT.any(dim=0)
    unread = int(read_T.int().argmax())
    if unread > 0 and unread >= UNREAD_SHARE_TO_DROP * capacity:
        drop_leading_positions(cache, unread)
        rows.mask_RT = rows.mask_RT[:, unread:]


def _draw(
    scores: _NextTokenScores,
    jobs: Sequence[BoundSamplingRequest],
    job_R: Sequence[int],
    generators: Sequence[torch.Generator],
    allowed_R: Sequence[Tensor | None],
) -> tuple[Tensor, Tensor]:
    """Each row's next token and its logprob, row r drawn for job `job_R[r]` among the tokens `allowed_R[r]` lets
    through (all when None).

    Each job draws its rows (in sample order) from its own generator, one uniform number a row, as it would alone.
    Rows whose job asks for neither top-k nor top-p nor a constraint are drawn together in one pass over the
    vocabulary when the scores are hidden states (`draw_from_hidden`); the others from their job's logits.
    """
    device = scores.logits_RV.device if scores.logits_RV is not None else scores.hidden_RH.device
    token_R = torch.empty(len(job_R), dtype=torch.long, device=device)
    logprob_R = torch.empty(len(job_R), dtype=torch.float32, device=device)
    temperature_R = torch.zeros(len(job_R), device=device)
    uniform_R = torch.zeros(len(job_R), device=device)
    vocab_size = scores.unembedding_VH.shape[0] if scores.logits_RV is None else scores.logits_RV.shape[-1]
    plain = []
    for j in dict.fromkeys(job_R):
        request = jobs[j].request
        rows = [r for r, owner in enumerate(job_R) if owner == j]
        rows_R = torch.tensor(rows, device=device)
        plain_job = not 0 < request.top_k < vocab_size and request.top_p == 1 and request.constraint is None
        if scores.logits_RV is None and plain_job:
            plain.extend(rows)
            temperature_R[rows_R] = request.temperature
            if request.temperature > 0:
                uniform_R[rows_R] = torch.rand(len(rows), generator=generators[j], device=device)
        else:
            logits = scores.rows(rows_R).logits()
            if request.constraint is not None:
                allowed = torch.stack([allowed_R[r] for r in rows]).to(logits.device)
                logits = logits.masked_fill(~allowed, -math.inf)
            token_R[rows_R], logprob_R[rows_R] = draw_from_logits(
                logits, request.temperature, request.top_k, request.top_p, generators[j]
            )
    if plain:
        plain_R = torch.tensor(plain, device=device)
        token_R[plain_R], logprob_R[plain_R] = draw_from_hidden(
            scores.hidden_RH[plain_R], scores.unembedding_VH, temperature_R[plain_R], uniform_R[plain_R], scores.softcap
        )
    return token_R, logprob_R
