"""The bandit protocol of `ftw-jax bandit` in plain NumPy: one seed after another, a Python loop per iteration.

    python experiments/benchmarks/bandit_numpy.py --num-seeds 1000 --json

The straightforward implementation, as a baseline for `experiments/benchmarks/bench_bandit.py`: a Gaussian
2-armed bandit, zero logits, one pull per iteration, a FIFO pool, J minibatches of C entries drawn without
replacement among those in the pool, the top K of each by return (ties broken at random), loss = mean
cross-entropy on the kept actions + β · KL(π ‖ π_ref) with π_ref the initial (uniform) policy, its gradient in
the logits written out, and plain SGD; no update until the pool holds C entries. The settings are
`ftw_jax.lab.reproduction.protocol_config()`'s (the benchmark checks they still are). Each seed has its own
`numpy.random.Generator`, so results agree with JAX's in distribution, not seed by seed.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

FIRST_SEED = 42  # as `ftw-jax bandit`: seeds 42, 43, ..., 42 + N - 1
PROTOCOL = dict(
    arm_means=(1.0, 0.3),
    noise_sd=0.2,
    num_iterations=240,
    pool_capacity=128,
    num_batches=4,
    batch_size=5,
    num_elites=1,
    kl_coef=0.05,
    learning_rate=0.08,
)


def softmax(logits: np.ndarray) -> np.ndarray:
    exp = np.exp(logits - logits.max())
    return exp / exp.sum()


def run(
    seed: int,
    *,
    arm_means,
    noise_sd,
    num_iterations,
    pool_capacity,
    num_batches,
    batch_size,
    num_elites,
    kl_coef,
    learning_rate,
) -> float:
    """One seed of the protocol (the settings of `PROTOCOL`); returns the best arm's probability at the end."""
    rng = np.random.default_rng(seed)
    means = np.asarray(arm_means, dtype=np.float64)
    num_arms = len(means)
    logits = np.zeros(num_arms)
    log_reference = np.log(softmax(logits))  # the frozen initial policy (uniform)
    actions = np.zeros(pool_capacity, dtype=np.int64)  # the FIFO pool, a ring buffer
    returns = np.zeros(pool_capacity)
    insert, size = 0, 0
    for _ in range(num_iterations):
        probs = softmax(logits)
        action = rng.choice(num_arms, p=probs)
        actions[insert], returns[insert] = action, means[action] + noise_sd * rng.standard_normal()
        insert, size = (insert + 1) % pool_capacity, min(size + 1, pool_capacity)
        if size < batch_size:
            continue
        kept = []
        for _ in range(num_batches):
            candidates = rng.choice(size, batch_size, replace=False)
            ranked = candidates[np.lexsort((rng.random(batch_size), -returns[candidates]))]  # ties: at random
            kept.extend(actions[ranked[:num_elites]])
        target = np.bincount(kept, minlength=num_arms) / len(kept)
        # d/dz of mean_k[-log π(a_k)] = π − target; of KL(π ‖ π_ref) = π ⊙ (log π − log π_ref − KL).
        log_ratio = np.log(probs) - log_reference
        kl = probs @ log_ratio
        logits = logits - learning_rate * (probs - target + kl_coef * probs * (log_ratio - kl))
    return float(softmax(logits)[int(np.argmax(means))])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-seeds", type=int, default=1000, help="seeds 42, 43, ... (default 1000)")
    parser.add_argument("--json", action="store_true", help="print one JSON object, as `ftw-jax bandit --json`")
    args = parser.parse_args()
    seeds = [FIRST_SEED + i for i in range(args.num_seeds)]
    started = time.perf_counter()
    final = np.array([run(seed, **PROTOCOL) for seed in seeds])
    seconds = time.perf_counter() - started
    if args.json:
        print(
            json.dumps(
                {
                    "seeds": seeds,
                    "best_arm_probability_final": final.tolist(),
                    "best_arm_probability_final_mean": float(final.mean()),
                    "seconds": seconds,
                }
            )
        )
    else:
        print(
            f"{len(seeds)} seed(s) in {seconds:.1f} s: final P(best arm) mean {final.mean():.6f}, "
            f"quantiles 10/50/90 {np.round(np.quantile(final, [0.1, 0.5, 0.9]), 6).tolist()}"
        )


if __name__ == "__main__":
    main()
