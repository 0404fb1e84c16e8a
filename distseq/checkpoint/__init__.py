"""checkpoint: training state on disk (``sharded``, DCP), and a model file to share and loading
a model from either (``export``); ``command`` is ``distseq export``."""
