"""The memory policy of a run: how the model runs over time, from ``memory.*``."""

from __future__ import annotations

from distseq.config import MemoryConfig, Offload
from distseq.memory.chunked import ChunkedModel
from distseq.memory.tbptt import TruncatedHead
from distseq.model.video import VideoModel


def apply_memory_policy(model: VideoModel, cfg: MemoryConfig) -> ChunkedModel:
    """The same modules, run as ``cfg`` says; parameter names do not change."""
    head = model.head
    if cfg.tbptt_frames:
        head = TruncatedHead(head.rnn, head.classifier, head.dropout.p, cfg.tbptt_frames)
    return ChunkedModel(
        model.backbone,
        head,
        model.feature_dim,
        cfg.chunk_frames,
        cfg.recompute,
        cfg.keep_frames,
        prefetch_frames=cfg.offload is Offload.frames,
    )
