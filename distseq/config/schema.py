"""The run configuration's schema: its keys as typed dataclasses, their defaults, and every
check a config can fail, the cross-key ones included, so that a bad config is refused where it
is loaded (config.load): before ``distseq submit`` queues a job, not on the cluster. What each
key means, for people, is config.keys."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from distseq.errors import ConfigError
from distseq.units import parse_budget


class Norm(str, Enum):
    batchnorm = "batchnorm"
    frozen_bn = "frozen_bn"
    groupnorm = "groupnorm"


class Temporal(str, Enum):
    lstm = "lstm"
    gru = "gru"
    none = "none"  # per-frame classifier, the baseline that cannot see time
    mstcn = "mstcn"  # MS-TCN's multi-stage dilated temporal convolutions (model/tcn.py)
    transformer = "transformer"  # an encoder with local attention (model/transformer.py)


RNNS = (Temporal.lstm.value, Temporal.gru.value)
STATELESS = (Temporal.mstcn.value, Temporal.transformer.value)  # nothing to carry across windows


class Recompute(str, Enum):
    """How a chunk's CNN activations are recomputed in backward: the checkpoint implementation."""

    torch = "torch"
    fairscale = "fairscale"
    none = "none"  # keep every activation: the plain model's memory


class Offload(str, Enum):
    """What a training step keeps in host memory instead of on the device."""

    none = "none"
    frames = "frames"  # the uint8 frames; each chunk is copied in for its forward and recompute


class ParallelMode(str, Enum):
    fsdp = "fsdp"
    ddp = "ddp"
    none = "none"


class Precision(str, Enum):
    auto = "auto"  # bf16 on GPU, fp32 on CPU
    bf16 = "bf16"
    fp32 = "fp32"


# A plain string rather than an Enum: the natural member name, ``raise``, is a Python keyword, and
# an Enum named ``raise_`` would be written into a run's config.yaml as ``raise_``.
ON_ERROR = ("raise", "skip")


def _check(ok: bool, key: str, value: object, want: str) -> None:
    if not ok:
        raise ConfigError(f"config key {key}={value!r}: {want}")


_IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def is_import_path(name: str) -> bool:
    """Whether a model name is a factory's import path, ``package.module:factory``."""
    return bool(_IMPORT_PATH.fullmatch(name)) and not name.startswith("timm:")


def is_remote(url: str) -> bool:
    """Whether a shard URL is read through a command or a server rather than from a path."""
    return urlparse(url).scheme not in ("", "file")


@dataclass
class AugmentConfig:
    """Train-time augmentation. One draw per sequence: every frame of it gets the same crop, flip
    and colour change, so that motion between frames stays what the camera saw."""

    crop_scale: float = 1.0  # random crop of [crop_scale, 1] of the frame area; 1: no crop
    flip: bool = False  # horizontal flip with probability 0.5
    brightness: float = 0.0  # factor drawn from [1 - x, 1 + x]; 0: off
    contrast: float = 0.0  # likewise
    saturation: float = 0.0  # likewise

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
    # T, frames per training window; longer sequences get a random window. 0: whole videos, one
    # sequence each (memory.budget then plans for the longest training video).
    window: int = 64
    size: int = 64  # frames are resized to size x size
    batch_size: int = 2  # sequences per rank per micro-step
    num_workers: int = 1  # loader processes per rank; 0: load in the training process
    shuffle_buffer: int = 8  # samples in the shuffle buffer
    on_error: str = "raise"  # one of ON_ERROR: a bad sample stops the run, or is skipped, counted
    frame_stride: int = 1  # keep every Nth stored frame (e.g. shards at 5 fps, train at 1 fps)
    # 0: off. N: sequences shorter than `window` are batched with others of similar length
    # (N buckets over 1..window), so that batches carry less padding.
    length_buckets: int = 0
    # Stateful mode: each video is cut into consecutive windows that reach the same rank and
    # worker in order; the RNN state is carried (detached) from one window to the next.
    ordered: bool = False
    augment: AugmentConfig = field(default_factory=AugmentConfig)  # train-time, per sequence
    # The shards hold per-frame features (distseq features' shards), not frames: the backbone is
    # not built, and model.backbone names the one that made them (its feature size must match).
    features: bool = False

    def __post_init__(self) -> None:
        _check(self.window >= 0, "data.window", self.window, "must be >= 0 (0: whole videos)")
        _check(self.size >= 16, "data.size", self.size, "must be >= 16")
        _check(self.batch_size >= 1, "data.batch_size", self.batch_size, "must be >= 1")
        _check(self.num_workers >= 0, "data.num_workers", self.num_workers, "must be >= 0")
        _check(self.shuffle_buffer >= 1, "data.shuffle_buffer", self.shuffle_buffer, "must be >= 1")
        _check(
            self.on_error in ON_ERROR, "data.on_error", self.on_error, f"must be one of {ON_ERROR}"
        )
        _check(self.frame_stride >= 1, "data.frame_stride", self.frame_stride, "must be >= 1")
        _check(
            not (self.length_buckets and not self.window),
            "data.length_buckets",
            self.length_buckets,
            "buckets windows by length: it needs data.window >= 1 (0 gives whole videos)",
        )
        _check(
            0 <= self.length_buckets <= self.window,
            "data.length_buckets",
            self.length_buckets,
            f"must be in [0, data.window={self.window}]",
        )
        _check(
            not (self.ordered and self.length_buckets),
            "data.length_buckets",
            self.length_buckets,
            "must be 0 with data.ordered=true: a lane of windows cannot wait for a bucket",
        )
        _check(
            not (self.ordered and not self.window),
            "data.ordered",
            self.ordered,
            "cuts videos into windows: it needs data.window >= 1",
        )
        _check(
            not (self.train and is_remote(self.train) and not self.manifest),
            "data.manifest",
            self.manifest,
            f"must be set for remote shards (data.train={self.train})",
        )


@dataclass
class BackboneConfig:
    # A torchvision classification model with a final nn.Linear (resnet18, ...), tiny_cnn,
    # timm:NAME (pip install distseq[timm]), or your factory's import path, pkg.module:make_cnn,
    # whose module maps float frames [N, 3, H, W] to features [N, F].
    name: str = "resnet18"
    # A local state_dict file, or a torchvision weights entry (DEFAULT, IMAGENET1K_V1, ...) read
    # from torchvision's cache ($TORCH_HOME/hub/checkpoints); empty: random init.
    weights: str = ""
    norm: Norm = Norm.groupnorm  # BatchNorm's replacement, if any (docs/training.md says why)
    args: dict[str, Any] = field(default_factory=dict)  # keyword arguments of a factory or timm

    def __post_init__(self) -> None:
        _check(
            not self.args or ":" in self.name,
            "model.backbone.args",
            self.args,
            "is for an import path or timm:NAME in model.backbone.name",
        )


@dataclass
class HeadConfig:
    # The temporal model over the per-frame features: lstm, gru, none (a per-frame classifier),
    # mstcn (MS-TCN, Farha and Gall 2019), transformer (local attention), or your factory's import
    # path, pkg.module:make_head, called as make_head(in_features=F, num_classes=K, **args).
    kind: str = Temporal.lstm.value
    hidden: int = 128  # RNN hidden size; MS-TCN's feature maps; the transformer's width
    layers: int = 1  # RNN layers; MS-TCN's layers per stage (dilation 2^i); transformer blocks
    dropout: float = (
        0.0  # between RNN layers and before the classifier; in each TCN/attention layer
    )
    bidirectional: bool = False  # an RNN that sees the future: offline segmentation only
    # mstcn, transformer: no frame sees the future (TeCNO's left-padded convolutions, attention
    # to earlier frames only), for online recognition. An RNN is causal unless bidirectional.
    causal: bool = False
    stages: int = 4  # mstcn: stages, each refining the softmax of the one before
    span: int = 128  # transformer: a frame attends to the frames less than this far away
    attention_heads: int = 4  # transformer: attention heads; they divide model.head.hidden
    # 0: PyTorch's initialisation. N: chrono initialisation (Tallec and Ollivier, 2018) for
    # dependencies of up to N frames: the RNN starts out remembering, not forgetting.
    chrono_frames: int = 0
    args: dict[str, Any] = field(default_factory=dict)  # keyword arguments of a factory

    def __post_init__(self) -> None:
        kinds = [t.value for t in Temporal]
        _check(
            self.kind in kinds or is_import_path(self.kind),
            "model.head.kind",
            self.kind,
            f"must be one of {kinds} or an import path, pkg.module:make_head",
        )
        _check(
            not self.args or is_import_path(self.kind),
            "model.head.args",
            self.args,
            "is for an import path in model.head.kind",
        )
        _check(self.hidden >= 1, "model.head.hidden", self.hidden, "must be >= 1")
        _check(
            self.chrono_frames == 0 or self.chrono_frames >= 2,
            "model.head.chrono_frames",
            self.chrono_frames,
            "must be 0, or >= 2",
        )
        _check(self.layers >= 1, "model.head.layers", self.layers, "must be >= 1")
        _check(0.0 <= self.dropout < 1.0, "model.head.dropout", self.dropout, "must be in [0, 1)")
        _check(self.stages >= 1, "model.head.stages", self.stages, "must be >= 1")
        _check(self.span >= 1, "model.head.span", self.span, "must be >= 1")
        _check(
            self.attention_heads >= 1
            and (
                self.kind != Temporal.transformer.value or self.hidden % self.attention_heads == 0
            ),
            "model.head.attention_heads",
            self.attention_heads,
            f"must be >= 1 and divide model.head.hidden={self.hidden}",
        )

    def misplaced(self) -> list[str]:
        """The options set for a head kind other than this one, each as ``key=value (kinds)``:
        a mistake, not a no-op. The config names them all at once (``Config``), with the memory
        keys of another head, so that switching a config's head takes one run, not one a key."""
        default = HeadConfig.__dataclass_fields__
        found = []
        for key, owners in (
            ("bidirectional", RNNS),
            ("chrono_frames", RNNS),
            ("causal", STATELESS),
            ("stages", (Temporal.mstcn.value,)),
            ("span", (Temporal.transformer.value,)),
            ("attention_heads", (Temporal.transformer.value,)),
        ):
            value = getattr(self, key)
            if value != default[key].default and self.kind not in owners:
                why = "; an RNN is causal unless bidirectional" if key == "causal" else ""
                found.append(f"model.head.{key}={value!r} ({' or '.join(owners)}{why})")
        return found


@dataclass
class ModelConfig:
    backbone: BackboneConfig = field(default_factory=BackboneConfig)  # the per-frame CNN
    head: HeadConfig = field(default_factory=HeadConfig)  # the temporal head and classifier
    # torch.compile the backbone (memory.ChunkedModel.compile_backbone) with this backend;
    # aot_eager traces without generating code, to check that a model compiles.
    compile: bool = False
    compile_backend: str = "inductor"


@dataclass
class MemoryConfig:
    recompute: Recompute = Recompute.torch  # the checkpoint implementation, or none
    chunk_frames: int = 8  # frames per checkpointed backbone chunk
    tbptt_frames: int = 0  # 0: backprop through the whole sequence; N: detach RNN state every N
    # The last N frames of a sequence hold their CNN activations instead of recomputing them.
    keep_frames: int = 0
    offload: Offload = Offload.none  # frames: a batch's frames stay in host memory
    # Device memory for a training step ("40GB", or "0.5" of the device): at chunk_frames (or
    # smaller, where even the floor does not fit), the plan picks for each T the chunks kept
    # whole and the CNN stages each other chunk holds, to recompute as little as fits; chosen
    # once at the run's start and recorded in plan.json. "": no plan.
    budget: str = ""

    def __post_init__(self) -> None:
        _check(self.chunk_frames >= 1, "memory.chunk_frames", self.chunk_frames, "must be >= 1")
        _check(self.tbptt_frames >= 0, "memory.tbptt_frames", self.tbptt_frames, "must be >= 0")
        _check(self.keep_frames >= 0, "memory.keep_frames", self.keep_frames, "must be >= 0")
        if self.budget:
            parse_budget(self.budget)
            _check(
                self.recompute is not Recompute.none,
                "memory.budget",
                self.budget,
                "needs memory.recompute torch or fairscale: with none, nothing is recomputed",
            )
            _check(
                self.keep_frames == 0,
                "memory.keep_frames",
                self.keep_frames,
                "must be 0 with memory.budget: the plan sets it",
            )


@dataclass
class ParallelConfig:
    mode: ParallelMode = ParallelMode.fsdp  # FSDP2 fully_shard, DDP, or one process
    precision: Precision = Precision.auto  # compute precision; gradients reduce in fp32
    # How long a rank waits in a collective (and for the group to form) before it gives up: a
    # lost node or link ends the run in this time, not in torch's 30 minutes.
    timeout_s: float = 300.0
    # S > 1: each sequence's frames split across S consecutive ranks (parallel/sequence.py).
    sequence: int = 1

    def __post_init__(self) -> None:
        _check(self.timeout_s > 0, "parallel.timeout_s", self.timeout_s, "must be > 0")
        _check(self.sequence >= 1, "parallel.sequence", self.sequence, "must be >= 1")
        _check(
            not (self.precision is Precision.bf16 and self.mode is not ParallelMode.fsdp),
            "parallel.precision",
            self.precision.value,
            f"bf16 needs parallel.mode=fsdp, not {self.mode.value}",
        )


@dataclass
class ParamGroup:
    """The parameters whose names begin with ``prefix`` (``backbone``, ``head``, ``head.rnn``,
    ``backbone.layer4``: a name or its dotted beginning), trained at their own learning rate and
    weight decay; a parameter under several prefixes goes with the longest."""

    prefix: str = ""
    lr_scale: float = 1.0  # times optim.lr, under the same schedule
    weight_decay: float | None = None  # None: optim.weight_decay
    # N > 0: the group does not change through step N (no update, no optimizer state, its
    # BatchNorm statistics kept), then trains, its learning rate warming up linearly over
    # warmup_steps steps.
    frozen_until: int = 0
    warmup_steps: int = 0

    def __post_init__(self) -> None:
        _check(bool(self.prefix), "optim.groups.prefix", self.prefix, "must name a prefix")
        _check(
            self.frozen_until >= 0, "optim.groups.frozen_until", self.frozen_until, "must be >= 0"
        )
        _check(
            self.warmup_steps >= 0, "optim.groups.warmup_steps", self.warmup_steps, "must be >= 0"
        )
        _check(self.lr_scale >= 0, "optim.groups.lr_scale", self.lr_scale, "must be >= 0")
        _check(
            self.weight_decay is None or self.weight_decay >= 0,
            "optim.groups.weight_decay",
            self.weight_decay,
            "must be >= 0 (or null: optim.weight_decay)",
        )


@dataclass
class OptimConfig:
    lr: float = 1e-3  # AdamW's peak learning rate
    weight_decay: float = 0.01  # AdamW's
    warmup_steps: int = 10  # linear warm-up, then cosine decay to 0 at train.steps
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    accum_steps: int = 1  # micro-batches per optimizer step
    # Parameter groups by name prefix, each with its learning-rate scale and weight decay, e.g.
    # [{prefix: backbone, lr_scale: 0.1}]: the pretrained CNN moves at a tenth of the head's pace.
    groups: list[ParamGroup] = field(default_factory=list)

    def __post_init__(self) -> None:
        _check(self.lr > 0, "optim.lr", self.lr, "must be > 0")
        _check(self.weight_decay >= 0, "optim.weight_decay", self.weight_decay, "must be >= 0")
        _check(self.warmup_steps >= 0, "optim.warmup_steps", self.warmup_steps, "must be >= 0")
        _check(self.grad_clip >= 0, "optim.grad_clip", self.grad_clip, "must be >= 0")
        _check(self.accum_steps >= 1, "optim.accum_steps", self.accum_steps, "must be >= 1")
        prefixes = [g.prefix for g in self.groups]
        _check(
            len(set(prefixes)) == len(prefixes),
            "optim.groups",
            prefixes,
            "names a prefix twice: give each prefix once",
        )


CLASS_WEIGHTS = ("none", "median_frequency")


@dataclass
class LossConfig:
    """Per-frame cross-entropy over labelled frames, summed over a multi-stage head's stages."""

    # none; median_frequency: median(f) / f_c from the training shards' label counts (f_c the
    # fraction of labelled frames of class c), as Cholec80's papers weight their phases; or a
    # list, one weight per class. Weighted, the loss is a mean over the weights of the labelled
    # frames, as torch's cross_entropy(weight=...) is.
    class_weights: Any = "none"
    # MS-TCN's smoothing term's weight (0.15 in its paper; 0: off): the mean over consecutive
    # real frames of the squared difference of their log-probabilities, each class's truncated
    # at smoothing_clip ** 2, the earlier frame's held constant, as MS-TCN's code computes it.
    smoothing: float = 0.0
    smoothing_clip: float = 4.0  # MS-TCN's tau: squared differences stop at 16

    def __post_init__(self) -> None:
        weights = self.class_weights
        if isinstance(weights, str):
            _check(
                weights in CLASS_WEIGHTS,
                "loss.class_weights",
                weights,
                f"must be one of {CLASS_WEIGHTS} or a list of weights, one per class",
            )
        else:
            _check(
                isinstance(weights, list)
                and bool(weights)
                and all(isinstance(w, int | float) and not isinstance(w, bool) for w in weights)
                and all(w >= 0 for w in weights)
                and any(w > 0 for w in weights),
                "loss.class_weights",
                weights,
                "must be a list of numbers >= 0, one per class, not all 0",
            )
        _check(self.smoothing >= 0, "loss.smoothing", self.smoothing, "must be >= 0")
        _check(self.smoothing_clip > 0, "loss.smoothing_clip", self.smoothing_clip, "must be > 0")


@dataclass
class TrainConfig:
    steps: int = 100  # optimizer steps
    seed: int = 0  # of the model's initialisation and the data order
    out_dir: str = "runs/default"  # config.yaml, metrics, TensorBoard and checkpoints
    log_every: int = 10  # steps between metrics records
    eval_every: int = 0  # 0: evaluate only at the end
    save_every: int = 0  # checkpoint every N steps; 0: only at the end
    keep_last: int = 3  # checkpoints kept on disk, newest first, and the best beside them
    # Model selection: "max val_<score>" or "min val_loss", the validation that picks the
    # checkpoint which export, predict, features, eval, report and init_from take; "": the last
    # step's.
    select: str = "max val_accuracy"
    # Stop (with a checkpoint) once this many validations in a row have not beaten the best;
    # 0: never.
    patience: int = 0
    # Weight averaging: the decay of an exponential moving average of the parameters, which
    # validation, selection and export then use in place of the trained weights; 0: off.
    ema: float = 0.0
    # Stop (with a checkpoint) after this step, as a preempted job would; the LR schedule still
    # runs to train.steps, so resuming continues the very same run. 0: run to train.steps.
    stop_after: int = 0
    # A SLURM job requeues itself on preemption or timeout at most this many times.
    max_requeues: int = 10
    # A new run's first parameters: run directories, checkpoints or exported model.pt files,
    # loaded by key in order before the first step (never over a resume); train/warm_start.py.
    # SOURCE:PREFIXES takes only the keys under those (comma-separated) prefixes, e.g.
    # runs/frames:backbone.
    init_from: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        _check(self.steps >= 1, "train.steps", self.steps, "must be >= 1")
        _check(self.log_every >= 1, "train.log_every", self.log_every, "must be >= 1")
        _check(self.eval_every >= 0, "train.eval_every", self.eval_every, "must be >= 0")
        _check(self.save_every >= 0, "train.save_every", self.save_every, "must be >= 0")
        _check(self.keep_last >= 1, "train.keep_last", self.keep_last, "must be >= 1")
        _check(self.stop_after >= 0, "train.stop_after", self.stop_after, "must be >= 0")
        _check(self.max_requeues >= 0, "train.max_requeues", self.max_requeues, "must be >= 0")
        _check(
            not self.select or re.fullmatch(r"(max|min) val_\S+", self.select) is not None,
            "train.select",
            self.select,
            "must be 'max val_<score>' (e.g. 'max val_jaccard') or 'min val_loss', or '' for "
            "the last step",
        )
        _check(self.patience >= 0, "train.patience", self.patience, "must be >= 0")
        _check(0 <= self.ema < 1, "train.ema", self.ema, "must be in [0, 1) (0: off; e.g. 0.999)")
        _check(
            not self.patience or bool(self.select),
            "train.patience",
            self.patience,
            "counts validations that do not beat train.select's best: set train.select",
        )
        _check(
            not self.patience or bool(self.eval_every),
            "train.patience",
            self.patience,
            "counts validations, and train.eval_every=0 validates only at the end: set "
            "train.eval_every",
        )
        for entry in self.init_from:
            source, _ = init_source(entry)
            _check(Path(source).exists(), "train.init_from", source, "does not exist")


_KEY_PREFIXES = re.compile(r"[A-Za-z_][\w.]*(,[A-Za-z_][\w.]*)*")


def init_source(entry: str) -> tuple[str, list[str]]:
    """A ``train.init_from`` entry's source and the key prefixes it is limited to (none: all)."""
    source, colon, prefixes = entry.rpartition(":")
    if colon and source and _KEY_PREFIXES.fullmatch(prefixes):
        return source, prefixes.split(",")
    return entry, []


# What acts on the backbone or the frames, of which a run on feature shards (data.features) has
# neither: set to anything but its default there, each is refused.
NOT_WITH_FEATURES = (
    "memory.budget",
    "memory.keep_frames",
    "memory.offload",
    "memory.tbptt_frames",
    "model.compile",
    "data.augment",
)


def dotted(cfg: object, key: str) -> Any:
    """The value of a dotted key (``memory.budget``) of a config or one of its sections."""
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)  # shards and how they are read
    model: ModelConfig = field(default_factory=ModelConfig)  # the network
    memory: MemoryConfig = field(default_factory=MemoryConfig)  # how it runs over time
    parallel: ParallelConfig = field(default_factory=ParallelConfig)  # how it runs across ranks
    loss: LossConfig = field(default_factory=LossConfig)  # what the model is trained to lower
    optim: OptimConfig = field(default_factory=OptimConfig)  # AdamW and its schedule
    train: TrainConfig = field(default_factory=TrainConfig)  # the run: steps, logs, checkpoints

    def __post_init__(self) -> None:
        if self.data.features:
            default = Config()
            for key in NOT_WITH_FEATURES:
                value = dotted(self, key)
                shown = value.value if isinstance(value, Enum) else value  # 'frames', not <...>
                _check(
                    value == dotted(default, key),
                    key,
                    shown,
                    "does not apply with data.features=true",
                )
        causal = not self.model.head.bidirectional
        _check(
            causal or not self.data.ordered,
            "data.ordered",
            self.data.ordered,
            "carries the RNN state forward, so it needs model.head.bidirectional=false",
        )
        _check(
            causal or not self.memory.tbptt_frames,
            "memory.tbptt_frames",
            self.memory.tbptt_frames,
            "truncated BPTT needs a causal head (model.head.bidirectional=false)",
        )
        _check(
            not self.data.ordered or self.model.head.kind not in STATELESS,
            "data.ordered",
            self.data.ordered,
            f"carries a head's state across windows, and model.head.kind={self.model.head.kind} "
            "carries none: give it whole videos (data.window=0) or windows",
        )
        _check(
            not self.train.patience or bool(self.data.val),
            "train.patience",
            self.train.patience,
            "counts validations, and there is no data.val to validate on",
        )
        misplaced = self.model.head.misplaced()
        tbptt = self.memory.tbptt_frames
        if tbptt and self.model.head.kind not in RNNS:
            misplaced.append(f"memory.tbptt_frames={tbptt} ({' or '.join(RNNS)})")
        _check(
            not misplaced,
            "model.head.kind",
            self.model.head.kind,
            f"these keys are for another head, unset them: {', '.join(misplaced)}",
        )
