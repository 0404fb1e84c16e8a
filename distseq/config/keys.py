"""What each config key means, for people: the manual's configuration page (docs/config.md)
and ``distseq config --keys`` are made from these and the schema's defaults, and the tests check
that every key of the schema has its line here and no line names a key it lacks
(tests/test_config.py)."""

from __future__ import annotations

import dataclasses
import re
from enum import Enum

from distseq.config.schema import Config

# Required keys have no default worth showing.
REQUIRED = ("data.train",)

DOCS: dict[str, str] = {
    "data.train": (
        "training shards: the folder `distseq shard` wrote (`shards/`: its `index.json` says "
        "which are the train shards), a glob (`'shards/train-*.tar'`) or a brace pattern "
        "(`shards/train-{000000..000099}.tar`), several joined by `::`; also `file:`, `pipe:` "
        "and http(s) URLs"
    ),
    "data.val": (
        "validation shards, given as `data.train`'s (a folder: its val shards); empty: no "
        "validation"
    ),
    "data.manifest": "the shards' `index.json`; empty: the one beside the first train shard",
    "data.window": (
        "T, frames per training window; longer sequences get a random window (ordered mode: "
        "consecutive windows); 0: whole videos, one sequence each (`memory.budget` then plans "
        "for the longest training video, read from the shards' headers, and says what it costs "
        "when it does not fit)"
    ),
    "data.size": "frames are resized to size x size",
    "data.batch_size": "sequences per rank per micro-step",
    "data.num_workers": "loader processes per rank",
    "data.shuffle_buffer": "samples in the shuffle buffer",
    "data.on_error": (
        "a bad sample stops the run (`raise`) or is skipped and counted (`skip`, the "
        "`skipped_samples` metric, summed over ranks)"
    ),
    "data.frame_stride": (
        "keep every Nth stored frame (and label), e.g. shards at 5 fps trained at 1 fps"
    ),
    "data.length_buckets": (
        "N > 0: windows shorter than `data.window` are batched only with others in the same of "
        "N length buckets, so less padding; 0: off. Not with `data.ordered`"
    ),
    "data.ordered": (
        "stateful mode: each video's consecutive windows go to the same rank, worker and batch "
        "row in order, and the RNN state is carried across them ([docs/data.md]"
        "(data.md#long-videos-random-windows-or-ordered-mode))"
    ),
    "data.augment.crop_scale": (
        "random crop of [crop_scale, 1] of the frame area, then resized; 1: no crop"
    ),
    "data.augment.flip": "horizontal flip with probability 0.5",
    "data.augment.brightness": "brightness factor drawn from [1 - x, 1 + x]; 0: off",
    "data.augment.contrast": "contrast factor drawn from [1 - x, 1 + x]; 0: off",
    "data.augment.saturation": "saturation factor drawn from [1 - x, 1 + x]; 0: off",
    "data.features": (
        "the shards are feature shards (`distseq features`): the backbone is not built and the "
        "head trains alone on the stored features, with the same loss, validation, metrics, "
        "checkpoints, TensorBoard, `eval` and `report`; `model.backbone.name` names the CNN "
        "that made them (its feature size must be the shards'; its weights are not read). "
        "`memory.budget`, `.keep_frames`, `.offload`, `.tbptt_frames`, `model.compile` and "
        "augmentation have nothing to act on and are refused; frame shards are refused, and "
        "feature shards without it. `predict` and `features` refuse such a model (it has no "
        "backbone): score it with `eval` on feature shards"
    ),
    "model.backbone.name": (
        "any torchvision classification CNN with a final `Linear`: resnet18/50, convnext_tiny, "
        "efficientnet_b0, regnet, mobilenet, ...; `tiny_cnn`, distseq's two-layer CNN for demos"
        " and tests (32 features); `timm:NAME`, a timm model without its classifier, with its "
        "own mean and std (`pip install 'distseq[timm]'`); or your factory's import path, "
        "`pkg.module:make_cnn`, whose module maps float frames [N, 3, H, W] to [N, F] "
        "([docs/library.md](library.md))"
    ),
    "model.backbone.weights": (
        "a local `state_dict` file (any backbone; a timm file's classifier keys are left out), "
        "`pretrained` for a timm model (its default weights from the Hugging Face cache, "
        "`$HF_HOME/hub`), or the name of one of the backbone's torchvision weights (`DEFAULT`, "
        "`IMAGENET1K_V1`, ...), read from torchvision's own cache "
        "(`$TORCH_HOME/hub/checkpoints`, by default `~/.cache/torch/hub/checkpoints`) and "
        "fetched only if it is not there; on a machine without network, put the file there (the"
        " error names it). The norm policy applies after the weights, so `frozen_bn` keeps "
        "their statistics. Empty: random init"
    ),
    "model.backbone.norm": (
        "`groupnorm`, `frozen_bn` or `batchnorm` ([docs/training.md]"
        "(training.md#why-the-default-norm-is-not-batchnorm))"
    ),
    "model.backbone.args": (
        "keyword arguments of an import path's factory or of `timm.create_model`"
    ),
    "model.head.kind": (
        "`lstm`, `gru`, `none` (per-frame classifier), `mstcn` (MS-TCN; with `causal`, TeCNO's "
        "causal TCN), `transformer` (local attention; see [docs/training.md, temporal "
        "heads](training.md#temporal-heads-and-losses)), or your factory's import path, "
        "`pkg.module:make_head`, called as `make_head(in_features=F, num_classes=K, "
        "**model.head.args)`; its module maps (features [B, T, F], mask [B, T]) to logits [B, "
        "T, K] (or [S, B, T, K], one per stage, the last the prediction), and carries state "
        "(`data.ordered`) if its forward takes `state` (`examples/tcn_head.py`)"
    ),
    "model.head.hidden": (
        "the RNN's hidden size; MS-TCN's feature maps (64 in its paper); the transformer's width"
    ),
    "model.head.layers": (
        "RNN layers; MS-TCN's layers per stage (10 in its paper; layer i has dilation 2^i); "
        "transformer blocks"
    ),
    "model.head.dropout": (
        "dropout between RNN layers and before the classifier; in each MS-TCN layer (0.5 in its"
        " paper) and transformer block"
    ),
    "model.head.bidirectional": (
        "an RNN that sees the future: for offline segmentation; causal by default"
    ),
    "model.head.causal": (
        "`mstcn`, `transformer`: no frame sees the future (left-padded convolutions, attention "
        "to earlier frames only), for online recognition. Like `stages`, `span` and "
        "`attention_heads` (and `bidirectional`, for the RNNs), refused with another kind: an "
        "option that would change nothing is a mistake"
    ),
    "model.head.stages": "`mstcn`: stages, each refining the softmax of the one before",
    "model.head.span": (
        "`transformer`: a frame attends to the frames less than this far away (only earlier "
        "ones when causal)"
    ),
    "model.head.attention_heads": "`transformer`: attention heads; they divide `model.head.hidden`",
    "model.head.chrono_frames": (
        "N >= 2: chrono initialisation for dependencies up to N frames (the biases of the "
        "LSTM's forget gate or the GRU's update gate drawn as log U(1, N-1)), so that the RNN "
        "starts out remembering; 0: PyTorch's initialisation"
    ),
    "model.head.args": "keyword arguments of an import path's factory",
    "model.compile": (
        "`torch.compile` the backbone, in place (parameter names unchanged), with its batch "
        "dimension dynamic from the first call, so that every chunk size (a sequence's last "
        "chunk, padding) runs one graph; works with every `memory.recompute`, "
        "`memory.keep_frames`, `memory.offload`, FSDP2 and DDP, and a `memory.budget` plan "
        "measures the compiled backbone but keeps whole chunks only (stages are not held: their"
        " hooks do not reach into a compiled graph). `metrics.jsonl` records `compiled_graphs`;"
        " more than dynamo's recompile limit (8) fails the run instead of falling back to "
        "eager. Gradients: with `aot_eager` equal to eager's; with inductor on this CPU within "
        "1.5e-5 of the plain model's (relative to a gradient's largest value) for a small "
        "ResNet-18 at 32 px, but **1.1% off** a float64 reference in layer2 of ResNet-18 "
        "(GroupNorm) at 64 px, where eager mode is within 1e-5: check `bench compare --compile "
        "inductor`'s `exact` column on your device before training with it. On this CPU "
        "compiled steps were slower than eager ([docs/benchmarks.md]"
        "(benchmarks.md#approaches-compared))"
    ),
    "model.compile_backend": (
        "the `torch.compile` backend; `aot_eager` traces without generating code (to check that"
        " a model compiles)"
    ),
    "memory.recompute": (
        "how a chunk's activations are recomputed in backward: `torch` (non-reentrant "
        "checkpoint), `fairscale` (its checkpoint function) or `none` (keep them all: the plain"
        " model's memory)"
    ),
    "memory.chunk_frames": (
        "k, frames per checkpointed CNN chunk; under `memory.budget` the plan's chunk size too "
        "(smaller only where even every chunk recomputed does not fit, and never changed after "
        "a run's first start)"
    ),
    "memory.tbptt_frames": (
        "0: gradients through the whole sequence; N: detach the RNN state every N frames"
    ),
    "memory.keep_frames": (
        "the chunks of the last N frames of a sequence hold their activations instead of "
        "recomputing them: backward frees them before the first recompute, so they add memory "
        "only beyond what one recomputed chunk takes"
    ),
    "memory.offload": (
        "`frames`: a training batch's uint8 frames stay in host memory (pinned on a GPU) and "
        "each chunk is copied to the device for its forward and again for its recompute, one "
        "chunk ahead on a side stream so that the copy overlaps the chunk before it, so device "
        "memory no longer grows with T by the frames (224 px: 150 KB a frame); rank 0 prints "
        "the host memory it takes. The plan counts them off the device"
    ),
    "memory.budget": (
        "device memory for training, `40GB`, `512MiB`, or `0.5` of the GPU: a probe measures "
        "the run's model on a few frames at `memory.chunk_frames` and the plan sets, for each "
        "T, which chunks are kept whole and which hold their late CNN stages, to recompute as "
        "little as fits ([docs/training.md](training.md#fitting-a-memory-budget)); the plan "
        "is chosen once, at the run's start, and recorded "
        "in `plan.json` for every resume; a budget that cannot hold `data.window` frames even "
        "at the smallest chunk is refused before training, with the largest window that fits. "
        "Needs `memory.recompute=torch` to hold stages (with `fairscale` it keeps whole chunks "
        "only). Empty: no plan"
    ),
    "parallel.mode": "`fsdp` (FSDP2 `fully_shard`), `ddp` or `none`",
    "parallel.precision": (
        "`auto` (bf16 compute with fp32 reduction on GPU, fp32 on CPU), `bf16` or `fp32`"
    ),
    "parallel.sequence": (
        "S > 1 splits every sequence's frames across S consecutive ranks (one node's first): "
        "each runs the CNN over its own slice, cut on chunk boundaries, and the head sees the "
        "whole sequence; the S ranks share one `data.batch_size`, so 2 ranks at S=2 train as "
        "one process. For videos longer than one GPU's memory holds, or more GPUs than videos "
        "in a step ([docs/sequence.md](sequence.md)). S must divide the ranks, and "
        "`data.window` hold S chunks"
    ),
    "parallel.timeout_s": (
        "how long a rank waits in a collective, or for the group to form, before it stops with "
        "an error: a lost node or link ends the run in this time, not torch's 30 minutes"
    ),
    "loss.class_weights": (
        "per-class weights of the cross-entropy: `none`, `median_frequency` (median(f) / f_c, "
        "f_c the fraction of the training shards' labelled frames of class c, from the label "
        "counts in their `index.json`, as Cholec80 papers weight their phases), or a list, one "
        "weight per class in the order of `index.json`'s classes. Weighted, the loss is a mean "
        "over the weights of the labelled frames, as torch's `cross_entropy(weight=...)` is; "
        "unlabelled frames never count"
    ),
    "loss.smoothing": (
        "MS-TCN's smoothing term's weight (0.15 in its paper; 0: off): the mean over "
        "consecutive real frames of the squared difference of their log-probabilities, the "
        "earlier frame held constant, each class's truncated at `smoothing_clip`^2"
    ),
    "loss.smoothing_clip": "MS-TCN's tau: squared differences stop at tau^2 = 16",
    "optim.lr": "AdamW peak learning rate",
    "optim.weight_decay": "AdamW weight decay",
    "optim.warmup_steps": "linear warm-up, then cosine decay to 0 at `train.steps`",
    "optim.grad_clip": "max global gradient norm; 0 disables clipping",
    "optim.accum_steps": "micro-batches per optimizer step",
    "optim.groups": (
        "parameter groups by name prefix, each `{prefix, lr_scale: 1.0, weight_decay: null, "
        "frozen_until: 0, warmup_steps: 0}`: the parameters whose names begin with `prefix` (a "
        "name or its dotted beginning: `backbone`, `head`, `head.rnn`, `backbone.layer4`; the "
        "longest prefix wins) train at `optim.lr x lr_scale` under the same schedule, with "
        "their own weight decay (null: `optim.weight_decay`). `'optim.groups=[{prefix: "
        "backbone, lr_scale: 0.1}]'` moves a pretrained CNN at a tenth of the head's pace. "
        "`frozen_until: N` keeps the group as it is through step N (no update, no AdamW state, "
        "its BatchNorm statistics used but not updated), then trains it, its learning rate "
        "rising linearly over its own `warmup_steps`: `'optim.groups=[{prefix: head, "
        "frozen_until: 200, warmup_steps: 100}]'` lets an end-to-end stage adapt the CNN to a "
        "head warm-started from features before the head moves. A resume across the unfreeze is"
        " bit-exact. While the whole backbone is frozen it runs without autograd: no CNN "
        "activation is kept or recomputed and no backward reaches it (a step's peak 14x "
        "smaller, ResNet-18 at 32 px). A group frozen through `train.steps` gets no gradients "
        "at all, and the memory plan counts no AdamW state for it; other frozen parts (a head "
        "while the CNN trains) still have their gradients computed, then dropped, and a part "
        "that unfreezes is planned as training. A prefix that names no parameter is refused, "
        "naming the model's top-level names; `distseq.param_groups` gives the same groups to an"
        " optimizer of your own ([docs/library.md](library.md))"
    ),
    "train.steps": "optimizer steps",
    "train.seed": "seeds the model init and the data order",
    "train.out_dir": "where metrics and checkpoints go",
    "train.log_every": "steps between metrics records",
    "train.eval_every": "steps between validations; 0: only at the end",
    "train.save_every": "steps between checkpoints; 0: only at the end",
    "train.keep_last": (
        "checkpoints kept on disk, the last ones; the best one (`train.select`) besides"
    ),
    "train.select": (
        "model selection: `max val_<score>` (any score validation logs: `val_accuracy`, "
        "`val_jaccard`, `val_edit`, `val_f1@50`, ...) or `min val_loss`; the "
        "checkpoint of the best validation (ties: the earliest) is kept, and `export`, "
        "`predict`, `features`, `eval`, `report` and `train.init_from` take it from a run "
        "directory, each saying its step (`checkpoints/latest` is the last step's). A warm start "
        '(`train.init_from`) is validated at step 0 too. `""`: the last step\'s, as without '
        "`data.val`"
    ),
    "train.ema": (
        "weight averaging: the decay d of an exponential moving average of the parameters "
        "(after each step, average = d average + (1 - d) parameters; e.g. 0.999), sharded "
        "like them under FSDP2 and saved in every checkpoint; validation, `train.select`, "
        "`export`, `predict`, `eval` and `report` use it in place of the trained weights; 0: off"
    ),
    "train.patience": (
        "stop early, with a checkpoint, once this many validations in a row have not beaten "
        "the best; a relaunch of a run that stopped so ends at once; 0: never"
    ),
    "train.stop_after": (
        "stop with a checkpoint after this step, schedule unchanged (as a preempted job would);"
        " 0: run to `train.steps`"
    ),
    "train.max_requeues": (
        "a SLURM job that gets the time-limit signal requeues itself at most this many times"
    ),
    "train.init_from": (
        "a new run's first parameters: run directories, checkpoints or exported `model.pt` "
        "files, loaded by key in order (a later one over an earlier), before the first step and"
        " never over a resume; one line per source says what it loaded and what it left; a key "
        "whose shape differs is refused, naming it. One value is a list of one "
        "(`train.init_from=runs/a`). `SOURCE:PREFIXES` takes only the keys under those "
        "comma-separated prefixes: `train.init_from=[runs/frames:backbone,runs/head]` takes the"
        " backbone of a per-frame run (whose classifier has another shape) and the head of a "
        "features run"
    ),
}


def key_values(cfg: Config | None = None) -> list[tuple[str, object]]:
    """Every key of the schema with its value in ``cfg`` (default: the defaults), in order."""

    def leaves(node: object, prefix: str) -> list[tuple[str, object]]:
        found: list[tuple[str, object]] = []
        for f in dataclasses.fields(node):  # type: ignore[arg-type]
            value = getattr(node, f.name)
            if dataclasses.is_dataclass(value):
                found += leaves(value, f"{prefix}{f.name}.")
            else:
                found.append((f"{prefix}{f.name}", value))
        return found

    return leaves(cfg or Config(), "")


def shown(key: str, value: object) -> str:
    """A value as the reference shows it: YAML's spelling, in backticks where it is text."""
    if key in REQUIRED:
        return "(required)"
    if isinstance(value, Enum):
        return f"`{value.value}`"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "`null`"
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    if isinstance(value, list | dict):
        return f"`{value}`"
    return str(value)


def reference_table() -> str:
    """The manual's configuration table (docs/config.md): key, default, meaning. Its links are
    relative to docs/."""
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for key, value in key_values():
        lines.append(f"| `{key}` | {shown(key, value)} | {DOCS[key]} |")
    return "\n".join(lines) + "\n"


def plain(text: str) -> str:
    """Markdown as a terminal shows it: no backticks, a link as its text (which names the page)."""
    text = re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", text)
    return text.replace("`", "")
