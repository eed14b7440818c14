"""Where a training program's time goes: acting, the updates and the evaluation, each a separately compiled
sub-program timed on the state after a warm-up period, S seeds vmapped as `ftw-jax train --seeds` runs them.

    python experiments/benchmarks/profile_train.py --env sokoban            # the environment's defaults, 3 seeds

Per iteration the program plays B episodes (acting), runs `learner.learn` on them (U updates) and, every
`eval_every` iterations, evaluates `eval_episodes` episodes. Each part is timed alone (median of --repeats
calls, each waited on), and the whole period (`Trainer.run` for one period) beside them, so the shares can
be checked against the total: acting + updates + evaluation / eval_every ≈ period / eval_every.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax

from ftw_jax.lab.rollout import Player, rollouts
from ftw_jax.lab.train import TrainConfig, make_train
from ftw_jax.running import threefry
from ftw_jax.running.loop import seed_keys

threefry.use_unrolled()


def median_seconds(function, *args, repeats: int) -> float:
    jax.block_until_ready(function(*args))  # compiles, and the first call's set-up
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        jax.block_until_ready(function(*args))
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def profile(config: TrainConfig, num_seeds: int, repeats: int) -> dict:
    trainer = make_train(config)
    env, env_params, policy, learner = trainer.env, trainer.env.default_params(), trainer.policy, trainer.learner
    run = jax.jit(jax.vmap(trainer.run, in_axes=(0, None)), static_argnums=1)
    carries = jax.vmap(trainer.init)(seed_keys(list(range(num_seeds))))
    carries, _ = jax.block_until_ready(run(carries, 1))  # a warm-up period: the pool filled, the policy moved
    keys = jax.vmap(lambda key: jax.random.fold_in(key, 1))(carries.key)

    def act(carry, key):
        state = carry.learner.policy
        player = Player(env, env_params, policy, state.params, state.version)
        return rollouts(key, player, config.episodes_per_iteration)[0]

    def learn(carry, batch, key):
        return learner.learn(carry.learner, batch, key, carry.hyperparameters)

    act, learn = jax.jit(jax.vmap(act)), jax.jit(jax.vmap(learn))
    evaluate = jax.jit(jax.vmap(trainer.evaluate))
    batch = act(carries, keys)
    seconds = {
        "acting": median_seconds(act, carries, keys, repeats=repeats),
        "updates": median_seconds(learn, carries, batch, keys, repeats=repeats),
        "evaluation": median_seconds(evaluate, keys, carries, repeats=repeats) / config.eval_every,
    }
    period = median_seconds(run, carries, 1, repeats=max(1, repeats // 5)) / config.eval_every
    parts = sum(seconds.values())
    return {
        "seconds_per_iteration": seconds,
        "shares": {name: value / parts for name, value in seconds.items()},
        "sum_of_parts": parts,
        "whole_iteration": period,
        "env_steps_per_iteration": float(batch.mask.sum()) / num_seeds,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="sokoban")
    parser.add_argument("--seeds", type=int, default=3, help="S, seeds vmapped in one program (default 3)")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls of each part (median)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a TrainConfig setting (repeatable), e.g. --set eval_every=40",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.repeats < 1:
        parser.error(f"--seeds and --repeats must be >= 1, got {args.seeds} and {args.repeats}")
    overrides = {}
    for item in args.set:
        name, separator, value = item.partition("=")
        if not separator:
            parser.error(f"--set expects NAME=VALUE, got {item!r}")
        overrides[name] = json.loads(value) if value[:1] in "[{0123456789-tfn" else value
    config = TrainConfig.for_env(args.env, **overrides)
    result = profile(config, args.seeds, args.repeats)
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{args.env}, {args.seeds} seeds vmapped, {jax.devices()[0].platform}: B={config.episodes_per_iteration}, "
        f"U={getattr(config.algorithm_config, 'updates_per_iteration', 1)}, "
        f"eval {config.eval_episodes} episodes every {config.eval_every} iterations; "
        f"~{result['env_steps_per_iteration']:.0f} env steps per seed per iteration"
    )
    print("| part | ms per iteration | share |\n|---|---:|---:|")
    for name, value in result["seconds_per_iteration"].items():
        print(f"| {name} | {1e3 * value:.1f} | {100 * result['shares'][name]:.0f}% |")
    print(f"| sum of the parts | {1e3 * result['sum_of_parts']:.1f} | |")
    print(f"| one period / eval_every (the whole program) | {1e3 * result['whole_iteration']:.1f} | |")


if __name__ == "__main__":
    main()
