"""A trained model's per-frame features, once, as ``distseq features`` writes them (or a
torchvision backbone's, by name and weights, with no trained run: ``named_backbone``):

- ``shards`` (the default): feature shards that ``data.features=true`` trains on. Each input
  shard becomes one of the same name, every video a sample of float16 features (frames,
  features) and its labels, and an ``index.json`` beside them names the classes, each shard's
  split, the feature size and the backbone (``data.manifest``).
- ``npy``: every video's features as ``<video>.npy`` of shape (features, frames), float32, the
  layout that action-segmentation code (MS-TCN and its successors) reads.

Videos, frame folders or shards are read as ``predict`` reads them (``predict.videos``) and go
through the backbone a chunk at a time, so device memory is one chunk's whatever the length;
the host keeps the video's features only (8 KB a frame for ResNet-50). Each file (a ``.npy``, a
whole shard) is written beside its final name and renamed when complete, and a file already
there is skipped, so a killed run leaves no half-written file and a rerun does only what is
left. Under torchrun the videos (shards) are split across the ranks.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from distseq.checkpoint.export import Loaded
from distseq.config import BackboneConfig, Config, DataConfig, ModelConfig, Norm
from distseq.data.decode import check_sample
from distseq.data.manifest import (
    FEATURES_MEMBER,
    LABELS_MEMBER,
    Manifest,
    ShardInfo,
    find_manifest,
    shard_label_counts,
    write_manifest,
)
from distseq.data.tar import EVERY_SPLIT, add_member, expand, read_shard, shard_name
from distseq.errors import ConfigError, DataError
from distseq.infer.predict import FrameSampling, chunks, frames_of, is_shards, videos
from distseq.model.video import VideoModel, build_model
from distseq.parallel import DistInfo, all_reduce_sum

FORMATS = ("shards", "npy")


@dataclass(frozen=True)
class Extracted:
    videos: int  # written by all ranks
    skipped: int  # already there: videos (npy) or shards
    frames: int
    seconds: float  # rank 0's time in the backbone


class _Backbone:
    """The model's backbone over one video's frames a chunk at a time, timed."""

    def __init__(self, model: VideoModel, chunk: int, device: torch.device) -> None:
        self.model, self.chunk, self.device = model.to(device).eval(), chunk, device
        self.seconds = 0.0

    @torch.no_grad()
    def __call__(self, frames: Iterable[torch.Tensor]) -> torch.Tensor:
        """float32 features [T, F] on the host."""
        parts = []
        for x in chunks(frames, self.chunk):
            start = time.perf_counter()
            mask = torch.ones(x.shape[:2], dtype=torch.bool, device=self.device)
            parts.append(self.model.features(x.to(self.device), mask)[0].float().cpu())
            self.seconds += time.perf_counter() - start
        return torch.cat(parts) if parts else torch.zeros((0, self.model.feature_dim or 0))


def named_backbone(
    name: str, weights: str, norm: str, inputs: list[str], size: int, manifest: str = ""
) -> Loaded:
    """A torchvision backbone by name and weights, with no trained run (``--backbone``), as a
    model whose features ``write_features`` writes, at ``size`` px (0: the size the first shards'
    index.json records, else 224). Its classes are the first shards' (their labels go into the
    feature shards); with no shards (``--format npy`` over videos) they are not used.
    ``manifest``: the shards' index.json (default: beside them)."""
    if not weights:
        raise ConfigError(
            f"--backbone {name}: needs --weights (a torchvision entry such as IMAGENET1K_V2, or "
            "a file): the features of random weights mean nothing"
        )
    found = next(
        (find_manifest(i, manifest, "INPUT", "--manifest") for i in inputs if is_shards(i)), None
    )
    classes = found.classes if found is not None else ["unused"]
    size = size or (found.size if found is not None and found.size else 224)
    backbone = BackboneConfig(name, weights, Norm(norm))
    cfg = Config(data=DataConfig(size=size), model=ModelConfig(backbone=backbone))
    return Loaded(build_model(cfg.model, len(classes)).eval(), cfg, classes, 0)


def write_features(
    loaded: Loaded,
    inputs: list[str],
    sampling: FrameSampling,
    chunk: int,
    out: Path,
    info: DistInfo,
    form: str = "shards",
    manifest: str = "",
) -> Extracted:
    """This rank's share of ``inputs``' features in ``out``, as ``form`` (one of FORMATS);
    ``manifest``: the index.json of the shards among the inputs (default: beside them)."""
    out.mkdir(parents=True, exist_ok=True)
    backbone = _Backbone(loaded.over_frames(), chunk, info.device)
    if form == "npy":
        counts = _write_npy(loaded, inputs, sampling, backbone, out, info, manifest)
    elif form == "shards":
        sources = _sources(loaded, inputs, manifest)
        counts = _write_shards(loaded, list(sources), backbone, out, info)
    else:
        raise ConfigError(f"--format {form!r}: one of {', '.join(FORMATS)}")
    totals = all_reduce_sum(torch.tensor(counts, dtype=torch.float64, device=info.device))
    if form == "shards" and info.is_main:  # after every rank's shards: the all-reduce waited
        _write_index(loaded, sources, out)
    return Extracted(int(totals[0]), int(totals[1]), int(totals[2]), backbone.seconds)


def _write_npy(
    loaded: Loaded,
    inputs: list[str],
    sampling: FrameSampling,
    backbone: _Backbone,
    out: Path,
    info: DistInfo,
    manifest: str,
) -> list[float]:
    """One ``<video>.npy`` per video, every world-th video; [done, skipped, frames]."""
    done = skipped = frames = 0
    bar = tqdm(unit="video", disable=not info.is_main, desc="features")
    for i, (name, video) in enumerate(videos(inputs, loaded, sampling, manifest)):
        if i % info.world != info.rank:
            continue
        path = out / f"{name}.npy"
        if path.exists():
            skipped += 1
            continue
        feats = backbone(video)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            np.save(f, feats.T.contiguous().numpy())  # (features, frames)
        os.replace(tmp, path)
        done += 1
        frames += len(feats)
        bar.update()
    bar.close()
    return [float(done), float(skipped), float(frames)]


def _sources(loaded: Loaded, inputs: list[str], manifest_path: str) -> dict[str, Manifest]:
    """Each input shard's URL and its manifest, checked before any work: the feature shards
    take their splits and labels from them."""
    sources = {}
    for item in inputs:
        if not is_shards(item):
            raise ConfigError(
                f"{item}: --format shards reads shards (their labels and splits go into the "
                "feature shards); use --format npy for videos and frame folders"
            )
        manifest = find_manifest(item, manifest_path, "INPUT", "--manifest")
        if manifest.classes != loaded.classes:
            raise ConfigError(
                f"{item}: its classes {manifest.classes} are not the model's {loaded.classes}"
            )
        for url in expand(item, "INPUT", EVERY_SPLIT):
            if shard_name(url) not in manifest.shards:
                raise DataError(f"shard {url} is not listed in {manifest.path}")
            sources[url] = manifest
    return sources


def _write_shards(
    loaded: Loaded, urls: list[str], backbone: _Backbone, out: Path, info: DistInfo
) -> list[float]:
    """One feature shard per input shard, every world-th shard; [videos, skipped shards,
    frames]."""
    done = skipped = frames = 0
    stride = loaded.config.data.frame_stride
    bar = tqdm(unit="video", disable=not info.is_main, desc="features")
    for url in urls[info.rank :: info.world]:
        path = out / shard_name(url)
        if path.exists():
            skipped += 1
            continue
        tmp = path.with_name(path.name + ".tmp")
        with tarfile.open(tmp, "w") as tar:
            for sample in read_shard(url):
                video = check_sample(sample, len(loaded.classes), stride)
                feats = backbone(frames_of(video, loaded.config.data.size))
                array = io.BytesIO()
                np.save(array, feats.half().numpy())  # (frames, features)
                add_member(tar, f"{video.key}.{FEATURES_MEMBER}", array.getvalue())
                labels = json.dumps({"labels": video.labels}).encode()
                add_member(tar, f"{video.key}.{LABELS_MEMBER}", labels)
                done += 1
                frames += len(feats)
                bar.update()
        os.replace(tmp, path)
    bar.close()
    return [float(done), float(skipped), float(frames)]


def _write_index(loaded: Loaded, sources: dict[str, Manifest], out: Path) -> None:
    """``out/index.json`` for the feature shards there: each input shard's split, the counts
    (samples, frames, frames of each class) read back from the shards' labels (their features
    are not read), the feature size."""
    shards: dict[str, ShardInfo] = {}
    for url, source in sources.items():
        name = shard_name(url)
        samples, frames, labels = shard_label_counts(out / name, len(loaded.classes))
        shards[name] = ShardInfo(source.shards[name].split, samples, frames, labels)
    fps = next((m.fps for m in sources.values() if m.fps), None)
    stride = loaded.config.data.frame_stride
    extra: dict[str, object] = {
        "features": loaded.over_frames().feature_dim,
        "backbone": loaded.config.model.backbone.name,
    }
    if fps is not None:
        extra["fps"] = fps / stride  # one feature vector per kept frame
    write_manifest(out / "index.json", Manifest(loaded.classes, shards), **extra)
