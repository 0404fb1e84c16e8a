"""bench: ``distseq bench`` numbers, each a benchmark that prints what it measured: ``memory``
(a step's peak and time per recompute backend), ``compare`` (the approaches side by side, with
the plan's bound), ``data`` (loader frames/s against plain decoding), and ``collectives`` (the
collectives a step issues, which back the design's communication contract); ``command`` holds
their options."""
