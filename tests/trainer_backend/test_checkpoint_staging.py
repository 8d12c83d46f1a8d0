"""Checkpoints are written into a staging folder and moved into place: a crash or a full disk leaves no half-written
folder behind for long, and never costs the checkpoint a failed save would have replaced."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest
import tinker
from support.backends import TINY, start_backend_process
from support.loopback import free_port
from support.trainer import assert_still_serves, next_token_datum
from tinker import types

from trainer_backend.checkpoints import CheckpointKind, CheckpointPath, CheckpointStore

KEY = "tml-staging-tests"


def test_half_written_checkpoints_left_by_a_crash_are_removed_at_start_up(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    path = CheckpointPath("run:train:0", CheckpointKind.TRAINING, "kept")
    staging = store.prepare(path)
    (staging / "adapter_model.safetensors").write_bytes(b"\0" * 1024)
    store.commit(path, staging, "owner", "base")
    # What a crash in the middle of the next save leaves: a staging folder beside the committed checkpoint.
    crashed = store.prepare(path)
    (crashed / "adapter_model.safetensors").write_bytes(b"\0" * 512)

    CheckpointStore(tmp_path)

    assert not crashed.exists()
    assert [info.name for info in CheckpointStore(tmp_path).list("owner")] == ["kept"]


# Files the backend may write: above its ledgers, logs and a rank-64 adapter (0.7 MB), below the same adapter's
# optimizer state once Adam has moments (1.4 MB).
FILE_SIZE_LIMIT = 1 << 20


def limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))


@pytest.mark.slow
def test_a_save_that_fills_the_disk_fails_by_name_and_the_last_checkpoint_and_the_lane_survive(tmp_path: Path) -> None:
    """A real write failure from the kernel: the backend runs under a file-size limit (RLIMIT_FSIZE, which a CI
    machine can set without privileges), so the optimizer file of the second save fails with EFBIG part-written,
    as a full disk fails a write with ENOSPC."""
    port = free_port()
    server = start_backend_process(tmp_path, port, "--api-key", KEY, before_start=limit_file_size)
    try:
        with tinker.ServiceClient(base_url=f"http://127.0.0.1:{port}", api_key=KEY) as client:
            training = client.create_lora_training_client(base_model=TINY, rank=64, seed=0).result()
            ids = training.get_tokenizer().encode("SELECT 1;")
            datum = next_token_datum(ids)
            before = logprobs(training, datum)
            saved = training.save_state("latest").result(timeout=30).path
            training.forward_backward([datum], "cross_entropy")
            training.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=30)
            trained = logprobs(training, datum)

            with pytest.raises(tinker.RequestFailedError, match=r"disk is full.*earlier checkpoints are intact"):
                training.save_state("latest").result(timeout=30)

            assert list((tmp_path / "checkpoints").rglob("*staging*")) == []
            # The lane goes on at once, and the checkpoint the failed save would have replaced still loads.
            assert_still_serves(training, ids)
            assert logprobs(training, datum) == pytest.approx(trained)
            restored = client.create_training_client_from_state(saved).result(timeout=30)
            assert logprobs(restored, datum) == pytest.approx(before)
    finally:
        server.terminate()
        server.wait(30)


def logprobs(training: tinker.TrainingClient, datum: types.Datum) -> list[float]:
    return training.forward([datum], "cross_entropy").result(timeout=30).loss_fn_outputs[0]["logprobs"].tolist()
