"""A client of a vLLM server: LoRA adapters hot-loaded by name, and the engine's sampling requests mapped onto vLLM's
completions API, token ids in and out.

The mapping keeps the built-in engine's semantics: the stop token stays the sequence's last token and stop strings
stay in the output (`include_stop_str_in_output`); logprobs are those of the distribution sampled from (vLLM's
`processed_logprobs`: after temperature, top-k and top-p); `stop=[]` disables EOS (`ignore_eos`); a JSON schema goes to
vLLM's structured output (llguidance, as the built-in engine's). A request whose adapter vLLM no longer holds (it
restarted) loads it again and is sent again once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import httpx

from trainer_backend.engine.types import SampledSequence, SamplingRequest, SamplingResult
from trainer_backend.errors import UserInputError
from trainer_backend.samplers.vllm_process import VllmProcess, VllmSettings, VllmUnavailableError
from trainer_backend.structured_output import JsonSchemaConstraint


class VllmClient:
    """Samples through a vLLM server, the one it started or one already running at `settings.url`: the base model,
    or an adapter loaded under its checkpoint folder's path."""

    def __init__(self, settings: VllmSettings, decode: Callable[[list[int]], str]) -> None:
        """`decode` turns token ids into text as the built-in engine does (to find stop strings)."""
        self.settings = settings
        self.decode = decode
        self.process = VllmProcess(settings) if settings.url is None else None
        self.url = settings.url or self.process.url
        self.http = httpx.Client(base_url=self.url, timeout=httpx.Timeout(600.0, connect=10.0))
        # Adapters vLLM holds, least recently used first: name -> folder.
        self._adapters: OrderedDict[str, Path] = OrderedDict()
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
