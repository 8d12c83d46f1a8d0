"""GET /api/v1/status: what the device is doing and where the caller's requests are (our extension of the API).

A future that hangs without a word is what users of hosted training services complain about most; this says, for
each of the caller's unfinished futures, whether it is queued or running and for how long, and how busy the
device has been. Other tenants appear only as a count.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class FutureInFlight(BaseModel):
    request_id: str
    kind: str
    model_id: str | None
    seq_id: int | None
    state: Literal["queued", "running"]
    age_s: float = Field(description="seconds since the request was accepted")


class DeviceStatus(BaseModel):
    busy_fraction_1m: float = Field(description="share of the last 60 s the device spent running requests")
    busy_fraction_10s: float
    running_kinds: list[str] = Field(description="kinds of the requests in the device call running now")
    running_for_s: float | None
    queued: int = Field(description="requests of all tenants waiting for the device")
    batched_calls: int = Field(description="device calls that served several requests at once, since start")
    batched_requests: int


class SamplerStatus(BaseModel):
    """The vLLM sampler, with --sampler vllm (it batches requests itself, outside the device's queue)."""

    engine: Literal["vllm"] = "vllm"
    in_flight: int = Field(description="sampling requests sent to vLLM and not yet answered, of all tenants")
    requests: int = Field(description="sampling requests vLLM answered (or failed) since start")
    busy_seconds: float = Field(description="summed time requests spent in vLLM")
    restarts: int = Field(description="times vLLM was found dead and started again")
    builtin_requests: dict[str, int] = Field(
        default_factory=dict,
        description="sampling requests the built-in engine served instead, because vLLM cannot serve them exactly, "
        "by reason (an adapter that trains the unembedding, structured output other than a JSON schema, a "
        "batch-invariant request)",
    )


class KeyUsage(BaseModel):
    """What the caller's API key holds against the server's per-key limits (None: no limit), and what it has used
    since the server started."""

    tenant: str = Field(
        description="the label of the key's series in /metrics (a hash; 'other' holds it when it is "
        "not among the busiest tenants)"
    )
    queued: int = Field(description="the key's operations waiting for the device")
    max_queued: int | None = Field(description="--max-queued-per-key")
    storage_bytes: int = Field(description="bytes of the key's live checkpoints")
    max_storage_bytes: int | None = Field(description="--max-storage-bytes-per-key")
    device_seconds: float = Field(description="device time the key's operations took (a batch's split by tokens)")
    tokens_sampled: int = Field(description="tokens the key's sampling requests generated")
    tokens_trained: int = Field(description="tokens of the key's forward and forward_backward passes")


class RunUsage(BaseModel):
    """One of the caller's training runs that used the device recently; sampling from its sampler weights counts
    toward it."""

    model_id: str
    user_metadata: dict[str, Any] | None = Field(description="what the run was created with, to tell runs apart")
    device_seconds: float = Field(description="device time since the server started")
    device_share_1m: float = Field(description="share of the device's time over about the last minute")
    tokens_sampled: int
    tokens_trained: int
    open_requests: int = Field(0, description="its requests queued or running on the device now")


class ServerStatus(BaseModel):
    base_model: str
    device: DeviceStatus
    sampler: SamplerStatus | None = Field(None, description="None with the built-in sampler (part of the device)")
    # The caller's waiting requests by training client (model id), sampling requests under "sampling".
    queued: dict[str, int]
    in_flight: list[FutureInFlight]
    other_tenants_in_flight: int
    usage: KeyUsage
    runs: list[RunUsage] = Field(description="the caller's runs that used the device in the last hour, busiest first")
