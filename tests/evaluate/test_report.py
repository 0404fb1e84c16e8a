"""``distseq report`` on a short real training run: pictures that are drawn, and a page that
shows each of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torchcodec.decoders import decode_png

from conftest import tiny_config
from distseq.cli import main
from distseq.config import load_config
from distseq.evaluate.report import make_report
from distseq.train.loop import train
from streams import N_VAL


def png(path: Path) -> torch.Tensor:
    return decode_png(torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8))


@pytest.mark.slow
def test_report_draws_every_picture_and_links_it(
    tmp_path: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tiny_config(tmp_path, shards)
    train(load_config(config, ["data.num_workers=0", "train.eval_every=1"]))
    run = tmp_path / "run"
    capsys.readouterr()  # training's own lines
    assert main(["report", str(run)]) == 0
    out = run / "report"
    pictures = sorted(out.rglob("*.png"))
    assert capsys.readouterr().out == f"wrote {out / 'report.html'} with {len(pictures)} pictures\n"
    names = {p.relative_to(out).as_posix() for p in pictures}
    ribbons = {f"ribbons/val-{i:06d}.png" for i in range(N_VAL)}
    assert (
        names
        == {"loss.png", "validation.png", "speed.png", "data_wait.png", "confusion.png"} | ribbons
    )
    # loss.png: the training and the validation loss, the legend beside them.
    sizes = {"loss.png": (320, 860), "confusion.png": (320, 340)}
    for picture in pictures:
        image = png(picture)
        name = picture.relative_to(out).as_posix()
        if name in sizes:
            assert image.shape[1:] == sizes[name], name
        if name.startswith("ribbons/"):
            assert image.shape[1:] == (285, 1000), name  # 3 bands, the legend and a title
        # Drawn: a blank or single-colour figure has (almost) no spread in its pixels.
        assert image.shape[0] in (3, 4) and image[:3].float().std() > 15, name
    page = (out / "report.html").read_text()
    linked = set(re.findall(r'<img src="([^"]+)"', page))
    assert linked == names
    assert "Validation at step 3" in page and "Peak device memory is recorded on GPUs" in page
    # Called directly, on other shards (--split): their videos' ribbons, the run's curves.
    other = make_report(run, tmp_path / "other", split=str(shards / "val-000001.tar"))
    drawn = sorted(p.relative_to(tmp_path / "other").as_posix() for p in other)
    assert [d for d in drawn if d.startswith("ribbons/")] == [
        "ribbons/val-000003.png",
        "ribbons/val-000004.png",
    ]
    assert "loss.png" in drawn and "confusion.png" in drawn


@pytest.mark.slow
def test_report_shows_the_worst_videos_first_and_one_validation_as_a_number(
    tmp_path: Path, shards: Path
) -> None:
    """A run validated once (at its end, the default) that logs once (at step 3 of 3), and a
    report of 2 ribbons for 5 videos: no curve of one dot, but each number on the page (the
    validation's table saying it is the only one); the ribbons are the 2 worst videos', the
    worst first, and the table after them has every video once, by accuracy."""
    overrides = ["data.num_workers=0", "train.log_every=3"]
    train(load_config(tiny_config(tmp_path, shards), overrides))
    out = tmp_path / "report"
    pictures = make_report(tmp_path / "run", out, ribbons=2)
    names = [p.relative_to(out).as_posix() for p in pictures]
    assert names[0] == "confusion.png"  # no curve
    page = (out / "report.html").read_text()
    assert "Validation at step 3, the run's only one</h2>" in page
    assert re.search(r"<p>Loss: loss \d\.\d+ at step 3, its one record\.</p>", page), page
    assert re.search(
        r"<p>Training speed: frames_per_s [\d.]+ at step 3, its one record\.</p>", page
    )
    ribbons = [n for n in names if n.startswith("ribbons/")]
    titles = re.findall(r"<h3>(val-\d+): accuracy (\d\.\d+)</h3>", page)
    assert ribbons == [f"ribbons/{key}.png" for key, _ in titles] and len(titles) == 2
    table = re.findall(r"<tr><td>\d+</td><td>(val-\d+)</td><td>(\d\.\d+)</td></tr>", page)
    assert sorted(key for key, _ in table) == [f"val-{i:06d}" for i in range(N_VAL)]
    accuracies = [float(a) for _, a in table]
    assert accuracies == sorted(accuracies) and titles == table[:2]
    low, mid, high = accuracies[0], accuracies[N_VAL // 2], accuracies[-1]
    assert (
        f"{N_VAL} videos, accuracy per video: median {mid:.3f}, from {low:.3f} to {high:.3f}. "
        "The phase ribbons of the 2 worst, the worst first" in page
    )
