"""Multi-node runs on the test bed of hosts (``.ci/hosts.sh``: network namespaces, each its own
hostname and address, joined by a bridge): torchrun's c10d rendezvous across hosts, launched as
docs/launching.md says, gives the parameters of the same ranks on one host."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from conftest import REPO, run_distseq, tiny_config
from distseq.checkpoint.export import load_model

pytestmark = [pytest.mark.integration, pytest.mark.hosts]

HOSTS = REPO / ".ci" / "hosts.sh"
STATE = Path(os.environ.get("DISTSEQ_HOSTS_STATE", "/tmp/distseq-hosts"))
NEEDED = 3


def _up() -> bool:
    made = STATE.read_text().split() if STATE.exists() else []
    return all(f"ds-h{k}" in made for k in range(1, NEEDED + 1))


@pytest.fixture(scope="module")
def bed() -> Iterator[None]:
    """The bed of NEEDED hosts: the one .ci/run made, else one made here and removed after."""
    if _up():
        yield
        return
    made = subprocess.run(["bash", str(HOSTS), "up", str(NEEDED)], capture_output=True, text=True)
    if made.returncode != 0:
        subprocess.run(["bash", str(HOSTS), "down"], check=True)  # what it made before failing
        lines = (made.stderr.strip() or "no output").splitlines()
        pytest.skip(f"no test bed of hosts (network namespaces need root): {lines[-1]}")
    try:
        yield
    finally:
        subprocess.run(["bash", str(HOSTS), "down"], check=True)


def rendezvous() -> tuple[str, str]:
    """A fresh c10d endpoint at host 1 and run id."""
    return f"ds-h1:{random.randint(20000, 29000)}", uuid.uuid4().hex[:8]


def start_on_hosts(
    hosts: list[int],
    nnodes: int,
    nproc: int,
    cwd: Path,
    *args: str,
    rdzv: tuple[str, str] | None = None,
    launcher: tuple[str, ...] = (),
    wrap: dict[int, list[str]] | None = None,
) -> list[subprocess.Popen[str]]:
    """``torchrun ... -m distseq ARGS`` started on ``hosts`` at once, as the multi-node recipe of
    docs/launching.md has it: c10d rendezvous at host 1 (``rdzv``: endpoint and id; default a
    fresh one), gloo told its interface, an unshared store for restarts; ``wrap[k]`` goes before
    host k's command. Each host's processes are a session of their own, led by its torchrun
    agent."""
    endpoint, run_id = rdzv or rendezvous()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env["GLOO_SOCKET_IFNAME"] = "eth0"
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # as docs/launching.md's restart recipe
    torchrun = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}"]
    torchrun += [f"--nproc_per_node={nproc}", "--rdzv_backend=c10d", *launcher]
    torchrun += [f"--rdzv_endpoint={endpoint}", f"--rdzv_id={run_id}"]
    distseq = [*torchrun, "-m", "distseq", *args]
    return [
        subprocess.Popen(
            ["bash", str(HOSTS), "run", str(k), *(wrap or {}).get(k, []), *distseq],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
        for k in hosts
    ]


def finish(
    procs: list[subprocess.Popen[str]], timeout: float = 420
) -> list[subprocess.CompletedProcess[str]]:
    """Each host's result; past ``timeout``, every host's processes are killed."""
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                os.killpg(p.pid, signal.SIGKILL)
            out, err = proc.communicate()
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return results


def on_hosts(
    nodes: int,
    nproc: int,
    cwd: Path,
    *args: str,
    timeout: float = 420,
    wrap: dict[int, list[str]] | None = None,
) -> list[subprocess.CompletedProcess[str]]:
    hosts = list(range(1, nodes + 1))
    return finish(start_on_hosts(hosts, nodes, nproc, cwd, *args, wrap=wrap), timeout)


def wait_for_step(out: Path, step: int, proc: subprocess.Popen[str]) -> None:
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while f'"step": {step},' not in (metrics.read_text() if metrics.exists() else ""):
        assert time.monotonic() < deadline and proc.poll() is None, f"no step {step}"
        time.sleep(0.2)


def host_pids(k: int) -> list[str]:
    """The processes running on host k (in its network namespace), but for the SLURM node daemon
    that CI's cluster keeps there (.ci/slurm.sh with DISTSEQ_SLURM_HOSTS)."""
    pids = subprocess.run(["ip", "netns", "pids", f"ds-h{k}"], capture_output=True, text=True)
    return [pid for pid in pids.stdout.split() if _command(pid) != "slurmd"]


def _command(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:  # gone meanwhile
        return ""


def parameters(run: Path) -> dict[str, torch.Tensor]:
    return load_model(run).model.state_dict()


def assert_bit_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]


def test_the_bed_is_hosts_that_reach_each_other(bed: None) -> None:
    # Host 2 is called ds-h2, resolves ds-h3 to its own address, and reaches it over TCP.
    server = subprocess.Popen(
        ["bash", str(HOSTS), "run", "3", sys.executable, "-c",
         "import socket; s = socket.create_server(('ds-h3', 23456)); c, a = s.accept(); "
         "print(a[0], c.recv(5).decode())"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    client = (
        "import socket, time\n"
        "for _ in range(50):\n"
        "    try: c = socket.create_connection(('ds-h3', 23456), timeout=1); break\n"
        "    except OSError: time.sleep(0.1)\n"
        "c.send(b'hello'); print(socket.gethostname(), socket.gethostbyname('ds-h3'))\n"
    )
    said = subprocess.run(
        ["bash", str(HOSTS), "run", "2", sys.executable, "-c", client],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert said.stdout.split() == ["ds-h2", "10.77.0.3"], said.stderr
    assert server.communicate(timeout=30)[0].split() == ["10.77.0.2", "hello"]


@pytest.mark.parametrize(
    ("nodes", "per_node", "mode", "sequence"),
    # 2 x 2: FSDP2 across the hosts, each video split across a host's 2 ranks (parallel.sequence)
    [(2, 2, "fsdp", 2), (3, 1, "ddp", 1)],
)
def test_a_multi_node_run_equals_one_host(
    bed: None, tmp_path: Path, shards: Path, nodes: int, per_node: int, mode: str, sequence: int
) -> None:
    config = str(tiny_config(tmp_path, shards))
    run = ["train", config, f"parallel.mode={mode}", f"parallel.sequence={sequence}"]
    results = on_hosts(nodes, per_node, tmp_path, *run, f"train.out_dir={tmp_path / 'hosts'}")
    for k, proc in enumerate(results, 1):
        assert proc.returncode == 0, f"host {k}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    # Rank 0 names every node's address and interface once, at the start.
    line = next(line for line in results[0].stdout.splitlines() if " nodes, store ds-h1:" in line)
    for k in range(1, nodes + 1):
        assert f"ds-h{k} 10.77.0.{k} (eth0, GLOO_SOCKET_IFNAME=eth0;" in line
    assert not any("nodes, store" in proc.stdout for proc in results[1:])
    if sequence > 1:  # a group inside a node
        assert "each video's frames split across ranks 0-1, 2-3" in results[0].stdout
    one = run_distseq(
        *run, f"train.out_dir={tmp_path / 'one'}", cwd=tmp_path, torchrun=nodes * per_node
    )
    assert one.returncode == 0, one.stderr[-3000:]
    assert " nodes, store" not in one.stdout  # one node: nothing to say
    # gloo reduces in rank order wherever the ranks run: bit-identical.
    assert_bit_equal(parameters(tmp_path / "hosts"), parameters(tmp_path / "one"))


@pytest.mark.alone
def test_an_output_folder_that_is_not_shared_is_refused_before_the_first_step(
    bed: None, tmp_path: Path, shards: Path
) -> None:
    # Host 2 sees a folder of its own at train.out_dir (a tmpfs in a mount namespace of its
    # own), as a node with a local disk there would.
    out = tmp_path / "run"
    out.mkdir()
    private = ["unshare", "--mount", "sh", "-c", f'mount -t tmpfs tmpfs {out} && exec "$@"', "sh"]
    config = str(tiny_config(tmp_path, shards))
    results = on_hosts(2, 1, tmp_path, "train", config, timeout=300, wrap={2: private})
    for k, proc in enumerate(results, 1):
        assert proc.returncode != 0, f"host {k} ran"
        assert (
            f"train.out_dir {out} is not one folder for all ranks: rank 1 on ds-h2 does not see "
            "what rank 0 on ds-h1 wrote there"
        ) in proc.stderr, proc.stderr[-3000:]
        assert "step 1:" not in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml"]  # no checkpoint, no token


# The faults' runs: long enough to be stopped at step 3 and resumed from a checkpoint.
FAULTED = ["train.steps=12", "train.save_every=2", "parallel.timeout_s=20"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory, shards: Path) -> dict[str, torch.Tensor]:
    """The parameters of the faults' run on 2 ranks of one host, never stopped: made once for the
    tests below (a torchrun run of 25-40 s each)."""
    tmp = tmp_path_factory.mktemp("straight")
    run = ["train", str(tiny_config(tmp, shards)), *FAULTED, f"train.out_dir={tmp / 'one'}"]
    one = run_distseq(*run, cwd=tmp, torchrun=2)
    assert one.returncode == 0, one.stderr[-3000:]
    return parameters(tmp / "one")


@pytest.mark.alone
def test_a_lost_link_stops_the_run_in_one_line_and_it_resumes_bit_exact(
    bed: None, tmp_path: Path, shards: Path, straight: dict[str, torch.Tensor]
) -> None:
    config = str(tiny_config(tmp_path, shards))
    run = ["train", config, *FAULTED]
    out = tmp_path / "hosts"
    procs = start_on_hosts([1, 2], 2, 1, tmp_path, *run, f"train.out_dir={out}")
    wait_for_step(out, 3, procs[0])
    subprocess.run(["ip", "-n", "ds-h2", "link", "set", "eth0", "down"], check=True)
    lost = time.monotonic()
    try:
        first = finish(procs[:1], timeout=180)[0]
        stopped = time.monotonic() - lost
    finally:
        os.killpg(procs[1].pid, signal.SIGKILL)  # the lost host's agent hangs on the store
        procs[1].communicate()
        subprocess.run(["ip", "-n", "ds-h2", "link", "set", "eth0", "up"], check=True)
    # Host 1 stops within the timeout (and the few seconds of probing), in one line that names
    # the host that does not answer.
    assert first.returncode != 0 and stopped < 20 + 30, (stopped, first.stderr[-3000:])
    errors = [line for line in first.stderr.splitlines() if line.startswith("distseq: error")]
    assert len(errors) == 1, first.stderr[-3000:]
    assert "a collective failed after step" in errors[0] and "(parallel.timeout_s=20)" in errors[0]
    assert "ds-h2 10.77.0.2 (eth0, GLOO_SOCKET_IFNAME=eth0; rank 1) does not answer" in errors[0]
    assert "Traceback" not in first.stderr.split(errors[0])[0]  # no wall before the line
    # Relaunched with the link back, the run resumes from its last checkpoint and ends as a
    # run never stopped does (2 ranks on one host give the same bits, test above).
    again = on_hosts(2, 1, tmp_path, *run, f"train.out_dir={out}")
    for k, proc in enumerate(again, 1):
        assert proc.returncode == 0, f"host {k}:\n{proc.stderr[-30000:]}"
    assert_bit_equal(parameters(out), straight)


@pytest.mark.alone
def test_a_killed_agent_leaves_no_orphan_and_the_group_re_forms_bit_exact(
    bed: None, tmp_path: Path, shards: Path, straight: dict[str, torch.Tensor]
) -> None:
    config = str(tiny_config(tmp_path, shards))
    run = ["train", config, *FAULTED, f"train.out_dir={tmp_path / 'hosts'}"]
    rdzv = rendezvous()
    restarts = ("--max-restarts=1",)
    first, second = start_on_hosts([1, 2], 2, 1, tmp_path, *run, rdzv=rdzv, launcher=restarts)
    wait_for_step(tmp_path / "hosts", 3, first)
    os.kill(second.pid, signal.SIGKILL)  # host 2's torchrun agent alone, as the OOM killer does
    # Its worker notices and exits: no process is left on host 2.
    deadline = time.monotonic() + 30
    while (left := host_pids(2)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"host 2's processes outlived its agent: {left}"
    _, err = second.communicate()
    assert "the torchrun agent" in err and "is gone; exiting" in err, err[-2000:]
    # Host 1's agent restarts its worker, which waits for host 2 to come back; then the group
    # re-forms and resumes from the last checkpoint.
    (again,) = start_on_hosts([2], 2, 1, tmp_path, *run, rdzv=rdzv, launcher=restarts)
    results = finish([first, again], timeout=300)
    for k, proc in enumerate(results, 1):
        assert proc.returncode == 0, f"host {k}:\n{proc.stderr[-30000:]}"
    assert "distseq: resuming from" in results[0].stdout + results[0].stderr
    lost = [line for line in results[0].stderr.splitlines() if "distseq: error" in line]
    assert len(lost) == 1 and "a collective failed after step" in lost[0], results[0].stderr[-3000:]
    assert_bit_equal(parameters(tmp_path / "hosts"), straight)


DELAY_MS = 20


def _step_seconds(out: Path) -> float:
    """The median step time of a run after its first step, from its metrics log."""
    lines = (out / "metrics.jsonl").read_text().splitlines()
    times = sorted(r["step_seconds"] for r in map(json.loads, lines[1:]) if "step_seconds" in r)
    return times[len(times) // 2]


@pytest.mark.alone
def test_a_slow_link_adds_at_least_its_delay_to_every_collective(
    bed: None, tmp_path: Path, shards: Path
) -> None:
    # netem delays what host 2 sends; where the kernel has no netem (gVisor, some containers),
    # there is nothing to measure.
    netem = ["ip", "netns", "exec", "ds-h2", "tc", "qdisc"]
    added = subprocess.run(
        [*netem, "add", "dev", "eth0", "root", "netem", "delay", f"{DELAY_MS}ms"],
        capture_output=True, text=True,
    )  # fmt: skip
    if added.returncode != 0:
        pytest.skip(f"no netem delay on this kernel: tc says {added.stderr.strip()!r}")
    config = str(tiny_config(tmp_path, shards))
    run = ["train", config, "train.steps=6", "parallel.mode=ddp"]
    try:
        slow = on_hosts(2, 1, tmp_path, *run, f"train.out_dir={tmp_path / 'slow'}")
    finally:
        subprocess.run([*netem, "del", "dev", "eth0", "root"], check=True)
    fast = on_hosts(2, 1, tmp_path, *run, f"train.out_dir={tmp_path / 'fast'}")
    for proc in (*slow, *fast):
        assert proc.returncode == 0, proc.stderr[-3000:]
    # Each collective waits at least once for a message from host 2, so a step is slower by at
    # least the delay times its collectives (6 for DDP here: `distseq bench traffic`).
    extra = _step_seconds(tmp_path / "slow") - _step_seconds(tmp_path / "fast")
    print(f"step time: +{extra * 1000:.0f} ms with {DELAY_MS} ms of delay on host 2's link")
    assert extra >= 6 * DELAY_MS / 1000, extra


@pytest.mark.alone
def test_the_stores_host_gone_at_start_fails_within_the_rendezvous_timeout(
    bed: None, tmp_path: Path, shards: Path
) -> None:
    # Host 2 is told the store is on host 1, where nothing runs: torchrun's agent gives up
    # after its read timeout (default 60 s, 97 s in all on the bed), not never.
    config = str(tiny_config(tmp_path, shards))
    start = time.monotonic()
    timeout = ("--rdzv_conf=read_timeout=15",)
    (agent,) = start_on_hosts([2], 2, 1, tmp_path, "train", config, launcher=timeout)
    (result,) = finish([agent], timeout=120)
    seconds = time.monotonic() - start
    assert result.returncode == 1, result.stderr[-2000:]
    assert "RendezvousConnectionError" in result.stderr, result.stderr[-2000:]
    assert "(ds-h1, " in result.stderr, result.stderr[-2000:]  # torch's words vary; the host
    assert seconds < 90, seconds  # two tries of 15 s and a back-off: 40 s on the bed
