"""checkpoint: training state on disk (``sharded``, DCP), a model file to share and loading a
model from either (``export``), and the check that every rank sees ``train.out_dir`` as one
folder (``shared``); ``command`` is ``distseq export``."""
