"""demo: ``distseq demo``, the first run a newcomer sees: the recall task (``task``), trained
three ways (``three_ways``) from its config ``demo.yaml``; ``command`` holds the options."""
