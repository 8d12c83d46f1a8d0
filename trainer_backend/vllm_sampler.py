"""vLLM as the sampling engine: a server process of its own (its own Python environment: its pins clash with ours),
LoRA adapters hot-loaded by name, and Tinker `sample` requests mapped onto its completions API, token ids in and out.

The mapping keeps the built-in engine's semantics: the stop token stays the sequence's last token and stop strings
stay in the output (`include_stop_str_in_output`); logprobs are those of the distribution sampled from (vLLM's
`processed_logprobs`: after temperature, top-k and top-p); `stop=[]` disables EOS (`ignore_eos`); a JSON schema goes to
vLLM's structured output (llguidance, as the built-in engine's). What vLLM cannot give exactly is refused by name.

vLLM batches concurrent requests itself, so each sampling request goes to it at once from a thread pool, outside the
device worker's queue; a request whose adapter vLLM no longer holds (it restarted) loads it again and retries once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from trainer_backend.engine.sampling import SampledSequence, SamplingRequest, SamplingResult
from trainer_backend.errors import ServerError, UserInputError
from trainer_backend.structured_output import JsonSchemaConstraint
from trainer_backend.wire.status import SamplerStatus

log = logging.getLogger(__name__)

# Requests in flight to vLLM at once; it queues the rest of a burst itself.
MAX_IN_FLIGHT = 64
HEALTH_POLL_S = 0.5


class VllmUnavailableError(ServerError):
    """vLLM did not start, died, or did not answer; the message says which and ends with its log."""


@dataclass(frozen=True)
class VllmSettings:
    """How to start (or reach) the vLLM server."""

    model_folder: Path
    served_name: str
    python: Path | None = None  # the interpreter of vLLM's environment; None with `url`
    url: str | None = None  # a vLLM server already running (started with --enable-lora, runtime LoRA updating)
    max_loras: int = 8
    max_lora_rank: int = 64
    log_path: Path = Path("vllm.log")
    startup_timeout_s: float = 600.0
    device: str = "cpu"
    gpu_memory_share: float = 0.4  # on a GPU: vLLM's share of its memory, the trainer keeps the rest


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class VllmProcess:
    """The vLLM server this backend started; `ensure_running` starts it again if it died."""

    def __init__(self, settings: VllmSettings) -> None:
        self.settings = settings
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.restarts = 0
        self.restarting = False  # between finding it down and its answering again
        self._lock = threading.Lock()

    def command(self) -> list[str]:
        s = self.settings
        # fp32 on a CPU (as the trainer computes), bf16 on a GPU; eager mode: no graph capture on the CPU build.
        dtype = "float32" if s.device == "cpu" else "bfloat16"
        command = [
            str(s.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(s.model_folder),
            "--served-model-name", s.served_name, "--host", "127.0.0.1", "--port", str(self.port), "--dtype", dtype,
            "--enforce-eager", "--enable-lora", "--max-loras", str(s.max_loras),
            "--max-lora-rank", str(s.max_lora_rank), "--logprobs-mode", "processed_logprobs",
            # Structured output through llguidance, compact as the built-in engine's: vLLM's default (xgrammar) can
            # leave raw control characters inside a JSON string, which strict JSON refuses.
            "--structured-outputs-config", '{"backend": "guidance", "disable_any_whitespace": true}',
        ]  # fmt: skip
        if s.device != "cpu":
            command += ["--gpu-memory-utilization", str(s.gpu_memory_share)]
        return command

    def start(self) -> None:
        environment = os.environ | {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
        environment.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        log.info("starting vLLM: %s", " ".join(self.command()))
        with self.settings.log_path.open("ab") as output:
            # A session (process group) of its own: vLLM's engine runs in child processes, which must go with it.
            self.process = subprocess.Popen(
                self.command(),
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=environment,
                start_new_session=True,
            )
        self._wait_until_healthy()

    def _wait_until_healthy(self) -> None:
        deadline = time.monotonic() + self.settings.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise VllmUnavailableError(
                    f"vLLM exited with status {self.process.returncode} while starting; its log "
                    f"({self.settings.log_path}) ends:\n{_tail(self.settings.log_path)}"
                )
            try:
                if httpx.get(f"{self.url}/v1/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(HEALTH_POLL_S)
        self.stop()
        raise VllmUnavailableError(
            f"vLLM did not answer within {self.settings.startup_timeout_s:.0f} s; its log ends:\n"
            + _tail(self.settings.log_path)
        )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ensure_running(self) -> bool:
        """Start vLLM again if it died or stopped answering; True when it was restarted."""
        with self._lock:
            if self.alive() and self._answers():
                return False
            log.warning(
                "vLLM is not answering (exit status %s); starting it again", self.process and self.process.poll()
            )
            self.restarting = True
            try:
                self.stop()
                self.restarts += 1
                self.start()
            finally:
                self.restarting = False
            return True

    def _answers(self) -> bool:
        try:
            return httpx.get(f"{self.url}/v1/models", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        """Stop vLLM and its engine processes; those of a server that crashed are left running by it otherwise."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self._signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=30)
        self._signal_group(signal.SIGKILL)
        self.process.wait()

    def _signal_group(self, signum: int) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)


def _tail(path: Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


@dataclass
class SamplerStats:
    """Counts behind the sampler's status."""

    in_flight: int = 0
    requests: int = 0
    busy_seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class VllmSampler:
    """Samples through a vLLM server: the base model, or an adapter loaded under its checkpoint path."""

    def __init__(self, settings: VllmSettings, decode: Callable[[list[int]], str]) -> None:
        """`decode` turns token ids into text as the built-in engine does (to find stop strings)."""
        self.settings = settings
        self.decode = decode
        self.process = VllmProcess(settings) if settings.url is None else None
        self.url = settings.url or self.process.url
        self.http = httpx.Client(base_url=self.url, timeout=httpx.Timeout(600.0, connect=10.0))
        self.pool = ThreadPoolExecutor(MAX_IN_FLIGHT, thread_name_prefix="vllm")
        self.stats = SamplerStats()
        # Adapters vLLM holds, least recently used first: name -> folder.
        self._adapters: OrderedDict[str, Path] = OrderedDict()
        # Reentrant: a load that finds vLLM down recovers it, which clears the adapters under the same lock.
        self._adapters_lock = threading.RLock()
        if self.process is not None:
            self.process.start()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.http.close()
        if self.process is not None:
            self.process.stop()

    # --- adapters -----------------------------------------------------------------------------------------

    def load_adapter(self, name: str, folder: Path) -> None:
        """Load the PEFT adapter in `folder` under `name` (again, if a save replaced it); past `max_loras` the least
        recently used one goes.

        Raises:
            VllmUnavailableError: vLLM refused the adapter or did not answer.
        """
        with self._adapters_lock:
            # A name is a checkpoint folder, which a save may overwrite: what vLLM holds under it would be stale.
            self._post("/v1/unload_lora_adapter", {"lora_name": name}, f"unload adapter {name}", missing_ok=True)
            self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)}, f"load adapter {name}")
            self._adapters[name] = folder
            self._adapters.move_to_end(name)
            while len(self._adapters) > self.settings.max_loras:
                old, _ = self._adapters.popitem(last=False)
                self._post("/v1/unload_lora_adapter", {"lora_name": old}, f"unload adapter {old}", missing_ok=True)

    def _post(self, path: str, body: dict, what: str, missing_ok: bool = False) -> None:
        try:
            response = self.http.post(path, json=body)
        except httpx.HTTPError as error:
            self._recover()
            raise VllmUnavailableError(f"vLLM did not answer ({what}): {error}") from None
        if response.status_code >= 400 and not (missing_ok and response.status_code in (400, 404)):
            raise VllmUnavailableError(f"vLLM refused to {what}: {response.status_code} {_message(response)}")

    # --- sampling -----------------------------------------------------------------------------------------

    def submit(
        self,
        request: SamplingRequest,
        adapter: tuple[str, Path] | None,
        stop_at_eos: bool,
        done: Callable[[SamplingResult | Exception], None],
    ) -> None:
        """Send one request to vLLM from the pool; `done` gets its result or the error that ended it."""

        def run() -> None:
            started = time.monotonic()
            with self.stats._lock:
                self.stats.in_flight += 1
            outcome: SamplingResult | Exception
            try:
                outcome = self.sample(request, adapter, stop_at_eos)
            except Exception as error:
                outcome = error
            # Counted before the future resolves, so that a client reading the status after its answer sees it.
            with self.stats._lock:
                self.stats.in_flight -= 1
                self.stats.requests += 1
                self.stats.busy_seconds += time.monotonic() - started
            done(outcome)

        self.pool.submit(run)

    def check(self, request: SamplingRequest) -> None:
        """Raises UserInputError for what vLLM cannot serve as the built-in engine would, before it is queued."""
        if request.constraint is not None and not isinstance(request.constraint, JsonSchemaConstraint):
            raise UserInputError("this structured output is served by --sampler builtin only")

    def status(self) -> SamplerStatus:
        with self.stats._lock:
            return SamplerStatus(
                in_flight=self.stats.in_flight,
                requests=self.stats.requests,
                busy_seconds=round(self.stats.busy_seconds, 3),
                restarts=self.process.restarts if self.process is not None else 0,
            )

    def sample(self, request: SamplingRequest, adapter: tuple[str, Path] | None, stop_at_eos: bool) -> SamplingResult:
        """One request, blocking; an adapter vLLM lost (it restarted) is loaded again and the request sent again.

        Raises:
            UserInputError: vLLM refused the request for its input (the message is vLLM's).
            VllmUnavailableError: vLLM died or did not answer; it is started again for the next request.
        """
        body = _completion_body(request, adapter[0] if adapter else self.settings.served_name, stop_at_eos)
        if self.process is not None and (self.process.restarting or not self.process.alive()):
            # Down since the last request: wait for the restart (or make it) first. Sent now, the request could reach
            # a server on its way down or up and fail as if it had been cut off.
            self._recover()
        if adapter is not None and adapter[0] not in self._adapters:
            self.load_adapter(*adapter)
        for attempt in (1, 2):
            try:
                response = self.http.post("/v1/completions", json=body)
            except httpx.ConnectError:
                # Never reached vLLM: it is down. Started again (adapters load on demand), the request is sent again.
                if attempt == 2 or not self._recover():
                    raise VllmUnavailableError("vLLM is not answering and could not be started again") from None
                if adapter is not None:
                    self.load_adapter(*adapter)
                continue
            except httpx.HTTPError as error:
                # This request fails now; vLLM comes back meanwhile, and requests that find it starting wait for it.
                threading.Thread(target=self._recover, name="vllm-restart", daemon=True).start()
                raise VllmUnavailableError(
                    f"vLLM stopped answering during this request ({type(error).__name__}); it is being started "
                    "again, submit the request again"
                ) from None
            if response.status_code == 404 and adapter is not None and attempt == 1:
                with self._adapters_lock:
                    self._adapters.pop(adapter[0], None)
                self.load_adapter(*adapter)
                continue
            if 400 <= response.status_code < 500:
                raise UserInputError(f"vLLM refused the sampling request: {_message(response)}")
            if response.status_code >= 500:
                raise VllmUnavailableError(f"vLLM failed the sampling request: {_message(response)}")
            return _sampling_result(response.json(), request, self.decode)
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _recover(self) -> bool:
        """Start vLLM again if it is down (a server we did not start cannot be); True when it answers again."""
        if self.process is None:
            return False
        if self.process.ensure_running():
            with self._adapters_lock:
                self._adapters.clear()
        return True


def _completion_body(request: SamplingRequest, model: str, stop_at_eos: bool) -> dict:
    body: dict = {
        "model": model,
        "prompt": list(request.prompt_tokens),
        # vLLM refuses n > 1 at temperature 0; greedy samples are all the same sequence, copied by _sampling_result.
        "n": 1 if request.temperature == 0 else request.num_samples,
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": request.top_k if request.top_k > 0 else -1,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
        "ignore_eos": not stop_at_eos,
    }
    if request.seed is not None:
        body["seed"] = request.seed
    if request.stop_token_ids:
        body["stop_token_ids"] = list(request.stop_token_ids)
    if request.stop_strings:
        body["stop"] = list(request.stop_strings)
    if request.prompt_logprobs or request.topk_prompt_logprobs:
        body["prompt_logprobs"] = request.topk_prompt_logprobs
    if isinstance(request.constraint, JsonSchemaConstraint):
        # vLLM masks the logits before it samples, so logprobs are of the constrained distribution, as built in.
        body["structured_outputs"] = {"json": request.constraint.schema}
    return body


def _message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error", response.text)
        return str(error.get("message", error) if isinstance(error, dict) else error)[:500]
    except ValueError:
        return response.text[:500]


def _token_id(token: str) -> int:
    # `return_tokens_as_token_ids` spells each token "token_id:<id>".
    return int(token.rpartition(":")[2])


def _sequence(choice: dict, decode: Callable[[list[int]], str]) -> SampledSequence:
    tokens = [_token_id(t) for t in choice["logprobs"]["tokens"]]
    logprobs = [float(lp) for lp in choice["logprobs"]["token_logprobs"]]
    stop = choice.get("stop_reason")
    if isinstance(stop, str):
        # vLLM's detokenizer may see a stop string a token late; the built-in engine ends on the token that
        # completes it, so the sequence is cut back to there.
        end = len(tokens)
        while end > 1 and stop in decode(tokens[: end - 1]):
            end -= 1
        tokens, logprobs = tokens[:end], logprobs[:end]
    return SampledSequence(
        tokens=tuple(tokens),
        logprobs=tuple(logprobs),
        stop_reason="stop" if choice["finish_reason"] == "stop" else "length",
    )


def _sampling_result(reply: dict, request: SamplingRequest, decode: Callable[[list[int]], str]) -> SamplingResult:
    choices = sorted(reply["choices"], key=lambda c: c["index"])
    sequences = tuple(_sequence(choice, decode) for choice in choices)
    if len(sequences) < request.num_samples:
        sequences = sequences * request.num_samples
    prompt_scores = choices[0].get("prompt_logprobs") if choices else None
    prompt_logprobs = topk = None
    if prompt_scores is not None:
        tokens = request.prompt_tokens
        prompt_logprobs = tuple(
            None if scores is None else float(scores[str(token)]["logprob"])
            for token, scores in zip(tokens, prompt_scores, strict=True)
        )
        if request.topk_prompt_logprobs:
            topk = tuple(
                None
                if scores is None
                else tuple(
                    (int(t), float(s["logprob"]))
                    for t, s in sorted(scores.items(), key=lambda item: item[1]["rank"])
                    if s["rank"] <= request.topk_prompt_logprobs
                )
                for scores in prompt_scores
            )
    return SamplingResult(
        sequences=sequences,
        prompt_logprobs=prompt_logprobs if request.prompt_logprobs else None,
        topk_prompt_logprobs=topk,
    )
