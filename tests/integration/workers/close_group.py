"""One rank of a short training run (``distseq.train.train``) in argv[2]'s parallel mode with
argv[1]'s config; reports the gloo threads still running once ``train`` has returned, which has
closed the process group."""

from __future__ import annotations

import sys
from pathlib import Path

from conftest import report
from distseq.config import load_config
from distseq.train.loop import train


def gloo_threads() -> list[str]:
    """This process's threads that belong to a gloo process group, by name."""
    names = [(task / "comm").read_text().strip() for task in Path("/proc/self/task").iterdir()]
    return sorted(name for name in names if "gloo" in name)


def main() -> None:
    config, mode = sys.argv[1], sys.argv[2]
    train(load_config(config, [f"parallel.mode={mode}"], quiet=True))
    report({"gloo_threads": gloo_threads()})


if __name__ == "__main__":
    main()
