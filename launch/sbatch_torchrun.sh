#!/bin/bash
# SLURM without submitit: one torchrun per node, 8 GPUs each. Submit with
#   sbatch launch/sbatch_torchrun.sh configs/cholec-resnet50-lstm.yaml data.train='shards/train-{000000..000099}.tar'
# Options on sbatch's command line win over the lines below; NPROC_PER_NODE sets the ranks per
# node (default 8), e.g. a 2-node CPU job of one rank each:
#   NPROC_PER_NODE=1 sbatch --nodes=2 --gpus-per-node=0 --cpus-per-task=1 launch/sbatch_torchrun.sh ...
#SBATCH --job-name=distseq
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --time=24:00:00
#SBATCH --requeue
set -euo pipefail
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
# On preemption SLURM sends SIGTERM; torchrun passes it to its workers, which save a checkpoint
# together at the next step boundary and exit. --requeue brings the job back, and distseq train
# resumes from the run's latest checkpoint. Leave GraceTime/KillWait room for one step and a save.
srun torchrun --nnodes="$SLURM_NNODES" --nproc_per_node="${NPROC_PER_NODE:-8}" \
    --rdzv_backend=c10d --rdzv_endpoint="$head:29500" \
    -m distseq train "$@"
