"""The jitted FTW update: exact loss, no-op before C entries, skipping non-finite steps, one trace."""

import functools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import make_trajectories

import ftw_jax
from ftw_jax.core import losses
from ftw_jax.core import pool as pool_lib
from ftw_jax.policies.base import PolicyNetwork

N, T, D, A = 8, 3, 3, 2
TRACES = []


def linear_apply(params, observation):
    TRACES.append(1)  # runs only while tracing
    return observation @ params["w"] + params["b"]


class _LinearModule(PolicyNetwork):
    """linear_apply as a Flax module (observation [T, D] -> logits [T, A]), for a learner's `Context`."""

    @nn.compact
    def __call__(self, observation):
        return nn.Dense(A)(observation)


def initial_params():
    return {"w": 0.1 * jnp.arange(D * A, dtype=jnp.float32).reshape(D, A), "b": jnp.zeros(A)}


def config(**overrides):
    sizes = dict(pool_capacity=N, num_batches=3, batch_size=4, num_elites=2)
    return ftw_jax.UpdateConfig(**{**sizes, **overrides})


@functools.cache
def shared_update(markov: bool = False, **overrides):
    """`make_update(linear_apply, config(**overrides))`, made once per setting for the module: a test that
    builds its own compiles it again (the jit cache is per function)."""
    return ftw_jax.make_update(linear_apply, config(**overrides), markov=markov)


def filled_pool(count=N, seed=0, returns=None):
    batch = make_trajectories(count, T, seed=seed, returns=returns)
    # Give the trajectories different numbers of policy steps, so the normalisations differ.
    batch = batch.replace(mask=jnp.arange(T)[None, :] < (1 + jnp.arange(count)[:, None] % T))
    empty = pool_lib.init(N, jax.tree.map(lambda leaf: leaf[0], batch))
    return pool_lib.add(empty, batch)


def state(kl_coef=0.3, optimizer=None):
    return ftw_jax.PolicyState.create(initial_params(), optimizer or optax.sgd(0.5), kl_coef=kl_coef)


def expected_loss(params, reference, pool, elites, kl_coef, normalisation):
    """The loss written out directly on the gathered elites (repeats included)."""
    batch = jax.tree.map(lambda leaf: leaf[elites.reshape(-1)], pool.trajectories)
    logits = jax.vmap(linear_apply, (None, 0))(params, batch.observation)
    reference_logits = jax.vmap(linear_apply, (None, 0))(reference, batch.observation)
    ce = -jax.vmap(losses.log_likelihood)(logits, batch.action, batch.mask)
    kl = jax.vmap(losses.categorical_kl)(logits, reference_logits, batch.mask)
    per_step = ce + kl_coef * kl
    if normalisation == "token":
        return per_step.sum() / batch.mask.sum()
    return jnp.mean(per_step.sum(1) / batch.mask.sum(1))


# Jitted, like the update they check: run eagerly, each of their operations would compile on its own.
expected_value_and_grad = jax.jit(jax.value_and_grad(expected_loss), static_argnums=5)
select_elites = jax.jit(ftw_jax.select_elites, static_argnames=("num_batches", "batch_size", "num_elites"))
select_elites_masked = jax.jit(
    ftw_jax.select_elites_masked, static_argnames=("max_batches", "max_batch_size", "max_elites")
)


@pytest.mark.parametrize("normalisation", ["token", "trajectory"])
@pytest.mark.parametrize("elite_path", ["gather", "counts"])
def test_loss_and_step_match_the_written_out_loss(normalisation, elite_path):
    pool = filled_pool()
    key = jax.random.key(3)
    start = state()
    new_state, metrics = shared_update(normalisation=normalisation, elite_path=elite_path)(start, pool, key)
    elites = select_elites(
        jax.random.key(3),
        pool.trajectories.episode_return,
        pool_lib.valid_mask(pool),
        num_batches=3,
        batch_size=4,
        num_elites=2,
    )
    loss, grads = expected_value_and_grad(start.params, start.params, pool, elites, 0.3, normalisation)
    np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-5)
    chex.assert_trees_all_close(
        new_state.params, jax.tree.map(lambda p, g: p - 0.5 * g, start.params, grads), rtol=1e-5
    )
    assert bool(metrics["applied"]) and int(new_state.version) == 1
    returns = np.asarray(pool.trajectories.episode_return)[np.asarray(elites)]
    np.testing.assert_allclose(metrics["elite_return_mean"], returns.mean(), rtol=1e-6)
    assert float(metrics["elite_return_min"]) == returns.min()
    np.testing.assert_allclose(metrics["unique_elite_fraction"], len(np.unique(elites)) / elites.size, rtol=1e-6)


@pytest.mark.parametrize("elite_path", ["gather", "counts"])
def test_traced_sizes_inside_the_config_give_the_written_out_loss_for_those_sizes(elite_path):
    pool = filled_pool()
    start = state()
    update = shared_update(elite_path=elite_path)  # maxima J=3, C=4, K=2
    TRACES.clear()
    for sizes in ((2, 3, 1), (3, 4, 2), (1, 2, 2)):
        new_state, metrics = update(start, pool, jax.random.key(3), ftw_jax.Sizes(*map(jnp.int32, sizes)))
        elites = select_elites_masked(
            jax.random.key(3),
            pool.trajectories.episode_return,
            pool_lib.valid_mask(pool),
            sizes,
            max_batches=3,
            max_batch_size=4,
            max_elites=2,
        )
        kept = np.asarray(elites)[: sizes[0], : sizes[2]]
        assert (kept >= 0).all() and (np.asarray(elites) >= 0).sum() == sizes[0] * sizes[2]
        loss, grads = expected_value_and_grad(start.params, start.params, pool, jnp.asarray(kept), 0.3, "token")
        np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-5)
        chex.assert_trees_all_close(
            new_state.params, jax.tree.map(lambda p, g: p - 0.5 * g, start.params, grads), rtol=1e-5
        )
        np.testing.assert_allclose(metrics["unique_elite_fraction"], len(np.unique(kept)) / kept.size, rtol=1e-6)
    traces = len(TRACES)
    update(start, pool, jax.random.key(4), ftw_jax.Sizes(*map(jnp.int32, (1, 1, 1))))
    assert len(TRACES) == traces  # one compile for every size
    _, metrics = update(start, filled_pool(3), jax.random.key(5), ftw_jax.Sizes(*map(jnp.int32, (2, 3, 1))))
    assert bool(metrics["ready"])  # 3 entries are enough for C = 3, though the config's C is 4


def test_no_op_until_the_pool_holds_c_entries():
    update = shared_update()
    start = state(optimizer=optax.adam(0.1))
    for count in (1, 3):
        new_state, metrics = update(start, filled_pool(count), jax.random.key(count))
        chex.assert_trees_all_equal(new_state, start)
        assert not bool(metrics["ready"]) and not bool(metrics["applied"]) and int(metrics["pool_filled"]) == count
    new_state, metrics = update(start, filled_pool(4), jax.random.key(4))
    assert bool(metrics["applied"]) and int(new_state.version) == 1
    assert not np.allclose(new_state.params["w"], start.params["w"])
    assert int(new_state.opt_state[0].count) == 1


def test_non_finite_steps_never_reach_the_params():
    pool = filled_pool()
    poisoned = pool.replace(
        trajectories=pool.trajectories.replace(observation=pool.trajectories.observation.at[:, 0, 0].set(jnp.nan))
    )
    start = state()
    new_state, metrics = shared_update()(start, poisoned, jax.random.key(0))
    chex.assert_trees_all_equal(new_state, start)
    assert bool(metrics["nonfinite"]) and bool(metrics["ready"]) and not bool(metrics["applied"])
    assert bool(metrics["observation_nonfinite"])  # the skip's cause, named (issue 35: only `nonfinite` said so)


def test_nan_returns_are_ranked_last_and_do_not_stop_learning():
    returns = jnp.array([jnp.nan, 1.0, jnp.nan, 3.0, 2.0, jnp.nan, 0.0, 5.0])
    _, metrics = shared_update(batch_size=8, num_elites=5)(state(), filled_pool(returns=returns), jax.random.key(0))
    assert bool(metrics["applied"]) and float(metrics["elite_return_min"]) == 0.0


def test_traces_once_and_keys_matter():
    update = ftw_jax.make_update(linear_apply, config())  # its own, not `shared_update`'s: it counts traces
    current = state()
    TRACES.clear()
    current, first = update(current, filled_pool(seed=0), jax.random.key(0))
    traces_after_compile = len(TRACES)
    assert traces_after_compile > 0
    params_by_key = []
    for seed in range(1, 4):
        new_state, _ = update(current, filled_pool(seed=seed), jax.random.key(seed))
        params_by_key.append(np.asarray(new_state.params["w"]))
    again, _ = update(current, filled_pool(seed=1), jax.random.key(1))
    assert len(TRACES) == traces_after_compile  # no retrace across calls
    np.testing.assert_array_equal(again.params["w"], params_by_key[0])  # same key, same result
    assert not np.array_equal(params_by_key[0], params_by_key[1])


def test_previous_reference_lags_one_update():
    update = shared_update(reference="previous")
    first, _ = update(state(), filled_pool(), jax.random.key(0))
    chex.assert_trees_all_equal(first.reference_params, initial_params())
    second, metrics = update(first, filled_pool(), jax.random.key(1))
    chex.assert_trees_all_equal(second.reference_params, first.params)
    assert float(metrics["kl"]) > 0


def test_reverse_kl_direction_changes_the_kl():
    pool = filled_pool()
    moved = state().replace(params=jax.tree.map(lambda p: p + jnp.array([0.7, -0.7]), initial_params()))
    _, forward = shared_update()(moved, pool, jax.random.key(0))
    _, reverse = shared_update(kl_direction="reference_to_policy")(moved, pool, jax.random.key(0))
    assert float(forward["kl"]) > 0 and float(reverse["kl"]) > 0
    assert not np.isclose(float(forward["kl"]), float(reverse["kl"]))


@pytest.mark.slow
def test_repeated_updates_converge_to_the_kept_action_frequency():
    """Without KL the cross-entropy's fixed point is the share of kept slots that took action 1."""
    batch = make_trajectories(N, T, returns=jnp.arange(N))
    # Constant observations make the policy tabular; the four best trajectories took action 1.
    batch = batch.replace(
        observation=jnp.ones_like(batch.observation),
        action=jnp.broadcast_to((jnp.arange(N) >= 4)[:, None], (N, T)).astype(jnp.int32),
    )
    pool = pool_lib.add(pool_lib.init(N, jax.tree.map(lambda leaf: leaf[0], batch)), batch)
    update = shared_update()
    current = state(kl_coef=0.0, optimizer=optax.adam(0.02))

    def probability(s):
        return float(jax.nn.softmax(linear_apply(s.params, batch.observation[0]))[0, 1])

    assert probability(current) < 0.7
    tail = []
    for step, key in enumerate(jax.random.split(jax.random.key(0), 400)):
        current, _ = update(current, pool, key)
        if step >= 300:
            tail.append(probability(current))
    kept_share = ftw_jax.rank_occupancy(N, 4, 2)[:4].sum()
    assert abs(np.mean(tail) - kept_share) < 0.03, (np.mean(tail), kept_share)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(num_elites=5), "num_elites"),
        (dict(batch_size=9), "batch_size"),
        (dict(num_elites=0), "num_elites"),
        (dict(pool_capacity=0), r"pool_capacity \(N\) must be an int >= 1"),
        (dict(num_batches=0), "num_batches"),
        (dict(normalisation="mean"), "normalisation"),
        (dict(reference="ema"), "reference"),
        (dict(kl_direction="forward"), "kl_direction"),
        (dict(elite_path="unique"), "elite_path"),
    ],
)
def test_bad_config_raises(overrides, message):
    with pytest.raises(ValueError, match=message):
        config(**overrides)


def test_pool_of_the_wrong_capacity_raises():
    update = shared_update(pool_capacity=16)
    with pytest.raises(ValueError, match="capacity 16"):
        update(state(), filled_pool(), jax.random.key(0))


def test_beat_minimum_on_tied_returns_keeps_nothing_and_applies_nothing():
    update = shared_update(elite_rule="beat_minimum", num_batches=8)
    start = state(optimizer=optax.adam(0.1))
    new_state, metrics = update(start, filled_pool(returns=jnp.ones(N)), jax.random.key(0))
    chex.assert_trees_all_equal(new_state, start)
    assert bool(metrics["ready"]) and not bool(metrics["applied"]) and float(metrics["kept_fraction"]) == 0.0
    new_state, metrics = update(start, filled_pool(returns=jnp.arange(N) >= 6), jax.random.key(1))  # 2 successes
    assert bool(metrics["applied"]) and float(metrics["elite_return_min"]) == 1.0
    assert 0 < float(metrics["kept_fraction"]) < 1 and float(metrics["pool_return_mean"]) == 0.25


def stale_pool(versions, returns=None):
    """A full pool whose entry i was played by policy version versions[i]."""
    pool = filled_pool(returns=returns)
    behaviour = jnp.broadcast_to(jnp.asarray(versions, jnp.int32)[:, None], (N, T))
    return pool.replace(trajectories=pool.trajectories.replace(behaviour_version=behaviour))


def test_staleness_metrics_and_histogram():
    versions = [5, 5, 4, 4, 3, 1, 0, 0]  # staleness at version 5: 0 0 1 1 2 4 5 5
    update = shared_update(staleness_histogram_bins=4)
    _, metrics = update(state().replace(version=jnp.int32(5)), stale_pool(versions), jax.random.key(0))
    assert float(metrics["pool_staleness_mean"]) == pytest.approx(18 / 8)
    assert int(metrics["pool_staleness_max"]) == 5
    np.testing.assert_array_equal(metrics["pool_staleness_histogram"], [2, 2, 1, 3])  # last bin: 3 and up
    assert 0 <= float(metrics["elite_staleness_mean"]) <= int(metrics["elite_staleness_max"]) <= 5


@pytest.mark.slow
def test_max_staleness_evicts_old_entries_from_selection():
    # The oldest entries have the best returns: FIFO alone keeps them, eviction by version never does.
    versions, returns = [9, 9, 9, 9, 8, 8, 2, 1], jnp.arange(N, dtype=jnp.float32)
    for max_staleness, expect_old in ((None, True), (1, False)):
        update = shared_update(max_staleness=max_staleness, num_batches=16)
        _, metrics = update(state().replace(version=jnp.int32(9)), stale_pool(versions, returns), jax.random.key(1))
        assert (int(metrics["elite_staleness_max"]) > 1) == expect_old
        assert float(metrics["usable_fraction"]) == (1.0 if max_staleness is None else 0.75)
    # Fewer usable entries than C: not ready, nothing applied.
    update = shared_update(max_staleness=0)  # none usable at version 10
    new_state, metrics = update(state().replace(version=jnp.int32(10)), stale_pool(versions), jax.random.key(2))
    assert not bool(metrics["ready"]) and not bool(metrics["applied"]) and int(new_state.version) == 10


def on_policy(pool, params):
    """The pool with behaviour log-probs equal to the policy's at `params` (importance ratios 1)."""
    logits = jax.vmap(linear_apply, (None, 0))(params, pool.trajectories.observation)
    log_probs = jax.vmap(losses.log_likelihood)(logits, pool.trajectories.action, pool.trajectories.mask)
    return pool.replace(trajectories=pool.trajectories.replace(behaviour_logp=log_probs))


@pytest.mark.slow
def test_importance_weights_and_their_cap():
    pool = on_policy(filled_pool(), initial_params())
    full = dict(num_batches=1, batch_size=N, num_elites=N, elite_path="gather")  # every entry kept once
    _, metrics = shared_update(**full)(state(kl_coef=0.0), pool, jax.random.key(0))
    assert (
        float(metrics["elite_ess_fraction"]) == pytest.approx(1.0)
        and abs(float(metrics["elite_log_weight_mean"])) < 1e-6
    )
    # Behaviour log-probs lowered by 0.1 per policy step: w = exp(0.1 · steps) = 1.105, 1.221, 1.350 for 1-3 steps.
    shifted = pool.replace(
        trajectories=pool.trajectories.replace(behaviour_logp=pool.trajectories.behaviour_logp - 0.1)
    )
    cap = 1.2
    _, metrics = shared_update(**full, importance_weight_cap=cap)(state(kl_coef=0.0), shifted, jax.random.key(0))
    batch = shifted.trajectories
    steps = batch.mask.sum(1)
    weights = jnp.minimum(jnp.exp(0.1 * steps), cap)
    logits = jax.vmap(linear_apply, (None, 0))(initial_params(), batch.observation)
    ce = -jax.vmap(losses.log_likelihood)(logits, batch.action, batch.mask)
    expected = jnp.sum(weights[:, None] * ce) / jnp.sum(weights * steps)
    np.testing.assert_allclose(metrics["cross_entropy"], expected, rtol=1e-5)
    assert float(metrics["elite_ess_fraction"]) < 1.0


@pytest.mark.slow
def test_trust_region_monitor_measures_the_step_it_logs():
    pool = filled_pool(returns=jnp.array([-7.0, 1, 2, 3, 4, 5, 6, 0]))
    update = shared_update(monitor_entries=4, monitor_discount=0.9)
    new_state, metrics = update(state(), pool, jax.random.key(3))
    assert bool(metrics["applied"])
    monitored = jax.tree.map(lambda leaf: leaf[jnp.array([0, 2, 4, 6])], pool.trajectories)  # evenly spaced
    old = jax.vmap(linear_apply, (None, 0))(initial_params(), monitored.observation)
    new = jax.vmap(linear_apply, (None, 0))(new_state.params, monitored.observation)
    kl = jax.vmap(losses.categorical_kl)(old, new, monitored.mask)
    tv = jnp.where(monitored.mask, 0.5 * jnp.abs(jax.nn.softmax(old) - jax.nn.softmax(new)).sum(-1), 0.0)
    np.testing.assert_allclose(metrics["policy_kl_mean"], kl.sum() / monitored.mask.sum(), rtol=1e-5)
    np.testing.assert_allclose(metrics["policy_tv_max"], tv.max(), rtol=1e-5)
    np.testing.assert_allclose(metrics["trpo_penalty"], 4 * 7.0 * 0.9 * tv.max() ** 2 / 0.01, rtol=1e-4)
    assert float(metrics["policy_kl_max"]) >= float(metrics["policy_kl_mean"]) > 0
    # No step, no movement.
    _, idle = update(
        state(),
        pool_lib.add(
            pool_lib.init(N, jax.tree.map(lambda leaf: leaf[0], pool.trajectories)),
            jax.tree.map(lambda leaf: leaf[:2], pool.trajectories),
        ),
        jax.random.key(3),
    )
    assert not bool(idle["applied"]) and float(idle["policy_kl_max"]) == 0.0
    # More entries than the pool's N only repeat entries: 10**9 of them measure what N do (and compile at once).
    _, huge = shared_update(monitor_entries=10**9)(state(), pool, jax.random.key(3))
    _, every = shared_update(monitor_entries=N)(state(), pool, jax.random.key(3))
    for name in ("policy_kl_mean", "policy_kl_max", "policy_tv_max"):
        np.testing.assert_array_equal(huge[name], every[name])


@pytest.mark.parametrize(
    ("elite_path", "normalisation"),
    [
        ("gather", "token"),
        ("counts", "trajectory"),
        pytest.param("gather", "trajectory", marks=pytest.mark.slow),  # the fast tier keeps two of the four
        pytest.param("counts", "token", marks=pytest.mark.slow),
    ],
)
def test_the_stepwise_loss_of_a_markov_policy_takes_the_same_step(elite_path, normalisation):
    """Run on the kept steps alone, in chunks, the loss, the gradient step and every metric are the dense loss's."""
    pool = filled_pool(returns=jnp.array([3.0, 1, 7, 2, 5, 0, 6, 4]))
    ended = jnp.arange(T)[None, :] < (1 + jnp.arange(N)[:, None] % T)  # episodes of 1..T steps, then padding
    pool = pool.replace(
        trajectories=pool.trajectories.replace(
            alive=ended, observation=jnp.where(ended[..., None], pool.trajectories.observation, jnp.nan)
        )
    )
    options = dict(normalisation=normalisation, elite_path=elite_path, num_batches=5)
    start = state(kl_coef=0.3, optimizer=optax.adam(0.1))
    dense_state, dense = shared_update(**options)(start, pool, jax.random.key(4))
    stepwise_state, stepwise = shared_update(**options, markov=True)(start, pool, jax.random.key(4))
    assert bool(dense["applied"]) and bool(stepwise["applied"])
    chex.assert_trees_all_close(stepwise_state, dense_state, rtol=1e-5, atol=1e-7)
    assert set(stepwise) == set(dense)
    for name in dense:
        np.testing.assert_allclose(stepwise[name], dense[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_the_stepwise_loss_stops_after_the_last_kept_step():
    """Three kept steps among N·T = 24, in chunks of ⌈24 / STEP_CHUNKS⌉ steps: the chunks holding them run, each
    applying the policy and the reference once, and the others not at all."""
    from ftw_jax.core import elite_loss, stepwise

    calls = []

    def counted_apply(params, observation):
        jax.debug.callback(lambda: calls.append(1))
        return observation @ params["w"] + params["b"]

    loss_and_grad = jax.jit(elite_loss.make_stepwise_loss_and_grad(counted_apply, config()))
    weights = jnp.zeros(N).at[jnp.array([1, 4])].set(1.0)  # entries 1 and 4: 2 and 2 policy steps...
    trajectories = filled_pool().trajectories
    trajectories = trajectories.replace(mask=trajectories.mask.at[4, 1].set(False))  # ...then 2 and 1
    (_, (_, _, kept_steps)), _ = loss_and_grad(initial_params(), initial_params(), 0.3, trajectories, weights)
    jax.effects_barrier()
    assert int(kept_steps) == 3
    chunk = -(-24 // stepwise.STEP_CHUNKS)
    chunks_run = -(-3 // chunk)
    assert chunks_run < stepwise.STEP_CHUNKS
    assert len(calls) == 2 * chunks_run


DIAGNOSTICS = (
    "pool_staleness_mean",
    "pool_staleness_max",
    "pool_staleness_histogram",
    "policy_kl_mean",
    "policy_kl_max",
    "policy_tv_mean",
    "policy_tv_max",
    "trpo_penalty",
)


@pytest.mark.parametrize("traced", [False, True])
def test_an_update_without_diagnostics_takes_the_same_step_and_marks_them_unmeasured(traced):
    pool = filled_pool(returns=jnp.arange(N, dtype=jnp.float32))
    start = state().replace(version=jnp.asarray(5, jnp.int32))  # staleness > 0
    update = shared_update(monitor_entries=4, staleness_histogram_bins=3)
    diagnosed_state, diagnosed = update(start, pool, jax.random.key(1))
    flag = jnp.asarray(False) if traced else False
    lean_state, lean = update(start, pool, jax.random.key(1), None, flag)
    chex.assert_trees_all_equal(lean_state, diagnosed_state)
    assert set(lean) == set(diagnosed)
    for name in diagnosed:
        if name in DIAGNOSTICS:
            assert float(diagnosed[name].max()) > 0, name  # measured, so the stand-ins below are not the values
            expected = np.nan if jnp.issubdtype(lean[name].dtype, jnp.floating) else -1
            np.testing.assert_array_equal(lean[name], np.full(lean[name].shape, expected), err_msg=name)
        else:
            np.testing.assert_array_equal(lean[name], diagnosed[name], err_msg=name)


@pytest.mark.slow
@pytest.mark.usefixtures("unchecked_key_reuse")  # the checker's false positive on vmapped scans
def test_ftw_runs_the_pool_diagnostics_once_per_batch_even_under_vmap():
    """Only the last of U updates measures the monitor, with a loop index the vmap over members does not batch, so
    the compiled program branches (and skips the work) rather than computing both sides and selecting."""
    from ftw_jax import algos
    from ftw_jax.algos.base import Context, Hyperparameters

    algo = algos.get("ftw")
    ftw_config = algo.config(
        pool_capacity=N, num_batches=3, batch_size=4, num_elites=2, monitor_entries=4, updates_per_iteration=3
    )
    batch = filled_pool().trajectories
    context = Context(
        policy=_LinearModule(),
        make_network=None,
        optimizer=optax.sgd(0.5),
        example=jax.tree.map(lambda leaf: leaf[0], batch),
        episodes_per_iteration=N,
    )
    learner = algo.make_learner(ftw_config, context)
    hyperparameters = Hyperparameters(
        kl_coef=jnp.float32(0.3), learning_rate=jnp.float32(0.5), algorithm=algo.hyperparameters(ftw_config)
    )
    observation = batch.observation[:1, 0]
    members = jax.vmap(lambda key: learner.init(key, observation, hyperparameters))(
        jax.random.split(jax.random.key(0), 2)
    )
    learn = jax.jit(jax.vmap(lambda state, key: learner.learn(state, batch, key, hyperparameters)))
    keys = jax.random.split(jax.random.key(1), 2)
    _, metrics = learn(members, keys)
    kl = np.asarray(metrics["policy_kl_mean"])  # [members, U]
    assert np.isnan(kl[:, :2]).all() and np.isfinite(kl[:, 2]).all() and (kl[:, 2] > 0).all()
    assert np.isfinite(np.asarray(metrics["loss"])).all()
    program = learn.lower(members, keys).as_text()
    assert "stablehlo.case" in program or "stablehlo.if" in program, "the monitor is selected, not skipped"


def test_bad_diagnostic_options_raise():
    with pytest.raises(ValueError, match="max_staleness must be None or an int >= 0, got -1"):
        config(max_staleness=-1)
    with pytest.raises(ValueError, match="importance_weight_cap must be None or > 0, got 0"):
        config(importance_weight_cap=0)
    with pytest.raises(ValueError, match=r"monitor_discount must be in \[0, 1\), got 1.0"):
        config(monitor_discount=1.0)


def sqrt_apply(params, observation):
    """`linear_apply` plus 0·sqrt(z): at z = 0 the logits (and the loss) are finite but ∂/∂z = 0·∞ = NaN."""
    return linear_apply(params, observation) + 0.0 * jnp.sqrt(params["z"])


def test_a_nan_gradient_with_a_finite_loss_is_skipped_and_adam_keeps_its_state():
    start = ftw_jax.PolicyState.create({**initial_params(), "z": jnp.zeros(())}, optax.adam(0.1), kl_coef=0.3)
    new_state, metrics = ftw_jax.make_update(sqrt_apply, config())(start, filled_pool(), jax.random.key(0))
    assert np.isfinite(float(metrics["loss"])) and not np.isfinite(float(metrics["grad_norm"]))  # the case claimed
    assert bool(metrics["ready"]) and bool(metrics["nonfinite"]) and not bool(metrics["applied"])
    chex.assert_trees_all_equal(new_state, start)  # params, Adam's count and moments, version


def test_a_non_finite_optimizer_update_from_finite_gradients_is_skipped():
    # Adam's step scaled by infinity: loss and gradients are finite, the update is not.
    start = state(optimizer=optax.chain(optax.adam(0.1), optax.scale(jnp.inf)))
    new_state, metrics = shared_update()(start, filled_pool(), jax.random.key(0))
    assert np.isfinite(float(metrics["loss"])) and np.isfinite(float(metrics["grad_norm"]))
    assert bool(metrics["nonfinite"]) and not bool(metrics["applied"])
    chex.assert_trees_all_equal(new_state, start)


def softmax(logits):
    shifted = np.exp(logits - logits.max(-1, keepdims=True))
    return shifted / shifted.sum(-1, keepdims=True)


@pytest.mark.parametrize("kl_direction", ["policy_to_reference", "reference_to_policy"])
def test_kl_value_and_gradient_by_hand_away_from_the_reference(kl_direction):
    """At params ≠ reference, in float64 numpy: the KL's value, and one SGD step on CE + β·KL, whose logit
    gradients are p − onehot(a) for the cross-entropy, p ⊙ (log p − log q − KL(p ‖ q)) for KL(π ‖ π_ref) and
    p − q for KL(π_ref ‖ π) (p = π, q = π_ref)."""
    kl_coef, learning_rate = 0.3, 0.5
    reference = initial_params()
    params = {"w": reference["w"] + jnp.array([[0.9, -0.4], [-0.6, 0.8], [0.3, 0.5]]), "b": jnp.array([0.4, -0.2])}
    start = ftw_jax.PolicyState.create(reference, optax.sgd(learning_rate), kl_coef=kl_coef).replace(params=params)
    pool = filled_pool()
    update = shared_update(kl_direction=kl_direction, elite_path="gather")
    new_state, metrics = update(start, pool, jax.random.key(3))

    elites = np.asarray(
        select_elites(
            jax.random.key(3),
            pool.trajectories.episode_return,
            pool_lib.valid_mask(pool),
            num_batches=3,
            batch_size=4,
            num_elites=2,
        )
    )
    batch = jax.tree.map(lambda leaf: np.asarray(leaf, np.float64)[elites.reshape(-1)], pool.trajectories)
    obs, actions, mask = batch.observation, batch.action.astype(int), batch.mask  # [M, T, D], [M, T], [M, T]
    as64 = lambda tree: {name: np.asarray(value, np.float64) for name, value in tree.items()}  # noqa: E731
    params64, reference64 = as64(params), as64(reference)
    p = softmax(obs @ params64["w"] + params64["b"])  # [M, T, A]
    q = softmax(obs @ reference64["w"] + reference64["b"])
    forward = np.sum(p * np.log(p / q), -1)
    reverse = np.sum(q * np.log(q / p), -1)
    steps = mask.sum()
    kl_forward, kl_reverse = (forward * mask).sum() / steps, (reverse * mask).sum() / steps
    assert abs(kl_forward - kl_reverse) > 0.1 * kl_forward  # the two directions are far apart here
    if kl_direction == "policy_to_reference":
        kl, kl_logit_grad = kl_forward, p * (np.log(p / q) - forward[..., None])
    else:
        kl, kl_logit_grad = kl_reverse, p - q
    cross_entropy = -(np.log(np.take_along_axis(p, actions[..., None], -1)[..., 0]) * mask).sum() / steps
    np.testing.assert_allclose(metrics["kl"], kl, rtol=1e-5)
    np.testing.assert_allclose(metrics["loss"], cross_entropy + kl_coef * kl, rtol=1e-5)
    logit_grad = mask[..., None] * (p - np.eye(A)[actions] + kl_coef * kl_logit_grad) / steps  # [M, T, A]
    expected = {
        "w": params64["w"] - learning_rate * np.einsum("mtd,mta->da", obs, logit_grad),
        "b": params64["b"] - learning_rate * logit_grad.sum((0, 1)),
    }
    chex.assert_trees_all_close(as64(new_state.params), expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("elite_path", ["gather", "counts"])
def test_nan_inputs_that_cannot_reach_the_loss_do_not_block_the_update(elite_path):
    # Entry 0 has the lowest return, so no 4-subset keeps it among its best 2; entry 5 gets a padding step
    # after its end. Both hold NaN observations: the update must be the one on the same pool with zeros there.
    pool = filled_pool()
    trajectories = pool.trajectories
    observation = trajectories.observation.at[0].set(jnp.nan).at[5, 2].set(jnp.nan)
    after_the_end = dict(alive=trajectories.alive.at[5, 2].set(False), mask=trajectories.mask.at[5, 2].set(False))
    poisoned = pool.replace(trajectories=trajectories.replace(observation=observation, **after_the_end))
    clean = pool.replace(trajectories=trajectories.replace(observation=jnp.nan_to_num(observation), **after_the_end))
    update = shared_update(elite_path=elite_path)
    new_state, metrics = update(state(), poisoned, jax.random.key(7))
    expected_state, expected = update(state(), clean, jax.random.key(7))
    assert bool(metrics["applied"]) and not bool(metrics["nonfinite"]) and not bool(metrics["observation_nonfinite"])
    np.testing.assert_allclose(metrics["loss"], expected["loss"], rtol=1e-6)
    chex.assert_trees_all_close(new_state.params, expected_state.params, rtol=1e-6)


def test_an_action_outside_the_action_space_fails_the_step_instead_of_training_another_action():
    pool = filled_pool()
    bad = pool.replace(trajectories=pool.trajectories.replace(action=pool.trajectories.action.at[:, 0].set(-1)))
    start = state(optimizer=optax.adam(0.1))
    new_state, metrics = shared_update()(start, bad, jax.random.key(8))
    assert bool(metrics["nonfinite"]) and not bool(metrics["applied"])
    chex.assert_trees_all_equal(new_state, start)


def test_elites_without_a_step_of_the_policy_s_own_are_not_an_update():
    pool = filled_pool()
    silent = pool.replace(trajectories=pool.trajectories.replace(mask=jnp.zeros_like(pool.trajectories.mask)))
    start = state(optimizer=optax.adam(0.1))  # Adam's momentum would move the params on a zero gradient
    new_state, metrics = shared_update()(start, silent, jax.random.key(9))
    assert bool(metrics["ready"]) and not bool(metrics["applied"]) and int(metrics["version"]) == 0
    chex.assert_trees_all_equal(new_state, start)


def test_sizes_outside_the_maxima_are_refused_when_concrete_and_clamped_and_flagged_when_traced():
    update = shared_update()  # maxima J=3, C=4, K=2
    for bad in ((2, 3, 4), (2, 9, 1), (4, 3, 1)):  # K > C, C > C_max, J > J_max
        with pytest.raises(ValueError, match=r"sizes \(J, C, K\) = .* must lie within the config's \(3, 4, 2\)"):
            update(state(), filled_pool(), jax.random.key(10), ftw_jax.Sizes(*map(jnp.int32, bad)))
    # Traced (a sweep vmaps over them), they cannot be refused: clamped into the maxima, and said so.
    traced = jax.jit(lambda key, sizes: update(state(), filled_pool(), key, sizes)[1])
    metrics = traced(jax.random.key(11), ftw_jax.Sizes(*map(jnp.int32, (2, 9, 1))))
    assert bool(metrics["sizes_clamped"]) and bool(metrics["applied"])
    metrics = traced(jax.random.key(12), ftw_jax.Sizes(*map(jnp.int32, (2, 3, 1))))
    assert not bool(metrics["sizes_clamped"])


def test_nan_behaviour_log_probs_are_flagged():
    pool = filled_pool()
    bad = pool.replace(
        trajectories=pool.trajectories.replace(behaviour_logp=jnp.full_like(pool.trajectories.behaviour_logp, jnp.nan))
    )
    _, metrics = shared_update()(state(), bad, jax.random.key(13))
    assert bool(metrics["behaviour_logp_nonfinite"]) and bool(metrics["applied"])
    _, metrics = shared_update()(state(), pool, jax.random.key(14))
    assert not bool(metrics["behaviour_logp_nonfinite"])


def test_a_monitor_larger_than_the_pool_is_recorded_as_the_pool():
    """The monitor measures at most the N entries there are: the config says N, so a run's config.json does too
    (`--monitor-entries 1000000000` was recorded as 10⁹ while N were measured)."""
    assert ftw_jax.UpdateConfig(pool_capacity=8, batch_size=4, monitor_entries=10**9).monitor_entries == 8
    assert ftw_jax.UpdateConfig(pool_capacity=8, batch_size=4, monitor_entries=3).monitor_entries == 3
