"""The processes of a sharded backend: their torch.distributed group, and the channel that carries the leader's
engine calls to the followers.

A process learns its place from the variables `torchrun` sets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), whether
torchrun started it or the leader did (`start_followers`). The group runs gloo on CPUs and NCCL on GPUs; its
collectives are FSDP2's gathers of a layer's weights, which every process makes at the same point of the same
engine call. The engine calls themselves go through the group's key-value store (`CommandChannel`), which a
follower polls, so a follower whose leader is gone notices and stops instead of waiting for ever.
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

log = logging.getLogger(__name__)

# A collective waits this long for a process that does not join it (one that died in the middle of an engine call),
# then fails: longer than any one layer's gather takes, short enough that a lost process does not hang the others.
COLLECTIVE_TIMEOUT = timedelta(minutes=5)
# How often a waiting follower checks that its leader is still there.
POLL = timedelta(seconds=1)
# The exit status of a leader whose follower died: the backend cannot go on without that shard of the weights.
SHARD_LOST_EXIT = 3


class LeaderGoneError(RuntimeError):
    """The leader's process ended: the follower has nothing left to follow."""


@dataclass(frozen=True)
class ShardPlace:
    """Where this process stands in its group: rank 0 leads (serves HTTP and schedules), the others follow."""

    rank: int
    world: int
    address: str = "127.0.0.1"
    port: int = 29500

    @property
    def leads(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_environment(cls) -> ShardPlace | None:
        """The place torchrun's variables give this process; None when they are not set."""
        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            return None
        return cls(
            rank=int(os.environ["RANK"]),
            world=int(os.environ["WORLD_SIZE"]),
            address=os.environ.get("MASTER_ADDR", "127.0.0.1"),
            port=int(os.environ.get("MASTER_PORT", "29500")),
        )

    def environment_of(self, rank: int) -> dict[str, str]:
        """torchrun's variables for the process of `rank` in this group."""
        return {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(self.world),
            "LOCAL_WORLD_SIZE": str(self.world),
            "MASTER_ADDR": self.address,
            "MASTER_PORT": str(self.port),
        }


def shard_device(place: ShardPlace, device: torch.device) -> torch.device:
    """The device of this process: its own GPU on a GPU node (by rank), the CPU otherwise."""
    return torch.device("cuda", place.rank) if device.type == "cuda" else device


class CommandChannel:
    """Messages from the leader to every follower, in order, one key of the group's store each; the last follower to
    read a message deletes it."""

    def __init__(self, store: dist.Store, place: ShardPlace) -> None:
        self._store = store
        self._followers = place.world - 1
        self._next = 0

    def send(self, message: object) -> None:
        self._store.set(str(self._next), pickle.dumps(message))
        self._next += 1

    def receive(self) -> object:
        """The next message, waiting as long as the leader is there.

        Raises:
            LeaderGoneError: the leader's process, which holds the store, has ended.
        """
        key = str(self._next)
        while True:
            try:
                self._store.wait([key], POLL)
                break
            except dist.DistNetworkError as error:
                raise LeaderGoneError("the leader process of this sharded backend has ended") from error
            except dist.DistStoreError as error:
                if not _timed_out(error):
                    unreachable = f"the leader process of this sharded backend is unreachable: {error}"
                    raise LeaderGoneError(unreachable) from error
        message = pickle.loads(self._store.get(key))
        if self._store.add(f"read/{key}", 1) == self._followers:
            self._store.delete_key(key)
            self._store.delete_key(f"read/{key}")
        self._next += 1
        return message


def _timed_out(error: dist.DistStoreError) -> bool:
    return "timeout" in str(error).lower() or "timed out" in str(error).lower()


class ShardGroup:
    """This process's membership of the group: the process group, the mesh FSDP2 shards over, the engine calls'
    channel. The leader's store serves the others, so it is made first (`start_followers` after it)."""

    def __init__(self, place: ShardPlace, device: torch.device) -> None:
        self.place = place
        store = dist.TCPStore(
            place.address,
            place.port,
            place.world,
            is_master=place.leads,
            timeout=COLLECTIVE_TIMEOUT,
            wait_for_workers=False,
        )
        if device.type == "cuda":
            torch.cuda.set_device(device)
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend, store=store, rank=place.rank, world_size=place.world, timeout=COLLECTIVE_TIMEOUT
        )
        self.mesh: DeviceMesh = init_device_mesh(device.type, (place.world,))
        self.channel = CommandChannel(dist.PrefixStore("engine-calls", store), place)

    def close(self) -> None:
        dist.destroy_process_group()


class FollowerProcesses:
    """The follower processes a leader started, watched: one that ends before the leader stops ends the leader too,
    with the reason in its log, since no engine call can complete without its shard of the weights."""

    def __init__(self, processes: Sequence[subprocess.Popen]) -> None:
        self.processes = list(processes)
        self._stopping = threading.Event()
        self._watch = threading.Thread(target=self._watch_them, name="shard-watch", daemon=True)
        self._watch.start()

    def _watch_them(self) -> None:
        while not self._stopping.wait(POLL.total_seconds()):
            for rank, process in enumerate(self.processes, start=1):
                status = process.poll()
                if status is not None and not self._stopping.is_set():
                    log.critical(
                        "shard process %d (pid %d) ended with status %d; the sharded backend cannot go on without its "
                        "shard of the weights and stops. Start it again: checkpoints and saved state are kept.",
                        rank,
                        process.pid,
                        status,
                    )
                    logging.shutdown()
                    os._exit(SHARD_LOST_EXIT)

    def expect_exit(self) -> None:
        """The followers are about to be told to stop (or the leader failed to start): their exits are no loss."""
        self._stopping.set()

    def wait(self, timeout_s: float = 30) -> None:
        """Wait for the followers to end (after `expect_exit`), killing those that do not within `timeout_s`."""
        for process in self.processes:
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, for the group's store."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def start_followers(place: ShardPlace, arguments: Sequence[str]) -> FollowerProcesses:
    """Start the processes of ranks 1 to N-1 of the leader's group: `python -m trainer_backend.sharding.follower`
    with `arguments` (how to load the base model), each with its place in the environment."""
    processes = []
    for rank in range(1, place.world):
        environment = {**os.environ, **place.environment_of(rank)}
        command = [sys.executable, "-m", "trainer_backend.sharding.follower", *arguments]
        processes.append(subprocess.Popen(command, env=environment))
    return FollowerProcesses(processes)
