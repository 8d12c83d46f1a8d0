"""Building and running the server: load the base model, wire the service, serve it with uvicorn."""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import TypeVar

import uvicorn
from uvicorn.main import STARTUP_FAILURE

from trainer_backend.api.app import create_app
from trainer_backend.api.http_protocol import JsonErrorH11Protocol
from trainer_backend.auth import KeyPolicy
from trainer_backend.config import ServerConfig
from trainer_backend.errors import UserInputError
from trainer_backend.models.loading import dtype_name, load_base_model, select_device, select_dtype
from trainer_backend.models.registry import default_cache_root, resolve_base_model
from trainer_backend.service import TrainingService
from trainer_backend.sharding.follower import run_follower
from trainer_backend.sharding.leader import engine_settings, lead, shard_place, torchrun_place

log = logging.getLogger(__name__)

T = TypeVar("T")


def build_service(config: ServerConfig) -> TrainingService:
    """Resolve and load the base model (converting it on first use), then open the stores; on a thread that ends."""
    return on_a_passing_thread(lambda: _build_service(config))


def on_a_passing_thread(build: Callable[[], T]) -> T:
    """`build()`, run on a thread that ends when it returns.

    A thread that runs PyTorch's parallel CPU kernels gets OpenMP (libgomp) worker threads that live as long as it
    does. Loading the model runs such kernels, and the device worker runs all the rest. While OpenMP keeps more
    threads than there are cores, libgomp's workers sleep as soon as a parallel region ends instead of spinning for
    the next one, and each of the thousands of small kernels of a decode step then waits for them to wake. A thread
    that ends takes its workers with it.
    """
    outcome: Future[T] = Future()

    def run() -> None:
        try:
            outcome.set_result(build())
        except BaseException as error:  # raised again on the caller's thread
            outcome.set_exception(error)

    # A daemon, so that Ctrl-C during a long first conversion stops the process rather than waiting for it.
    thread = threading.Thread(target=run, name="model-loading", daemon=True)
    thread.start()
    thread.join()
    return outcome.result()


def _build_service(config: ServerConfig) -> TrainingService:
    cache_root = config.model_cache or default_cache_root()
    resolved = resolve_base_model(config.base_model, cache_root)
    device = select_device(config.device)
    dtype = select_dtype(config.dtype, device)
    place = shard_place(config)
    if place is None:
        engine = engine_settings(config, cache_root, device).engine(load_base_model(resolved, device, dtype))
        where = str(device)
    else:
        engine = lead(config, place, resolved, cache_root, device)
        where = f"{place.world} processes on {device.type}, the decoder layers sharded"
    log.info("serving %s from %s on %s in %s", resolved.name, resolved.folder, where, dtype_name(dtype))
    return TrainingService(config, engine)


def serve(config: ServerConfig) -> None:
    """Run until interrupted (Ctrl-C, SIGTERM), then shut down: requests in flight answered, vLLM stopped, stores
    closed."""
    place = torchrun_place()
    if place is not None and not place.leads:
        # A process of a group torchrun started, other than rank 0: it follows the leader's engine calls.
        device = select_device(config.device)
        settings = engine_settings(config, config.model_cache or default_cache_root(), device)
        raise SystemExit(run_follower(settings, place))
    policy = KeyPolicy(frozenset(config.api_keys))
    policy.check_bind(config.host)
    # uvicorn answers SIGTERM by shutting down, then raises it again under the handler it found: the default one would
    # end the process there, before `service.close()` stops vLLM (found running on as an orphan). Raised as
    # SystemExit, it unwinds through the `finally`; during the model's loading too.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    listener = reserve_port(config.host, config.port)
    try:
        service = build_service(config)
        try:
            app = create_app(service, policy, config.long_poll_s)
            server = uvicorn.Server(
                uvicorn.Config(app, host=config.host, port=config.port, log_level="info", http=JsonErrorH11Protocol)
            )
            # uvicorn raises Ctrl-C again once it has shut down: an orderly stop.
            with contextlib.suppress(KeyboardInterrupt):
                server.run(sockets=[listener])
            if not server.started:
                raise SystemExit(STARTUP_FAILURE)
        finally:
            service.close()
    finally:
        listener.close()


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to `host`:`port` (0: one the system picks), listening only once uvicorn serves on it.

    Bound before the model loads: vLLM and its engine take ports of their own while they start, and a port chosen for
    the server, but not yet bound, was seen taken by one of them; a port in use fails here, at once, not after a
    minute of loading. Until uvicorn listens, a client's connection is refused, as before.

    Raises:
        UserInputError: the port is in use or the address is not this machine's.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, as uvicorn names it: asyncio turns Nagle's algorithm off only on sockets that say so, and
    # with it on every small reply waited for the client's delayed ACK (40 ms a request).
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a port in TIME_WAIT is free
    try:
        listener.bind((host, port))
    except OSError as error:
        listener.close()
        raise UserInputError(f"cannot serve on {host}:{port}: {error.strerror}") from None
    return listener


def _exit_on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signal.SIGTERM)


@dataclass(frozen=True)
class RunningServer:
    url: str
    service: TrainingService


@contextmanager
def running_server(config: ServerConfig) -> Iterator[RunningServer]:
    """A real server on a background thread, for tests and benchmarks (trials start `python -m trainer_backend
    serve` in a process of its own)."""
    policy = KeyPolicy(frozenset(config.api_keys))
    policy.check_bind(config.host)
    with reserve_port(config.host, config.port) as listener:
        port = listener.getsockname()[1]
        service = build_service(config)
        app = create_app(service, policy, config.long_poll_s)
        server = uvicorn.Server(
            uvicorn.Config(app, host=config.host, port=port, log_level="warning", http=JsonErrorH11Protocol)
        )
        thread = threading.Thread(target=server.run, args=([listener],), name="uvicorn", daemon=True)
        thread.start()
        try:
            while not server.started:
                if not thread.is_alive():
                    raise RuntimeError("the server failed to start; see the log above")
                threading.Event().wait(0.02)
            yield RunningServer(f"http://{config.host}:{port}", service)
        finally:
            server.should_exit = True
            thread.join(timeout=30)
            service.close()
