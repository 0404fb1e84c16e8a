"""The training loss: class weights and MS-TCN's smoothing term, worked out by hand, and their
mean over the global batch whatever the split into micro-batches."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from conftest import random_batch, tiny_config, tiny_model
from distseq.bench.heads import mstcn_code_loss
from distseq.config import LossConfig, load_config
from distseq.data.batch import IGNORE_INDEX, Batch
from distseq.data.manifest import Manifest, ShardInfo
from distseq.errors import ConfigError, ModelError
from distseq.train.loop import train
from distseq.train.loss import Loss, build_loss, median_frequency
from distseq.train.step import train_step


def test_median_frequency_weights_by_hand() -> None:
    # 6 frames of class 0, 2 of class 1, 4 of class 2: frequencies 1/2, 1/6, 1/3, median 1/3.
    weights = median_frequency([6, 2, 4], ["a", "b", "c"])
    assert weights == pytest.approx([2 / 3, 2.0, 1.0])


def test_median_frequency_refuses_a_class_without_frames() -> None:
    with pytest.raises(ConfigError, match="class 'b' has no labelled frame"):
        median_frequency([6, 0, 4], ["a", "b", "c"])


def test_weighted_cross_entropy_by_hand() -> None:
    # Two frames, uniform logits over 2 classes: each frame's loss is log 2, labelled 0 and 1,
    # weights 1 and 3; the third frame is unlabelled. Mean over the weights: (log2 + 3 log2) / 4.
    loss = Loss(LossConfig(), [1.0, 3.0])
    labels = torch.tensor([[0, 1, IGNORE_INDEX]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    logits = torch.tensor([[[0.0, 0.0], [0.0, 0.0], [5.0, -5.0]]])
    counts = loss.counts(labels, mask)
    assert counts.tolist() == [3.0, 4.0, 2.0]  # real frames, summed weights, pairs
    ce, smooth = loss.sums(logits, labels, mask)
    assert float(loss.total(ce, smooth, counts)) == pytest.approx(math.log(2))
    # Frame 1 wrong by a margin: its weight 3 shows in the mean.
    logits[0, 1] = torch.tensor([math.log(3), 0.0])  # p(1) = 1/4
    ce, smooth = loss.sums(logits, labels, mask)
    assert float(loss.total(ce, smooth, counts)) == pytest.approx(
        (math.log(2) + 3 * math.log(4)) / 4
    )


def test_the_smoothing_term_on_three_frames_by_hand() -> None:
    # Log-probabilities: frames 0 and 1 [-log 2, -log 2]; frame 2 [log 3/4, log 1/4]. Pair (0, 1)
    # differs by nothing; pair (1, 2) by log 3/2 and log 1/2. The term is the mean over the 2
    # pairs of the mean over the 2 classes of the squares.
    logits = torch.tensor([[[0.0, 0.0], [0.0, 0.0], [math.log(3), 0.0]]])
    labels = torch.full((1, 3), IGNORE_INDEX)  # no cross-entropy: the term alone
    mask = torch.ones(1, 3, dtype=torch.bool)
    squares = [math.log(1.5) ** 2, math.log(0.5) ** 2]  # 0.1644, 0.4805
    for clip, want in [(4.0, sum(squares) / 2 / 2), (0.5, (squares[0] + 0.25) / 2 / 2)]:
        loss = Loss(LossConfig(smoothing=1.0, smoothing_clip=clip), None)
        ce, smooth = loss.sums(logits, labels, mask)
        assert float(loss.total(ce, smooth, loss.counts(labels, mask))) == pytest.approx(want)


def test_one_video_scores_as_mstcns_code_computes_it() -> None:
    # MS-TCN's train.py's loss (as bench heads' plain loop runs it), one fully labelled video.
    torch.manual_seed(0)
    stages = torch.randn(3, 1, 20, 4, requires_grad=True)
    labels = torch.randint(0, 4, (1, 20))
    mask = torch.ones(1, 20, dtype=torch.bool)
    ref = mstcn_code_loss(stages, labels)
    loss = Loss(LossConfig(smoothing=0.15), None)
    ce, smooth = loss.sums(stages, labels, mask)
    got = loss.total(ce, smooth, loss.counts(labels, mask))
    assert got.item() == pytest.approx(ref.item(), rel=1e-6)
    (ref_grad,) = torch.autograd.grad(ref, stages)
    (grad,) = torch.autograd.grad(got, stages)
    torch.testing.assert_close(grad, ref_grad)


def test_micro_batches_give_the_loss_and_gradients_of_the_whole_batch() -> None:
    # Weighted, smoothed, a multi-stage head, unequal padding and unlabelled frames: the split
    # into micro-batches (as into ranks) must not change the mean.
    loss = Loss(LossConfig(smoothing=0.15), [0.5, 2.0, 1.0])
    batch = random_batch(3, 8, lengths=[8, 5, 3])
    batch.labels[0, 1:4] = IGNORE_INDEX
    parts = [Batch(batch.frames[r], batch.labels[r], batch.mask[r]) for r in ([0], [1, 2])]
    results = []
    for micro in ([batch], parts):
        model = tiny_model("torch", 4, kind="mstcn", stages=2, layers=2)
        value, real = train_step(
            model, torch.optim.SGD(model.parameters(), 0.1), micro, 1, None, loss
        )
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((value, real, grads))
    (whole, real, ref), (split, split_real, got) = results
    assert split == pytest.approx(whole, rel=1e-6) and split_real == real == 16
    for name in ref:  # summed in another order: equal to float32's rounding of the largest
        err = (got[name] - ref[name]).abs().max() / ref[name].abs().max()
        assert err < 1e-5, (name, float(err))


def _manifest(counts: list[int] | None) -> Manifest:
    info = ShardInfo("train", 1, 10, labels=counts)
    return Manifest(["a", "b", "c"], {"train-000000.tar": info}, path=Path("s/index.json"))


def test_build_loss_takes_median_frequency_from_the_manifests_label_counts() -> None:
    manifest = _manifest([6, 2, 4])
    loss = build_loss(
        LossConfig(class_weights="median_frequency"),
        manifest.classes,
        lambda: manifest.label_counts(["train-000000.tar"]),
    )
    assert loss.weights is not None and loss.weights.tolist() == pytest.approx([2 / 3, 2.0, 1.0])


def test_class_weights_of_the_wrong_length_are_one_line() -> None:
    with pytest.raises(ConfigError, match=r"has 2 weights, but the data has 3 classes \(a, b, c\)"):
        build_loss(LossConfig(class_weights=[1.0, 2.0]), ["a", "b", "c"], list)


@pytest.mark.parametrize(
    "value",
    [
        "loss.class_weights=inverse",
        "loss.class_weights=[-1,2]",
        "loss.class_weights=[0,0]",
        "loss.class_weights=[true,false]",
    ],
)
def test_bad_class_weights_are_refused_by_the_config(value: str) -> None:
    with pytest.raises(ConfigError, match=r"loss\.class_weights"):
        load_config(None, ["data.train=s/x.tar", value])


def test_class_weights_from_a_yaml_list(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("data: {train: s/x.tar}\nloss: {class_weights: [1, 2.5], smoothing: 0.15}\n")
    cfg = load_config(path, [])
    assert cfg.loss.class_weights == [1, 2.5] and cfg.loss.smoothing == 0.15


WRONG_HEADS = """
from torch import nn

class Scores(nn.Module):
    def __init__(self, in_features, classes):
        super().__init__()
        self.fc = nn.Linear(in_features, classes)
    def forward(self, feats, mask):
        return self.fc(feats)

def make_head(in_features, num_classes, classes):
    return Scores(in_features, classes)  # num_classes ignored: the user's mistake
"""


@pytest.mark.parametrize("classes", [1, 8])
def test_a_head_with_another_class_count_than_the_data_is_refused(
    classes: int, shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's head that ignores num_classes: [B, T, 1] for the data's 3 classes trained to loss
    0 and 5 extra trained without a word; one line naming both counts, at the first step."""
    (tmp_path / "wrongheads.py").write_text(WRONG_HEADS)
    monkeypatch.syspath_prepend(str(tmp_path))
    head = ["model.head.kind=wrongheads:make_head", f"model.head.args={{classes: {classes}}}"]
    with pytest.raises(ModelError) as e:
        train(load_config(tiny_config(tmp_path, shards), [*head, "data.val="]))
    assert str(e.value) == (
        f"the head returns {classes} class scores a frame (logits of shape [2, 8, {classes}]), "
        "and the data has 3 classes: a head's last dimension is the data's class count, given "
        "to a head's factory as num_classes"
    )
    assert not (tmp_path / "run" / "checkpoints").exists()
