"""Under torchrun: a worker exits when the agent that started it is gone.

torchrun starts each worker in a session of its own, so a SIGKILL to the agent (the OOM killer,
a ``kill -9`` of the launcher, a lost login shell) leaves its workers running. Seen here: killed
4 s after launch, the agent left both workers sleeping in a retry loop against its dead store,
still alive after 30 minutes, about 730 MB each. On a GPU they would hold device memory and the
rendezvous port, so a relaunch fails or runs out of memory; killed mid-training, they would go
on and write checkpoints beside the relaunched job.

A worker's parent is its agent. When the agent dies, the kernel hands the worker to another
process (init, or a subreaper), and its parent pid changes: a thread polls for that. A torch-free
module, so that the guard starts before torch is imported: that import alone takes seconds,
and the agent may die during it.
"""

from __future__ import annotations

import os
import sys
import threading
import time

POLL_S = 0.5
EXIT_ORPHANED = 1
_agent: int | None = None  # the agent's pid, under torchrun


def exit_with_agent() -> None:
    """Under torchrun, exit this process within ``POLL_S`` of its agent's death; else nothing."""
    global _agent
    if "TORCHELASTIC_RUN_ID" not in os.environ:  # set by torchrun's agent for its workers
        return
    _agent = os.getppid()

    def watch() -> None:
        while not agent_gone():
            time.sleep(POLL_S)
        exit_orphaned()

    threading.Thread(target=watch, name="distseq-agent-watch", daemon=True).start()


def agent_gone() -> bool:
    """Whether this worker's torchrun agent has died. A worker whose peer saw it first fails in a
    collective (the peer is gone) before its own poll: that error's cause is this."""
    return _agent is not None and os.getppid() != _agent


def exit_orphaned() -> None:
    rank = os.environ.get("RANK", "?")
    print(
        f"distseq: error (rank {rank}): the torchrun agent (pid {_agent}) is gone; exiting",
        file=sys.stderr,
        flush=True,
    )
    # At once, from any thread: the main thread may be stuck in a collective that only the dead
    # agent's store could finish. A save cut short leaves step_N.tmp, never read.
    os._exit(EXIT_ORPHANED)
