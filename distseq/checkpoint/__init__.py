"""checkpoint: training state on disk (``sharded``, DCP), and a model file to share (``export``)."""
