"""How a run under torchrun ends when one rank cannot go on: every rank says one line, none a
traceback (gloo, CPU). The stops' codes and SLURM's states: tests/train/test_signals.py and
test_slurm_cluster.py."""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

from conftest import run_distseq, tiny_config


def _junk_frames(shard: Path) -> None:
    """Every JPEG of ``shard`` replaced by bytes that are none."""
    with tarfile.open(shard) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers() if m.isfile()]  # type: ignore[union-attr]
    with tarfile.open(shard, "w") as tar:
        for member, data in members:
            if member.name.endswith(".jpg"):
                data = b"junk"
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))


def test_a_bad_frame_in_one_rank_s_first_batch_is_one_line_on_every_rank(
    tmp_path: Path, shards: Path
) -> None:
    # Rank 1 reads shard 1 first: its first batch fails to decode while rank 0 waits in the first
    # poll of a stop, which was outside the code that makes a failed collective one line: rank 0
    # printed gloo's whole traceback ("Connection closed by peer").
    bad = tmp_path / "shards"
    shutil.copytree(shards, bad)
    _junk_frames(bad / "train-000001.tar")
    config = str(tiny_config(tmp_path, shards))
    train = f"data.train={bad}/train-{{000000..000003}}.tar"
    proc = run_distseq("train", config, train, "data.val=", cwd=tmp_path, torchrun=2)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("distseq: error")]
    assert proc.returncode != 0 and len(lines) == 2, proc.stderr[-5000:]
    by_rank = dict(line.split(": ", 2)[1:] for line in lines)
    assert by_rank.keys() == {"error (rank 0)", "error (rank 1)"}, lines
    assert "train-000001.tar sample train-000004: frame 000000.jpg" in by_rank["error (rank 1)"]
    assert by_rank["error (rank 0)"].startswith("a collective failed after step 0 ")
    # Nothing but torchrun's own report after the ranks' lines.
    assert "Traceback" not in proc.stderr.split(lines[-1])[0], proc.stderr[-5000:]
