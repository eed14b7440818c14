"""How much the jitted FTW update costs on CPU over a bare CE+KL gradient step on pre-gathered elites (the floor)."""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import ftw_jax
from ftw_jax.core import losses
from ftw_jax.core import pool as pool_lib
from ftw_jax.policies import MLPPolicy
from ftw_jax.running import threefry
from ftw_jax.running.timing import interleaved_medians

threefry.use_unrolled()

OBS_DIM = 16
NUM_ACTIONS = 4
KL_COEF = 0.1
LEARNING_RATE = 1e-3
WARMUP_CALLS = 3
# (J, C, K): J·K = 4, 64, 1024.
JCK = ((4, 8, 1), (16, 16, 4), (64, 32, 16))
POOL_SIZES = (128, 4096)
STEPS = (1, 64)
# Above this many policy steps per call (J·K·T, or N·T on the counts path) the repeats are capped.
BIG_STEPS = 16_384
BIG_REPEATS = 15


def random_pool(key: jax.Array, capacity: int, num_steps: int) -> pool_lib.Pool:
    """A full pool of random trajectories (random returns, every step masked in)."""
    obs_key, action_key, logp_key, return_key = jax.random.split(key, 4)
    batch = ftw_jax.Trajectory(
        observation=jax.random.normal(obs_key, (capacity, num_steps, OBS_DIM), jnp.float32),
        action=jax.random.randint(action_key, (capacity, num_steps), 0, NUM_ACTIONS, jnp.int32),
        mask=jnp.ones((capacity, num_steps), jnp.bool_),
        behaviour_logp=-jax.random.exponential(logp_key, (capacity, num_steps), jnp.float32),
        behaviour_version=jnp.zeros((capacity, num_steps), jnp.int32),
        episode_return=jax.random.normal(return_key, (capacity,), jnp.float32),
        reward=jnp.zeros((capacity, num_steps), jnp.float32),
        alive=jnp.ones((capacity, num_steps), jnp.bool_),
    )
    pool = pool_lib.init(capacity, jax.tree.map(lambda leaf: leaf[0], batch))
    pool = pool_lib.add(pool, batch)
    assert int(pool.size) == capacity
    return pool


def make_floor(apply_fn, optimizer: optax.GradientTransformation):
    """The bare step: token-mean of −log π + β·KL(π ‖ π_ref) over masked steps, its gradient, one optax step."""

    def loss_fn(params, reference_params, kl_coef, trajectories):
        def per_step(trajectory):
            logits = apply_fn(params, trajectory.observation)
            reference_logits = jax.lax.stop_gradient(apply_fn(reference_params, trajectory.observation))
            mask = trajectory.mask
            return -losses.log_likelihood(logits, trajectory.action, mask) + kl_coef * losses.categorical_kl(
                logits, reference_logits, mask
            )

        values = jax.vmap(per_step)(trajectories)  # [M, T]
        return jnp.sum(values) / jnp.maximum(jnp.sum(trajectories.mask), 1)

    def floor(params, opt_state, reference_params, kl_coef, trajectories):
        loss, grads = jax.value_and_grad(loss_fn)(params, reference_params, kl_coef, trajectories)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(floor)


UPDATES_PER_SCAN = 8


def scanned_update(update, num_updates: int):
    """`num_updates` updates in one `lax.scan` inside one jit, as FTW's learner runs them: the pool-wide
    diagnostics (the monitor, the pool's staleness) only on the last."""

    def run(state, pool, keys):
        def step(carry, inputs):
            key, u = inputs
            return update(carry, pool, key, None, u == num_updates - 1)

        return jax.lax.scan(step, state, (keys, jnp.arange(num_updates)))

    return jax.jit(run)


def scanned_floor(floor):
    """Floor steps in one `lax.scan` inside one jit, one per stacked set of gathered elites.

    Each step gets its own elites, as each update does: with the same elites every step, XLA would hoist
    the reference forward pass out of the loop and the floor would do less work than an update.
    """

    def run(params, opt_state, reference_params, kl_coef, stacked_trajectories):
        def step(carry, trajectories):
            new_params, new_opt_state, loss = floor(carry[0], carry[1], reference_params, kl_coef, trajectories)
            return (new_params, new_opt_state), loss

        return jax.lax.scan(step, (params, opt_state), stacked_trajectories)

    return jax.jit(run)


def scanned_selection(num_batches: int, batch_size: int, num_elites: int):
    """The update's selection alone, for a stack of keys in one `lax.scan` inside one jit: the part of FTW's
    work the floor does not do. The elites are summed so that XLA keeps the draws."""

    def run(pool, keys):
        def step(total, key):
            elites = ftw_jax.select_elites(
                key,
                pool.trajectories.episode_return,
                pool_lib.valid_mask(pool),
                num_batches=num_batches,
                batch_size=batch_size,
                num_elites=num_elites,
            )
            return total + jnp.sum(elites), None

        return jax.lax.scan(step, jnp.zeros((), jnp.int32), keys)[0]

    return jax.jit(run)


def time_interleaved(calls, repeats: int) -> list[float]:
    """Median wall time in ms of each stateful call `f(i) -> outputs` (i the call index, for pre-split keys), the
    calls alternated and each waited for; warm-up calls come first."""
    return [1e3 * seconds for seconds in interleaved_medians(calls, repeats, warmup=WARMUP_CALLS)]


def gather_elites(key, pool, num_batches, batch_size, num_elites):
    """The J·K elites `select_elites` picks with `key`, gathered from the pool: leaves [J·K, T, ...]."""
    elites = ftw_jax.select_elites(
        key,
        pool.trajectories.episode_return,
        pool_lib.valid_mask(pool),
        num_batches=num_batches,
        batch_size=batch_size,
        num_elites=num_elites,
    ).reshape(-1)
    assert bool(jnp.all(elites >= 0))
    return jax.tree.map(lambda leaf: leaf[elites], pool.trajectories)


def bench_row(key, capacity, num_batches, batch_size, num_elites, num_steps, repeats, compare):
    module = MLPPolicy(num_actions=NUM_ACTIONS, hidden_sizes=(64, 64))
    apply_fn = lambda params, observation: module.apply(params, observation)  # noqa: E731
    optimizer = optax.adam(LEARNING_RATE)
    init_key, pool_key, select_key, run_key = jax.random.split(key, 4)
    params = module.init(init_key, jnp.zeros((num_steps, OBS_DIM), jnp.float32))
    pool = random_pool(pool_key, capacity, num_steps)

    # The floor's input: the elites gathered once, outside the timed function, repeats included.
    gathered = jax.block_until_ready(gather_elites(select_key, pool, num_batches, batch_size, num_elites))

    paths = ["auto"]
    if compare:
        paths += ["gather", "counts"]
    configs = {
        path: ftw_jax.UpdateConfig(
            pool_capacity=capacity,
            num_batches=num_batches,
            batch_size=batch_size,
            num_elites=num_elites,
            elite_path=path,
        )
        for path in paths
    }
    auto_path = "counts" if configs["auto"].uses_counts else "gather"
    # Time each distinct path once: the auto path, plus the other one when comparing.
    timed_paths = [auto_path] + ([p for p in ("gather", "counts") if p != auto_path] if compare else [])
    updates = {p: ftw_jax.make_update(apply_fn, configs[p if p != auto_path else "auto"]) for p in timed_paths}
    floor = make_floor(apply_fn, optimizer)

    # Check (and compile): with the key that picked `elites`, the update sees the floor's elites, so the loss
    # and the new params must agree.
    kl_coef = jnp.asarray(KL_COEF, jnp.float32)
    floor_params, _, floor_loss = floor(params, optimizer.init(params), params, kl_coef, gathered)
    for path, update in updates.items():
        state, metrics = update(ftw_jax.PolicyState.create(params, optimizer, kl_coef=KL_COEF), pool, select_key)
        np.testing.assert_allclose(metrics["loss"], floor_loss, rtol=1e-4, err_msg=f"{path} loss != floor loss")
        for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(floor_params)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=f"{path} params != floor params")

    keys = list(jax.random.split(run_key, WARMUP_CALLS + repeats))
    states = {p: ftw_jax.PolicyState.create(params, optimizer, kl_coef=KL_COEF) for p in timed_paths}
    floor_carry = [params, optimizer.init(params)]

    def update_call(path, diagnose=True):
        def call(i):
            states[path], metrics = updates[path](states[path], pool, keys[i], None, diagnose)
            return states[path], metrics

        return call

    def floor_call(i):
        new_params, new_opt_state, loss = floor(floor_carry[0], floor_carry[1], params, kl_coef, gathered)
        floor_carry[:] = [new_params, new_opt_state]
        return new_params, new_opt_state, loss

    # The same work with the dispatch of each call amortised: U updates (or floor steps) per scanned call.
    scan_update = scanned_update(updates[auto_path], UPDATES_PER_SCAN)
    scan_floor = scanned_floor(floor)
    stacked = jax.tree.map(
        lambda *leaves: jnp.stack(leaves),
        *[
            gather_elites(jax.random.fold_in(select_key, u), pool, num_batches, batch_size, num_elites)
            for u in range(UPDATES_PER_SCAN)
        ],
    )
    scan_keys = list(jax.random.split(jax.random.fold_in(run_key, 1), (WARMUP_CALLS + repeats) * UPDATES_PER_SCAN))
    scan_state = [ftw_jax.PolicyState.create(params, optimizer, kl_coef=KL_COEF)]
    scan_floor_carry = [params, optimizer.init(params)]

    scan_select = scanned_selection(num_batches, batch_size, num_elites)

    def scan_select_call(i):
        return scan_select(pool, jnp.stack(scan_keys[i * UPDATES_PER_SCAN : (i + 1) * UPDATES_PER_SCAN]))

    def scan_update_call(i):
        keys_i = jnp.stack(scan_keys[i * UPDATES_PER_SCAN : (i + 1) * UPDATES_PER_SCAN])
        scan_state[0], metrics = scan_update(scan_state[0], pool, keys_i)
        return scan_state[0], metrics

    def scan_floor_call(i):
        carry, losses_ = scan_floor(scan_floor_carry[0], scan_floor_carry[1], params, kl_coef, stacked)
        scan_floor_carry[:] = list(carry)
        return carry, losses_

    calls = [update_call(p) for p in timed_paths] + [
        update_call(auto_path, diagnose=False),
        floor_call,
        scan_update_call,
        scan_floor_call,
        scan_select_call,
    ]
    times = time_interleaved(calls, repeats)
    update_ms = dict(zip(timed_paths, times[: len(timed_paths)]))
    lean_ms, floor_ms = times[len(timed_paths) : len(timed_paths) + 2]
    scan_update_ms, scan_floor_ms, scan_select_ms = (t / UPDATES_PER_SCAN for t in times[-3:])
    assert bool(states[auto_path].version == 2 * (WARMUP_CALLS + repeats)), "an update was not applied"
    for path in timed_paths[1:]:
        assert bool(states[path].version == WARMUP_CALLS + repeats), "an update was not applied"
    return {
        "path": auto_path,
        "update_ms": update_ms[auto_path],
        "diagnostics_ms": update_ms[auto_path] - lean_ms,
        "lean_ms": lean_ms,
        "floor_ms": floor_ms,
        "scan_update_ms": scan_update_ms,
        "scan_floor_ms": scan_floor_ms,
        "scan_select_ms": scan_select_ms,
        "gather_ratio": update_ms["gather"] / floor_ms if "gather" in update_ms and compare else None,
        "counts_ratio": update_ms["counts"] / floor_ms if "counts" in update_ms and compare else None,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a tiny smoke configuration")
    parser.add_argument("--repeats", type=int, default=30, help="timed calls per function (median taken)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")

    if args.quick:
        pool_sizes, jck, steps, repeats = (128,), ((4, 8, 1), (64, 32, 16)), (1,), min(args.repeats, 5)
    else:
        pool_sizes, jck, steps, repeats = POOL_SIZES, JCK, STEPS, args.repeats

    print(
        f"jax {jax.__version__} on {jax.devices()[0].platform}; MLPPolicy(A={NUM_ACTIONS}, hidden=(64, 64)), "
        f"obs [T, {OBS_DIM}], adam({LEARNING_RATE}), beta={KL_COEF}; median of {repeats} interleaved calls "
        f"(at most {BIG_REPEATS} when a call runs the policy on > {BIG_STEPS} steps)"
    )
    header = (
        f"{'N':>5} {'J':>3} {'C':>3} {'K':>3} {'J*K':>5} {'T':>3} {'path':>6} {'update ms':>10} "
        f"{'diag ms':>8} {'floor ms':>9} {'ratio':>6} {'lean':>6} {'scan upd':>9} {'scan flr':>9} {'ratio':>6} "
        f"{'select':>7} {'rest':>6} "
        f"{'JK<=N':>6} {'gather/floor':>13} {'counts/floor':>13}"
    )
    print(header)
    print("-" * len(header))
    key = jax.random.key(args.seed)
    start = time.perf_counter()
    for capacity in pool_sizes:
        for num_batches, batch_size, num_elites in jck:
            for num_steps in steps:
                key, row_key = jax.random.split(key)
                num_kept = num_batches * num_elites
                compare = 2 * num_kept >= capacity
                policy_steps = max(num_kept, capacity if num_kept >= capacity or compare else 0) * num_steps
                row_repeats = min(repeats, BIG_REPEATS) if policy_steps > BIG_STEPS else repeats
                r = bench_row(row_key, capacity, num_batches, batch_size, num_elites, num_steps, row_repeats, compare)
                ratio = r["update_ms"] / r["floor_ms"]
                fmt = lambda x: f"{x:13.2f}" if x is not None else f"{'-':>13}"  # noqa: E731
                print(
                    f"{capacity:>5} {num_batches:>3} {batch_size:>3} {num_elites:>3} {num_kept:>5} {num_steps:>3} "
                    f"{r['path']:>6} {r['update_ms']:>10.3f} {r['diagnostics_ms']:>8.3f} {r['floor_ms']:>9.3f} "
                    f"{ratio:>6.2f} {r['lean_ms'] / r['floor_ms']:>6.2f} "
                    f"{r['scan_update_ms']:>9.3f} {r['scan_floor_ms']:>9.3f} "
                    f"{r['scan_update_ms'] / r['scan_floor_ms']:>6.2f} {r['scan_select_ms']:>7.3f} "
                    f"{(r['scan_update_ms'] - r['scan_select_ms']) / r['scan_floor_ms']:>6.2f} "
                    f"{'yes' if num_kept <= capacity else 'no':>6} {fmt(r['gather_ratio'])} "
                    f"{fmt(r['counts_ratio'])}",
                    flush=True,
                )
    print("-" * len(header))
    print(
        "ratio = update ms / floor ms, one jitted call each (dispatch included). 'diag ms': what the pool-wide\n"
        "diagnostics (the trust-region monitor's forward passes, the pool's staleness) add to one call: update ms\n"
        "minus the same call with diagnose=False; 'lean' = that call / floor ms. 'scan upd' / 'scan flr': ms per\n"
        f"update / floor step when {UPDATES_PER_SCAN} run in one lax.scan in one jit, as FTW's learner runs them\n"
        "(the diagnostics on the last update only). 'select': ms per update of the selection alone in such a\n"
        "scan, work the floor does not do; 'rest' = (scan upd - select) / scan flr.\n"
        "The update is one jit: select_elites (J uniform C-subsets, by Floyd's algorithm when C*C <= N, else\n"
        "top_k over N random keys; a sort of C per minibatch), the gather of J*K trajectories (or, on the counts\n"
        "path, a forward/backward over all N entries weighted by selection counts), the CE + beta*KL loss and\n"
        "gradient, the adam step, plus finiteness checks and metrics. The floor is a separately jitted CE +\n"
        "beta*KL gradient and the same adam step on the same J*K elites gathered beforehand: what the update\n"
        "would cost if selection and gathering were free.\n"
        "Target: ratio <= 1.15 where J*K <= N. Where J*K > N the counts path runs the policy on N < J*K entries,\n"
        "so the ratio may fall below 1. gather/floor and counts/floor (rows with J*K >= N/2) force elite_path.\n"
        f"Total time {time.perf_counter() - start:.1f} s."
    )


if __name__ == "__main__":
    main()
