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
