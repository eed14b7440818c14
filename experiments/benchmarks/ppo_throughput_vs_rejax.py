"""Our PPO's training throughput on CartPole-v1 against rejax's, compile and evaluation left out, side by side.

    python experiments/benchmarks/ppo_throughput_vs_rejax.py  # ~3 minutes on 2 cores (rejax's venv built once)
    python experiments/benchmarks/ppo_throughput_vs_rejax.py --rounds 3

Both sides train rejax's recommended CartPole PPO config (`rejax_ppo_cartpole.py`: 5 epochs × 5 minibatches,
Adam 7.5e-4, γ 0.99, λ 0.95, ε 0.2, entropy 0.01, gradient clip 0.5, tanh MLP 64-64) for 10 seeds vmapped in
one program. rejax (its own virtual environment, `runs/rejax-venv`) runs `PPO.train` for 100k env steps per seed
with a single evaluation at the end, compiled first (`jit(...).lower(...).compile()`), then timed. Ours runs
`ftw-jax train --env cartpole --algorithm ppo` with the same settings (B = 10 whole episodes per iteration, one
evaluation at the end) and reports its own env steps/s, which leave the compile out (the first period's). Each
side's env steps/s counts every seed's training steps; the rounds alternate the two processes and the table
gives the median. The final returns (mean over seeds of the last evaluation) are printed beside them: a
throughput is comparable only at returns alike.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from rejax_ppo_cartpole import OURS, REJAX_CONFIG, SEEDS, TOTAL_STEPS, run_rejax  # noqa: E402

OUR_ITERATIONS = 80  # B = 10 episodes each: past 100k steps per seed (rejax_ppo_cartpole.py's --iterations)


def rejax_worker(out: pathlib.Path) -> None:
    """Runs inside rejax's venv: PPO's training compiled, then timed, evaluating once at the end."""
    import jax
    import numpy as np
    from rejax import PPO

    algorithm = PPO.create(**{**json.loads(json.dumps(REJAX_CONFIG)), "eval_freq": TOTAL_STEPS})
    keys = jax.random.split(jax.random.key(0), len(SEEDS))
    compiled = jax.jit(jax.vmap(algorithm.train)).lower(keys).compile()
    started = time.perf_counter()
    _, (_, returns) = jax.block_until_ready(compiled(keys))
    seconds = time.perf_counter() - started
    final = float(np.asarray(returns)[:, -1].mean())
    out.write_text(json.dumps({"steps_per_second": len(SEEDS) * TOTAL_STEPS / seconds, "final_return": final}))


def ours(folder: pathlib.Path) -> dict:
    """`ftw-jax train` with rejax's settings; its own env steps/s (compile excluded) and final return."""
    flags = {
        "updates-per-iteration": OURS["updates_per_iteration"],
        "num-minibatches": OURS["num_minibatches"],
        "learning-rate": OURS["learning_rate"],
        "discount": OURS["discount"],
        "gae-lambda": OURS["gae_lambda"],
        "clip-epsilon": OURS["clip_epsilon"],
        "clip-value-loss": "yes" if OURS["clip_value_loss"] else "no",
        "entropy-coef": OURS["entropy_coef"],
        "max-grad-norm": OURS["max_grad_norm"],
        "optimizer": OURS["optimizer"],
        "hidden-sizes": ",".join(map(str, OURS["hidden_sizes"])),
        "kl-coef": OURS["kl_coef"],
        "eval-episodes": OURS["eval_episodes"],
        "iterations": OUR_ITERATIONS,
        "eval-every": OUR_ITERATIONS,
        "episodes-per-iteration": 10,
        "seeds": ",".join(map(str, SEEDS)),
    }
    argv = [sys.executable, "-m", "ftw_jax.cli", "train", "--env", "cartpole", "--algorithm", "ppo"]
    argv += [item for name, value in flags.items() for item in (f"--{name}", str(value))]
    argv += ["--no-tensorboard", "--json", "--out", str(folder)]
    result = subprocess.run(argv, capture_output=True, text=True, check=True)
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    if min(summary["env_steps"]) < TOTAL_STEPS:
        raise SystemExit(f"a seed trained only {min(summary['env_steps'])} steps; raise OUR_ITERATIONS.")
    return {"steps_per_second": summary["env_steps_per_second"], "final_return": statistics.mean(summary["return"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--venv", type=pathlib.Path, default=pathlib.Path("runs/rejax-venv"))
    parser.add_argument("--rounds", type=int, default=2, help="alternating rejax / ours process pairs (median)")
    parser.add_argument("--worker", choices=["rejax"], help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", type=pathlib.Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        rejax_worker(args.worker_out)
        return
    runs: dict[str, list[dict]] = {"rejax": [], "ours": []}
    with tempfile.TemporaryDirectory() as scratch:
        folder = pathlib.Path(scratch)
        for index in range(args.rounds):
            runs["rejax"].append(run_rejax(args.venv.resolve(), folder / "rejax.json", worker=__file__))
            runs["ours"].append(ours(folder / f"ours-{index}"))
            print(f"  round {index + 1} of {args.rounds}: {runs}", file=sys.stderr, flush=True)
    median = {side: statistics.median(run["steps_per_second"] for run in done) for side, done in runs.items()}
    print(f"CartPole-v1 PPO, rejax's config, {len(SEEDS)} seeds vmapped, median of {args.rounds} alternating rounds\n")
    print("| side | env steps/s (compile excluded) | / rejax | final return (mean over seeds, each round) |")
    print("|---|---:|---:|---|")
    for side, done in runs.items():
        finals = ", ".join(f"{run['final_return']:.1f}" for run in done)
        print(f"| {side} | {median[side]:,.0f} | {median[side] / median['rejax']:.2f} | {finals} |")


if __name__ == "__main__":
    main()
