"""launch: running ``distseq train`` on clusters: SLURM jobs through submitit (``slurm``,
``command`` is ``distseq submit``) and a worker's guard against an agent that died under
torchrun (``agent``). The repository's top-level ``launch/`` holds the scripts (sbatch +
torchrun, submitting from Python)."""
