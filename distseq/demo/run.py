"""``distseq demo``: generate the synthetic procedure task, train a per-frame CNN and the
end-to-end CNN+RNN on it, and report both accuracies."""

from __future__ import annotations

import argparse
import time
from importlib.resources import files
from pathlib import Path

from distseq.config import load_config
from distseq.data.synthetic import write_synthetic
from distseq.train.loop import train

PHASES = 4
# The baseline cannot beat the class prior, so it needs far fewer steps to show it.
BASELINE_STEPS = 40


def demo_config_path() -> Path:
    return Path(str(files("distseq.demo") / "demo.yaml"))


def run_demo(out_dir: str, overrides: list[str]) -> dict[str, float]:
    out = Path(out_dir)
    data_dir = out / "data"
    if not (data_dir / "index.json").is_file():
        print(f"writing synthetic shards to {data_dir} ...", flush=True)
        write_synthetic(
            data_dir,
            train_sequences=96,
            val_sequences=32,
            min_frames=48,
            max_frames=64,
            size=32,
            phases=PHASES,
            seed=0,
            sequences_per_shard=8,
        )
    shards = [f"data.train={data_dir}/train-{{000000..000011}}.tar"]
    shards.append(f"data.val={data_dir}/val-{{000000..000003}}.tar")
    results: dict[str, float] = {}
    runs = {
        "cnn_only": ["model.head.kind=none", f"train.steps={BASELINE_STEPS}"],
        "cnn_rnn": [],
    }
    for name, extra in runs.items():
        print(f"\n== {name}", flush=True)
        start = time.perf_counter()
        cfg = load_config(
            demo_config_path(), [*shards, f"train.out_dir={out / name}", *extra, *overrides]
        )
        metrics = train(cfg)
        results[name] = metrics["val_accuracy"]
        results[f"{name}_seconds"] = time.perf_counter() - start
    print(
        f"\nper-frame val accuracy ({PHASES} phases, chance {1 / PHASES:.2f}):\n"
        f"  CNN alone (per frame)     {results['cnn_only']:.3f}"
        f"   ({results['cnn_only_seconds']:.0f} s)\n"
        f"  CNN+LSTM, end to end      {results['cnn_rnn']:.3f}"
        f"   ({results['cnn_rnn_seconds']:.0f} s)"
    )
    return results


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="synthetic long-video task, trained end to end on CPU")
    p.add_argument("--out", default="runs/demo", help="where data and runs go")
    p.add_argument("overrides", nargs="*", help="key=value overrides of the demo config")
    p.set_defaults(run=lambda args: run_demo(args.out, args.overrides))
