"""Streams run in DataLoader workers, and the error policy for bad samples.

Bad samples, a shard cut off mid-way included, raise :class:`DataError` (one line naming shard
and sample), or, with ``data.on_error=skip``, are logged and reported in ``Batch.skipped``
(training counts them in its ``skipped_samples`` metric). Shard-level problems (a missing or
unreadable shard, a bad ``index.json``) always raise.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import traceback
from collections.abc import Iterator
from dataclasses import replace

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from distseq.data import sharedmem
from distseq.data.batch import Batch
from distseq.errors import DataError

log = logging.getLogger(__name__)


class Stream(IterableDataset[Batch]):
    """A stream of batches that may run in DataLoader workers: the train and the val stream.

    ``pools`` travels to the workers with the stream; :func:`loader` sets it.
    """

    pools: sharedmem.Pools | None = None


def worker_slot() -> tuple[int, int]:
    """(this DataLoader worker, how many there are); (0, 1) outside a worker."""
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def on_error(policy: str, error: DataError, sample_id: str, skipped: list[str]) -> None:
    """Apply the error policy: re-raise, or log the bad sample and note its id."""
    if policy != "skip":
        raise error
    log.warning("skipping bad sample: %s", error)
    skipped.append(sample_id)


# A stop signal sent to a whole process group (``kill -- -PGID``, ``scancel --signal=TERM``, a
# node shutting down) reaches the loader's workers as well as the trainer. torch's workers die of a
# SIGTERM their parent did not send, and the trainer then fails with "DataLoader worker ... is
# killed by signal" before the step boundary where it would save. So a worker ignores the stop
# signals, but for its parent's SIGTERM: torch (and multiprocessing at exit) ends a worker that
# does not stop by itself with it, and a worker that ignored that one hung its trainer's exit
# (seen in CI: two ranks saved on a SIGTERM to one of them, then waited on their live workers for
# two hours). Python's handlers do not say who sent a signal; a thread in sigwaitinfo does.
STOP_SIGNALS = {signal.SIGTERM, signal.SIGUSR2}


def _ignore_stop_signals(worker_id: int) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # in every thread, from here on
    parent = os.getppid()

    def take_sigterm() -> None:
        while signal.sigwaitinfo({signal.SIGTERM}).si_pid != parent:
            pass
        os._exit(0)  # as torch's own worker handler does on its parent's SIGTERM

    threading.Thread(target=take_sigterm, name="distseq-sigterm", daemon=True).start()
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR2})  # blocked since the fork


def loader(dataset: Stream, num_workers: int) -> Iterator[Batch]:
    """Run the stream in DataLoader workers, with one-line errors."""
    pools = dataset.pools = sharedmem.Pools.for_workers(num_workers) if num_workers else None
    workers = DataLoader(
        dataset,
        batch_size=None,
        num_workers=num_workers,
        pin_memory=torch.cuda.is_available(),
        worker_init_fn=_ignore_stop_signals,
    )
    # The stop signals stay blocked while the workers start, so that none reaching a worker
    # between its fork and its init function kills it: a worker inherits the mask, and a signal
    # pending there goes to its SIGTERM thread or is dropped. The trainer gets its own when they
    # are up.
    unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        batches = iter(workers)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
    try:
        for batch in batches:
            if pools is not None and batch.segment[0] >= 0:
                if not batch.frames.is_pinned():  # pinning for the GPU made a copy already
                    batch = replace(batch, frames=batch.frames.clone())
                pools.release(*batch.segment)
            if batch.frames.shape[0] > 0:
                yield batch
        return
    except DataError as e:
        message = str(e)
        # A worker's error comes back through a reference cycle (exception -> traceback ->
        # frames -> exception) that holds the DataLoader iterator; freed by a later garbage
        # collection, its workers then take ~5 s to stop. Clear the frames and drop the iterator
        # so they stop now, then raise a fresh one-line error.
        traceback.clear_frames(e.__traceback__)
    del batches, workers
    raise DataError(message)
