"""Several ``distseq`` commands in this one process, one after another, as ``bench recipes`` runs
its trainings (a process each would pay torch's import each time).

argv: a JSON list of command lines. Exits with the first that fails, saying which.
"""

from __future__ import annotations

import json
import sys

from distseq.cli import main

for argv in json.loads(sys.argv[1]):
    code = main(argv)
    if code:
        sys.exit(f"distseq {' '.join(argv)}: exit {code}")
