"""Protobuf codecs for the binary flows of the Tinker API: forward/backward requests and results, and samples.

The message classes come from the SDK's generated module (`tinker.proto.tinker_public_pb2`), never a copy, so the
format is whatever the installed SDK speaks. The layouts below are read from the SDK's own codecs
(`tinker/proto/request_conv.py`, `tinker/proto/response_conv.py`) and proven against them in
`tests/trainer_backend/test_wire.py`:

- token ids are raw little-endian int32 bytes;
- a `Tensor` is dense bytes, or sparse CSR (values plus int64 row pointers and column indices), with a dtype and a
  shape; the SDK sends float32 and int64 only;
- a `ForwardBackwardOutput` holds `ArrayRecord`s: per output field, one `BatchedTensor` packing every datum's
  flattened values back to back, with n + 1 int64 *byte* offsets and the shape each datum has after its first
  dimension (`trailing_shape`);
- a `SampleResponse` carries float32 logprobs with NaN where none was computed, and top-k logprobs as dense N×K
  matrices whose empty cells hold token 0 and logprob -99999.0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Protocol

import numpy as np
import torch
import zstandard
from google.protobuf.message import DecodeError
from tinker.lib.chunked_fwdbwd_helpers import REDUCE_MAP
from tinker.proto import tinker_public_pb2 as pb
from tinker.types.topk_logprobs import MASK_LOGPROB

from trainer_backend.engine.types import DecodedDatum, ForwardBackwardResult
from trainer_backend.errors import UserInputError

PROTOBUF_CONTENT_TYPE = "application/x-protobuf"
# The SDK keeps a chunk under ~5 MB of serialized proto by default (`fwdbwd_max_chunk_bytes_count`); the cap only
# stops a corrupt or hostile zstd frame from inflating into all of the server's memory.
MAX_DECOMPRESSED_BYTES = 1 << 30
# For callers other than the server, which passes its own limit (`ServerConfig.max_tensor_elements`).
MAX_TENSOR_ELEMENTS = 1 << 24
# The SDK reports this as `ForwardBackwardOutput.loss_fn_output_type`, the name its JSON responses used.
LOSS_FN_OUTPUT_TYPE = "ArrayRecord"

_MAX_TOKEN_ID = 2**31 - 1
_READ_BLOCK_BYTES = 1 << 20
_STOP_REASONS = {"stop": pb.STOP_REASON_STOP, "length": pb.STOP_REASON_LENGTH}


class WireFormatError(UserInputError, ValueError):
    """A body or result that breaks the wire format; the message names the part at fault and what was expected."""


@dataclass(frozen=True)
class ForwardBackwardBatch:
    """One `/api/v1/forward_backward` request, which `forward` (forward_only) and `forward_backward` both send.

    The SDK splits a large call into several such requests with consecutive `seq_id`s and combines their results
    itself; nothing else on the wire ties the chunks together, so each one is a whole request with its own result.
    """

    model_id: str
    seq_id: int
    forward_only: bool
    loss_fn: str
    loss_fn_config: dict[str, float | str] | None
    datums: list[DecodedDatum]


class SampledSequenceLike(Protocol):
    """What `encode_sample_response` reads of one completion; the engine's `SampledSequence` fits."""

    @property
    def tokens(self) -> Sequence[int]: ...

    @property
    def logprobs(self) -> Sequence[float] | None: ...

    @property
    def stop_reason(self) -> str: ...


class SampleResultLike(Protocol):
    """What `encode_sample_response` reads of a sampling result; the engine's `SamplingResult` fits.

    `prompt_logprobs` has one entry per prompt token, None where nothing was computed (position 0).
    `topk_prompt_logprobs` has one row per prompt token: (token id, logprob) pairs, most likely first, or None.
    """

    @property
    def sequences(self) -> Sequence[SampledSequenceLike]: ...

    @property
    def prompt_logprobs(self) -> Sequence[float | None] | None: ...

    @property
    def topk_prompt_logprobs(self) -> Sequence[Sequence[tuple[int, float]] | None] | None: ...


def decode_forward_backward_request(
    body: bytes,
    content_encoding: str | None = None,
    *,
    max_decompressed_bytes: int = MAX_DECOMPRESSED_BYTES,
    max_tensor_elements: int = MAX_TENSOR_ELEMENTS,
) -> ForwardBackwardBatch:
    """Decode the body of a `/api/v1/forward_backward` request.

    Args:
        body: the request body as received.
        content_encoding: the request's Content-Encoding header; the SDK sends "zstd" when the client config's
            `proto_compress_fwdbwd` is true, and no header otherwise.
        max_decompressed_bytes: the largest decompressed body accepted.
        max_tensor_elements: the most elements a loss_fn_inputs tensor may have once dense, checked before it is
            made dense (a sparse tensor of a few bytes can declare any shape).

    Returns:
        The request, with sparse tensors made dense (absent cells 0, the SDK's default pad value).

    Raises:
        WireFormatError: the body cannot be decompressed or parsed, or breaks the format (an image chunk, a token
            array that is not int32, a tensor whose bytes do not fill its shape or whose dtype is unknown, ...).
    """
    raw = _decompress(body, content_encoding, max_decompressed_bytes)
    request = pb.ForwardBackwardRequest()
    try:
        request.ParseFromString(raw)
    except DecodeError as error:
        raise WireFormatError(f"forward_backward body is not a ForwardBackwardRequest protobuf: {error}") from error
    if not request.model_id:
        raise WireFormatError("forward_backward request has no model_id")
    if not request.loss_fn:
        raise WireFormatError("forward_backward request has no loss_fn")
    if not request.data:
        raise WireFormatError("forward_backward request carries no datums")
    return ForwardBackwardBatch(
        model_id=request.model_id,
        seq_id=request.seq_id,
        forward_only=request.forward_only,
        loss_fn=request.loss_fn,
        loss_fn_config=_decode_loss_fn_config(request),
        datums=[_decode_datum(datum, index, max_tensor_elements) for index, datum in enumerate(request.data)],
    )


def encode_forward_backward_output(result: ForwardBackwardResult) -> bytes:
    """Serialize a forward/backward result as the `ForwardBackwardOutput` protobuf the SDK decodes.

    Floating outputs are sent as float32 and integer ones as int64. Datums go into one `ArrayRecord` while each
    field keeps its dtype and trailing shape, and a new record starts where one changes: the SDK's decoder
    (`response_conv.deserialize_forward_backward_output`) reads any number of records in order.

    Raises:
        WireFormatError: a metric key is not "name:reduction" with a known reduction, datums do not all have the
            same output names, or an output has a dtype the wire cannot carry (bool, complex).
    """
    _check_metric_keys(result.metrics)
    message = pb.ForwardBackwardOutput(loss_fn_output_type=LOSS_FN_OUTPUT_TYPE)
    for key, value in result.metrics.items():
        message.metrics[key] = float(value)
    per_datum = [_output_arrays(outputs, index) for index, outputs in enumerate(result.loss_fn_outputs)]
    _check_same_output_names(per_datum)
    for _, run in groupby(per_datum, key=_layout):
        message.loss_fn_outputs.append(_array_record(list(run)))
    return message.SerializeToString()


def encode_sample_response(result: SampleResultLike) -> bytes:
    """Serialize a sampling result as the `SampleResponse` protobuf the SDK decodes.

    Sequences keep their order, which must be that of the `sample_sequence_ids` the asample future carried: the
    SDK pairs them by position. Prompt logprobs go out as float32 with NaN for None (the SDK turns NaN back into
    None); top-k rows are padded to the widest row with the SDK's empty-cell sentinel.

    Raises:
        WireFormatError: an unknown stop reason, a token id outside int32 or negative, or logprobs whose count
            differs from the sequence's tokens.
    """
    message = pb.SampleResponse()
    for index, sequence in enumerate(result.sequences):
        message.sequences.append(_sampled_sequence(sequence, index))
    if result.prompt_logprobs is not None:
        prompt_logprobs = [math.nan if logprob is None else logprob for logprob in result.prompt_logprobs]
        message.prompt_logprobs = np.asarray(prompt_logprobs, dtype="<f4").tobytes()
    if result.topk_prompt_logprobs is not None:
        message.topk_prompt_logprobs.CopyFrom(_topk_logprobs(result.topk_prompt_logprobs))
    return message.SerializeToString()


def _decompress(body: bytes, content_encoding: str | None, max_bytes: int) -> bytes:
    encoding = (content_encoding or "").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding != "zstd":
        raise WireFormatError(f"Content-Encoding {content_encoding!r} is not supported: the SDK sends zstd or none")
    # Read in blocks rather than trusting the frame header's content size, so the cap holds for any frame.
    pieces: list[bytes] = []
    size = 0
    try:
        with zstandard.ZstdDecompressor().stream_reader(body, read_across_frames=True) as reader:
            while piece := reader.read(_READ_BLOCK_BYTES):
                size += len(piece)
                if size > max_bytes:
                    raise WireFormatError(f"zstd body inflates past the limit of {max_bytes} bytes")
                pieces.append(piece)
    except zstandard.ZstdError as error:
        raise WireFormatError(f"body is marked Content-Encoding zstd but is not a valid zstd frame: {error}") from error
    return b"".join(pieces)


def _decode_loss_fn_config(request: pb.ForwardBackwardRequest) -> dict[str, float | str] | None:
    # The SDK writes numbers to both maps and strings to v2 only (request_conv.py:105-114); v2 wins where both are
    # set. An absent config and an empty one are the same on the wire.
    config: dict[str, float | str] = dict(request.loss_fn_config)
    for key, value in request.loss_fn_config_v2.items():
        kind = value.WhichOneof("value")
        if kind is None:
            raise WireFormatError(f"loss_fn_config_v2[{key!r}] holds neither a number nor a text")
        config[key] = value.number if kind == "number" else value.text
    return config or None


def _decode_datum(datum: pb.Datum, index: int, max_elements: int) -> DecodedDatum:
    where = f"datum {index}"
    return DecodedDatum(
        model_input_tokens=_decode_tokens(datum.model_input, where),
        loss_fn_inputs={
            name: _decode_tensor(tensor, f"{where} loss_fn_inputs[{name!r}]", max_elements)
            for name, tensor in datum.loss_fn_inputs.items()
        },
    )


def _decode_tokens(chunks: Sequence[pb.Chunk], where: str) -> list[int]:
    tokens: list[int] = []
    for position, chunk in enumerate(chunks):
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise WireFormatError(
                f"{where} model_input chunk {position} is {kind or 'empty'}: this server reads only encoded_text "
                "(token id) chunks, not images or audio"
            )
        raw = chunk.encoded_text.tokens
        if len(raw) % 4:
            raise WireFormatError(
                f"{where} model_input chunk {position} has {len(raw)} token bytes, not a whole number of int32 ids"
            )
        ids = np.frombuffer(raw, dtype="<i4")
        if ids.size and ids.min() < 0:
            raise WireFormatError(f"{where} model_input chunk {position} has a negative token id {ids.min()}")
        tokens.extend(ids.tolist())
    return tokens


def _decode_tensor(tensor: pb.Tensor, where: str, max_elements: int) -> torch.Tensor:
    shape = list(tensor.shape)
    if any(size < 0 for size in shape):
        raise WireFormatError(f"{where} has a negative size in its shape {shape}")
    if math.prod(shape) > max_elements:
        raise WireFormatError(
            f"{where} has shape {shape}, {math.prod(shape)} elements; this server takes at most {max_elements} "
            "(--max-tensor-elements)"
        )
    if tensor.WhichOneof("encoding") == "sparse_csr":
        array = _densify_csr(tensor.sparse_csr, tensor.dtype, shape, where)
    else:
        values = _values(tensor.dense, tensor.dtype, where)
        # The SDK omits the shape of a tensor built without one, which it treats as 1-D (TensorData.shape).
        shape = shape or [values.size]
        if math.prod(shape) != values.size:
            raise WireFormatError(
                f"{where} has shape {shape}, which needs {math.prod(shape)} values, not {values.size}"
            )
        array = values.reshape(shape)
    return torch.from_numpy(array)


def _values(raw: bytes, dtype: int, where: str) -> np.ndarray:
    """The values in `raw`, widened as the SDK widens them: int32 to int64 and bfloat16 to float32."""
    # Each branch copies: `frombuffer` views the immutable request bytes, which torch cannot wrap writably.
    if dtype == pb.DTYPE_FLOAT32:
        return _frombuffer(raw, np.dtype("<f4"), where).astype(np.float32)
    if dtype == pb.DTYPE_INT64:
        return _frombuffer(raw, np.dtype("<i8"), where).astype(np.int64)
    if dtype == pb.DTYPE_INT32:
        return _frombuffer(raw, np.dtype("<i4"), where).astype(np.int64)
    if dtype == pb.DTYPE_BFLOAT16:
        # A bfloat16 is the upper half of a float32.
        return (_frombuffer(raw, np.dtype("<u2"), where).astype(np.uint32) << 16).view(np.float32)
    name = pb.DType.Name(dtype) if dtype in pb.DType.values() else str(dtype)
    raise WireFormatError(f"{where} has dtype {name}; the wire carries FLOAT32, INT64, INT32 or BFLOAT16")


def _frombuffer(raw: bytes, dtype: np.dtype, where: str) -> np.ndarray:
    if len(raw) % dtype.itemsize:
        raise WireFormatError(f"{where} has {len(raw)} bytes, not a whole number of {dtype.itemsize}-byte values")
    return np.frombuffer(raw, dtype=dtype)


def _densify_csr(csr: pb.SparseCsr, dtype: int, shape: list[int], where: str) -> np.ndarray:
    if len(shape) != 2:
        raise WireFormatError(f"{where} is sparse CSR, which needs a 2-D shape, not {shape}")
    rows, columns = shape
    values = _values(csr.values, dtype, where)
    row_pointers = _frombuffer(csr.crow_indices, np.dtype("<i8"), f"{where} crow_indices").astype(np.int64)
    column_indices = _frombuffer(csr.col_indices, np.dtype("<i8"), f"{where} col_indices").astype(np.int64)
    row_lengths = np.diff(row_pointers)
    if (
        row_pointers.size != rows + 1
        or row_pointers[0] != 0
        or row_pointers[-1] != values.size
        or (row_lengths < 0).any()
    ):
        raise WireFormatError(
            f"{where} crow_indices must be {rows + 1} non-decreasing offsets from 0 to {values.size}, "
            f"got {row_pointers.tolist()[:8]}{'...' if row_pointers.size > 8 else ''}"
        )
    if column_indices.size != values.size:
        raise WireFormatError(f"{where} has {column_indices.size} col_indices for {values.size} values")
    if values.size and (column_indices.min() < 0 or column_indices.max() >= columns):
        raise WireFormatError(f"{where} has a column index outside [0, {columns})")
    row_of_value = np.repeat(np.arange(rows), row_lengths)
    same_row = row_of_value[1:] == row_of_value[:-1]
    # The SDK builds these with torch, whose CSR invariants require strictly rising columns within a row.
    if (np.diff(column_indices)[same_row] <= 0).any():
        raise WireFormatError(f"{where} col_indices must strictly increase within each row")
    dense = np.zeros(shape, dtype=values.dtype)
    dense[row_of_value, column_indices] = values
    return dense


def _check_metric_keys(metrics: Mapping[str, float]) -> None:
    for key in metrics:
        parts = key.split(":")
        if len(parts) != 2 or parts[1] not in REDUCE_MAP:
            raise WireFormatError(
                f"metric key {key!r} must be 'name:reduction' with one of {sorted(REDUCE_MAP)}: the SDK combines "
                "chunked results by that suffix"
            )


def _output_arrays(outputs: Mapping[str, torch.Tensor | np.ndarray], index: int) -> dict[str, np.ndarray]:
    return {name: _output_array(value, f"datum {index} output {name!r}") for name, value in outputs.items()}


def _output_array(value: torch.Tensor | np.ndarray, where: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            # numpy has no bfloat16, so floats go through float32 on the torch side.
            value = value.detach().to(device="cpu", dtype=torch.float32)
        elif value.dtype in (torch.bool, torch.complex64, torch.complex128):
            raise WireFormatError(f"{where} has dtype {value.dtype}; the wire carries floats and integers only")
        value = value.detach().cpu().numpy()
    if value.dtype.kind == "f":
        array = np.ascontiguousarray(value, dtype="<f4")
    elif value.dtype.kind in "iu":
        array = np.ascontiguousarray(value, dtype="<i8")
    else:
        raise WireFormatError(f"{where} has dtype {value.dtype}; the wire carries floats and integers only")
    return array.reshape(1) if array.ndim == 0 else array


def _check_same_output_names(per_datum: list[dict[str, np.ndarray]]) -> None:
    # The SDK indexes every field by datum (response_conv.py), so a field missing from one datum breaks the client.
    if not per_datum:
        return
    expected = sorted(per_datum[0])
    for index, outputs in enumerate(per_datum):
        if sorted(outputs) != expected:
            raise WireFormatError(f"datum {index} has outputs {sorted(outputs)}, datum 0 has {expected}")


def _layout(outputs: dict[str, np.ndarray]) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    return tuple((name, outputs[name].dtype.str, outputs[name].shape[1:]) for name in sorted(outputs))


def _array_record(run: list[dict[str, np.ndarray]]) -> pb.ArrayRecord:
    record = pb.ArrayRecord(type_tag=LOSS_FN_OUTPUT_TYPE, num_datums=len(run))
    for name in run[0]:
        arrays = [outputs[name] for outputs in run]
        offsets = np.cumsum([0] + [array.nbytes for array in arrays], dtype="<i8")
        batched = record.fields[name]
        batched.data = b"".join(array.tobytes() for array in arrays)
        batched.offsets = offsets.tobytes()
        batched.dtype = pb.DTYPE_FLOAT32 if arrays[0].dtype.kind == "f" else pb.DTYPE_INT64
        batched.trailing_shape.extend(arrays[0].shape[1:])
    return record


def _sampled_sequence(sequence: SampledSequenceLike, index: int) -> pb.SampledSequence:
    where = f"sequence {index}"
    stop_reason = _STOP_REASONS.get(sequence.stop_reason)
    if stop_reason is None:
        raise WireFormatError(
            f"{where} has stop_reason {sequence.stop_reason!r}; the SDK knows {sorted(_STOP_REASONS)}"
        )
    message = pb.SampledSequence(stop_reason=stop_reason, tokens=_token_bytes(sequence.tokens, where))
    if sequence.logprobs is not None:
        if len(sequence.logprobs) != len(sequence.tokens):
            raise WireFormatError(
                f"{where} has {len(sequence.logprobs)} logprobs for {len(sequence.tokens)} tokens; they pair up"
            )
        message.logprobs = np.asarray(sequence.logprobs, dtype="<f4").tobytes()
    return message


def _token_bytes(tokens: Sequence[int] | np.ndarray, where: str) -> bytes:
    ids = np.asarray(tokens, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() > _MAX_TOKEN_ID):
        raise WireFormatError(
            f"{where} has token ids outside [0, {_MAX_TOKEN_ID}], which int32 on the wire cannot hold"
        )
    return ids.astype("<i4").tobytes()


def _topk_logprobs(rows: Sequence[Sequence[tuple[int, float]] | None]) -> pb.TopkLogprobs:
    width = max((len(row) for row in rows if row is not None), default=0)
    token_ids = np.zeros((len(rows), width), dtype=np.int64)
    logprobs = np.full((len(rows), width), MASK_LOGPROB, dtype=np.float32)
    for position, row in enumerate(rows):
        for rank, (token_id, logprob) in enumerate(row or ()):
            token_ids[position, rank] = token_id
            logprobs[position, rank] = logprob
    return pb.TopkLogprobs(
        token_ids=_token_bytes(token_ids.ravel(), "topk_prompt_logprobs"),
        logprobs=logprobs.astype("<f4").tobytes(),
        k=width,
        length=len(rows),
    )
