"""Pydantic models of the JSON bodies of the Tinker API, as the SDK 0.38 sends and parses them (see WIRE.md).

Requests are our own models with `extra="ignore"`, so fields a newer SDK adds do not break the server. Their fields,
types and defaults are the SDK's (`tinker/types/*_request.py`); the `type` tag the SDK puts in every body is ignored.
Nested SDK models are reused where they fit (`SamplingParams`, and `LoraConfig`/`AdamParams` subclassed only to
ignore extra fields), so those formats cannot drift.

Responses are the SDK's own response models, re-exported: what the server sends is then exactly what the client
validates, and it validates strictly. Serialize them with `model_dump(mode="json")`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from tinker import types
from tinker.types import try_again_response

from trainer_backend.engine.types import DEFAULT_MAX_TOKENS, AdamSettings, LoraSettings, SamplingRequest
from trainer_backend.errors import UserInputError
from trainer_backend.wire.proto import WireFormatError

__all__ = [
    "AdamParams",
    "Checkpoint",
    "CheckpointsListResponse",
    "ClientConfigRequest",
    "ClientConfigResponse",
    "ClientDynamicConfigResponse",
    "CreateModelRequest",
    "CreateModelResponse",
    "CreateSamplingSessionRequest",
    "CreateSamplingSessionResponse",
    "CreateSessionRequest",
    "CreateSessionResponse",
    "Cursor",
    "EncodedTextChunk",
    "FinishSessionReason",
    "FinishSessionRequest",
    "FutureRetrieveRequest",
    "GetInfoRequest",
    "GetInfoResponse",
    "GetSamplerResponse",
    "GetServerCapabilitiesResponse",
    "HealthResponse",
    "LoadWeightsRequest",
    "LoadWeightsResponse",
    "LoraConfig",
    "ModelData",
    "ModelInput",
    "NonTextChunk",
    "OptimStepRequest",
    "OptimStepResponse",
    "OptimizerConfig",
    "OptimizerParams",
    "RequestErrorCategory",
    "RequestFailedResponse",
    "SampleRequest",
    "SamplingParams",
    "SaveWeightsForSamplerRequest",
    "SaveWeightsForSamplerResponseInternal",
    "SaveWeightsRequest",
    "SaveWeightsResponse",
    "SessionHeartbeatRequest",
    "SessionHeartbeatResponse",
    "SupportedModel",
    "TelemetryResponse",
    "TelemetrySendRequest",
    "TrainingRun",
    "TrainingRunsResponse",
    "TryAgainResponse",
    "UntypedAPIFuture",
    "WeightsInfoRequest",
    "WeightsInfoResponse",
]

# Responses, each the model the SDK validates the body with (its file in tinker/types/ has the same name).
ClientConfigResponse = types.ClientConfigResponse  # POST /client/config: feature flags; {} keeps the SDK defaults
ClientDynamicConfigResponse = types.ClientDynamicConfigResponse  # POST /client/dynamic_config: refreshed flags
CreateSessionResponse = types.CreateSessionResponse  # POST /create_session: {session_id, *_message?}
SessionHeartbeatResponse = types.SessionHeartbeatResponse  # POST /session_heartbeat: {type?}
TelemetryResponse = types.TelemetryResponse  # POST /telemetry: {"status": "accepted"}
UntypedAPIFuture = types.UntypedAPIFuture  # every future-returning POST: {request_id, model_id?, sample_sequence_ids?}
# POST /retrieve_future, still running: {type: "try_again", request_id, queue_state}.
TryAgainResponse = try_again_response.TryAgainResponse
RequestFailedResponse = types.RequestFailedResponse  # POST /retrieve_future, failed: {error, category}
RequestErrorCategory = types.RequestErrorCategory  # "user" | "server" | "unknown"
CreateModelResponse = types.CreateModelResponse  # create_model future result: {model_id}
GetInfoResponse = types.GetInfoResponse  # POST /get_info: {model_id, model_data{model_name, tokenizer_id}, ...}
ModelData = types.ModelData  # GetInfoResponse.model_data: {arch?, model_name?, tokenizer_id?}
OptimStepResponse = types.OptimStepResponse  # optim_step future result: {metrics?}
SaveWeightsResponse = types.SaveWeightsResponse  # save_weights future result: {path: tinker://run/weights/name}
# save_weights_for_sampler future result: {path} when named, {sampling_session_id} when ephemeral.
SaveWeightsForSamplerResponseInternal = types.SaveWeightsForSamplerResponseInternal
LoadWeightsResponse = types.LoadWeightsResponse  # load_weights future result: {path?, model_id?}
CreateSamplingSessionResponse = types.CreateSamplingSessionResponse  # POST /create_sampling_session (not a future)
GetSamplerResponse = types.GetSamplerResponse  # GET /samplers/{id}: {sampler_id, base_model, model_path?}
GetServerCapabilitiesResponse = types.GetServerCapabilitiesResponse  # GET /get_server_capabilities
SupportedModel = types.SupportedModel  # one entry of supported_models
HealthResponse = types.HealthResponse  # GET /healthz: {"status": "ok"}
Cursor = types.Cursor  # pagination: {offset, limit, total_count}
Checkpoint = types.Checkpoint  # one checkpoint: {checkpoint_id, checkpoint_type, time, tinker_path, ...}
CheckpointsListResponse = types.CheckpointsListResponse  # GET .../checkpoints and /checkpoints: {checkpoints, cursor?}
TrainingRun = types.TrainingRun  # GET /training_runs/{id}: {training_run_id, base_model, model_owner, ...}
TrainingRunsResponse = types.TrainingRunsResponse  # GET /training_runs: {training_runs, cursor}
WeightsInfoResponse = types.WeightsInfoResponse  # POST /weights_info: {base_model, is_lora, lora_rank?, ...}
SamplingParams = types.SamplingParams  # SampleRequest.sampling_params; the SDK's model already ignores extras

# Token ids travel as int32 in the protobuf flows; the JSON flows hold them to the same range.
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]
# Sequence numbers are stored as SQLite integers: 64 bits, signed.
SeqId = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
# A checkpoint's expiry must stay a date every reader can represent: at most a century ahead.
MAX_TTL_SECONDS = 100 * 365 * 86_400
TtlSeconds = Annotated[int, Field(ge=1, le=MAX_TTL_SECONDS)]


class _Request(BaseModel):
    """Base of our request models: unknown fields (the `type` tag, fields of newer SDKs) are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True, protected_namespaces=())


class LoraConfig(types.LoraConfig):
    """The SDK's LoRA settings (rank, seed, train_mlp, train_attn, train_unembed), ignoring fields added later."""

    model_config = ConfigDict(extra="ignore")

    def to_engine(self) -> LoraSettings:
        return LoraSettings(
            rank=self.rank,
            train_mlp=self.train_mlp,
            train_attn=self.train_attn,
            train_unembed=self.train_unembed,
            seed=self.seed,
        )


class AdamParams(types.AdamParams):
    """The SDK's Adam step parameters (learning_rate, beta1, beta2, eps, weight_decay, grad_clip_norm)."""

    model_config = ConfigDict(extra="ignore")

    def to_engine(self) -> AdamSettings:
        """The engine's settings, checked: a value out of range is the caller's error, named."""
        settings = AdamSettings(
            learning_rate=self.learning_rate,
            beta1=self.beta1,
            beta2=self.beta2,
            eps=self.eps,
            weight_decay=self.weight_decay,
            grad_clip_norm=self.grad_clip_norm,
        )
        settings.validate()
        return settings


class OptimizerConfig(_Request):
    """The optimizer family fixed at model creation, `{"type": "adamw"}` by default; other families keep fields."""

    model_config = ConfigDict(extra="allow", frozen=True)

    type: str = "adamw"


class OptimizerParams(_Request):
    """Step parameters of a non-Adam optimizer (`{"type": "dimuon", "learning_rate": ...}`), fields kept as sent."""

    model_config = ConfigDict(extra="allow", frozen=True)

    type: str


class EncodedTextChunk(_Request):
    """A run of token ids in a prompt: `{"type": "encoded_text", "tokens": [...]}`."""

    type: Literal["encoded_text"] = "encoded_text"
    tokens: list[TokenId]


class NonTextChunk(_Request):
    """An image, image pointer or audio chunk: parsed only so that it can be refused by name."""

    type: Literal["image", "image_asset_pointer", "dmel"]


class ModelInput(_Request):
    """A prompt as the SDK sends it in JSON: `{"chunks": [chunk, ...]}`, each chunk tagged by `type`."""

    chunks: list[Annotated[EncodedTextChunk | NonTextChunk, Field(discriminator="type")]]

    def tokens(self) -> list[int]:
        """The prompt's token ids, in order.

        Raises:
            WireFormatError: a chunk is not text; this server reads token ids only.
        """
        tokens: list[int] = []
        for position, chunk in enumerate(self.chunks):
            if not isinstance(chunk, EncodedTextChunk):
                raise WireFormatError(
                    f"prompt chunk {position} is {chunk.type}: this server reads only encoded_text (token id) chunks"
                )
            tokens.extend(chunk.tokens)
        return tokens


class ClientConfigRequest(_Request):
    """POST /api/v1/client/config and /client/dynamic_config: the SDK's version, for flag resolution."""

    sdk_version: str


class CreateSessionRequest(_Request):
    """POST /api/v1/create_session: tags (from $TINKER_TAGS), metadata and the SDK version."""

    tags: list[str] = Field(default_factory=list)
    user_metadata: dict[str, Any] | None = None
    sdk_version: str
    project_id: str | None = None
    display_name: str | None = None


class SessionHeartbeatRequest(_Request):
    """POST /api/v1/session_heartbeat, every 10 s."""

    session_id: str


class FinishSessionReason(_Request):
    """How the client ended the session: the `status` passed to `ServiceClient.close`."""

    type: Literal["success", "errored", "interrupted"]


class FinishSessionRequest(_Request):
    """POST /api/v1/sessions/{session_id}/finish: `{"reason": {"type": ...}, "detail": str | null}`."""

    reason: FinishSessionReason
    detail: str | None = None


class TelemetrySendRequest(_Request):
    """POST /api/v1/telemetry: a batch of SDK events, kept as sent (they are logged, never interpreted)."""

    events: list[dict[str, Any]]
    platform: str
    sdk_version: str
    session_id: str
    process_uuid: str


class CreateModelRequest(_Request):
    """POST /api/v1/create_model: a LoRA training run on `base_model`, the session's `model_seq_id`-th model."""

    session_id: str
    model_seq_id: SeqId
    base_model: str
    user_metadata: dict[str, Any] | None = None
    lora_config: LoraConfig | None = None
    optimizer_config: OptimizerConfig = OptimizerConfig()


class GetInfoRequest(_Request):
    """POST /api/v1/get_info: answered at once, not with a future."""

    model_id: str


class OptimStepRequest(_Request):
    """POST /api/v1/optim_step: Adam parameters under `adam_params`, another family's under `optimizer_params`."""

    model_id: str
    seq_id: SeqId | None = None
    adam_params: AdamParams | None = None
    optimizer_params: OptimizerParams | None = None

    @model_validator(mode="after")
    def _one_optimizer(self) -> OptimStepRequest:
        if (self.adam_params is None) == (self.optimizer_params is None):
            raise ValueError("optim_step needs exactly one of adam_params and optimizer_params")
        return self


class SaveWeightsRequest(_Request):
    """POST /api/v1/save_weights (`TrainingClient.save_state`): a resumable checkpoint named `path`."""

    model_id: str
    path: str | None = None
    seq_id: SeqId | None = None
    ttl_seconds: TtlSeconds | None = None
    overwrite: bool = False
    user_metadata: dict[str, str] | None = None


class SaveWeightsForSamplerRequest(_Request):
    """POST /api/v1/save_weights_for_sampler: named (`path`) or ephemeral (`sampling_session_seq_id` and `kind`)."""

    model_id: str
    path: str | None = None
    sampling_session_seq_id: SeqId | None = None
    kind: Literal["snapshot", "inflight"] = "snapshot"
    seq_id: SeqId | None = None
    ttl_seconds: TtlSeconds | None = None
    user_metadata: dict[str, str] | None = None

    @model_validator(mode="after")
    def _named_or_ephemeral(self) -> SaveWeightsForSamplerRequest:
        if (self.path is None) == (self.sampling_session_seq_id is None):
            raise ValueError("save_weights_for_sampler needs exactly one of path and sampling_session_seq_id")
        return self

    @property
    def ephemeral(self) -> bool:
        """True for `save_weights_and_get_sampling_client`, whose result is a sampling session, not a path."""
        return self.path is None


class LoadWeightsRequest(_Request):
    """POST /api/v1/load_weights: into an existing model (`model_id`), or creating one (`session_id`, `model_seq_id`).

    The second form is how `create_training_client_from_state[_with_optimizer]` starts a run: the model it creates
    must get the id `f"{session_id}:train:{model_seq_id}"`, which the client derives on its own.
    """

    model_id: str | None = None
    seq_id: SeqId | None = None
    session_id: str | None = None
    model_seq_id: SeqId | None = None
    base_model: str | None = None
    user_metadata: dict[str, Any] | None = None
    path: str
    optimizer: bool
    optimizer_config: OptimizerConfig | None = None
    weights_access_token: str | None = None

    @model_validator(mode="after")
    def _one_addressing(self) -> LoadWeightsRequest:
        creates = self.session_id is not None and self.model_seq_id is not None
        if (self.model_id is not None) == creates:
            raise ValueError("load_weights needs either model_id, or session_id together with model_seq_id")
        return self


class CreateSamplingSessionRequest(_Request):
    """POST /api/v1/create_sampling_session: a sampler on `model_path` (tinker://...) or on `base_model`."""

    session_id: str
    sampling_session_seq_id: SeqId
    base_model: str | None = None
    model_path: str | None = None

    @model_validator(mode="after")
    def _has_model(self) -> CreateSamplingSessionRequest:
        if self.base_model is None and self.model_path is None:
            raise ValueError("create_sampling_session needs base_model or model_path")
        return self


class SampleRequest(_Request):
    """POST /api/v1/asample (also behind `compute_logprobs`, as max_tokens=1 with prompt_logprobs)."""

    num_samples: int = Field(default=1, ge=1)
    prompt: ModelInput
    sampling_params: SamplingParams
    base_model: str | None = None
    model_path: str | None = None
    sampling_session_id: str | None = None
    seq_id: SeqId | None = None
    prompt_logprobs: bool | None = None
    topk_prompt_logprobs: int = Field(default=0, ge=0)
    topk_sample_logprobs: int = Field(default=0, ge=0)
    # A TensorData in JSON ({data, dtype, shape, sparse_*}); kept raw, as this server does not score target ids.
    target_prompt_logprobs: dict[str, Any] | None = None
    prompt_alt_tokens_k: int = Field(default=0, ge=0)
    prompt_logprobs_last_n: int | None = Field(default=None, ge=1)
    record_stability_info: bool | None = None

    def to_engine(self, weights_folder: Path | None) -> SamplingRequest:
        """The engine's request, sampling the base model or the sampler weights in `weights_folder`.

        Raises:
            UserInputError: a field this server does not serve, or `prompt_logprobs_last_n` past the prompt.
        """
        if self.topk_sample_logprobs or self.prompt_alt_tokens_k or self.target_prompt_logprobs:
            raise UserInputError(
                "topk_sample_logprobs, prompt_alt_tokens_k and target_prompt_logprobs are not supported by this server"
            )
        prompt = tuple(self.prompt.tokens())
        last_n = self.prompt_logprobs_last_n
        if last_n is not None and last_n > len(prompt):
            raise UserInputError(f"prompt_logprobs_last_n={last_n} exceeds the prompt's {len(prompt)} tokens")
        params = self.sampling_params
        stop = params.stop
        stop_strings: tuple[str, ...] = ()
        stop_tokens: tuple[int, ...] = ()
        if isinstance(stop, str):
            stop_strings = (stop,)
        elif stop:
            if all(isinstance(s, str) for s in stop):
                stop_strings = tuple(stop)
            else:
                stop_tokens = tuple(int(s) for s in stop)
        return SamplingRequest(
            prompt_tokens=prompt,
            num_samples=self.num_samples,
            max_tokens=params.max_tokens if params.max_tokens is not None else DEFAULT_MAX_TOKENS,
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            seed=params.seed,
            # `stop=[]` disables every stop, EOS included (SamplingParams' documented semantics).
            stop_at_eos=stop is None or bool(stop),
            stop_token_ids=stop_tokens,
            stop_strings=stop_strings,
            prompt_logprobs=bool(self.prompt_logprobs),
            topk_prompt_logprobs=self.topk_prompt_logprobs,
            weights_folder=weights_folder,
        )


class FutureRetrieveRequest(_Request):
    """POST /api/v1/retrieve_future: poll one future; `allow_metadata_only` may be ignored (full payload sent)."""

    request_id: str
    allow_metadata_only: bool = False


class WeightsInfoRequest(_Request):
    """POST /api/v1/weights_info: what is needed to load the checkpoint at `tinker_path`."""

    tinker_path: str
