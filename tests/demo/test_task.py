"""The demo's recall task: the evidence is far from every label it decides, and no single frame
carries the answer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from distseq.data.decode import UNLABELLED
from distseq.data.manifest import find_manifest
from distseq.demo.task import CLASSES, CUE_FRAMES, make_sequence, sequences, write_task

LENGTH, SIZE = 512, 16


def test_the_evidence_is_150_frames_or_more_before_every_label_it_decides() -> None:
    firsts = []
    for i in range(50):
        frames, labels, cue, first = make_sequence(np.random.default_rng(i), LENGTH, SIZE)
        assert frames.shape == (LENGTH, 3, SIZE, SIZE) and frames.dtype == torch.uint8
        answer = labels[-1]
        assert answer in range(len(CLASSES))
        assert first - (cue + CUE_FRAMES - 1) >= 150  # so no 64-frame window holds both
        assert labels[:first] == [UNLABELLED] * first  # the cue's frames too
        assert set(labels[first:]) == {answer}
        # The cue is the only tinted stretch: the channels differ there and nowhere else.
        tinted = (frames[:, 0].float() - frames[:, 2].float()).abs().mean((1, 2)) > 10
        assert tinted.nonzero().flatten().tolist() == list(range(cue, cue + CUE_FRAMES))
        firsts.append(first)
    assert len(set(firsts)) > 10  # positions are drawn, not fixed


def _probe_accuracy(x: torch.Tensor, y: torch.Tensor) -> float:
    """A linear probe on raw pixels, trained on half the frames, scored on the other half."""
    x = (x.flatten(1).float() - 128) / 64
    half = len(x) // 2
    probe = torch.nn.Linear(x.shape[1], len(CLASSES))
    opt = torch.optim.Adam(probe.parameters(), lr=1e-2)
    for _ in range(200):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(probe(x[:half]), y[:half]).backward()
        opt.step()
    with torch.no_grad():
        return float((probe(x[half:]).argmax(-1) == y[half:]).float().mean())


def test_a_frame_alone_says_nothing_about_its_label() -> None:
    memory, cues, answers = [], [], []
    for _, frames, labels in sequences("train", 120, LENGTH, SIZE, seed=0):
        memory.append(frames[-10:])  # labelled with the answer
        tinted = (frames[:, 0].float() - frames[:, 2].float()).abs().mean((1, 2)) > 10
        cues.append(frames[tinted][:10])
        answers.append(labels[-1])
    y = torch.tensor(answers).repeat_interleave(10)
    at_chance = _probe_accuracy(torch.cat(memory), y)
    assert abs(at_chance - 1 / len(CLASSES)) < 0.06, at_chance
    # The probe itself works: on the cue's frames, which show the colour, it finds the answer.
    assert _probe_accuracy(torch.cat(cues), y) > 0.95


def test_too_short_a_sequence_is_refused() -> None:
    with pytest.raises(ValueError, match="a sequence needs at least 301 frames"):
        make_sequence(np.random.default_rng(0), 300, SIZE)


def test_the_task_is_a_pure_function_of_its_seed() -> None:
    a = list(sequences("val", 3, LENGTH, SIZE, seed=7))
    b = list(sequences("val", 3, LENGTH, SIZE, seed=7))
    for x, y in zip(a, b, strict=True):
        assert x[0] == y[0] and torch.equal(x[1], y[1]) and x[2] == y[2]
    assert not torch.equal(a[0][1], next(sequences("val", 1, LENGTH, SIZE, seed=8))[1])


def test_the_task_s_shards_record_a_frame_rate(tmp_path: Path) -> None:
    # distseq predict makes a video's frames at the rate the training shards record.
    write_task(tmp_path, train=1, val=1, length=301, size=16, seed=0, per_shard=1)
    index = json.loads((tmp_path / "index.json").read_text())
    assert index["fps"] == 1.0 and find_manifest("", str(tmp_path / "index.json"), "x").fps == 1.0
