"""``distseq bench recipes``: does end to end pay on my data? The trainings (``trainings.py``),
run here or as SLURM jobs (``slurm.py``), and their report (``report.py``); ``run.py`` is the
command's work."""
