"""The memory policy of a run: how the model runs over time, from ``memory.*``."""

from __future__ import annotations

from distseq.config import MemoryConfig, Offload
from distseq.memory.chunked import ChunkedModel
from distseq.memory.tbptt import TruncatedHead
from distseq.model.head import TemporalHead
from distseq.model.video import VideoModel


def apply_memory_policy(model: VideoModel, cfg: MemoryConfig) -> ChunkedModel:
    """The same modules, run as ``cfg`` says; parameter names do not change."""
    head = model.head
    if cfg.tbptt_frames:
        assert isinstance(head, TemporalHead)  # the config refuses tbptt with a head of yours
        head = TruncatedHead(head.rnn, head.classifier, head.dropout.p, cfg.tbptt_frames)
    given = model.input
    return ChunkedModel(
        model.backbone,
        head,
        model.feature_dim,
        chunk_frames=cfg.chunk_frames,
        recompute=cfg.recompute,
        keep_frames=cfg.keep_frames,
        frames=given.dtype,
        normalize=given.normalize,
        prefetch_frames=cfg.offload is Offload.frames,
    )
