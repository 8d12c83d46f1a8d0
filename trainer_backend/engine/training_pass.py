"""The training pass: every datum of one or more clients' forward/backward requests through the base model, each row
through its own client's adapter, log-probs computed from the decoder's hidden states by the output head in chunks
(never the whole logits), in micro-batches that fit the activation budget, shared prompt prefixes computed once."""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import Cache

from trainer_backend.engine.adapters import AdapterPool
from trainer_backend.engine.decoder_steps import DecoderSteps
from trainer_backend.engine.kv_cache import cut_cache, repeated_cache
from trainer_backend.engine.logprobs import LowRankDelta
from trainer_backend.engine.losses import compute_loss, gradient_positions
from trainer_backend.engine.microbatches import Piece, plan_pieces
from trainer_backend.engine.output_head import LinearOutputHead, linear_output_head
from trainer_backend.engine.prefixes import PrefixGroup, length_buckets, shared_prefix_groups
from trainer_backend.engine.types import DecodedDatum, ForwardBackwardCall, ForwardBackwardResult
from trainer_backend.errors import UserInputError
from trainer_backend.models.loading import LoadedModel

IGNORED_TARGET = -100


class TrainingPass:
    """Runs forward/backward passes over `adapters` of the loaded model. `logprobs` computes target log-probs from
    hidden states (chunked by default); `chunk_tokens` positions' logits exist at once, `piece_tokens` tokens'
    activations per micro-batch; `steps` is told of each decoder forward and backward before it runs."""

    def __init__(
        self,
        loaded: LoadedModel,
        adapters: AdapterPool,
        logprobs: Callable[..., Tensor],
        chunk_tokens: int,
        piece_tokens: int,
        steps: DecoderSteps | None = None,
    ) -> None:
        self.loaded = loaded
        self.steps = steps or DecoderSteps()
        self.adapters = adapters
        self._logprobs = logprobs
        self.chunk_tokens = chunk_tokens
        self.piece_tokens = piece_tokens
        output = linear_output_head(loaded.model)
        assert output is not None, "the engine checks the head before it builds its pass"
        self.softcap = output.softcap
        self.pad_token_id = loaded.tokenizer.pad_token_id or 0

    def run(
        self, calls: Sequence[ForwardBackwardCall], pause: Callable[[], None] = lambda: None
    ) -> list[ForwardBackwardResult | UserInputError]:
        """Every datum of the calls through the base model, in micro-batches that fit the activation budget, calling
        `pause` between two micro-batches.

        Datums of one call that begin with the same tokens (the completions of one prompt) are computed through
        their shared prefix (`prefixes.py`): the prefix once, its KV cache repeated for the members, each member's
        remaining tokens on top, gradients flowing back through the cache. The other datums go in right-padded
        batches. Each micro-batch (`microbatches.py`) runs its forward and its losses' backward before the next
        begins; the losses are sums over data, so the gradients add up to those of one pass. Either way a datum gets
        the log-probs, loss and gradients it gets alone, up to float rounding.

        What runs in a pause may use the model with other adapters (a generation makes its own active and frozen):
        the pass makes its adapter active and trainable again before its next micro-batch.
        """
        # Bad loss inputs fail their call before any of its gradients reach the adapter.
        outcomes: list[ForwardBackwardResult | UserInputError | None] = [self.refusal(call) for call in calls]
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
            output = self.output_head()
            weight, delta = self._unembedding(output, calls[0].model_id)
            head = functools.partial(
                self._logprobs,
                lm_head_weight=weight,
                chunk_tokens=self.chunk_tokens,
                final_logit_softcapping=self.softcap,
                lm_head_delta=delta,
            )
            pieces = plan_pieces(alone, shared, lengths, self.piece_tokens)
            prefixes = _PrefixesInFlight(
                shared, pieces, lambda c, group: self._prefix(output.decoder, head, calls[c], group, one_adapter)
            )
            for number, piece in enumerate(pieces):
                if number:
                    pause()
                    if one_adapter:
                        self.adapters.activate(calls[0].model_id)
                keys = list(piece.alone) + [(c, i) for c, group in piece.groups for i in group.members]
                needs_grad = any(not calls[c].forward_only for c, _ in keys)
                piece_prefixes = prefixes.of(piece)
                outputs = _DecoderOutputs()
                with torch.set_grad_enabled(needs_grad):
                    piece_logprobs = self._piece_logprobs(
                        output.decoder, head, calls, piece, piece_prefixes, one_adapter, outputs
                    )
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
                outputs.backward(self.steps)
                prefixes.done(piece, self.steps)
        for c in valid:
            outcomes[c] = ForwardBackwardResult(
                loss_fn_outputs=[{"logprobs": logprobs[(c, i)]} for i in range(len(calls[c].datums))],
                metrics={"loss:sum": losses[c]},
            )
        return outcomes

    def refusal(self, call: ForwardBackwardCall) -> UserInputError | None:
        """Why the call's loss cannot be computed on its datums (their inputs or its config), or None."""
        try:
            compute_loss(
                call.loss_fn, _placeholder_logprobs(call), [d.loss_fn_inputs for d in call.datums], call.loss_fn_config
            )
        except UserInputError as error:
            return error
        return None

    def _piece_logprobs(
        self,
        decoder: torch.nn.Module,
        head: Callable[..., Tensor],
        calls: Sequence[ForwardBackwardCall],
        piece: Piece,
        prefixes: Sequence[_ComputedPrefix],
        one_adapter: bool,
        outputs: _DecoderOutputs,
    ) -> dict[tuple[int, int], Tensor]:
        """The `[T, K]` target log-probs of every datum of one micro-batch, keyed by (call, datum); `prefixes` are its
        groups' computed prefixes, in order. Its decoder outputs all go through the head together, cut from the
        decoder's graph (`outputs`)."""
        waiting: list[_HeadRows] = []
        if piece.alone:
            datums = [calls[c].datums[i] for c, i in piece.alone]
            with self._routed(one_adapter, [calls[c].model_id for c, _ in piece.alone]):
                tokens_B_T, mask_B_T, targets_B_T_K, live_B_T = self._batch(
                    datums, [self._gradient_rows(calls[c], i) for c, i in piece.alone]
                )
                self.steps.forward()
                hidden_B_T_H = outputs.cut(decoder(input_ids=tokens_B_T, attention_mask=mask_B_T).last_hidden_state)
            owners = [
                _RowOwner(key, len(d.model_input_tokens), None) for key, d in zip(piece.alone, datums, strict=True)
            ]
            waiting.append(_HeadRows(owners, hidden_B_T_H, targets_B_T_K, live_B_T))
        for (c, part), prefix in zip(piece.groups, prefixes, strict=True):
            waiting += self._member_buckets(decoder, c, calls[c], part, prefix, one_adapter, outputs)
        logprobs: dict[tuple[int, int], Tensor] = {}
        for rows, logprobs_B_T_K in zip(waiting, _logprobs_together(head, waiting), strict=True):
            for b, owner in enumerate(rows.owners):
                own_T_K = logprobs_B_T_K[b, : owner.length]
                if owner.prefix is not None:
                    own_T_K = torch.cat([owner.prefix.member_logprobs(owner.key[1]), own_T_K])
                logprobs[owner.key] = own_T_K
        return logprobs

    def _prefix(
        self,
        decoder: torch.nn.Module,
        head: Callable[..., Tensor],
        call: ForwardBackwardCall,
        group: PrefixGroup,
        one_adapter: bool,
    ) -> _ComputedPrefix:
        """The common prefix of `group` through the decoder once, with every member's target log-probs over it."""
        device = self.loaded.device
        members = [call.datums[i] for i in group.members]
        prefix = group.prefix_length
        prefix_1P = torch.tensor([members[0].model_input_tokens[:prefix]], dtype=torch.long, device=device)
        with torch.set_grad_enabled(not call.forward_only):
            with self._routed(one_adapter, [call.model_id]):
                self.steps.forward()
                output = decoder(input_ids=prefix_1P, use_cache=True)
            targets = [_targets_by_position(d)[:prefix] for d in members]
            live = [self._gradient_rows(call, i)[:prefix] for i in group.members]
            # Prefix positions: one row of hidden state, every member's own targets side by side.
            targets_1P_GK = torch.cat(targets, dim=1)[None].to(device)
            live_1P = torch.stack(live).any(dim=0)[None].to(device)
            logprobs_1P_GK = head(output.last_hidden_state, targets=targets_1P_GK, gradient_rows=live_1P)
        cache, cut = cut_cache(output.cache)
        logprobs_leaf = logprobs_1P_GK.detach().requires_grad_(logprobs_1P_GK.requires_grad)
        return _ComputedPrefix(
            group.members,
            targets[0].shape[1],
            cache,
            logprobs_leaf,
            [*cut, (logprobs_1P_GK, logprobs_leaf)],
            output.last_hidden_state,
        )

    def _member_buckets(
        self,
        decoder: torch.nn.Module,
        c: int,
        call: ForwardBackwardCall,
        part: PrefixGroup,
        prefix: _ComputedPrefix,
        one_adapter: bool,
        outputs: _DecoderOutputs,
    ) -> list[_HeadRows]:
        """The members of `part` (of call `c`) through the decoder on top of their group's computed prefix, in
        buckets of completions of similar length, each continuing its own copy of the prefix's cache; their decoder
        outputs cut from its graph (`outputs`)."""
        device = self.loaded.device
        members = [call.datums[i] for i in part.members]
        prefix_length = part.prefix_length
        targets = [_targets_by_position(d) for d in members]
        live = [self._gradient_rows(call, i) for i in part.members]
        suffixes = [d.model_input_tokens[prefix_length:] for d in members]
        buckets = []
        for bucket in length_buckets([len(suffix) for suffix in suffixes]):
            longest = max(len(suffixes[g]) for g in bucket)
            suffix_B_S = torch.full((len(bucket), longest), self.pad_token_id, dtype=torch.long)
            mask_B_A = torch.zeros((len(bucket), prefix_length + longest), dtype=torch.long)
            mask_B_A[:, :prefix_length] = 1
            targets_B_S_K = torch.full((len(bucket), longest, prefix.width), IGNORED_TARGET, dtype=torch.long)
            live_B_S = torch.zeros((len(bucket), longest), dtype=torch.bool)
            for b, g in enumerate(bucket):
                size = len(suffixes[g])
                suffix_B_S[b, :size] = torch.tensor(suffixes[g])
                mask_B_A[b, prefix_length : prefix_length + size] = 1
                targets_B_S_K[b, :size] = targets[g][prefix_length:]
                live_B_S[b, :size] = live[g][prefix_length:]
            positions_B_S = torch.arange(prefix_length, prefix_length + longest).expand(len(bucket), -1)
            with self._routed(one_adapter, [call.model_id] * len(bucket)):
                self.steps.forward()
                hidden_B_S_H = decoder(
                    input_ids=suffix_B_S.to(device),
                    attention_mask=mask_B_A.to(device),
                    position_ids=positions_B_S.to(device),
                    cache=repeated_cache(prefix.cache, len(bucket)),
                    use_cache=True,
                ).last_hidden_state
            hidden_B_S_H = outputs.cut(hidden_B_S_H)
            owners = [_RowOwner((c, part.members[g]), len(suffixes[g]), prefix) for g in bucket]
            buckets.append(_HeadRows(owners, hidden_B_S_H, targets_B_S_K.to(device), live_B_S.to(device)))
        return buckets

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

    def output_head(self) -> LinearOutputHead:
        """The model as decoder and head, as it stands now (a LoRA layer may wrap the head)."""
        model = self.adapters.peft_model or self.adapters.base_model
        output = linear_output_head(model.get_base_model() if hasattr(model, "get_base_model") else model)
        assert output is not None, "checked when the engine was built"
        return output

    def _routed(self, one_adapter: bool, rows: Sequence[str]) -> contextlib.AbstractContextManager:
        """Each row of the next forward through its own adapter; nothing to do when the pass has one adapter."""
        return contextlib.nullcontext() if one_adapter else self.adapters.routed(rows)

    def trains_unembedding(self, model_id: str) -> bool:
        return self.adapters.peft_model is not None and self.output_head().trained_by(model_id)

    def check_datums(self, datums: Sequence[DecodedDatum]) -> None:
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


@dataclass(frozen=True)
class _RowOwner:
    """The datum a row of decoder output belongs to, how many of the row's positions are its own, and the computed
    prefix its own positions continue (None for a datum computed whole)."""

    key: tuple[int, int]  # (call, datum)
    length: int
    prefix: _ComputedPrefix | None


@dataclass(frozen=True)
class _HeadRows:
    """Rows of decoder output waiting for the head: hidden states, `[B, T, K]` targets and gradient rows."""

    owners: list[_RowOwner]
    hidden_B_T_H: Tensor
    targets_B_T_K: Tensor
    live_B_T: Tensor


def _logprobs_together(head: Callable[..., Tensor], waiting: Sequence[_HeadRows]) -> list[Tensor]:
    """Each entry's `[B, T, K]` target log-probs, from one head call per target width for all of them.

    A head call reads the whole unembedding (Qwen's is `[151936, 896]`) for each chunk of at most `chunk_tokens`
    positions, and for a bucket of a few short completions that read, not the arithmetic, is what it costs. One call
    per micro-batch reads it once per full chunk instead of once per bucket.
    """
    outcomes: list[Tensor | None] = [None] * len(waiting)
    by_width: dict[int, list[int]] = {}
    for index, rows in enumerate(waiting):
        by_width.setdefault(rows.targets_B_T_K.shape[2], []).append(index)
    for width, indices in by_width.items():
        hidden_1N_H = torch.cat([waiting[i].hidden_B_T_H.flatten(0, 1) for i in indices])[None]
        targets_1N_K = torch.cat([waiting[i].targets_B_T_K.reshape(-1, width) for i in indices])[None]
        live_1N = torch.cat([waiting[i].live_B_T.reshape(-1) for i in indices])[None]
        logprobs_N_K = head(hidden_1N_H, targets=targets_1N_K, gradient_rows=live_1N)[0]
        sizes = [waiting[i].live_B_T.numel() for i in indices]
        for i, logprobs_n_K in zip(indices, logprobs_N_K.split(sizes), strict=True):
            outcomes[i] = logprobs_n_K.reshape(waiting[i].targets_B_T_K.shape)
    return [logprobs for logprobs in outcomes if logprobs is not None]


@dataclass
class _ComputedPrefix:
    """A group's common prefix, computed once for all its members however many micro-batches they take.

    Its keys and values and its log-probs are cut from the prefix's graph: the members' backwards stop at these
    leaves and add up their gradients there, and `backward` sends the sums through the prefix once. A group split
    across micro-batches used to compute its prefix again for each part, forward and backward: for Qwen's RL step
    of 8 prompts of ~250 tokens × 8 completions, five prompts more in a pass of about 5,000 tokens.
    """

    members: tuple[int, ...]  # the whole group's, in the order of the log-probs' columns
    width: int  # target tokens per position
    cache: Cache
    logprobs_1P_GK: Tensor
    cut: list[tuple[Tensor, Tensor]]  # (a tensor of the prefix's graph, the leaf that stands for it)
    hidden_1P_H: Tensor  # the decoder's output, where the prefix's backward starts

    def member_logprobs(self, member: int) -> Tensor:
        """`[P, K]`: datum `member`'s target log-probs at the prefix's positions."""
        g = self.members.index(member)
        return self.logprobs_1P_GK[0, :, g * self.width : (g + 1) * self.width]

    def backward(self, steps: DecoderSteps) -> None:
        """The gradients the members' backwards left on the leaves, through the prefix's own graph."""
        reached = [(tensor, leaf.grad) for tensor, leaf in self.cut if leaf.grad is not None]
        if reached:
            # From the decoder's output too, with a zero gradient: the backward then enters every layer from its
            # output, as `DecoderSteps` has it. From a layer's keys and values alone (a prefix none of whose
            # positions has a gradient of its own) it would start inside the layer, where a sharded layer's weights
            # are not gathered.
            reached.append((self.hidden_1P_H, torch.zeros_like(self.hidden_1P_H)))
            steps.backward()
            torch.autograd.backward([tensor for tensor, _ in reached], [grad for _, grad in reached])


class _PrefixesInFlight:
    """The computed prefixes of a pass's groups, each from the first piece that holds one of its parts to the last."""

    def __init__(
        self,
        shared: Sequence[tuple[int, PrefixGroup]],
        pieces: Sequence[Piece],
        compute: Callable[[int, PrefixGroup], _ComputedPrefix],
    ) -> None:
        self._whole = {(c, i): (c, group) for c, group in shared for i in group.members}
        self._parts_left = Counter(self._whole_of(c, part) for piece in pieces for c, part in piece.groups)
        self._computed: dict[tuple[int, PrefixGroup], _ComputedPrefix] = {}
        self._compute = compute

    def _whole_of(self, c: int, part: PrefixGroup) -> tuple[int, PrefixGroup]:
        return self._whole[(c, part.members[0])]

    def of(self, piece: Piece) -> list[_ComputedPrefix]:
        """The prefix of each of the piece's groups, computed where this is its group's first piece."""
        prefixes = []
        for c, part in piece.groups:
            whole = self._whole_of(c, part)
            if whole not in self._computed:
                self._computed[whole] = self._compute(*whole)
            prefixes.append(self._computed[whole])
        return prefixes

    def done(self, piece: Piece, steps: DecoderSteps) -> None:
        """After the piece's backward: the prefixes whose last part it held send their gradients through."""
        for c, part in piece.groups:
            whole = self._whole_of(c, part)
            self._parts_left[whole] -= 1
            if self._parts_left[whole] == 0:
                self._computed.pop(whole).backward(steps)


class _DecoderOutputs:
    """A micro-batch's decoder outputs, cut from the head's graph: the losses' backward leaves the head's gradients
    on the cuts, and each output's backward then runs on its own (`DecoderSteps`). On a sharded model, one backward
    through several forwards gathers a layer as many times as autograd's interleaving of them asks (two forwards of
    two layers: three gathers); one backward per forward gathers each layer once, whatever the micro-batch holds."""

    def __init__(self) -> None:
        self._cut: list[tuple[Tensor, Tensor]] = []  # (the decoder's output, the leaf the head reads instead)

    def cut(self, hidden: Tensor) -> Tensor:
        """A leaf standing for `hidden` in the head's graph."""
        leaf = hidden.detach().requires_grad_(hidden.requires_grad)
        self._cut.append((hidden, leaf))
        return leaf

    def backward(self, steps: DecoderSteps) -> None:
        """Each output that the losses reached, backward through the decoder from its leaf's gradient."""
        for hidden, leaf in self._cut:
            if leaf.grad is not None:
                steps.backward()
                hidden.backward(leaf.grad)
        self._cut.clear()


def _placeholder_logprobs(call: ForwardBackwardCall) -> list[Tensor]:
    """Log-probs of the right shapes for checking a call's loss inputs before its pass."""
    return [torch.zeros(d.loss_fn_inputs["target_tokens"].shape) for d in call.datums]


def _targets_by_position(datum: DecodedDatum) -> Tensor:
    """The datum's target tokens as `[T, K]` (K = 1 for one target per position)."""
    targets = datum.loss_fn_inputs["target_tokens"].long()
    return targets.reshape(targets.shape[0], -1)
