"""Everything that runs across ranks: the process group (``group``), the network under it
(``network``), the package's collectives (``collectives``), wrapping the model for FSDP2 or DDP
(``wrap``), BatchNorm statistics kept one across the ranks (``batchnorm``) and one video's
frames split across ranks (``sequence``).

The only package that talks to ``torch.distributed`` (a contract ``lint-imports`` keeps). gloo
on CPU and NCCL on GPU run the same code.
"""

from distseq.parallel.batchnorm import average_batchnorm_stats
from distseq.parallel.collectives import (
    all_gather_objects,
    all_reduce_sum,
    any_rank,
    from_rank_zero,
)
from distseq.parallel.group import (
    DistInfo,
    barrier,
    close_distributed,
    init_distributed,
    rank_world,
    say,
)
from distseq.parallel.network import Node, is_collective_failure, nodes, nodes_line, unreachable
from distseq.parallel.sequence import SIGNATURE_BYTES, sequence_line
from distseq.parallel.wrap import gradient_sync, parallelize

__all__ = [
    "SIGNATURE_BYTES",
    "DistInfo",
    "Node",
    "all_gather_objects",
    "all_reduce_sum",
    "any_rank",
    "average_batchnorm_stats",
    "barrier",
    "close_distributed",
    "from_rank_zero",
    "gradient_sync",
    "init_distributed",
    "is_collective_failure",
    "nodes",
    "nodes_line",
    "parallelize",
    "rank_world",
    "say",
    "sequence_line",
    "unreachable",
]
