"""Following a command's value through the rooms: the rooms its room imports, transitively (the
utilities errors, files, units and options aside), and the imports among them that climb back
up the flow, to a room not earlier in config -> data -> shard -> model -> memory -> parallel ->
score -> train -> checkpoint -> infer | evaluate. For `train` (cfg) and `evaluate` (eval's args).

    python .ci/rooms.py .     # from the repository's root; any checkout's root works
"""

import ast
import collections
import pathlib
import sys

FLOW = {
    "config": 0, "data": 1, "shard": 2, "model": 3, "memory": 4, "parallel": 5, "score": 6,
    "train": 7, "checkpoint": 8, "infer": 9, "evaluate": 9,
}  # fmt: skip
UTIL = {"errors", "files", "units", "options"}
root = pathlib.Path(sys.argv[1]) / "distseq"
edges = collections.defaultdict(set)
for f in root.rglob("*.py"):
    r = f.relative_to(root).parts[0]
    if r.endswith(".py"):
        continue
    for n in ast.walk(ast.parse(f.read_text())):
        if isinstance(n, ast.ImportFrom) and n.module:
            mods = [n.module]
        elif isinstance(n, ast.Import):
            mods = [a.name for a in n.names]
        else:
            continue
        for m in mods:
            p = m.split(".")
            if p[0] == "distseq" and len(p) > 1 and p[1] != r and p[1] in FLOW:
                edges[r].add(p[1])
for start in ("train", "evaluate"):
    seen, todo = {start}, [start]
    while todo:
        for t in edges[todo.pop()]:
            if t not in seen:
                seen.add(t)
                todo.append(t)
    climbs = sorted((a, b) for a in seen for b in edges[a] if FLOW[b] >= FLOW[a])
    print(f"{start}: {len(seen)} rooms {sorted(seen, key=FLOW.get)}; climbs {len(climbs)} {climbs}")
