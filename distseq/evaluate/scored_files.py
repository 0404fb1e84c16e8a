"""Prediction files of any model scored against truth files, without the model, as ``distseq
eval --predictions DIR --labels DIR`` does: videos matched by name, every layout of
``data.label_text`` on either side, every metric and protocol of ``metrics.py``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from distseq.data.cholec80 import default_class_order
from distseq.data.label_text import csv_classes, frame_labels, labelled_frames
from distseq.errors import ConfigError, DataError
from distseq.evaluate.judging import Judging, scoring_of
from distseq.score.metrics import count_video, summarize

# How a video's file may be named: <video>-phase.txt (Cholec80), <video>.txt|.csv|.tsv, or
# <video> alone (MS-TCN's predictions); longest first.
SUFFIXES = ("-phase.txt", ".txt", ".csv", ".tsv")


def video_name(path: Path) -> str | None:
    """The video a file is for; None for a file of another kind (eval.json, a PNG)."""
    for suffix in SUFFIXES:
        if path.name.endswith(suffix):
            return path.name[: -len(suffix)]
    return None if "." in path.name else path.name


def video_files(folder: Path, option: str) -> dict[str, Path]:
    if not folder.is_dir():
        raise ConfigError(f"{option} {folder}: not a folder")
    found: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        name = video_name(path)
        if not path.is_file() or path.name.startswith(".") or name is None:
            continue
        if name in found:
            raise DataError(f"{found[name]} and {path} are both for video {name}")
        found[name] = path
    return found


def _class_ids(classes: list[str]) -> dict[str, int]:
    """Each label's id: the class names, and the ids as numbers (0-based) where no name is a
    number, as some prediction files write them."""
    ids = {name: i for i, name in enumerate(classes)}
    if not any(name.isdigit() for name in classes):
        ids |= {str(i): i for i in range(len(classes))}
    return ids


def _ids(labels: dict[int, str], ids: dict[str, int], path: Path, frames: list[int]) -> list[int]:
    out = []
    for frame in frames:
        label = labels[frame]
        if label not in ids:
            raise DataError(
                f"{path}: frame {frame}'s label {label!r} is not a class of the truth files "
                "(pass --mapping with every class)"
            )
        out.append(ids[label])
    return out


def _predicted(path: Path, truth: dict[int, str], stride: int | None) -> dict[int, str]:
    """A prediction file's labels by truth frame. A file that numbers its frames says which
    truth frames it predicts. One that only lists labels in order must have one for each truth
    frame, or, with ``stride`` N (``--prediction-stride``), one for each Nth (frames 0, N, 2N,
    ...): a cut-off file and one at another rate look alike, so anything else is refused rather
    than scored on the frames it happens to reach."""
    labels, numbered = labelled_frames(path)
    if numbered:
        if stride is not None:
            raise ConfigError(
                f"--prediction-stride {stride}: {path} numbers its frames, which say what it "
                "predicts; the option is for files of labels alone"
            )
        return labels
    span = max(truth, default=-1) + 1
    step = stride or 1
    expected = sorted({-(-span // step), span // step})  # the last, partial stride's frame or not
    if len(labels) not in expected:
        hint = (
            f"with --prediction-stride {stride}, {' or '.join(map(str, expected))} are expected"
            if stride
            else "a cut-off file, or predictions at another rate? For a label every Nth truth "
            "frame, give --prediction-stride N"
        )
        raise DataError(
            f"{path}: {len(labels)} labels without frame numbers for the {span} truth frames of "
            f"its video: {hint}"
        )
    return {i * step: label for i, label in labels.items()}


def score_files(
    predictions: Path,
    truth: Path,
    mapping: list[str] | None,
    judging: Judging,
    fps: float | None,
    say: Callable[[str], None],
    stride: int | None = None,
) -> dict[str, object]:
    """The report of the prediction files in ``predictions`` against the truth files in
    ``truth``; ``mapping``: the classes in id order (else a CSV's header, or the truth's names);
    ``fps``: the frame rate of the scored frames (for the relaxed window); ``stride``: truth
    frames per line of a prediction file without frame numbers (:func:`_predicted`); ``say`` gets
    one line for each video missing on either side and each difference in frames."""
    predicted_files = video_files(predictions, "--predictions")
    truth_files = video_files(truth, "--labels")
    for name in sorted(truth_files.keys() - predicted_files.keys()):
        say(f"{name}: no prediction file in {predictions}, left out")
    for name in sorted(predicted_files.keys() - truth_files.keys()):
        say(f"{name}: no truth file in {truth}, left out")
    names = sorted(truth_files.keys() & predicted_files.keys())
    if not names:
        raise DataError(
            f"no video has both a prediction file in {predictions} and a truth file in {truth}"
        )
    truths = {n: frame_labels(truth_files[n]) for n in names}
    pairs = {n: (_predicted(predicted_files[n], truths[n], stride), truths[n]) for n in names}
    classes = mapping or csv_classes(predicted_files[names[0]])
    if classes is None:
        classes = default_class_order({x for _, true in pairs.values() for x in true.values()})
        say(f"classes, in id order (--mapping sets them): {', '.join(classes)}")
    judge, header = scoring_of(judging, classes, fps)
    ids = _class_ids(classes)
    counts = []
    for name in names:
        pred, true = pairs[name]
        frames = sorted(pred.keys() & true.keys())
        if not frames:
            say(f"{name}: no frame number is in both files, left out")
            continue
        extra = len(pred) - len(frames)
        if extra:
            say(f"{name}: {extra} predicted frames have no truth, left out")
        if len(frames) < len(true):
            say(f"{name}: {len(frames)} of {len(true)} truth frames predicted, scored on those")
        y = _ids(true, ids, truth_files[name], frames)
        p = _ids(pred, ids, predicted_files[name], frames)
        counts.append(count_video(name, p, y, len(classes), judge))
    return {**header, **summarize(counts, classes, judge.protocol)}
