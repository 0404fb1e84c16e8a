"""bench: ``distseq bench`` numbers (``memory``, ``data``) and the exact measurements behind the
design's contracts (``measure``: saved bytes, peak memory, collectives)."""
