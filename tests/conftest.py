"""Shared helpers: real torchrun launches and tiny models that run in seconds on 2 CPU cores.

Tests mirror the package (tests/data for distseq/data, ...). Those that start real processes
(torchrun, SLURM) live in tests/integration and are marked ``integration``; their torchrun worker
scripts are the files in tests/integration/workers. Tests elsewhere that take more than a few
seconds (a whole bench, the memory probe, a ``distseq`` subprocess) are marked ``slow``, which puts
them in the integration tier too. ``python -m pytest -m "not integration" -n 2`` runs the rest,
the fast tier, in under a minute and a half. docs/development.md says how the two workers of the
whole suite share the cores.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from distseq.checkpoint.export import Loaded
from distseq.config import (
    BackboneConfig,
    HeadConfig,
    MemoryConfig,
    ModelConfig,
    Norm,
    Recompute,
    load_config,
)
from distseq.data.batch import IGNORE_INDEX, Batch
from distseq.memory.chunked import ChunkedModel
from distseq.memory.policy import apply_memory_policy
from distseq.model.video import build_model
from distseq.parallel import DistInfo
from streams import write_stream_shards

# Under pytest-xdist (-n 2) each worker takes one core. With torch's default of a thread per core,
# two workers put four threads on two cores, which wait on each other. The fast tier took 191 s in
# one process and 121 s as two workers of one thread.
if "PYTEST_XDIST_WORKER" in os.environ:
    torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
INTEGRATION = REPO / "tests" / "integration"
WORKERS = INTEGRATION / "workers"


# The tests that use the bed of hosts or the SLURM cluster (whose hosts partition is the bed's
# hosts 1 and 2): under xdist they run one after another on one worker, since a link cut or an
# agent killed on the bed would fail a SLURM job running there at the time.
SHARED_SERVICES = {"test_hosts.py", "test_recipes.py", "test_slurm_cluster.py"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A slow test is in the integration tier wherever it lives, so that the fast tier
    # (-m "not integration") stays the few minutes of docs/development.md.
    for item in items:
        if INTEGRATION in item.path.parents or item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.integration)
    # The order the scheduler below hands out. The bed's tests first, those that run alone
    # before the rest, while the other worker runs the fast tests, which take no lock: in a CI
    # run in xdist's own order (the largest modules first), the workers waited 470 s in all for
    # the lock. Then the integration modules, the largest first, so that none is left for last.
    sizes = Counter(item.path for item in items if item.get_closest_marker("integration"))

    def order(item: pytest.Item) -> tuple[int, int]:
        if item.path.name in SHARED_SERVICES:
            return 0, 2 * sorted(SHARED_SERVICES).index(item.path.name) + (
                not item.get_closest_marker("alone")
            )
        if not item.get_closest_marker("integration"):
            return 1, 0
        return 2, -sizes[item.path]

    items.sort(key=order)  # stable: a module's tests keep their order, and stay together


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under -n 2: an integration module's tests stay on one worker, so that its module fixtures
    (a reference run, demo shards) are made once; the bed's and the cluster's tests share one
    worker (SHARED_SERVICES); every other test goes wherever a worker is free.

    Not xdist_group marks: xdist (3.8) names a test's group in ``item._nodeid``, which pytest 9.2
    no longer reads, so every group was silently dropped and modules were split (seen in a CI
    run's -v output: test_hosts.py on both workers).
    """
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::")[0]
            if Path(path).name in SHARED_SERVICES:
                return "bed"
            return path if path.startswith("tests/integration/") else nodeid

    config.option.loadscopereorder = False  # the collection's order (modifyitems above)
    return ByModule(config, log)


@pytest.fixture(autouse=True)
def _cores(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Under -n 2, a test marked ``alone`` runs with no other integration test beside it.

    Those are the faults whose timing a busy core changes: with a torchrun beside it on the
    other worker, a killed agent's survivor did not restart and a gone store's error read
    otherwise. Other integration tests share the lock; fast tests never wait for it.
    """
    node = request.node
    if "PYTEST_XDIST_WORKER" not in os.environ or not node.get_closest_marker("integration"):
        yield
        return
    mode = fcntl.LOCK_EX if node.get_closest_marker("alone") else fcntl.LOCK_SH
    with open(tmp_path_factory.getbasetemp().parent / "cores.lock", "a") as lock:
        fcntl.flock(lock, mode)  # released when the file closes, after the test
        yield


@pytest.fixture(scope="session")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tests' shards (``streams.write_stream_shards``), written once for the session; tests
    only read them."""
    return write_stream_shards(tmp_path_factory.mktemp("shards"))


def tiny_config(tmp_path: Path, shards: Path) -> Path:
    """A run's config on the session's shards: distseq's two-layer CNN, three steps.

    tiny_cnn, not ResNet-18: a 3-step run took 0.7 s against 9.9 s, and a checkpoint with its
    AdamW moments is 232 KB against 129 MB (a full suite wrote ~13 GB of them).
    """
    path = tmp_path / "tiny.yaml"
    path.write_text(f"""
data:
  train: {shards}/train-{{000000..000003}}.tar
  val: {shards}/val-{{000000..000001}}.tar
  window: 8
  size: 32
  batch_size: 2
  num_workers: 0
model:
  backbone: {{name: tiny_cnn}}
  head: {{hidden: 16}}
memory: {{chunk_frames: 3}}
train: {{steps: 3, log_every: 1, out_dir: {tmp_path / "run"}}}
""")
    return path


ONE = DistInfo(0, 1, torch.device("cpu"))  # one process, no process group


def untrained(shards: Path, classes: list[str]) -> Loaded:
    """A small model (tiny_cnn), as loaded for eval or predict, before any training."""
    overrides = [f"data.train={shards}/train-000000.tar", f"data.val={shards}/val-000000.tar"]
    model = ["model.backbone.name=tiny_cnn", "model.head.hidden=8"]
    cfg = load_config(None, [*overrides, "data.size=32", *model])
    torch.manual_seed(0)
    return Loaded(build_model(cfg.model, len(classes)).eval(), cfg, classes, 0)


# distseq's own small CNN: two stages (as a ResNet has four), a probe or a step in a fraction of
# ResNet-18's time. Tests of how the memory plan works take it; those of real CNNs name theirs.
TINY = "tiny_cnn"


def tiny_model(
    recompute: str = "torch",
    chunk: int = 4,
    *,
    backbone: str = "resnet18",
    norm: str = "groupnorm",
    classes: int = 3,
    seed: int = 0,
    **head: object,
) -> ChunkedModel:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        backbone=BackboneConfig(name=backbone, norm=Norm(norm)),
        head=HeadConfig(**{"hidden": 16, **head}),  # type: ignore[arg-type]
    )
    model = build_model(cfg, classes)
    memory = MemoryConfig(recompute=Recompute(recompute), chunk_frames=chunk)
    return apply_memory_policy(model, memory)


def random_batch(
    b: int,
    t: int,
    size: int = 32,
    lengths: list[int] | None = None,
    seed: int = 1,
    classes: int = 3,
) -> Batch:
    g = torch.Generator().manual_seed(seed)
    frames = torch.randint(0, 256, (b, t, 3, size, size), generator=g, dtype=torch.uint8)
    labels = torch.randint(0, classes, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.bool)
    for i, n in enumerate(lengths or []):
        mask[i, n:] = False
    labels[~mask] = IGNORE_INDEX
    return Batch(frames, labels, mask)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def report(record: dict) -> None:
    """Called by a rank inside a torchrun script: one result file per rank, so that ranks'
    output never interleaves."""
    rank = int(os.environ["RANK"])
    Path(f"result_{rank}.json").write_text(json.dumps({"rank": rank, **record}))


def _distseq(args: tuple[str, ...], torchrun: int) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of ``python -m distseq ARGS``, or under ``torchrun``
    with that many ranks."""
    launcher = [sys.executable, "-m"]
    if torchrun:
        launcher += [
            "torch.distributed.run",
            f"--nproc_per_node={torchrun}",
            "--master_addr=127.0.0.1",
            f"--master_port={free_port()}",
            "-m",
        ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return [*launcher, "distseq", *args], env


def run_distseq(*args: str, cwd: Path, torchrun: int = 0) -> subprocess.CompletedProcess[str]:
    """``python -m distseq ARGS`` as a user runs it, or under ``torchrun`` with that many ranks."""
    cmd, env = _distseq(args, torchrun)
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


def sigterm_group_at_step(
    *args: str, cwd: Path, run: Path, step: int = 2, torchrun: int = 0
) -> tuple[int, str]:
    """Run ``distseq ARGS`` (as :func:`run_distseq`) in a process group of its own, as a job's;
    once ``run``'s metrics record ``step``, send SIGTERM to the whole group, as ``scancel`` or a
    node shutting down does. Returns the exit code and stderr."""
    cmd, env = _distseq(args, torchrun)
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        metrics = run / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while not (metrics.exists() and f'"step": {step},' in metrics.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, "training never started"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):  # none left
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, err


def launch_torchrun(
    script: Path,
    nproc: int,
    cwd: Path,
    *args: str,
    launcher_args: Sequence[str] = (),
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """A real ``torchrun --nproc_per_node=nproc script args`` (gloo, CPU) in ``cwd``.

    ``launcher_args`` replace the default rendezvous on a free local port. On a timeout the
    workers are killed with the launcher (they run in a session of their own) and the result has
    return code -9.
    """
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), str(REPO / "examples")]),
        # A restarted group must not share the store of the group it replaces: there it can
        # read the dead ranks' gloo addresses and fail or hang connecting (pytorch#135712).
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    }
    rendezvous = list(launcher_args) or ["--master_addr=127.0.0.1", f"--master_port={free_port()}"]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
    cmd += [*rendezvous, str(script), *args]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\ntimed out after {timeout} s"
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def torchrun(
    worker: str, nproc: int, tmp_path: Path, *args: str, timeout: float = 300
) -> list[dict]:
    """Run ``tests/integration/workers/<worker>.py`` under torchrun in tmp_path; it must succeed.

    Each rank calls :func:`report`; the records come back in rank order.
    """
    for old in tmp_path.glob("result_*.json"):
        old.unlink()
    proc = launch_torchrun(WORKERS / f"{worker}.py", nproc, tmp_path, *args, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(
            f"torchrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    return [json.loads((tmp_path / f"result_{r}.json").read_text()) for r in range(nproc)]


def full_state(checkpoint: Path) -> dict[str, Any]:
    """Everything in a sharded checkpoint (model and optimizer), read without a process group."""
    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(checkpoint, Path(tmp) / "full.pt")
        return torch.load(Path(tmp) / "full.pt", weights_only=True)


def assert_identical(a: Any, b: Any, key: str = "") -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), key
        for k in a:
            assert_identical(a[k], b[k], f"{key}.{k}")
    elif isinstance(a, torch.Tensor):
        same = torch.equal(a, b)
        assert same, key
    else:
        assert a == b, key


# --- the SLURM cluster (.ci/slurm.sh): test_slurm_cluster.py's and the recipes' on SLURM ---------


def _cluster_problem() -> str | None:
    """Why the SLURM cluster can't be used, or None if it can."""
    if shutil.which("sbatch") is None:
        return "sbatch not found on PATH"
    conf = os.environ.get("SLURM_CONF")
    if not conf:
        return "SLURM_CONF is not set"
    if not Path(conf).is_file():
        return f"SLURM_CONF={conf} does not exist"
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-p", "debug", "-o", "%a %T"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"sinfo failed: {e}"
    if out.returncode != 0:
        return f"sinfo failed (is slurmctld running?): {out.stderr.strip()}"
    if not out.stdout.strip():
        return "no partition named 'debug'"
    return None


def _require_cluster() -> None:
    problem = _cluster_problem()
    if problem is None:
        return
    hint = "start one with `.ci/slurm.sh up && . /tmp/distseq-slurm/env`"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"SLURM cluster required under CI=true: {problem}; {hint}", pytrace=False)
    pytest.skip(f"no SLURM cluster: {problem}; {hint}")


@pytest.fixture
def slurm(tmp_path: Path) -> Path:
    _require_cluster()
    return tmp_path / "submitit"


@pytest.fixture
def two_nodes(slurm: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The partition ``hosts``: nodes ds-h1 and ds-h2, each a host of the bed (.ci/hosts.sh)
    with a slurmd of its own. Jobs talk to each other over the bed's eth0."""
    # A node that stopped answering (state "down*": the bed's lost-link test cuts host 2's link)
    # is back at slurmctld's next ping, within SlurmdTimeout (60 s, .ci/slurm.sh).
    deadline = time.monotonic() + 90
    while True:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-p", "hosts", "-o", "%N %T"],
            capture_output=True, text=True, timeout=20, check=False,
        )  # fmt: skip
        nodes = dict(line.split() for line in out.stdout.splitlines())
        answering = not any(state.endswith("*") for state in nodes.values())
        if answering or time.monotonic() > deadline:
            break
        time.sleep(2)
    if not all(nodes.get(n) in ("idle", "mixed") for n in ("ds-h1", "ds-h2")):
        problem = f"partition 'hosts' has no idle ds-h1 and ds-h2 ({nodes or out.stderr.strip()})"
        hint = "start it with `.ci/hosts.sh up 3 && DISTSEQ_SLURM_HOSTS=2 .ci/slurm.sh up`"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{problem} under CI=true; {hint}", pytrace=False)
        pytest.skip(f"{problem}; {hint}")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")
    return slurm
