"""demo: ``distseq demo``, the first run a newcomer sees, with its config ``demo.yaml``."""
