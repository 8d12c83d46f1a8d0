"""Reward code run in a worker process of its own, under limits the operating system enforces.

The worker is a fresh interpreter (`python -m tasks.reward_code.sandbox`, a `tasks.pipe_worker.PipeWorker`) tied to
its parent by `lifeline`, that imports only the standard library. It defines the function with only
`static_check.SAFE_BUILTINS` and, for each allowed module, a stand-in holding the module's public functions and
constants but no submodule (so `re.enum.sys` does not lead to `os`). Before it runs any of the code it forbids
writing files (RLIMIT_FSIZE 0) and caps its address space (RLIMIT_AS) at what it maps then plus
`CodeLimits.memory_mb`, so an allocation past the cap is a MemoryError inside the worker; before each call it allows
`cpu_s` more seconds of CPU time (RLIMIT_CPU: past them the kernel ends it with SIGXCPU). The parent gives each call
a wall-clock deadline and kills a worker that misses it. A call that ends its worker (a loop, a crash, memory) is an
error with the reason, and a new worker takes the next call; nothing the code does reaches the caller.

What crosses the pipes is JSON (a worker's answer is only ever parsed, never unpickled: the code runs there), and a
batch of calls goes to the worker in one message.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace

from tasks.closeable import Closeable
from tasks.pipe_worker import LiveWorkers, ParentPipes, PipeWorker, WorkerGoneError
from tasks.reward_code.errors import RewardCodeError
from tasks.reward_code.static_check import ALLOWED_MODULES, FUNCTION_NAME, SAFE_BUILTINS

# How long past a call's wall-clock limit the parent waits for its answer (the pipe, the JSON).
_GRACE_S = 0.5


@dataclass(frozen=True)
class CodeLimits:
    """What one call of reward code may use."""

    # CPU seconds a call may use (whole seconds: RLIMIT_CPU's unit; the kernel may allow up to one more).
    cpu_s: int = 1
    # Wall-clock seconds a call may take before its worker is killed.
    wall_s: float = 2.0
    # Address space the worker may map beyond what it holds once the function is defined.
    memory_mb: int = 256
    # Seconds a worker may take to start and define the function (its top-level code runs under the CPU limit).
    start_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("cpu_s", "wall_s", "memory_mb", "start_s"):
            if getattr(self, name) <= 0:
                raise RewardCodeError(f"CodeLimits.{name} must be positive, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class CallOutcome:
    """One call's result: the number it returned, or why there is none."""

    value: float | None = None
    error: str | None = None


class CodeSandbox(Closeable):
    """Runs one source's `reward` function in a worker process; safe from any number of threads (calls queue).

    The worker starts on the first call and is replaced when a call ends it.
    """

    def __init__(self, source: str, limits: CodeLimits | None = None) -> None:
        self.source = source
        self.limits = limits or CodeLimits()
        self._lock = threading.Lock()
        self._live = LiveWorkers(self)
        self._worker: _Worker | None = None
        self.replaced = 0  # workers a call ended: for logs and tests

    def call_many(self, calls: Sequence[Sequence[object]], stop_at_error: bool = False) -> list[CallOutcome]:
        """Each call's outcome, in order; with `stop_at_error`, those up to and including the first error.

        Raises:
            RewardCodeError: the sandbox is closed, the worker could not start, or defining the function failed (the
                reason names why).
        """
        outcomes: list[CallOutcome] = []
        with self._lock:
            while len(outcomes) < len(calls):
                if self._worker is None:
                    worker = _Worker(self.source, self.limits)
                    if not self._live.add(worker):
                        raise RewardCodeError("the reward code's sandbox is closed")
                    self._worker = worker
                answers, ended = self._worker.run(calls[len(outcomes) :], self.limits.wall_s + _GRACE_S)
                outcomes += answers
                if ended is not None:
                    self._live.discard(self._worker)
                    self._worker = None
                    if len(outcomes) < len(calls) and ended:  # the call after the last answer ended the worker
                        outcomes.append(CallOutcome(error=ended))
                        self.replaced += 1
                if stop_at_error and any(outcome.error for outcome in outcomes):
                    return outcomes[: next(i for i, o in enumerate(outcomes) if o.error) + 1]
        return outcomes

    def close(self) -> None:
        with self._lock:
            self._worker = None
            self._live.kill_all()


class _Worker(PipeWorker):
    """One worker process: the function defined, then batches of calls; JSON both ways."""

    def __init__(self, source: str, limits: CodeLimits) -> None:
        super().__init__("tasks.reward_code.sandbox", json.dumps(asdict(limits)))
        self.limits = limits
        try:
            self.send(json.dumps({"source": source}).encode())
            message = self.receive(limits.start_s)
        except WorkerGoneError:
            self.kill()
            raise RewardCodeError(f"defining the function ended its worker: {self._death()}") from None
        if message is None:
            self.kill()
            raise RewardCodeError(f"defining the function took longer than {limits.start_s:g} s")
        answer = json.loads(message)
        if "error" in answer:
            self.kill()
            raise RewardCodeError(f"defining the function failed: {answer['error']}")

    def run(self, calls: Sequence[Sequence[object]], deadline_s: float) -> tuple[list[CallOutcome], str | None]:
        """Send the calls at once and collect the outcomes, each within `deadline_s` of the one before.

        Returns the outcomes received and, where the worker is gone, why ('' for a worker that retired on its own
        after its last answer, which then holds the error).
        """
        outcomes: list[CallOutcome] = []
        try:
            self.send(json.dumps([list(call) for call in calls]).encode())
            while len(outcomes) < len(calls):
                message = self.receive(deadline_s)
                if message is None:
                    self.kill()
                    return outcomes, f"ran past the wall-clock limit of {self.limits.wall_s:g} s"
                answer = json.loads(message)
                outcomes.append(CallOutcome(value=answer.get("value"), error=answer.get("error")))
                if answer.get("retire"):
                    self.kill()
                    return outcomes, ""
        except WorkerGoneError:
            reason = self._death()
            self.kill()
            return outcomes, reason
        return outcomes, None

    def _death(self) -> str:
        """Why the worker ended, from its exit status."""
        code = self.wait()
        if code == -signal.SIGXCPU:
            return f"used more than its {self.limits.cpu_s} s of CPU time"
        if code < 0:
            return f"its worker died of signal {signal.Signals(-code).name}"
        return f"its worker exited with status {code}"


# --- the worker's side ---------------------------------------------------------------------------------------------


def _serve(limits: CodeLimits) -> None:
    """Define the function from the source the parent sends, then answer batches of calls until the pipe closes."""
    import builtins
    import resource

    parent = ParentPipes()

    def send(answer: dict[str, object]) -> None:
        parent.send(json.dumps(answer).encode())

    stand_ins = {name: _public(__import__(name)) for name in ALLOWED_MODULES}

    def restricted_import(
        name: str, globals_: object = None, locals_: object = None, fromlist: object = (), level: int = 0
    ) -> SimpleNamespace:
        if level or name not in stand_ins:
            raise ImportError(f"only {', '.join(sorted(stand_ins))} may be imported")
        return stand_ins[name]

    message = parent.receive()
    if message is None:
        return
    source = json.loads(message)["source"]
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    # A write past the size limit then fails with an error rather than ending the worker (stderr may be a file).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _cap_address_space(resource, limits.memory_mb * 2**20)
    safe = {name: getattr(builtins, name) for name in SAFE_BUILTINS}
    namespace: dict[str, object] = {"__builtins__": {**safe, "__import__": restricted_import}}
    _allow_cpu(resource, limits.cpu_s)
    try:
        exec(compile(source, "<reward code>", "exec"), namespace)  # the checked source, with stripped builtins
        function = namespace.get(FUNCTION_NAME)
        if not callable(function):
            raise TypeError(f"the source defines no function {FUNCTION_NAME!r}")
    except BaseException as error:  # whatever the code raises, the parent gets the reason
        send({"error": _described(error)})
        return
    send({"ready": True})
    while (message := parent.receive()) is not None:
        for call in json.loads(message):
            _allow_cpu(resource, limits.cpu_s)
            try:
                value = function(*call)
            except MemoryError:
                # What is left of the heap after a failed allocation is no place for the next call.
                send({"error": f"MemoryError: needed more than the {limits.memory_mb} MiB memory cap", "retire": True})
                return
            except BaseException as error:  # the code's own error is its outcome; the worker goes on
                send({"error": _described(error)})
                continue
            send(_number(value))


def _public(module: ModuleType) -> SimpleNamespace:
    """A module's public functions and constants, without the modules it imported."""
    return SimpleNamespace(
        **{k: v for k, v in vars(module).items() if not k.startswith("_") and not isinstance(v, ModuleType)}
    )


def _number(value: object) -> dict[str, object]:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return {"error": f"{FUNCTION_NAME} returned a {type(value).__name__}, not a float"}
    number = float(value)
    return {"value": number} if math.isfinite(number) else {"error": f"{FUNCTION_NAME} returned {number}"}


def _described(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:300]}" if text else type(error).__name__


def _cap_address_space(resource: ModuleType, headroom: int) -> None:
    try:
        pages = int(Path("/proc/self/statm").read_bytes().split()[0])
    except OSError:  # no /proc (macOS): the CPU and wall-clock limits still hold
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = pages * os.sysconf("SC_PAGE_SIZE") + headroom
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))


def _allow_cpu(resource: ModuleType, seconds: int) -> None:
    """Let the next call use `seconds` more CPU seconds than this process has used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = math.ceil(usage.ru_utime + usage.ru_stime)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = used + seconds
    resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


if __name__ == "__main__":
    _serve(CodeLimits(**json.loads(sys.argv[1])))
