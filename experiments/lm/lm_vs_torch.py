"""The LM side by side with PyTorch transformers on identical weights: forward, train step, sampling.

    python experiments/lm/lm_vs_torch.py                        # tiny, small, medium; builds runs/parity-venv once
    python experiments/lm/lm_vs_torch.py --sizes small --rounds 5
    git worktree add /tmp/before HEAD~1 && python experiments/lm/lm_vs_torch.py --baseline /tmp/before   # a change

Each size (the shapes of `experiments/lm/lm_benchmark.py`, a Qwen2 layout) is initialised once in JAX and saved as
a Hugging Face folder that both sides load. Each side then runs in its own process (torch in the parity venv
that `experiments/lm/lm_parity.py` builds: torch is never a dependency of the project), the two alternating for
`--rounds` rounds so that the machine's load falls on both alike; each process compiles or warms up first and
reports the median of `--repeats` calls, and the table gives the median over rounds. Measured, in float32:

- forward: the logits of batch × length tokens (torch under `inference_mode`, its default SDPA attention);
- train step: next-token cross-entropy, its gradient and an Adam step (torch: `backward` and `torch.optim.Adam`);
  "backward / forward" is (train step − forward) / forward on each side;
- sampling: `new_tokens` tokens per row after a prompt of length − new_tokens tokens, through the KV cache:
  `make_sampler` against `generate(do_sample=True)`, with nothing cut (top-k 0, top-p 1) and with top-p 0.95,
  every row writing all its tokens (no stop token; `min_new_tokens` on the torch side).

Ratios are JAX's speed over torch's (above 1: JAX is faster). torch runs `--torch-threads` threads (default 1,
where it ran fastest on the 2-core machine); JAX uses what XLA takes. With `--baseline CHECKOUT`, a third process
runs that checkout's `ftw_jax` in the same rotation, and a second table compares this revision with it.
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

ROOT = pathlib.Path(__file__).resolve().parents[2]
MEASURES = ("forward", "train", "sample", "sample_top_p")
TOP_P = 0.95


def cpu_description() -> str:
    """The CPU's model and vector extensions: the two libraries pick their kernels by them, so ratios measured
    on different hosts differ (2026-12-04's AMD host gave JAX/torch 1.6–3× the ratios of the day before)."""
    try:
        info = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return "CPU: unknown (no /proc/cpuinfo)"
    fields = {
        key.strip(): value.strip() for key, value in (line.split(":", 1) for line in info.splitlines() if ":" in line)
    }
    flags = fields.get("flags", "").split()
    wanted = [flag for flag in ("avx", "avx2", "fma", "avx512f", "amx_tile") if flag in flags]
    model = fields.get("model name", "unknown")
    return f"CPU: {model}, {os.cpu_count()} cores, {' '.join(wanted) or 'no AVX'}"


def median_seconds(call, repeats: int) -> float:
    """Median seconds of `call()` over `repeats` calls, after one call that compiles or warms up."""
    call()
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def jax_worker(folder: pathlib.Path, batch: int, length: int, new_tokens: int, repeats: int) -> dict:
    import jax
    import jax.numpy as jnp
    import optax
    from lm_benchmark import make_train_step  # the worker runs from experiments/

    from ftw_jax.lm import SamplingConfig, load, make_sampler

    model, params = load(folder)
    tokens = jax.random.randint(jax.random.key(1), (batch, length), 0, model.config.vocab_size)
    prompts = tokens[:, : length - new_tokens]
    prompt_mask = jnp.ones(prompts.shape, bool)
    optimizer = optax.adam(1e-4)
    train_step = make_train_step(model, optimizer)
    forward = jax.jit(model.apply)
    opt_state = optimizer.init(params)
    samplers = {
        "sample": make_sampler(model, SamplingConfig(max_new_tokens=new_tokens)),
        "sample_top_p": make_sampler(model, SamplingConfig(max_new_tokens=new_tokens, top_p=TOP_P)),
    }
    key = jax.random.key(2)
    seconds = {
        "forward": median_seconds(lambda: jax.block_until_ready(forward(params, tokens)), repeats),
        "train": median_seconds(lambda: jax.block_until_ready(train_step(params, opt_state, tokens)), repeats),
    }
    for name, sample in samplers.items():
        seconds[name] = median_seconds(
            lambda s=sample: jax.block_until_ready(s(params, key, prompts, prompt_mask)), repeats
        )
    return seconds


def torch_worker(folder: pathlib.Path, batch: int, length: int, new_tokens: int, repeats: int, threads: int) -> dict:
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    vocab = model.config.vocab_size
    tokens = torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(1))
    prompts = tokens[:, : length - new_tokens]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def forward():
        model.eval()
        with torch.inference_mode():
            return model(tokens).logits

    def train_step():
        model.train()
        optimizer.zero_grad(set_to_none=True)
        logits = model(tokens[:, :-1]).logits
        F.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1)).backward()
        optimizer.step()

    def sample(top_p: float):
        model.eval()
        with torch.inference_mode():
            out = model.generate(
                prompts,
                attention_mask=torch.ones_like(prompts),
                do_sample=True,
                top_k=0,
                top_p=top_p,
                temperature=1.0,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=0,
            )
        assert out.shape == (batch, length), out.shape  # every row wrote all its tokens

    return {
        "forward": median_seconds(forward, repeats),
        "train": median_seconds(train_step, repeats),
        "sample": median_seconds(lambda: sample(1.0), repeats),
        "sample_top_p": median_seconds(lambda: sample(TOP_P), repeats),
    }


TABLE_HEAD = (
    "| size | parameters | train step JAX / torch | forward JAX / torch | sampling JAX / `generate` | "
    "sampling top-p 0.95 JAX / `generate` | backward / forward JAX | backward / forward torch |",
    "|---|---:|---:|---:|---:|---:|---:|---:|",
)
BASELINE_HEAD = (
    "| size | train step speed / baseline | forward | sampling | sampling top-p | backward / forward, baseline |",
    "|---|---:|---:|---:|---:|---:|",
)


def backward_over_forward(seconds: dict) -> float:
    return (seconds["train"] - seconds["forward"]) / seconds["forward"]


def table_row(label: str, jax_seconds: dict, torch_seconds: dict) -> str:
    """A row of JAX's speed over torch's (torch's seconds over JAX's) and each side's backward / forward."""
    ratios = " | ".join(
        f"{torch_seconds[m] / jax_seconds[m]:.2f}" for m in ("train", "forward", "sample", "sample_top_p")
    )
    backward = (backward_over_forward(jax_seconds), backward_over_forward(torch_seconds))
    return f"| {label} | {ratios} | {backward[0]:.1f} | {backward[1]:.1f} |"


def baseline_row(name: str, jax_seconds: dict, baseline_seconds: dict) -> str:
    ratios = " | ".join(
        f"{baseline_seconds[m] / jax_seconds[m]:.2f}" for m in ("train", "forward", "sample", "sample_top_p")
    )
    return f"| {name} | {ratios} | {backward_over_forward(baseline_seconds):.1f} |"


def run_worker(python: pathlib.Path, side: str, folder: pathlib.Path, args: argparse.Namespace) -> dict:
    """One worker process's medians; side "baseline" is JAX importing `ftw_jax` from `args.baseline`."""
    command = [str(python), __file__, "--worker", "torch" if side == "torch" else "jax", "--folder", str(folder)]
    for flag in ("batch", "length", "new_tokens", "repeats", "torch_threads"):
        command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    # PYTHONPATH comes before the editable install's finder; the worker's own folder is experiments/, not ROOT.
    env = {**os.environ, "PYTHONPATH": str(args.baseline.resolve())} if side == "baseline" else None
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    if done.returncode != 0:
        raise SystemExit(f"the {side} worker failed ({folder.name}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="tiny,small,medium", help="comma-separated sizes of lm_benchmark.py")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=128, help="tokens per row (forward and training)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens each row samples")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per process (median)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating process pairs per size (median)")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--venv", type=pathlib.Path, default=ROOT / "runs" / "parity-venv")
    parser.add_argument("--out", type=pathlib.Path, help="also write every round's seconds here (JSON)")
    parser.add_argument("--baseline", type=pathlib.Path, help="a checkout of another revision, timed alongside")
    parser.add_argument("--worker", choices=["jax", "torch"], help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=pathlib.Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "jax":
        print(json.dumps(jax_worker(args.folder, args.batch, args.length, args.new_tokens, args.repeats)))
        return
    if args.worker == "torch":
        seconds = torch_worker(args.folder, args.batch, args.length, args.new_tokens, args.repeats, args.torch_threads)
        print(json.dumps(seconds))
        return

    from lm_benchmark import SIZES
    from lm_parity import build_venv

    sizes = args.sizes.split(",")
    unknown = [name for name in sizes if name not in SIZES]
    if unknown or not 0 < args.new_tokens < args.length or min(args.repeats, args.rounds, args.torch_threads) < 1:
        raise SystemExit(
            f"error: unknown sizes {unknown} (known: {', '.join(SIZES)})"
            if unknown
            else "error: --new-tokens must be in [1, --length) and --repeats, --rounds, --torch-threads >= 1."
        )
    if args.baseline and not (args.baseline / "ftw_jax" / "__init__.py").is_file():
        raise SystemExit(f"error: --baseline {args.baseline} is not a checkout of this project (no ftw_jax/ in it).")
    sides = ["jax", "torch"] + (["baseline"] if args.baseline else [])
    torch_python = build_venv(args.venv.resolve())
    import jax

    from ftw_jax.lm import CausalLM, save
    from ftw_jax.lm.memory import parameter_count

    device = jax.devices()[0]
    print(
        f"JAX {jax.__version__} on {device.device_kind} ({device.platform}) against torch at {args.torch_threads} "
        f"thread(s); float32, batch {args.batch}, length {args.length}, {args.new_tokens} new tokens; median of "
        f"{args.repeats} calls per process, median of {args.rounds} alternating rounds\n{cpu_description()}\n",
        flush=True,
    )
    rows, against_baseline, record = list(TABLE_HEAD), list(BASELINE_HEAD), {}
    with tempfile.TemporaryDirectory() as scratch:
        for name in sizes:
            config = SIZES[name]
            params = jax.jit(CausalLM(config).init)(jax.random.key(0), jax.numpy.zeros((1, 8), jax.numpy.int32))
            folder = save(pathlib.Path(scratch) / name, config, params)
            rounds: dict[str, list[dict]] = {side: [] for side in sides}
            for index in range(args.rounds):  # rotate which side goes first
                for side in sides[index % len(sides) :] + sides[: index % len(sides)]:
                    python = torch_python if side == "torch" else pathlib.Path(sys.executable)
                    rounds[side].append(run_worker(python, side, folder, args))
                print(f"  {name}: round {index + 1} of {args.rounds}", file=sys.stderr, flush=True)
            medians = {
                side: {measure: statistics.median(r[measure] for r in runs) for measure in MEASURES}
                for side, runs in rounds.items()
            }
            record[name] = {"rounds": rounds, "medians": medians}
            rows.append(table_row(f"{name} | {parameter_count(config) / 1e6:,.1f}M", medians["jax"], medians["torch"]))
            print(rows[-1] if len(rows) > len(TABLE_HEAD) + 1 else "\n".join(rows), flush=True)
            if args.baseline:
                against_baseline.append(baseline_row(name, medians["jax"], medians["baseline"]))
    if args.baseline:
        print(f"\nthis revision against {args.baseline} (speed ratios, above 1: faster now):\n")
        print("\n".join(against_baseline))
    if args.out:
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
