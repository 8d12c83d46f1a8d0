"""A client of a vLLM server: LoRA adapters hot-loaded by name, and the engine's sampling requests mapped onto vLLM's
completions API, token ids in and out.

The mapping keeps the built-in engine's semantics: the stop token stays the sequence's last token and stop strings
stay in the output (`include_stop_str_in_output`); logprobs are those of the distribution sampled from (vLLM's
`processed_logprobs`: after temperature, top-k and top-p); `stop=[]` disables EOS (`ignore_eos`); a JSON schema goes to
vLLM's structured output (llguidance, as the built-in engine's). A request whose adapter vLLM no longer holds (it
restarted) loads it again and is sent again once.

Each adapter is loaded under a name of its folder and its weights' content, and checked before any request uses it
(`weights_proof.py`): vLLM keys its prefix cache by adapter name and path, so weights saved again under one name
would be served with KV blocks computed by the old ones (seen on vLLM 0.32: a 200-token prompt answered as the old
weights answer it).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from safetensors import SafetensorError

from trainer_backend.checkpoints import checkpoint_label
from trainer_backend.engine.types import SampledSequence, SamplingInputError, SamplingRequest, SamplingResult
from trainer_backend.engine.weights_proof import (
    ADAPTER_WEIGHTS_FILE,
    AdapterProof,
    ProbeAnswer,
    SamplerWeightsError,
    WeightChecks,
    unproven,
    weights_digest,
)
from trainer_backend.errors import UserInputError
from trainer_backend.samplers.vllm_process import VllmProcess, VllmSettings, VllmUnavailableError
from trainer_backend.structured_output import JsonSchemaConstraint

ENGINE = "vllm"


@dataclass(frozen=True)
class _Held:
    """An adapter vLLM holds: the folder it was loaded from, and the sha256 of the weights it was shown to apply."""

    folder: Path
    sha256: str


def adapter_name(folder: Path, stamp: str) -> str:
    """The name vLLM holds the sampler weights in `folder` under, whose content (or, saved before proofs, file time)
    is `stamp`: weights saved again under the same path get another name, and vLLM's prefix cache, keyed by name and
    path, never answers them with KV blocks of the old weights."""
    return f"{folder}@{stamp}"


class VllmClient:
    """Samples through a vLLM server, the one it started or one already running at `settings.url`: the base model,
    or sampler weights loaded as an adapter named after their folder and content."""

    def __init__(
        self,
        settings: VllmSettings,
        decode: Callable[[list[int]], str],
        checks: WeightChecks,
        probe: tuple[int, ...],
    ) -> None:
        """`decode` turns token ids into text as the built-in engine does (to find stop strings). `checks` checks
        each adapter loaded against its proof; `probe` is the probe of weights saved before proofs existed."""
        self.settings = settings
        self.decode = decode
        self.checks = checks
        self.probe = probe
        self.process = VllmProcess(settings) if settings.url is None else None
        self.url = settings.url or self.process.url
        self.http = httpx.Client(base_url=self.url, timeout=httpx.Timeout(600.0, connect=10.0))
        # Adapters vLLM holds, least recently loaded first.
        self._adapters: OrderedDict[str, _Held] = OrderedDict()
        # vLLM's answers on a probe without an adapter, by probe; forgotten when vLLM starts again.
        self._base_answers: dict[tuple[int, ...], tuple[float, ...]] = {}
        # Reentrant: a load that finds vLLM down recovers it, which clears the adapters under the same lock.
        self._adapters_lock = threading.RLock()
        if self.process is not None:
            self.process.start()

    @property
    def restarts(self) -> int:
        return self.process.restarts if self.process is not None else 0

    def close(self) -> None:
        self.http.close()
        if self.process is not None:
            self.process.stop()

    def load_adapter(self, folder: Path) -> str:
        """Load the sampler weights in `folder` unless vLLM holds them already, and check them before any request
        uses them; the name requests give. Past `max_loras` the least recently loaded adapter goes, and so does an
        older version of the same folder.

        Raises:
            SamplingInputError: the weights were deleted.
            SamplerWeightsError: the check refused them (counted and logged); vLLM holds them no longer.
            VllmUnavailableError: vLLM refused the adapter or did not answer.
        """
        label = checkpoint_label(folder)
        try:
            proof = self.checks.read(ENGINE, folder, label)
            # Weights saved before proofs existed are named by their file's time instead of their content.
            stamp = proof.weights_sha256[:16] if proof else str((folder / ADAPTER_WEIGHTS_FILE).stat().st_mtime_ns)
        except OSError:
            raise SamplingInputError("the sampler weights were deleted before this request ran") from None
        name = adapter_name(folder, stamp)
        # Outside the lock: a request for weights vLLM holds never waits for another adapter's load and check.
        held = self._adapters.get(name)
        if held is not None and (proof is None or held.sha256 == proof.weights_sha256):
            return name
        with self._adapters_lock:
            held = self._adapters.get(name)
            if held is not None:
                if proof is not None and held.sha256 != proof.weights_sha256:
                    # Only a fault makes a name stale; unloaded, it loads afresh next time.
                    self._unload(name)
                    self.checks.stale(ENGINE, label, held.sha256, proof)
                return name
            # vLLM may hold the name still: a refused load whose unload did not reach it.
            self._post("/v1/unload_lora_adapter", {"lora_name": name}, f"unload adapter {name}", missing_ok=True)
            self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)}, f"load adapter {name}")
            try:
                read = self._check(name, folder, label, proof)
            except (SamplerWeightsError, OSError, SafetensorError) as error:
                self._post("/v1/unload_lora_adapter", {"lora_name": name}, f"unload adapter {name}", missing_ok=True)
                if isinstance(error, SamplerWeightsError):
                    raise
                raise SamplingInputError("the sampler weights were deleted or damaged while they loaded") from None
            for older in [other for other, loaded in self._adapters.items() if loaded.folder == folder]:
                self._unload(older)
            self._adapters[name] = _Held(folder, read)
            while len(self._adapters) > self.settings.max_loras:
                self._unload(next(iter(self._adapters)))
        return name

    def _check(self, name: str, folder: Path, label: str, proof: AdapterProof | None) -> str:
        """Refuse the adapter just loaded as `name` unless the file vLLM read holds the saved weights and vLLM's
        answers on the probe move from the base model's as the saved weights move them (`WeightChecks.check`); the
        sha256 of the file read."""
        started = time.perf_counter()
        read = weights_digest((folder / ADAPTER_WEIGHTS_FILE).read_bytes())
        if proof is None:
            proof = unproven(folder, self.probe)
        answer = None
        if not proof.zero:
            tokens = proof.probe_tokens
            if tokens not in self._base_answers:
                self._base_answers[tokens] = self._probe(self.settings.served_name, tokens)
            answer = ProbeAnswer(self._probe(name, tokens), self._base_answers[tokens])
        self.checks.check(ENGINE, label, proof, read, answer, time.perf_counter() - started)
        return read

    def _probe(self, model: str, tokens: tuple[int, ...]) -> tuple[float, ...]:
        """vLLM's log-probability of each probe token after the ones before it, through `model` (an adapter's name or
        the base model's), as a request for the prompt's log-probs is served."""
        request = SamplingRequest(
            prompt_tokens=tokens, max_tokens=1, temperature=0.0, stop_at_eos=False, prompt_logprobs=True
        )
        body = _completion_body(request, model)
        try:
            response = self.http.post("/v1/completions", json=body)
        except httpx.HTTPError as error:
            raise VllmUnavailableError(f"vLLM did not answer the probe of {model}: {error}") from None
        if response.status_code >= 400:
            raise VllmUnavailableError(f"vLLM failed the probe of {model}: {response.status_code} {_message(response)}")
        scores = _sampling_result(response.json(), request, self.decode).prompt_logprobs or ()
        return tuple(float(score) for score in scores[1:] if score is not None)

    def _unload(self, name: str) -> None:
        self._adapters.pop(name, None)
        self._post("/v1/unload_lora_adapter", {"lora_name": name}, f"unload adapter {name}", missing_ok=True)

    def _post(self, path: str, body: dict, what: str, missing_ok: bool = False) -> None:
        try:
            response = self.http.post(path, json=body)
        except httpx.HTTPError as error:
            self._recover()
            raise VllmUnavailableError(f"vLLM did not answer ({what}): {error}") from None
        if response.status_code >= 400 and not (missing_ok and response.status_code in (400, 404)):
            raise VllmUnavailableError(f"vLLM refused to {what}: {response.status_code} {_message(response)}")

    # --- sampling -----------------------------------------------------------------------------------------

    def sample(self, request: SamplingRequest) -> SamplingResult:
        """One request for the base model or the sampler weights in its `weights_folder`, blocking; weights vLLM does
        not hold are loaded (and checked) first, and again, with the request sent again, if vLLM lost them (it
        restarted).

        Raises:
            UserInputError: vLLM refused the request for its input (the message is vLLM's), or the weights are gone.
            SamplerWeightsError: the weights' load was refused by its check.
            VllmUnavailableError: vLLM died or did not answer; it is started again for the next request.
        """
        if self.process is not None and (self.process.restarting or not self.process.alive()):
            # Down since the last request: wait for the restart (or make it) first. Sent now, the request could reach
            # a server on its way down or up and fail as if it had been cut off.
            self._recover()
        folder = request.weights_folder
        name = self.settings.served_name if folder is None else self.load_adapter(folder)
        body = _completion_body(request, name)
        for attempt in (1, 2):
            try:
                response = self.http.post("/v1/completions", json=body)
            except httpx.ConnectError:
                # Never reached vLLM: it is down. Started again (adapters load on demand), the request is sent again.
                if attempt == 2 or not self._recover():
                    raise VllmUnavailableError("vLLM is not answering and could not be started again") from None
                if folder is not None:
                    body["model"] = self.load_adapter(folder)
                continue
            except httpx.HTTPError as error:
                # This request fails now; vLLM comes back meanwhile, and requests that find it starting wait for it.
                threading.Thread(target=self._recover, name="vllm-restart", daemon=True).start()
                raise VllmUnavailableError(
                    f"vLLM stopped answering during this request ({type(error).__name__}); it is being started "
                    "again, submit the request again"
                ) from None
            if response.status_code == 404 and folder is not None and attempt == 1:
                with self._adapters_lock:
                    self._adapters.pop(name, None)
                body["model"] = self.load_adapter(folder)
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
                self._base_answers.clear()
        return True


def _completion_body(request: SamplingRequest, model: str) -> dict:
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
        "ignore_eos": not request.stop_at_eos,
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
