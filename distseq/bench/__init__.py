"""bench: ``distseq bench`` numbers, each a benchmark that prints what it measured: ``memory``
(a step's peak and time per recompute backend), ``compare`` (the approaches side by side, with
the plan's bound), ``data`` (loader frames/s against plain decoding), ``collectives`` (the
collectives a step issues, which back the design's communication contract) and ``traffic``
(their bytes at each world size, a real torchrun group), ``protocols`` (eval's two protocols on
simulated Cholec80 predictions), ``heads`` (each temporal head's step over long feature
sequences, MS-TCN against its own loop), ``recipes`` (the training recipes on the user's
shards) and ``gpu`` (the GPU acceptance table, over compare, traffic and data); ``command``
holds their options."""
