"""Checkpoints are written into a staging folder and moved into place: a crash or a full disk leaves no half-written
folder behind for long, and never costs the checkpoint a failed save would have replaced."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path

import pytest
import tinker
from conftest import next_token_datum
from support.backends import TINY, tiny_server_config
from tinker import types

from trainer_backend.checkpoints import CheckpointKind, CheckpointPath, CheckpointStore
from trainer_backend.server import RunningServer, running_server

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


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    with running_server(tiny_server_config(tmp_path, api_keys=[KEY])) as running:
        yield running


def test_a_save_that_fills_the_disk_fails_by_name_and_the_last_checkpoint_and_the_lane_survive(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with tinker.ServiceClient(base_url=server.url, api_key=KEY) as client:
        training = client.create_lora_training_client(base_model=TINY, rank=4, seed=0).result()
        saved = training.save_state("latest").result(timeout=30).path
        ids = training.get_tokenizer().encode("SELECT 1;")
        datum = next_token_datum(ids)
        before = logprobs(training, datum)

        # A full disk cannot be made on a CI machine without privileges: the engine's write fails as it would,
        # after writing part of a file, with the error the kernel gives.
        def write_until_full(model_id: str, folder: Path, include_optimizer: bool) -> None:
            (folder / "adapter_model.safetensors").write_bytes(b"\0" * 4096)
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(server.service.engine, "save", write_until_full)
        with pytest.raises(tinker.RequestFailedError, match=r"disk is full.*earlier checkpoints are intact"):
            training.save_state("latest").result(timeout=30)
        monkeypatch.undo()

        runs = Path(server.service.config.storage_root, "checkpoints", "runs")
        assert list(runs.glob("*/*/.*staging*")) == []
        # The lane goes on at once, and the checkpoint the failed save would have replaced still loads.
        assert logprobs(training, datum) == pytest.approx(before)
        restored = client.create_training_client_from_state(saved).result(timeout=30)
        assert logprobs(restored, datum) == pytest.approx(before)


def logprobs(training: tinker.TrainingClient, datum: types.Datum) -> list[float]:
    return training.forward([datum], "cross_entropy").result(timeout=30).loss_fn_outputs[0]["logprobs"].tolist()
