"""The engine calls of a sharded backend, made by the leader and replayed by every follower in the same order.

Every process holds a `ModelEngine` over its shard of the base model. The leader's scheduler calls a `LeaderEngine`,
which sends each call to the followers before making it; a follower (`follow`) makes the same call on its own engine,
so every process reaches the same FSDP2 gathers in the same order. A generation batch calls back into the scheduler
between its decode steps: its pauses run other operations (sent as they are made, and followed inside the follower's
own pause) and its admissions take in more requests (sent as the leader took them in). Whatever a call draws at
random comes from a state the leader sends: the global generator's (a new adapter's initial weights) and each
request's seed, drawn by the leader for a request that has none.

A forward_backward's datums are split across the processes, each computing its share (`data_parallel.py`); every
other call (a generation, prompt scoring, a save's proof) every process computes whole. An error a call raises on the
leader it raises on every follower, which goes on to the next call; the leader answers the tenant.
"""

from __future__ import annotations

import functools
import random
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from trainer_backend.engine.model_engine import ModelEngine, SampleOutcome
from trainer_backend.engine.types import (
    AdamSettings,
    ForwardBackwardCall,
    ForwardBackwardResult,
    LoraSettings,
    SamplingRequest,
)
from trainer_backend.errors import BackendError
from trainer_backend.sharding.group import CommandChannel, FollowerProcesses, ShardGroup
from trainer_backend.structured_output import JsonSchemaConstraint, JsonSchemaConstraints, SentGrammar


@dataclass(frozen=True)
class EngineCall:
    """One call of the leader's engine: the method, its arguments, and the global generators' state before it."""

    method: str
    arguments: tuple
    random_state: tuple[torch.Tensor, ...] = field(default_factory=lambda: _random_state())
    # For sample_batch: whether the leader's generation takes in requests between its steps.
    takes_in: bool = False


@dataclass(frozen=True)
class SentSample:
    """A sampling request as the followers receive it: the leader's (with the seed every process draws from, without
    its streaming callback), its structured-output constraint as text, which each follower makes again with its own
    tokenizer."""

    request: SamplingRequest
    grammar: SentGrammar | None = None

    @classmethod
    def of(cls, request: SamplingRequest) -> SentSample:
        """Raises ValueError for a constraint that is not a JSON schema's (none other can be sent)."""
        if request.constraint is None:
            return cls(request)
        if not isinstance(request.constraint, JsonSchemaConstraint):
            raise ValueError(f"a sharded backend cannot send a {type(request.constraint).__name__} to its followers")
        return cls(replace(request, constraint=None), request.constraint.sent())

    def made(self, constraints: Callable[[], JsonSchemaConstraints]) -> SamplingRequest:
        """The request with its constraint made from `constraints()` (called only for a constrained request)."""
        if self.grammar is None:
            return self.request
        return replace(self.request, constraint=constraints().remade(self.grammar))


@dataclass(frozen=True)
class TakenIn:
    """The requests the leader's generation took in before its next decode step."""

    requests: tuple[SentSample, ...]


@dataclass(frozen=True)
class Resumed:
    """The leader's generation came back from its pause: the follower's does too."""


@dataclass(frozen=True)
class Stop:
    """The backend is stopping."""


class ShardDivergedError(RuntimeError):
    """A follower's engine reached a state the leader's did not: the processes no longer make the same calls."""


def _random_state() -> tuple[torch.Tensor, ...]:
    # The CPU's generator and this process's GPU's (each process's current device is its rank's): asking for every
    # GPU's would make a CUDA context on each of them in every process.
    states = [torch.get_rng_state()]
    if torch.cuda.is_available():
        states.append(torch.cuda.get_rng_state())
    return tuple(states)


def _set_random_state(states: tuple[torch.Tensor, ...]) -> None:
    torch.set_rng_state(states[0])
    if len(states) > 1:
        torch.cuda.set_rng_state(states[1])


def _replayable(request: SamplingRequest) -> SamplingRequest:
    """`request` as every process makes it: a seed of its own (the leader's draw, which every process repeats), and
    without the leader's streaming callback."""
    seed = random.getrandbits(63) if request.seed is None else request.seed
    return replace(request, seed=seed, on_token=None)


class LeaderEngine:
    """The leader's engine: each call is sent to the followers, then made here. What only reads the engine's state
    (`has_adapter`, `residency`, the weight checks) is the leader's alone."""

    def __init__(self, engine: ModelEngine, group: ShardGroup, followers: FollowerProcesses | None) -> None:
        """`followers`: the processes this leader started (None where torchrun started them)."""
        self.engine = engine
        self.group = group
        self.channel = group.channel
        self.followers = followers
        self.loaded = engine.loaded
        self.residency = engine.residency
        self.weight_checks = engine.weight_checks
        self.applied_weights = engine.applied_weights

    def _send(self, method: str, *arguments: object, takes_in: bool = False) -> None:
        self.channel.send(EngineCall(method, arguments, takes_in=takes_in))

    def has_adapter(self, model_id: str) -> bool:
        return self.engine.has_adapter(model_id)

    def create_adapter(self, model_id: str, lora: LoraSettings) -> None:
        self._send("create_adapter", model_id, lora)
        self.engine.create_adapter(model_id, lora)

    def forward_backward_batch(
        self, calls: Sequence[ForwardBackwardCall], pause: Callable[[], None] = lambda: None
    ) -> list[ForwardBackwardResult | BackendError]:
        """As `ModelEngine.forward_backward_batch`, on every process of the group; it does not pause (`pause` is not
        called): the other processes would wait in the middle of the pass for whatever ran in this one's pause."""
        self._send("forward_backward_batch", list(calls))
        return self.engine.forward_backward_batch(calls)

    def optim_step(self, model_id: str, adam: AdamSettings) -> dict[str, float]:
        self._send("optim_step", model_id, adam)
        return self.engine.optim_step(model_id, adam)

    def save(self, model_id: str, folder: Path, include_optimizer: bool) -> None:
        self._send("save", model_id, folder, include_optimizer)
        self.engine.save(model_id, folder, include_optimizer)

    def load(self, model_id: str, folder: Path, with_optimizer: bool) -> None:
        self._send("load", model_id, folder, with_optimizer)
        self.engine.load(model_id, folder, with_optimizer)

    def sample_batch(
        self,
        requests: Sequence[SamplingRequest],
        pause: Callable[[], None] = lambda: None,
        admit: Callable[[Callable[[SamplingRequest], bool]], Sequence[SamplingRequest]] | None = None,
        finished: Callable[[int, SampleOutcome], None] | None = None,
        prefilled: Callable[[], None] = lambda: None,
    ) -> list[SampleOutcome]:
        """As `ModelEngine.sample_batch`; the followers make the same generation, pausing and taking in as it does."""
        replayed = [_replayable(request) for request in requests]
        self._send("sample_batch", [SentSample.of(request) for request in replayed], takes_in=admit is not None)

        def paused() -> None:
            pause()
            self.channel.send(Resumed())

        def taking_in(accepts: Callable[[SamplingRequest], bool]) -> Sequence[SamplingRequest]:
            taken = [_replayable(request) for request in admit(accepts)]
            self.channel.send(TakenIn(tuple(SentSample.of(request) for request in taken)))
            return taken

        return self.engine.sample_batch(replayed, paused, taking_in if admit is not None else None, finished, prefilled)

    def close(self) -> None:
        """Tell the followers to stop, wait for those this leader started, and leave the group."""
        # Expected before they are told: one that ends at once must not look lost to the watch.
        if self.followers is not None:
            self.followers.expect_exit()
        self.channel.send(Stop())
        if self.followers is not None:
            self.followers.wait()
        self.group.close()


def follow(engine: ModelEngine, channel: CommandChannel) -> None:
    """Make the leader's engine calls on `engine`, in order, until the leader stops."""
    scratch = Path(tempfile.mkdtemp(prefix="shard-saves-"))
    try:
        replay = _Replay(engine, channel, scratch)
        while not isinstance(message := channel.receive(), Stop):
            replay.make(message)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class _Replay:
    """A follower's side of the leader's calls: each made on its engine as the leader made it."""

    def __init__(self, engine: ModelEngine, channel: CommandChannel, scratch: Path) -> None:
        self.engine = engine
        self.channel = channel
        self.scratch = scratch

    @functools.cached_property
    def constraints(self) -> JsonSchemaConstraints:
        # Made at the first constrained request: converting a tokenizer for llguidance takes a while.
        return JsonSchemaConstraints(self.engine.loaded.tokenizer, self.engine.loaded.vocab_size)

    def make(self, call: object) -> None:
        if not isinstance(call, EngineCall):
            raise ShardDivergedError(f"a follower expected an engine call and got {type(call).__name__}")
        _set_random_state(call.random_state)
        try:
            if call.method == "sample_batch":
                self._sample_batch(call)
            elif call.method == "save":
                # The leader writes the files; a follower's save still makes the proof's forward pass with the others.
                model_id, _folder, include_optimizer = call.arguments
                folder = self.scratch / "save"
                folder.mkdir()
                self.engine.save(model_id, folder, include_optimizer)
                shutil.rmtree(folder)
            else:
                getattr(self.engine, call.method)(*call.arguments)
        except BackendError:
            pass  # the leader's own call fails alike and answers the tenant

    def _sample_batch(self, call: EngineCall) -> None:
        def pause() -> None:
            while not isinstance(message := self.channel.receive(), Resumed):
                self.make(message)

        def take_in(accepts: Callable[[SamplingRequest], bool]) -> Sequence[SamplingRequest]:
            message = self.channel.receive()
            if not isinstance(message, TakenIn):
                got = type(message).__name__
                raise ShardDivergedError(f"a follower's generation expected the requests taken in, got {got}")
            requests = [self._made(sent) for sent in message.requests]
            if not all(accepts(request) for request in requests):
                raise ShardDivergedError("a follower's generation cannot take in a request the leader's took in")
            return requests

        (sent,) = call.arguments
        self.engine.sample_batch([self._made(one) for one in sent], pause, take_in if call.takes_in else None)

    def _made(self, sent: SentSample) -> SamplingRequest:
        return sent.made(lambda: self.constraints)
