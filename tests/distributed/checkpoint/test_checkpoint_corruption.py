"""A damaged checkpoint is refused on every rank, naming the file and the tensor, without a hang:
a deleted shard file, a flipped byte, an index that lists a piece twice. The checkpoint is saved
at tensor 2 (1D), so each rank's file holds its own blocks and only rank 1 reads rank 1's file:
rank 0 must learn of rank 1's problem too."""

import json
import os

import pytest
from layouts import Run, run

import minigrad.distributed as dist
from minigrad.testing.distributed import run_workers


def _try_load(path):
    model = Run("tensor2_1d")
    try:
        dist.checkpoint.load(model.state(0), path)
    except dist.checkpoint.CheckpointError as exc:
        return str(exc)
    return "loaded"


@pytest.fixture
def saved(tmp_path):
    run("tensor2_1d", 1, str(tmp_path), save_at=1)
    path = tmp_path / "step-1"
    assert sorted(os.listdir(path)) == ["index.json", "rank00000.safetensors",
                                        "rank00001.safetensors"]
    return path


def _sharded_piece(path, file="rank00001.safetensors"):
    index = json.loads((path / "index.json").read_text())
    for key, meta in index["tensors"].items():
        for piece in meta["pieces"]:
            if piece["file"] == file and key.startswith("model/"):
                return index, key, piece
    raise AssertionError("no piece in " + file)


def test_intact_checkpoint_loads(saved):
    assert run_workers(_try_load, 2, str(saved), timeout=120) == ["loaded", "loaded"]


def test_deleted_shard_file_is_named_on_every_rank(saved):
    os.unlink(saved / "rank00001.safetensors")
    for msg in run_workers(_try_load, 2, str(saved), timeout=120):
        assert "rank00001.safetensors" in msg and "is missing" in msg
        assert msg.startswith("rank 1: ") and "rank 0:" not in msg  # rank 0 never reads it
        assert "tensor 'model/" in msg or "tensor 'optim/" in msg


def test_flipped_byte_is_a_checksum_error_naming_file_and_tensor(saved):
    _, key, piece = _sharded_piece(saved)
    blob = bytearray((saved / "rank00001.safetensors").read_bytes())
    blob[-3] ^= 0x01  # inside the last array's data
    (saved / "rank00001.safetensors").write_bytes(bytes(blob))
    for msg in run_workers(_try_load, 2, str(saved), timeout=120):
        assert "rank00001.safetensors" in msg and "checksum mismatch" in msg
        assert "of tensor '" in msg


def test_index_listing_a_piece_twice_is_refused(saved):
    index, key, piece = _sharded_piece(saved)
    index["tensors"][key]["pieces"].append(dict(piece))
    (saved / "index.json").write_text(json.dumps(index))
    for msg in run_workers(_try_load, 2, str(saved), timeout=120):
        assert f"tensor {key!r}" in msg and "overlap" in msg
        assert "rank00001.safetensors" in msg
