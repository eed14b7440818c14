"""The project's PPO against rejax's on gymnax CartPole-v1, side by side at the same env-step budget.

    # builds runs/rejax-venv from the package index on first use (~1 minute)
    python experiments/benchmarks/rejax_ppo_cartpole.py

rejax (a peer library of JAX RL algorithms) is not a dependency: its 0.1.3 release expects gymnax 0.0.9's
`step`, and the project needs gymnax 1.0.x, so this script builds a virtual environment of its own for
rejax 0.1.3 + gymnax 0.0.9 and runs rejax there (this same file, `--worker rejax`). Both sides take rejax's
recommended CartPole PPO config: 5 envs × 100 steps per iteration (ours: B = 10 whole episodes), 5 epochs ×
5 minibatches, Adam 7.5e-4, γ 0.99, λ 0.95, ε 0.2 (value clipping too), entropy 0.01, gradient clip 0.5,
tanh MLP 64-64, 100k env steps, evaluation = mean return of 128 episodes of the sampled policy. It prints
and writes (`results/rejax_ppo_cartpole/`) both curves against env steps with 95% t-intervals over seeds,
their wall clock, and whether the two gymnax versions' CartPole dynamics agree step for step.

Where the implementations differ (by design, not tuned away):
- rollouts: rejax steps 5 environments for 100 steps and bootstraps nothing past a `done` (truncation
  included); ours plays B whole episodes per iteration (so its iterations hold 10 × episode length steps).
- gradient clipping: rejax's `max_grad_norm` is `optax.clip`, each gradient entry clipped to ±0.5; ours
  (and CleanRL's, PureJaxRL's) clips the global norm to 0.5.
- the critic loss: rejax scales it by vf_coef = 0.5 (with Adam this changes almost nothing); both clip it.
- the policy's loss averages over the steps of a minibatch in both; ours masks the steps after an episode's end.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import pathlib
import subprocess
import sys
import time

import numpy as np

REJAX = ["rejax==0.1.3", "gymnax==0.0.9"]
SEEDS = list(range(10))
TOTAL_STEPS = 100_000
EVAL_EVERY_STEPS = 5_000
EVAL_EPISODES = 128
REJAX_CONFIG = dict(
    env="CartPole-v1",
    num_envs=5,
    num_steps=100,
    num_epochs=5,
    num_minibatches=5,
    learning_rate=7.5e-4,
    gamma=0.99,
    gae_lambda=0.95,
    clip_eps=0.2,
    ent_coef=0.01,
    vf_coef=0.5,
    max_grad_norm=0.5,
    total_timesteps=TOTAL_STEPS,
    eval_freq=EVAL_EVERY_STEPS,
    agent_kwargs={"activation": "tanh", "hidden_layer_sizes": [64, 64]},
)
OURS = dict(
    algorithm="ppo",
    updates_per_iteration=5,
    num_minibatches=5,
    learning_rate=7.5e-4,
    discount=0.99,
    gae_lambda=0.95,
    clip_epsilon=0.2,
    clip_value_loss=True,
    entropy_coef=0.01,
    max_grad_norm=0.5,
    optimizer="adam",
    hidden_sizes=(64, 64),
    kl_coef=0.0,
    eval_episodes=EVAL_EPISODES,
)
ACTIONS = [0, 1, 1, 0, 1, 1, 1, 0, 0, 0, 1, 0] * 20  # the dynamics check's fixed action sequence
START = (0.03, -0.2, 0.04, 0.3)  # x, ẋ, θ, θ̇


def cartpole_trajectory() -> dict:
    """Observations, rewards and dones of gymnax's CartPole from a fixed state under `ACTIONS` (this process's
    gymnax version)."""
    import gymnax
    import jax
    import jax.numpy as jnp

    env, params = gymnax.make("CartPole-v1")
    _, state = env.reset(jax.random.key(0), params)
    state = state.replace(
        x=jnp.float32(START[0]),
        x_dot=jnp.float32(START[1]),
        theta=jnp.float32(START[2]),
        theta_dot=jnp.float32(START[3]),
    )
    observations, rewards, dones = [], [], []
    for action in ACTIONS:
        observation, state, reward, done, *_ = env.step_env(jax.random.key(1), state, action, params)
        observations.append(np.asarray(observation).tolist())
        rewards.append(float(reward))
        dones.append(bool(done))
    return {
        "gymnax": importlib.metadata.version("gymnax"),
        "observations": observations,
        "rewards": rewards,
        "dones": dones,
    }


def rejax_worker(out: pathlib.Path) -> None:
    """Runs inside the rejax venv: every seed's evaluation curve, vmapped, and the dynamics check."""
    import jax
    from rejax import PPO

    started = time.perf_counter()
    algorithm = PPO.create(**json.loads(json.dumps(REJAX_CONFIG)))
    train = jax.jit(jax.vmap(algorithm.train))
    _, (_, returns) = train(jax.random.split(jax.random.key(0), len(SEEDS)))
    returns = np.asarray(returns).mean(axis=-1)  # [S, evaluations]
    seconds = time.perf_counter() - started
    steps = np.arange(returns.shape[1]) * EVAL_EVERY_STEPS
    out.write_text(
        json.dumps(
            {
                "env_steps": steps.tolist(),
                "returns": returns.tolist(),
                "seconds": seconds,
                "jax": jax.__version__,
                "dynamics": cartpole_trajectory(),
            }
        )
    )


def run_rejax(venv: pathlib.Path, out: pathlib.Path, worker: str = __file__) -> dict:
    """`worker` (a script taking `--worker rejax --worker-out OUT`) run in rejax's venv, built first if missing."""
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"building {venv} with {' '.join(REJAX)} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *REJAX], check=True)
    subprocess.run([str(python), worker, "--worker", "rejax", "--worker-out", str(out)], check=True)
    return json.loads(out.read_text())


def run_ours(iterations: int, episodes_per_iteration: int) -> dict:
    """Our PPO with rejax's config, all seeds in one compiled sweep; curves at rejax's evaluation points (each
    the last evaluation at or before that many env steps)."""
    from ftw_jax.lab.sweep import make_sweep, run_sweep

    started = time.perf_counter()
    sweep = make_sweep(
        "cartpole",
        {"lr": [OURS["learning_rate"]]},
        SEEDS,
        num_iterations=iterations,
        eval_every=1,
        episodes_per_iteration=episodes_per_iteration,
        **{name: value for name, value in OURS.items() if name != "learning_rate"},
    )
    results = run_sweep(sweep)
    seconds = time.perf_counter() - started
    checkpoints = np.arange(TOTAL_STEPS // EVAL_EVERY_STEPS + 1) * EVAL_EVERY_STEPS
    curves = np.full((len(SEEDS), len(checkpoints)), np.nan)
    for seed, (steps, returns) in enumerate(zip(results["env_steps"], results["return"])):
        if steps[-1] < TOTAL_STEPS:
            raise SystemExit(f"seed {SEEDS[seed]} used only {steps[-1]} env steps; raise --iterations.")
        for i, checkpoint in enumerate(checkpoints):
            before = np.nonzero(steps <= checkpoint)[0]
            curves[seed, i] = returns[before[-1]] if before.size else np.nan
    return {
        "env_steps": checkpoints.tolist(),
        "returns": curves.tolist(),
        "seconds": seconds,
        "steps_per_seed_run": results["env_steps"][:, -1].tolist(),
    }


def t_interval(values: np.ndarray) -> tuple[float, float, float]:
    """Mean and 95% t-interval over seeds (axis 0)."""
    import scipy.stats

    mean = float(np.mean(values))
    half = float(scipy.stats.t.ppf(0.975, len(values) - 1) * np.std(values, ddof=1) / np.sqrt(len(values)))
    return mean, mean - half, mean + half


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=pathlib.Path, default=pathlib.Path("runs/rejax-venv"))
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("results/rejax_ppo_cartpole"))
    parser.add_argument("--iterations", type=int, default=80, help="our iterations (must pass 100k env steps)")
    parser.add_argument(
        "--episodes-per-iteration",
        type=int,
        default=10,
        help="our B (a multiple of the 5 minibatches); fewer: more gradient steps per env step",
    )
    parser.add_argument("--worker", choices=["rejax"], help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", type=pathlib.Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        rejax_worker(args.worker_out)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    rejax = run_rejax(args.venv.resolve(), args.out / "rejax.json")
    ours = run_ours(args.iterations, args.episodes_per_iteration)
    (args.out / "ours.json").write_text(json.dumps(ours))
    dynamics = cartpole_trajectory()
    agree = (
        dynamics["dones"] == rejax["dynamics"]["dones"]
        and dynamics["rewards"] == rejax["dynamics"]["rewards"]
        and np.allclose(dynamics["observations"], rejax["dynamics"]["observations"], rtol=0, atol=1e-6)
    )
    worst = float(np.max(np.abs(np.array(dynamics["observations"]) - np.array(rejax["dynamics"]["observations"]))))
    print(
        f"CartPole dynamics, gymnax {rejax['dynamics']['gymnax']} (rejax's) vs {dynamics['gymnax']} (ours), "
        f"{len(ACTIONS)} steps from a fixed state: {'agree' if agree else 'DIFFER'} (max |Δobs| {worst:.2e})"
    )
    rows = ["| env steps | rejax PPO: mean [95% t-CI] | ours: mean [95% t-CI] |", "|---:|---:|---:|"]
    summary = {
        "seeds": SEEDS,
        "dynamics_agree": agree,
        "max_observation_difference": worst,
        "rejax_seconds": rejax["seconds"],
        "ours_seconds": ours["seconds"],
        "rejax_jax": rejax["jax"],
    }
    for i, steps in enumerate(rejax["env_steps"]):
        if steps == 0 or (steps % 20_000 and steps != TOTAL_STEPS):  # ours evaluates only after training
            continue
        cells = [t_interval(np.array(side["returns"])[:, i]) for side in (rejax, ours)]
        rows.append(f"| {steps:,} | " + " | ".join(f"{m:.1f} [{lo:.1f}, {hi:.1f}]" for m, lo, hi in cells) + " |")
        if steps == TOTAL_STEPS:
            summary["final"] = {"rejax": cells[0], "ours": cells[1]}
    rows.append(
        f"\nwall clock, compile included: rejax {rejax['seconds']:.1f} s, ours {ours['seconds']:.1f} s "
        f"({len(SEEDS)} seeds vmapped; ours also plays its last iteration past 100k steps: "
        f"{np.mean(ours['steps_per_seed_run']):,.0f} steps per seed in all)"
    )
    table = "\n".join(rows)
    print(table)
    (args.out / "table.md").write_text(table + "\n")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(rejax, ours, args.out / "curves.png")


def plot(rejax: dict, ours: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for name, side in (("rejax PPO", rejax), ("ftw_jax PPO", ours)):
        returns = np.array(side["returns"])
        cells = np.array([t_interval(returns[:, i]) for i in range(returns.shape[1])])
        axis.plot(side["env_steps"], cells[:, 0], label=name)
        axis.fill_between(side["env_steps"], cells[:, 1], cells[:, 2], alpha=0.25)
    axis.set_xlabel("env steps per seed")
    axis.set_ylabel("evaluation return (128 episodes)")
    axis.set_title(f"CartPole-v1, PPO with rejax's config: mean of {len(SEEDS)} seeds, 95% t-CI")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
