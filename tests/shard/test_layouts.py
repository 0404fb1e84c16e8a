"""``distseq shard`` on the layouts the field distributes: MS-TCN's (groundTruth/, mapping.txt,
splits/*.bundle, Windows line ends), unlabelled names and lengths, and Cholec80's standard
splits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_shard import SIZE, frame_folder, read_back, shard

from distseq.data.batch import IGNORE_INDEX
from distseq.data.cholec80 import standard_split
from distseq.errors import ConfigError, DataError


def mstcn(root: Path) -> Path:
    """Four 4-frame videos as MS-TCN distributes them, one label per line; returns the root."""
    truth = {
        "a": ["SIL", "take", "take", "pour"],
        "b": ["take", "pour", "pour", "SIL"],
        "c": ["UNK", "SIL", "SIL"],  # one frame short of its video; UNK is not labelled
        "d": ["pour"] * 4,
    }
    (root / "groundTruth").mkdir(parents=True)
    (root / "splits").mkdir()
    for name, labels in truth.items():
        frame_folder(root / "videos" / name, 4, 16, 16)
        text = "".join(f"{label}\n" for label in labels)
        if name == "b":  # written on Windows: CRLF and a byte-order mark
            (root / "groundTruth" / "b.txt").write_bytes(
                b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode()
            )
        else:
            (root / "groundTruth" / f"{name}.txt").write_text(text)
    (root / "mapping.txt").write_text("0 take\n1 pour\n2 SIL\n")  # not sorted: id order rules
    (root / "splits" / "train.split1.bundle").write_text("a.txt\r\nb.txt\r\n")
    (root / "splits" / "test.split1.bundle").write_text("c.txt\n")  # d: in no list
    return root


def test_mstcn_layout_with_its_lists_and_unlabelled_frames(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = mstcn(tmp_path)
    out = tmp_path / "shards"
    summary = shard(
        root / "videos",
        *("--labels", root / "groundTruth", "--mapping", root / "mapping.txt"),
        *("--train-list", root / "splits" / "train.split1.bundle"),
        *("--test-list", root / "splits" / "test.split1.bundle", "--val-fraction", 0),
        *("--unlabelled", "UNK", "--out", out, "--size", SIZE, "--workers", 0),
        *("--fps", 2, "--folder-fps", 2),
    )
    said = capsys.readouterr().out
    assert "1 inputs in no split's list, left out: d" in said
    assert "c.txt: 3 labelled frames" in said and "its last 1 unlabelled" in said
    assert summary.processed == 3
    index = json.loads((out / "index.json").read_text())
    assert index["classes"] == ["take", "pour", "SIL"]
    assert {name: info["split"] for name, info in index["shards"].items()} == {
        "train-000000.tar": "train",
        "test-000000.tar": "test",
    }
    train = read_back(out, "train-000000.tar")
    # take 0, pour 1, SIL 2; b's CRLF and byte-order mark read as a's plain lines do.
    assert train["a"][1] == [2, 0, 0, 1] and train["b"][1] == [0, 1, 1, 2]
    # c: UNK is unlabelled, and so is the frame past its labels' end (-1 stored, IGNORE_INDEX
    # loaded, as the loss and the metrics leave them out).
    assert read_back(out, "test-000000.tar")["c"][1] == [IGNORE_INDEX, 2, 2, IGNORE_INDEX]
    # The label tolerance decides the samples: a rerun into this --out must not change it.
    with pytest.raises(ConfigError, match="written with label_tolerance=1, not 2"):
        shard(
            root / "videos",
            *("--labels", root / "groundTruth", "--mapping", root / "mapping.txt"),
            *("--train-list", root / "splits" / "train.split1.bundle"),
            *("--test-list", root / "splits" / "test.split1.bundle", "--val-fraction", 0),
            *("--unlabelled", "UNK", "--out", out, "--size", SIZE, "--workers", 0),
            *("--fps", 2, "--folder-fps", 2, "--label-tolerance", 2),
        )


def test_label_lengths_beyond_the_tolerance_are_refused(tmp_path: Path) -> None:
    root = mstcn(tmp_path)
    argv = [root / "videos", "--labels", root / "groundTruth", "--out", tmp_path / "o"]
    argv += ["--mapping", root / "mapping.txt", "--unlabelled", "UNK", "--workers", 0]
    with pytest.raises(DataError, match=r"c\.txt: 3 labelled frames, but .*c has 4 \(--label-tol"):
        shard(*argv, "--label-tolerance", 0)
    with pytest.raises(DataError, match=r"c\.txt: label 'UNK' is not one of \['take', 'pour'"):
        shard(*argv[:-4], "--workers", 0)  # without --unlabelled UNK
    with pytest.raises(ConfigError, match="a is in --test and in --train"):
        shard(*argv, "--test", "a", "--train-list", root / "splits" / "train.split1.bundle")


def test_cholec80_standard_splits() -> None:
    stems = [f"video{k:02d}" for k in range(1, 81)]
    split = standard_split("cholec80-40-8-32", stems)
    counts = {part: list(split.values()).count(part) for part in ("train", "val", "test")}
    assert counts == {"train": 40, "val": 8, "test": 32}
    assert (split["video40"], split["video41"], split["video48"], split["video49"]) == (
        "train",
        "val",
        "val",
        "test",
    )
    split = standard_split("cholec80-32-8-40", stems)
    assert (split["video32"], split["video33"], split["video40"], split["video41"]) == (
        "train",
        "val",
        "val",
        "test",
    )
    with pytest.raises(ConfigError, match="no input is video17"):
        standard_split("cholec80-40-8-32", [s for s in stems if s != "video17"])
    with pytest.raises(ConfigError, match="input clip is not named videoNN"):
        standard_split("cholec80-40-8-32", [*stems, "clip"])


def test_a_standard_split_through_shard(tmp_path: Path) -> None:
    for k in range(1, 81):
        frame_folder(tmp_path / "frames" / f"video{k:02d}", 1, 16, 16)
    labels = tmp_path / "labels"
    labels.mkdir()
    for k in range(1, 81):  # Cholec80's names and layout: video01-phase.txt
        (labels / f"video{k:02d}-phase.txt").write_text(
            "Frame\tPhase\n0\tCalotTriangleDissection\n"
        )
    out = tmp_path / "shards"
    argv = [tmp_path / "frames", "--labels", labels, "--out", out, "--size", 16, "--workers", 0]
    shard(*argv, "--standard-split", "cholec80-40-8-32")
    index = json.loads((out / "index.json").read_text())
    splits = [source["split"] for source in index["sources"].values()]
    assert (splits.count("train"), splits.count("val"), splits.count("test")) == (40, 8, 32)
    # Cholec80's phases keep procedure order (its evaluation numbers them so), all 7 of them.
    assert index["classes"][:3] == ["Preparation", "CalotTriangleDissection", "ClippingCutting"]
    assert len(index["classes"]) == 7
