"""distseq command line: train, demo, shard, export, eval, predict, features, report, submit,
bench.

Each stage's commands live in ``<stage>/command.py`` (``add_parser`` sets ``run``), thin runs
over that stage's library; this file only assembles them and turns the errors users cause into
one line and an exit code.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from distseq.errors import ConfigError, DataError, TrainingError
from distseq.launch.agent import agent_gone, exit_orphaned, exit_with_agent
from distseq.train.signals import StoppedAtStart

EXIT_CONFIG = 2
EXIT_FAILURE = 1
EXIT_SIGTERM = 128 + 15


def _parser() -> argparse.ArgumentParser:
    from distseq.bench import command as bench
    from distseq.checkpoint import command as export
    from distseq.demo import command as demo
    from distseq.evaluate import command as evaluate
    from distseq.launch import command as submit
    from distseq.shard import command as shard
    from distseq.train import command as train

    parser = argparse.ArgumentParser(prog="distseq", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (train, demo, shard, export, evaluate, submit, bench):
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    exit_with_agent()  # first: the imports below take seconds, and the agent may die meanwhile
    args = _parser().parse_args(argv)
    rank = os.environ.get("RANK")
    prefix = "distseq: error: " if rank is None else f"distseq: error (rank {rank}): "
    try:
        args.run(args)
    except ConfigError as e:
        print(prefix + str(e), file=sys.stderr)
        return EXIT_CONFIG
    except (DataError, TrainingError) as e:
        print(prefix + str(e), file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print(prefix + "interrupted", file=sys.stderr)
        return 130
    except StoppedAtStart as e:
        print(prefix + str(e), file=sys.stderr)
        return EXIT_SIGTERM
    except Exception:
        if agent_gone():  # a peer exited with the agent, and the collective failed first here
            exit_orphaned()
        raise
    return 0
