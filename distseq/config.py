"""Typed run configuration: YAML file + ``key=value`` overrides, validated against a schema."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException


class ConfigError(ValueError):
    """A bad config; the message is one line that names the key or file."""


class Norm(str, Enum):
    batchnorm = "batchnorm"
    frozen_bn = "frozen_bn"
    groupnorm = "groupnorm"


class Temporal(str, Enum):
    lstm = "lstm"
    gru = "gru"
    none = "none"  # per-frame classifier, the baseline that cannot see time


class Backend(str, Enum):
    torch = "torch"
    fairscale = "fairscale"
    none = "none"


class ParallelMode(str, Enum):
    fsdp = "fsdp"
    ddp = "ddp"
    none = "none"


class Precision(str, Enum):
    auto = "auto"  # bf16 on GPU, fp32 on CPU
    bf16 = "bf16"
    fp32 = "fp32"


class OnError(str, Enum):
    raise_ = "raise"
    skip = "skip"


def _check(ok: bool, key: str, value: object, want: str) -> None:
    if not ok:
        raise ConfigError(f"config key {key}={value!r}: {want}")


@dataclass
class AugmentConfig:
    """Train-time augmentation. One draw per sequence: every frame of it gets the same crop, flip
    and colour change, so that motion between frames stays what the camera saw."""

    crop_scale: float = 1.0  # random crop of [crop_scale, 1] of the frame area; 1: no crop
    flip: bool = False  # horizontal flip with probability 0.5
    brightness: float = 0.0  # factor drawn from [1 - x, 1 + x]; 0: off
    contrast: float = 0.0
    saturation: float = 0.0

    def __post_init__(self) -> None:
        _check(
            0.0 < self.crop_scale <= 1.0,
            "data.augment.crop_scale",
            self.crop_scale,
            "must be in (0, 1]",
        )
        for key in ("brightness", "contrast", "saturation"):
            value = getattr(self, key)
            _check(0.0 <= value < 1.0, f"data.augment.{key}", value, "must be in [0, 1)")


@dataclass
class DataConfig:
    train: str = ""  # shard URLs, brace patterns allowed: shards/train-{000000..000009}.tar
    val: str = ""  # empty: no validation
    manifest: str = ""  # index.json; empty: next to the first train shard
    frames: int = 64  # training window T; longer sequences get a random window
    size: int = 64  # frames are resized to size x size
    batch_size: int = 2  # sequences per rank per micro-step
    num_workers: int = 1
    shuffle_buffer: int = 8
    on_error: OnError = OnError.raise_
    frame_stride: int = 1  # keep every Nth stored frame (e.g. shards at 5 fps, train at 1 fps)
    # 0: off. N: sequences shorter than `frames` are batched with others of similar length
    # (N buckets over 1..frames), so that batches carry less padding.
    length_buckets: int = 0
    # Stateful mode: each video is cut into consecutive windows of `frames` that reach the same
    # rank and worker in order; the RNN state is carried (detached) from one window to the next.
    ordered: bool = False
    augment: AugmentConfig = field(default_factory=AugmentConfig)

    def __post_init__(self) -> None:
        _check(self.frames >= 1, "data.frames", self.frames, "must be >= 1")
        _check(self.size >= 16, "data.size", self.size, "must be >= 16")
        _check(self.batch_size >= 1, "data.batch_size", self.batch_size, "must be >= 1")
        _check(self.num_workers >= 0, "data.num_workers", self.num_workers, "must be >= 0")
        _check(self.shuffle_buffer >= 1, "data.shuffle_buffer", self.shuffle_buffer, "must be >= 1")
        _check(self.frame_stride >= 1, "data.frame_stride", self.frame_stride, "must be >= 1")
        _check(
            0 <= self.length_buckets <= self.frames,
            "data.length_buckets",
            self.length_buckets,
            f"must be in [0, data.frames={self.frames}]",
        )
        _check(
            not (self.ordered and self.length_buckets),
            "data.length_buckets",
            self.length_buckets,
            "must be 0 with data.ordered=true: a lane of windows cannot wait for a bucket",
        )


@dataclass
class BackboneConfig:
    name: str = "resnet18"  # any torchvision classification model with a final nn.Linear
    weights: str = ""  # local state_dict file; empty: random init. Never fetched.
    norm: Norm = Norm.groupnorm


@dataclass
class HeadConfig:
    kind: Temporal = Temporal.lstm
    hidden: int = 128
    layers: int = 1
    dropout: float = 0.0
    bidirectional: bool = False  # sees the future: offline segmentation only

    def __post_init__(self) -> None:
        _check(self.hidden >= 1, "model.head.hidden", self.hidden, "must be >= 1")
        _check(self.layers >= 1, "model.head.layers", self.layers, "must be >= 1")
        _check(0.0 <= self.dropout < 1.0, "model.head.dropout", self.dropout, "must be in [0, 1)")


@dataclass
class ModelConfig:
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    head: HeadConfig = field(default_factory=HeadConfig)


@dataclass
class MemoryConfig:
    backend: Backend = Backend.torch
    chunk_frames: int = 8  # frames per checkpointed backbone chunk
    tbptt_frames: int = 0  # 0: backprop through the whole sequence; N: detach RNN state every N

    def __post_init__(self) -> None:
        _check(self.chunk_frames >= 1, "memory.chunk_frames", self.chunk_frames, "must be >= 1")
        _check(self.tbptt_frames >= 0, "memory.tbptt_frames", self.tbptt_frames, "must be >= 0")


@dataclass
class ParallelConfig:
    mode: ParallelMode = ParallelMode.fsdp
    precision: Precision = Precision.auto


@dataclass
class OptimConfig:
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_steps: int = 10
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    accum_steps: int = 1

    def __post_init__(self) -> None:
        _check(self.lr > 0, "optim.lr", self.lr, "must be > 0")
        _check(self.weight_decay >= 0, "optim.weight_decay", self.weight_decay, "must be >= 0")
        _check(self.warmup_steps >= 0, "optim.warmup_steps", self.warmup_steps, "must be >= 0")
        _check(self.grad_clip >= 0, "optim.grad_clip", self.grad_clip, "must be >= 0")
        _check(self.accum_steps >= 1, "optim.accum_steps", self.accum_steps, "must be >= 1")


@dataclass
class TrainConfig:
    steps: int = 100  # optimizer steps
    seed: int = 0
    out_dir: str = "runs/default"
    log_every: int = 10
    eval_every: int = 0  # 0: evaluate only at the end
    save_every: int = 0  # checkpoint every N steps; 0: only at the end
    keep_last: int = 3  # checkpoints kept on disk, newest first
    # Stop (with a checkpoint) after this step, as a preempted job would; the LR schedule still
    # runs to train.steps, so resuming continues the very same run. 0: run to train.steps.
    stop_after: int = 0
    # A SLURM job requeues itself on preemption or timeout at most this many times.
    max_requeues: int = 10

    def __post_init__(self) -> None:
        _check(self.steps >= 1, "train.steps", self.steps, "must be >= 1")
        _check(self.log_every >= 1, "train.log_every", self.log_every, "must be >= 1")
        _check(self.eval_every >= 0, "train.eval_every", self.eval_every, "must be >= 0")
        _check(self.save_every >= 0, "train.save_every", self.save_every, "must be >= 0")
        _check(self.keep_last >= 1, "train.keep_last", self.keep_last, "must be >= 1")
        _check(self.stop_after >= 0, "train.stop_after", self.stop_after, "must be >= 0")
        _check(self.max_requeues >= 0, "train.max_requeues", self.max_requeues, "must be >= 0")


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        _check(
            not (self.data.ordered and self.model.head.bidirectional),
            "data.ordered",
            self.data.ordered,
            "carries the RNN state forward, so it needs model.head.bidirectional=false",
        )


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:  # type: ignore[assignment]
    """Merge the schema defaults, a YAML file and ``key=value`` overrides, then validate."""
    merged = OmegaConf.structured(Config)
    try:
        if path is not None:
            path = Path(path)
            if not path.is_file():
                raise ConfigError(f"config file not found: {path}")
            merged = OmegaConf.merge(merged, OmegaConf.load(path))
        for item in overrides:
            if "=" not in item:
                raise ConfigError(f"override {item!r} is not key=value")
        merged = OmegaConf.merge(merged, OmegaConf.from_dotlist(list(overrides)))
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        first = str(getattr(e, "msg", e)).splitlines()[0]
        raise ConfigError(f"config key {key}: {first}") from None
    except Exception as e:  # YAML syntax errors come from yaml, not OmegaConf
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"config file {path}: {str(e).splitlines()[0]}") from None
    assert isinstance(cfg, Config)
    return cfg


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
