"""Peak resident memory of `ftw-jax lm learn` over a real vocabulary, by the logits' chunk, side by side.

    python experiments/lm/lm_learn_resident.py --vocab 151936 --length 512 --chunks 128,auto --repeats 2

Writes a tiny Qwen2-shaped model over `vocab` tokens (`lm.config.tiny_config`, random weights) and 16 episodes of
`length` random tokens whose second half the model wrote (uniform log-probabilities; `--sampler-gap-limit 0`, as
they are not the model's own), then runs `ftw-jax lm learn` on them once per chunk setting in a process of its
own (B = 8: two iterations, FTW's defaults, TensorBoard off), the settings alternating over `repeats` rounds. It
prints each process's peak resident set (from `wait4`) and seconds, and the medians per setting. "auto" is the
default (`policies.lm.logits_chunk_for`: sized to the loss's sequences and the vocabulary).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from ftw_jax.lm.config import tiny_config
from ftw_jax.lm.load import save
from ftw_jax.lm.model import CausalLM

GIB = 2**30


def write_inputs(folder: pathlib.Path, vocab: int, length: int) -> tuple[pathlib.Path, pathlib.Path]:
    """The model folder and the episodes file."""
    config = tiny_config(vocab)
    save(folder / "model", config, CausalLM(config).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32)))
    rng = np.random.default_rng(0)
    lines = []
    for index in range(16):
        tokens = rng.integers(0, vocab, size=length).tolist()
        start = length // 2
        span = {"start": start, "end": length, "version": 0, "logprobs": [-float(np.log(vocab))] * (length - start)}
        lines.append(json.dumps({"tokens": tokens, "spans": [span], "reward": float(index % 3 == 0)}))
    episodes = folder / "episodes.jsonl"
    episodes.write_text("\n".join(lines) + "\n")
    return folder / "model", episodes


def run_once(model: pathlib.Path, episodes: pathlib.Path, out: pathlib.Path, length: int, chunk: str) -> dict:
    """One `lm learn` process: its peak resident bytes and seconds."""
    argv = [sys.executable, "-m", "ftw_jax.cli", "lm", "learn", "--episodes", str(episodes), "--model", str(model)]
    argv += ["--out", str(out), "--max-length", str(length + 1), "--episodes-per-iteration", "8"]
    argv += ["--sampler-gap-limit", "0", "--no-tensorboard", "--json"]
    argv += [] if chunk == "auto" else ["--logits-chunk", chunk]
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    out_text, err_text = process.stdout.read(), process.stderr.read()  # type: ignore[union-attr]
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"lm learn failed (chunk {chunk}):\n{err_text[-2000:]}")
    summary = json.loads(out_text.strip().splitlines()[-1])
    return {"chunk": chunk, "resident": usage.ru_maxrss * 1024, "seconds": seconds, "iterations": summary["iterations"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--vocab", type=int, default=151_936, help="vocabulary size (default Qwen2.5's 151,936)")
    parser.add_argument("--length", type=int, default=512, help="tokens per episode (default 512)")
    parser.add_argument("--chunks", default="128,auto", help="--logits-chunk values to compare, 'auto' the default")
    parser.add_argument("--repeats", type=int, default=2, help="rounds over the settings (default 2)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        model, episodes = write_inputs(pathlib.Path(folder), args.vocab, args.length)
        for round_ in range(args.repeats):
            for chunk in args.chunks.split(","):
                row = run_once(model, episodes, pathlib.Path(folder) / f"run-{round_}-{chunk}", args.length, chunk)
                rows.append(row)
                print(f"chunk {chunk}: {row['resident'] / GIB:.2f} GiB resident, {row['seconds']:.1f} s", flush=True)
    shape = f"16 episodes of {args.length} tokens (B = 8: 2 iterations)"
    print(f"\nV = {args.vocab:,}, {shape}, medians of {args.repeats}:")
    print("| --logits-chunk | peak resident (GiB) | seconds (process) |\n|---|---:|---:|")
    for chunk in args.chunks.split(","):
        mine = [row for row in rows if row["chunk"] == chunk]
        resident = statistics.median(row["resident"] for row in mine) / GIB
        print(f"| {chunk} | {resident:.2f} | {statistics.median(row['seconds'] for row in mine):.1f} |")


if __name__ == "__main__":
    main()
