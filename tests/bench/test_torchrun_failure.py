"""The line ``bench traffic`` gives when its torchrun group fails, from torchrun's real output
(torch 2.14, trimmed): the rank's own error, else the exit of the rank torchrun blames."""

from __future__ import annotations

from distseq.bench.traffic import torchrun_failure

SUMMARY = """\
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 386
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
=======================================================
distseq.bench.traffic FAILED
-------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-02_09:08:53
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 24035)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 24035
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-02_09:08:53
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -6 (pid: 24036)  (SIGABRT)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 24036
=======================================================
"""
AGENT = (
    "E1202 09:08:53.983000 24030 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
    "(exitcode: -6) local_rank: 1 (pid: 24036) of binary: /venv/bin/python\n"
)


def test_a_rank_s_own_line_comes_first() -> None:
    said = "UserWarning: a warning\nterminate called without an active exception\n"
    assert (
        torchrun_failure(said + AGENT + SUMMARY) == "terminate called without an active exception"
    )
    said = "  File 'x.py', line 3\nRuntimeError: [../gloo/pair.cc:534] Connection closed by peer\n"
    assert torchrun_failure(said + AGENT + SUMMARY).startswith("RuntimeError: [../gloo/pair.cc")


def test_a_silent_rank_is_named_with_its_exit_from_the_root_cause() -> None:
    # A rank killed by a signal prints nothing: before, torchrun's "ChildFailedError:" was all.
    assert torchrun_failure(AGENT + SUMMARY) == (
        "rank : 1 (local_rank: 1), exitcode : -6 (pid: 24036) (SIGABRT)"
    )
