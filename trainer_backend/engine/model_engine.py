"""Everything the device does for the server: forward/backward, optimizer steps, sampling, adapter save/load.

One `ModelEngine` wraps one base model and its adapters. It is called only from the scheduler's worker thread.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from torch import Tensor

from trainer_backend.engine.adapters import AdapterPool
from trainer_backend.engine.kv_cache import repeated_cache
from trainer_backend.engine.logprobs import LowRankDelta, full_logits_target_logprobs, target_logprobs
from trainer_backend.engine.losses import compute_loss, gradient_positions
from trainer_backend.engine.microbatches import (
    ACTIVATION_BUDGET_BYTES,
    Piece,
    activation_bytes_per_token,
    plan_pieces,
)
from trainer_backend.engine.onednn_linear import route_linears
from trainer_backend.engine.output_head import LinearOutputHead, linear_output_head
from trainer_backend.engine.prefixes import PrefixGroup, length_buckets, shared_prefix_groups
from trainer_backend.engine.residency import AdapterResidency
from trainer_backend.engine.sampling import (
    SamplingInputError,
    SamplingJob,
    SamplingRequest,
    SamplingResult,
    sample_batch,
)
from trainer_backend.engine.types import AdamSettings, DecodedDatum, ForwardBackwardResult, LoraSettings
from trainer_backend.errors import BackendError, UnknownBaseModelError, UserInputError
from trainer_backend.models.loading import LoadedModel

# Logits of this many vocabulary entries (summed over positions) exist at once in a forward/backward: 32 Mi
# fp32 values, 128 MiB. For Gemma's 262,144-entry vocabulary that is 128 positions per chunk.
LOGITS_BUDGET = 32 * 1024 * 1024
# Sampler snapshots kept loaded as adapters; older ones are reloaded from disk on use.
SAMPLER_ADAPTERS_KEPT = 8
# Rows (samples) decoded together in one generation batch; more requests wait for the next batch.
MAX_SAMPLING_ROWS = 64
IGNORED_TARGET = -100


class ModelEngine:
    """The base model, its adapters, and the operations the Tinker API asks of them."""

    def __init__(
        self,
        loaded: LoadedModel,
        logits_budget: int = LOGITS_BUDGET,
        activation_budget: int = ACTIVATION_BUDGET_BYTES,
        chunked_logprobs: bool = True,
        spill_root: Path | None = None,
        max_loaded_adapters: int | None = None,
    ) -> None:
        """`max_loaded_adapters` training adapters stay loaded; the least recently used others go to `spill_root`."""
        self.loaded = loaded
        route_linears(loaded.model)
        # The full-logits path exists to measure what chunking saves (benchmarks/backend_gemma.py).
        self._logprobs = target_logprobs if chunked_logprobs else full_logits_target_logprobs
        self.adapters = AdapterPool(loaded.model)
        self.residency = AdapterResidency(self.adapters, spill_root, max_loaded_adapters)
        self.chunk_tokens = max(1, logits_budget // loaded.vocab_size)
        dtype_bytes = next(loaded.model.parameters()).element_size()
        self.piece_tokens = max(1, activation_budget // activation_bytes_per_token(loaded.model.config, dtype_bytes))
        self._sampler_adapters: OrderedDict[str, str] = OrderedDict()
        output = linear_output_head(loaded.model)
        if output is None:
            raise UnknownBaseModelError(
                f"base model {loaded.name!r}: its logits are not a linear head (without bias) over its decoder's "
                "hidden states, which the engine's training pass computes on its own; no other causal LM is supported"
            )
        self.softcap = output.softcap
        self.pad_token_id = loaded.tokenizer.pad_token_id or 0

    # --- training -----------------------------------------------------------------------------------------

    def create_adapter(self, model_id: str, lora: LoraSettings) -> None:
        self.adapters.create(model_id, lora)
        self.residency.added(model_id)

    def forward_backward(
        self,
        model_id: str,
        datums: Sequence[DecodedDatum],
        loss_fn: str,
        loss_fn_config: dict[str, float | str] | None,
        forward_only: bool,
    ) -> ForwardBackwardResult:
        """Per-datum log-probs and the loss; gradients accumulate in the adapter until `optim_step`."""
        (outcome,) = self.forward_backward_batch(
            [ForwardBackwardCall(model_id, datums, loss_fn, loss_fn_config, forward_only)]
        )
        if isinstance(outcome, BackendError):
            raise outcome
        return outcome

    def forward_backward_batch(
        self, calls: Sequence[ForwardBackwardCall]
    ) -> list[ForwardBackwardResult | BackendError]:
        """Several clients' forward/backward requests in one pass over the base model.

        Each row goes through its own client's adapter (PEFT's mixed-batch LoRA); each call's loss is computed on
        its own rows, and the backward of their sum leaves in each adapter exactly the gradient its own call
        alone would (the adapters share no parameters). A call with bad input gets its error; the others run.
        Adapters that train the unembedding take their log-probs through their own low-rank head, so each of
        those runs in a pass of its own.
        """
        outcomes: list[ForwardBackwardResult | BackendError | None] = [None] * len(calls)
        # Calls that can share a pass: same target width, and no adapter on the unembedding (its own key).
        groups: dict[tuple, list[int]] = {}
        for index, call in enumerate(calls):
            try:
                if not call.datums:
                    raise UserInputError("forward_backward needs at least one datum")
                self.residency.use([call.model_id])
                self.adapters.require(call.model_id)
                self._check_datums(call.datums)
            except BackendError as error:
                outcomes[index] = error
                continue
            width = tuple(call.datums[0].loss_fn_inputs["target_tokens"].shape[1:])
            own_pass = call.model_id if self._trains_unembedding(call.model_id) else None
            groups.setdefault((width, own_pass), []).append(index)
        for group in groups.values():
            # The group's adapters all loaded at once (bringing one back may have spilled another of the group).
            self.residency.use([calls[i].model_id for i in group])
            for index, outcome in zip(group, self._forward_backward_pass([calls[i] for i in group]), strict=True):
                outcomes[index] = outcome
        return outcomes

    def _forward_backward_pass(
        self, calls: Sequence[ForwardBackwardCall]
    ) -> list[ForwardBackwardResult | UserInputError]:
        """Every datum of the calls through the base model, in micro-batches that fit the activation budget.

        Datums of one call that begin with the same tokens (the completions of one prompt) are computed through
        their shared prefix (`prefixes.py`): the prefix once, its KV cache repeated for the members, each member's
        remaining tokens on top, gradients flowing back through the cache. The other datums go in right-padded
        batches. Each micro-batch (`microbatches.py`) runs its forward and its losses' backward before the next
        begins; the losses are sums over data, so the gradients add up to those of one pass. Either way a datum gets
        the log-probs, loss and gradients it gets alone, up to float rounding.
        """
        outcomes: list[ForwardBackwardResult | UserInputError | None] = [None] * len(calls)
        for c, call in enumerate(calls):
            try:
                # Bad loss inputs fail their call before any of its gradients reach the adapter.
                compute_loss(
                    call.loss_fn,
                    _placeholder_logprobs(call),
                    [d.loss_fn_inputs for d in call.datums],
                    call.loss_fn_config,
                )
            except UserInputError as error:
                outcomes[c] = error
        valid = [c for c, outcome in enumerate(outcomes) if outcome is None]
        alone: list[tuple[int, int]] = []
        shared: list[tuple[int, PrefixGroup]] = []
        for c in valid:
            groups, singles = shared_prefix_groups([d.model_input_tokens for d in calls[c].datums])
            shared += [(c, group) for group in groups]
            alone += [(c, i) for i in singles]
        lengths = {(c, i): len(d.model_input_tokens) for c in valid for i, d in enumerate(calls[c].datums)}
        logprobs: dict[tuple[int, int], Tensor] = {}
        losses = {c: 0.0 for c in valid}
        one_adapter = len({call.model_id for call in calls}) == 1
        adapter = self.adapters.active(calls[0].model_id) if one_adapter else contextlib.nullcontext()
        with adapter:
            output = self._output_head()
            weight, delta = self._unembedding(output, calls[0].model_id)
            head = functools.partial(
                self._logprobs,
                lm_head_weight=weight,
                chunk_tokens=self.chunk_tokens,
                final_logit_softcapping=self.softcap,
                lm_head_delta=delta,
            )
            for piece in plan_pieces(alone, shared, lengths, self.piece_tokens):
                keys = list(piece.alone) + [(c, i) for c, group in piece.groups for i in group.members]
                needs_grad = any(not calls[c].forward_only for c, _ in keys)
                with torch.set_grad_enabled(needs_grad):
                    piece_logprobs = self._piece_logprobs(output.decoder, head, calls, piece, one_adapter)
                    piece_loss = None
                    for c in dict.fromkeys(c for c, _ in keys):
                        call = calls[c]
                        members = [i for owner, i in keys if owner == c]
                        result = compute_loss(
                            call.loss_fn,
                            [
                                piece_logprobs[(c, i)].reshape(call.datums[i].loss_fn_inputs["target_tokens"].shape)
                                for i in members
                            ],
                            [call.datums[i].loss_fn_inputs for i in members],
                            call.loss_fn_config,
                        )
                        losses[c] += float(result.loss.detach())
                        for i, out in zip(members, result.outputs, strict=True):
                            logprobs[(c, i)] = out["logprobs"].float().cpu()
                        if not call.forward_only:
                            piece_loss = result.loss if piece_loss is None else piece_loss + result.loss
                    if piece_loss is not None:
                        piece_loss.backward()
        for c in valid:
            outcomes[c] = ForwardBackwardResult(
                loss_fn_outputs=[{"logprobs": logprobs[(c, i)]} for i in range(len(calls[c].datums))],
                metrics={"loss:sum": losses[c]},
            )
        return outcomes

    def _piece_logprobs(
        self,
        decoder: torch.nn.Module,
        head: Callable[..., Tensor],
        calls: Sequence[ForwardBackwardCall],
        piece: Piece,
        one_adapter: bool,
    ) -> dict[tuple[int, int], Tensor]:
        """The `[T, K]` target log-probs of every datum of one micro-batch, keyed by (call, datum)."""
        logprobs: dict[tuple[int, int], Tensor] = {}
        if piece.alone:
            datums = [calls[c].datums[i] for c, i in piece.alone]
            with self._routed(one_adapter, [calls[c].model_id for c, _ in piece.alone]):
                tokens_B_T, mask_B_T, targets_B_T_K, live_B_T = self._batch(
                    datums, [self._gradient_rows(calls[c], i) for c, i in piece.alone]
                )
                hidden_B_T_H = decoder(input_ids=tokens_B_T, attention_mask=mask_B_T).last_hidden_state
            logprobs_B_T_K = head(hidden_B_T_H, targets=targets_B_T_K, gradient_rows=live_B_T)
            for row, key in enumerate(piece.alone):
                logprobs[key] = logprobs_B_T_K[row, : len(datums[row].model_input_tokens)]
        for c, group in piece.groups:
            members_logprobs = self._shared_prefix_logprobs(decoder, head, calls[c], group, one_adapter)
            for i, logprobs_T_K in zip(group.members, members_logprobs, strict=True):
                logprobs[(c, i)] = logprobs_T_K
        return logprobs

    def _shared_prefix_logprobs(
        self,
        decoder: torch.nn.Module,
        head: Callable[..., Tensor],
        call: ForwardBackwardCall,
        group: PrefixGroup,
        one_adapter: bool,
    ) -> list[Tensor]:
        """The `[T, K]` target log-probs of each member of `group`, its common prefix computed once."""
        device = self.loaded.device
        members = [call.datums[i] for i in group.members]
        prefix = group.prefix_length
        prefix_1P = torch.tensor([members[0].model_input_tokens[:prefix]], dtype=torch.long, device=device)
        with self._routed(one_adapter, [call.model_id]):
            prefix_output = decoder(input_ids=prefix_1P, use_cache=True)
        targets = [_targets_by_position(d) for d in members]
        live = [self._gradient_rows(call, i) for i in group.members]
        width = targets[0].shape[1]
        # Prefix positions: one row of hidden state, every member's own targets side by side.
        targets_1P_GK = torch.cat([t[:prefix] for t in targets], dim=1)[None].to(device)
        live_1P = torch.stack([rows[:prefix] for rows in live]).any(dim=0)[None]
        prefix_1P_GK = head(prefix_output.last_hidden_state, targets=targets_1P_GK, gradient_rows=live_1P)
        suffixes = [d.model_input_tokens[prefix:] for d in members]
        suffix_logprobs: dict[int, Tensor] = {}
        # Completions of similar length together, each batch continuing its own copy of the prefix's cache.
        for bucket in length_buckets([len(suffix) for suffix in suffixes]):
            longest = max(len(suffixes[g]) for g in bucket)
            suffix_B_S = torch.full((len(bucket), longest), self.pad_token_id, dtype=torch.long)
            mask_B_A = torch.zeros((len(bucket), prefix + longest), dtype=torch.long)
            mask_B_A[:, :prefix] = 1
            targets_B_S_K = torch.full((len(bucket), longest, width), IGNORED_TARGET, dtype=torch.long)
            live_B_S = torch.zeros((len(bucket), longest), dtype=torch.bool)
            for b, g in enumerate(bucket):
                length = len(suffixes[g])
                suffix_B_S[b, :length] = torch.tensor(suffixes[g])
                mask_B_A[b, prefix : prefix + length] = 1
                targets_B_S_K[b, :length] = targets[g][prefix:]
                live_B_S[b, :length] = live[g][prefix:]
            positions_B_S = torch.arange(prefix, prefix + longest).expand(len(bucket), -1)
            with self._routed(one_adapter, [call.model_id] * len(bucket)):
                hidden_B_S_H = decoder(
                    input_ids=suffix_B_S.to(device),
                    attention_mask=mask_B_A.to(device),
                    position_ids=positions_B_S.to(device),
                    cache=repeated_cache(prefix_output.cache, len(bucket)),
                    use_cache=True,
                ).last_hidden_state
            logprobs_B_S_K = head(hidden_B_S_H, targets=targets_B_S_K.to(device), gradient_rows=live_B_S.to(device))
            for b, g in enumerate(bucket):
                suffix_logprobs[g] = logprobs_B_S_K[b, : len(suffixes[g])]
        return [
            torch.cat([prefix_1P_GK[0, :, g * width : (g + 1) * width], suffix_logprobs[g]])
            for g in range(len(members))
        ]

    def _gradient_rows(self, call: ForwardBackwardCall, index: int) -> Tensor:
        """`[T]` bool: the positions of datum `index` whose log-probs the call's loss may send a gradient to."""
        datum = call.datums[index]
        length = len(datum.model_input_tokens)
        if call.forward_only:
            return torch.zeros(length, dtype=torch.bool)
        support = gradient_positions(call.loss_fn, datum.loss_fn_inputs)
        if support is None:
            return torch.ones(length, dtype=torch.bool)
        return support.reshape(length, -1).any(dim=1)

    def _output_head(self) -> LinearOutputHead:
        """The model as decoder and head, as it stands now (a LoRA layer may wrap the head)."""
        model = self.adapters.peft_model or self.adapters.base_model
        output = linear_output_head(model.get_base_model() if hasattr(model, "get_base_model") else model)
        assert output is not None, "checked when the engine was built"
        return output

    def _routed(self, one_adapter: bool, rows: Sequence[str]) -> contextlib.AbstractContextManager:
        """Each row of the next forward through its own adapter; nothing to do when the pass has one adapter."""
        return contextlib.nullcontext() if one_adapter else self.adapters.routed(rows)

    def _trains_unembedding(self, model_id: str) -> bool:
        return self.adapters.peft_model is not None and self._output_head().trained_by(model_id)

    def _check_datums(self, datums: Sequence[DecodedDatum]) -> None:
        """Raises UserInputError naming the first datum that cannot be batched (length, ids, targets)."""
        vocab = self.loaded.vocab_size
        longest = max(len(d.model_input_tokens) for d in datums)
        if longest > self.loaded.max_context_length:
            raise UserInputError(
                f"a datum has {longest} tokens; the model's context length is {self.loaded.max_context_length}"
            )
        width = None
        for index, datum in enumerate(datums):
            tokens = datum.model_input_tokens
            if not tokens:
                raise UserInputError(f"datum {index} has an empty model_input")
            if min(tokens) < 0 or max(tokens) >= vocab:
                raise UserInputError(f"datum {index} has token ids outside the vocabulary [0, {vocab})")
            targets = datum.loss_fn_inputs.get("target_tokens")
            if targets is None:
                raise UserInputError(f"datum {index} has no loss_fn_inputs['target_tokens']")
            if targets.shape[0] != len(tokens):
                raise UserInputError(
                    f"datum {index}: target_tokens has {targets.shape[0]} positions for {len(tokens)} input tokens"
                )
            if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= vocab):
                raise UserInputError(f"datum {index} has target_tokens outside the vocabulary [0, {vocab})")
            shape = tuple(targets.shape[1:])
            if width is None:
                width = shape
            elif shape != width:
                raise UserInputError("all data of one request must have target_tokens of the same rank and width")

    def _batch(self, datums: Sequence[DecodedDatum], live: Sequence[Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Right-padded tokens, attention mask, `[B, T, K]` targets (-100 on padding) and gradient rows, on the device.

        The datums are checked, and their targets all have one width (one token or K tokens per position).
        """
        longest = max(len(d.model_input_tokens) for d in datums)
        width = _targets_by_position(datums[0]).shape[1]
        tokens_B_T = torch.full((len(datums), longest), self.pad_token_id, dtype=torch.long)
        mask_B_T = torch.zeros((len(datums), longest), dtype=torch.long)
        targets_B_T_K = torch.full((len(datums), longest, width), IGNORED_TARGET, dtype=torch.long)
        live_B_T = torch.zeros((len(datums), longest), dtype=torch.bool)
        for i, datum in enumerate(datums):
            n = len(datum.model_input_tokens)
            tokens_B_T[i, :n] = torch.tensor(datum.model_input_tokens)
            mask_B_T[i, :n] = 1
            targets_B_T_K[i, :n] = _targets_by_position(datum)
            live_B_T[i, :n] = live[i]
        device = self.loaded.device
        return tokens_B_T.to(device), mask_B_T.to(device), targets_B_T_K.to(device), live_B_T.to(device)

    def _unembedding(self, output: LinearOutputHead, adapter: str) -> tuple[Tensor, LowRankDelta | None]:
        """The head's weight, and the adapter's low-rank delta on it when the adapter trains the unembedding."""
        if output.trained_by(adapter):
            head = output.head
            delta = LowRankDelta(head.lora_A[adapter].weight, head.lora_B[adapter].weight, head.scaling[adapter])
            return output.weight, delta
        return output.weight, None

    def optim_step(self, model_id: str, adam: AdamSettings) -> dict[str, float]:
        self.residency.use([model_id])
        return self.adapters.step(model_id, adam)

    def save(self, model_id: str, folder: Path, include_optimizer: bool) -> None:
        self.residency.use([model_id])
        self.adapters.save(model_id, folder, include_optimizer)

    def load(self, model_id: str, folder: Path, with_optimizer: bool) -> None:
        self.adapters.load(model_id, folder, with_optimizer=with_optimizer, trainable=True)
        self.residency.added(model_id)

    def has_adapter(self, model_id: str) -> bool:
        """Whether the training adapter exists, loaded or spilled to disk."""
        return model_id in self.residency

    # --- sampling -----------------------------------------------------------------------------------------

    def sample(self, weights_folder: Path | None, request: SamplingRequest, stop_at_eos: bool) -> SamplingResult:
        """Sample from the base model (no folder) or from saved sampler weights."""
        (outcome,) = self.sample_batch([SamplerCall(weights_folder, request, stop_at_eos)])
        if isinstance(outcome, SamplingInputError):
            raise outcome
        return outcome

    def sample_batch(
        self, calls: Sequence[SamplerCall], pause: Callable[[], None] = lambda: None
    ) -> list[SamplingResult | SamplingInputError]:
        """Serve several sampling requests, of any mix of weights, in as few generation batches as fit.

        A batch holds at most `MAX_SAMPLING_ROWS` rows and `SAMPLER_ADAPTERS_KEPT` distinct sampler weights, so
        loading one batch's adapters never evicts another of the same batch. `pause` is called every few decode
        steps (see `sample_batch` in sampling.py).
        """
        outcomes: list[SamplingResult | SamplingInputError] = []
        for batch in _sampling_batches(calls):
            # Each call's weights are resolved on their own: weights deleted while their request waited fail that
            # request alone, never the other tenants' requests of the batch.
            batch_outcomes: list[SamplingResult | SamplingInputError | None] = [None] * len(batch)
            jobs, runnable = [], []
            for index, call in enumerate(batch):
                try:
                    adapter = None if call.weights_folder is None else self._sampler_adapter(call.weights_folder)
                except SamplingInputError as error:
                    batch_outcomes[index] = error
                    continue
                eos = self.loaded.eos_token_ids if call.stop_at_eos else ()
                jobs.append(SamplingJob(request=call.request, adapter=adapter, eos_token_ids=eos))
                runnable.append(index)
            if jobs:
                model = self.adapters.peft_model or self.adapters.base_model
                results = sample_batch(model, jobs, self._decode, self.loaded.max_context_length, pause)
                for index, result in zip(runnable, results, strict=True):
                    batch_outcomes[index] = result
            outcomes += [outcome for outcome in batch_outcomes if outcome is not None]
        return outcomes

    def _decode(self, tokens: Sequence[int]) -> str:
        return self.loaded.tokenizer.decode(list(tokens), skip_special_tokens=False)

    def _sampler_adapter(self, folder: Path) -> str:
        """The loaded adapter of the sampler weights in `folder`, loading them on first use.

        Raises:
            SamplingInputError: the weights are gone or unreadable (deleted after the request was queued); the
                message names no server path.
        """
        key = folder.resolve()
        try:
            stamp = (folder / "adapter_model.safetensors").stat().st_mtime_ns
        except OSError:
            raise SamplingInputError("the sampler weights were deleted before this request ran") from None
        name = "sampler-" + hashlib.sha256(f"{key}:{stamp}".encode()).hexdigest()[:16]
        if name in self._sampler_adapters:
            self._sampler_adapters.move_to_end(name)
            return name
        try:
            self.adapters.load(name, folder, with_optimizer=False, trainable=False)
        except (OSError, ValueError, SafetensorError, UserInputError) as error:
            # Deleted while loading, or not weights of this model: take back what was half added.
            if name in self.adapters:
                self.adapters.delete(name)
            if isinstance(error, UserInputError):
                raise SamplingInputError(str(error)) from None
            raise SamplingInputError("the sampler weights were deleted or damaged before this request ran") from None
        self._sampler_adapters[name] = str(key)
        while len(self._sampler_adapters) > SAMPLER_ADAPTERS_KEPT:
            evicted, _ = self._sampler_adapters.popitem(last=False)
            self.adapters.delete(evicted)
        return name


def _placeholder_logprobs(call: ForwardBackwardCall) -> list[Tensor]:
    """Log-probs of the right shapes for checking a call's loss inputs before its pass."""
    return [torch.zeros(d.loss_fn_inputs["target_tokens"].shape) for d in call.datums]


def _targets_by_position(datum: DecodedDatum) -> Tensor:
    """The datum's target tokens as `[T, K]` (K = 1 for one target per position)."""
    targets = datum.loss_fn_inputs["target_tokens"].long()
    return targets.reshape(targets.shape[0], -1)


@dataclass(frozen=True)
class SamplerCall:
    """One sampling request and the weights it samples: a sampler checkpoint folder, or None for the base model."""

    weights_folder: Path | None
    request: SamplingRequest
    stop_at_eos: bool


def _sampling_batches(calls: Sequence[SamplerCall]) -> list[list[SamplerCall]]:
    """Consecutive runs of calls within the row and distinct-weights limits of one generation batch."""
    batches: list[list[SamplerCall]] = []
    rows, weights = 0, set()
    for call in calls:
        grown = weights | {call.weights_folder}
        if batches and rows + call.request.num_samples <= MAX_SAMPLING_ROWS and len(grown) <= SAMPLER_ADAPTERS_KEPT:
            batches[-1].append(call)
            rows, weights = rows + call.request.num_samples, grown
        else:
            batches.append([call])
            rows, weights = call.request.num_samples, {call.weights_folder}
    return batches


@dataclass(frozen=True)
class ForwardBackwardCall:
    """One client's forward or forward/backward request."""

    model_id: str
    datums: Sequence[DecodedDatum]
    loss_fn: str
    loss_fn_config: dict[str, float | str] | None
    forward_only: bool
