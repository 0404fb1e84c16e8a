"""Submit a distseq training job to SLURM from Python (what `distseq submit` does).

python launch/submit_from_python.py configs/cholec-resnet50-lstm.yaml data.train=...
"""

import sys

from distseq.launch.slurm import SlurmOptions, submit

if __name__ == "__main__":
    config, *overrides = sys.argv[1:]
    opts = SlurmOptions(nodes=4, gpus_per_node=8, cpus_per_task=8, partition="gpu", time="24:00:00")
    job = submit(config, overrides, opts)
    print(f"job {job.job_id}: logs in {job.paths.stdout.parent}")
    print("rank 0 result:", job.results()[0])
