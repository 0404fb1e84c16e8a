"""Is ``train.out_dir`` one folder for every rank? On several nodes it must be a file system all
of them mount: otherwise each node's ranks write their checkpoint shards to their own disk, no
node holds a whole checkpoint, and a resume loses the run. Checked before the first step."""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

from distseq.errors import ConfigError
from distseq.files import write_atomic
from distseq.parallel import all_gather_objects, barrier, rank_world

TOKEN = ".distseq-shared"  # rank 0 writes a fresh random token; every rank must read it back


def check_shared(folder: Path) -> None:
    """Raise on every rank, naming the first rank and host that does not see what rank 0 wrote
    into ``folder``; nothing to check in one process."""
    rank, world = rank_world()
    if world == 1:
        return
    token = folder / TOKEN
    if rank == 0:
        write_atomic(token, secrets.token_hex(16))
    barrier()
    try:
        seen = token.read_text()
    except OSError:
        seen = ""
    views = all_gather_objects([(socket.gethostname(), seen)])  # every rank has read it now
    if rank == 0:
        token.unlink()
    blind = [(r, host) for r, (host, text) in enumerate(views) if text != views[0][1]]
    if blind:
        r, host = blind[0]
        raise ConfigError(
            f"train.out_dir {folder} is not one folder for all ranks: rank {r} on {host} does "
            f"not see what rank 0 on {views[0][0]} wrote there ({len(blind)} of {world} ranks "
            "do not); checkpoints would be split across disks. Put it on a file system every "
            "node mounts"
        )
