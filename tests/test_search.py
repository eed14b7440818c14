"""The search task: forced tokens, tool results, exact-match scoring, two hops, caps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import jitted_steps

from ftw_jax.core.losses import categorical_kl, entropy
from ftw_jax.envs.search import ANSWER, BOS, NONE, QUESTION_ONE_HOP, QUESTION_TWO_HOP, RESULT, SEARCH, SearchTask
from ftw_jax.lab.rollout import Player, rollout
from ftw_jax.policies import ARCHITECTURES


def run(env, seed, chooser):
    """Plays an episode; `chooser(state)` gives the policy's token at free steps. Returns the log."""
    reset, forced_action, step = jitted_steps(env)
    observation, state = reset(jax.random.key(seed), ())
    log = []
    for _ in range(env.max_steps):
        forced, forced_token = forced_action(state, ())
        action = forced_token if bool(forced) else chooser(state)
        observation, state, reward, done, info = step(jax.random.key(0), state, jnp.int32(action), ())
        log.append((int(observation.observation), bool(forced), float(reward), bool(done), bool(info["solved"])))
        if bool(done):
            break
    return state, log


def history_policy(name, env, num_outputs=None):
    """The search task's policy `name` (an `ARCHITECTURES` entry), with env.num_actions or num_outputs outputs."""
    return ARCHITECTURES[name](num_outputs or env.num_actions, env, None)


def first_state(env, seed):
    """The state after reset, and the entity the question asks about."""
    _, state = jitted_steps(env)[0](jax.random.key(seed), ())
    return state, int(state.queue[1]) - env.entity_token(0)


def test_one_hop_search_then_answer_scores_exact_match():
    env = SearchTask()
    key = 3
    state, entity = first_state(env, key)
    right = env.value_token(int(state.value[entity]))
    script = iter([SEARCH, env.entity_token(entity), ANSWER, right])
    _, log = run(env, key, lambda state: next(script))
    tokens = [token for token, *_ in log]
    forced = [flag for _, flag, *_ in log]
    link = env.entity_token(int(state.link[entity]))
    assert tokens == [
        QUESTION_ONE_HOP,
        env.entity_token(entity),
        SEARCH,
        env.entity_token(entity),
        RESULT,
        link,
        right,
        ANSWER,
        right,
    ]
    assert forced == [True, True, False, False, True, True, True, False, False]
    assert log[-1][2:] == (1.0, True, True)


def test_wrong_answer_and_non_entity_search():
    env = SearchTask()
    key = 4
    state, entity = first_state(env, key)
    wrong = env.value_token((int(state.value[entity]) + 1) % env.num_values)
    script = iter([SEARCH, ANSWER, ANSWER, wrong])  # searching for ANSWER (not an entity) finds nothing
    _, log = run(env, key, lambda state: next(script))
    assert [token for token, *_ in log][4:7] == [RESULT, NONE, NONE]
    assert log[-1][2:] == (0.0, True, False)


def test_two_hops_need_two_searches():
    env = SearchTask(hops=2)
    key = 5
    state, entity = first_state(env, key)
    middle = int(state.link[entity])
    right = env.value_token(int(state.value[middle]))
    script = iter([SEARCH, env.entity_token(entity), SEARCH, env.entity_token(middle), ANSWER, right])
    _, log = run(env, key, lambda state: next(script))
    assert log[0][0] == QUESTION_TWO_HOP and log[-1][2:] == (1.0, True, True)
    assert int(state.answer) == right and middle != entity


def test_search_cap_and_step_limit_end_the_episode():
    env = SearchTask(max_searches=1)
    script = iter([SEARCH, env.entity_token(0), SEARCH, env.entity_token(1)])
    _, log = run(env, 6, lambda state: next(script))
    assert log[-1][3] and log[-1][2] == 0.0 and len(log) == 8  # the second SEARCH exceeds the cap
    _, log = run(SearchTask(), 7, lambda state: BOS)
    assert len(log) == SearchTask().step_limit and log[-1][3] and not log[-1][4]


@pytest.mark.slow
@pytest.mark.usefixtures("unchecked_key_reuse")
@pytest.mark.parametrize("architecture", ["lm", "transformer"])
def test_rollout_masks_forced_tokens_and_the_policy_is_causal(architecture):
    env = SearchTask()
    policy = history_policy(architecture, env)
    params = jax.jit(policy.init)(jax.random.key(0), jnp.zeros((env.max_steps,), jnp.int32))
    batch, success = jax.jit(jax.vmap(lambda k: rollout(k, Player(env, (), policy, params, jnp.int32(0)))))(
        jax.random.split(jax.random.key(1), 6)
    )
    mask = np.asarray(batch.mask)
    assert not mask[:, :2].any() and mask[:, 2].all()  # the question is written by the environment
    played = np.asarray(batch.alive)[:, 1:]  # steps after the end are not played (zeros)
    np.testing.assert_array_equal(
        np.asarray(batch.observation.observation)[:, 1:][played], np.asarray(batch.action)[:, :-1][played]
    )
    legal_taken = np.take_along_axis(np.asarray(batch.observation.legal), np.asarray(batch.action)[..., None], -1)[
        ..., 0
    ]
    assert legal_taken[mask].all()  # the policy only ever writes tokens the grammar allows
    assert np.all(np.asarray(batch.behaviour_logp)[:, :2] == 0.0)  # forced steps carry no log-prob
    tokens = jnp.arange(env.max_steps) % env.vocabulary_size
    changed = tokens.at[-1].set(0)
    apply = jax.jit(policy.apply)
    np.testing.assert_allclose(apply(params, tokens)[:-1], apply(params, changed)[:-1], atol=1e-6)


def test_grammar_allows_search_or_answer_then_an_entity_or_a_value():
    env = SearchTask()
    entities = {env.entity_token(i) for i in range(env.num_entities)}
    values = {env.value_token(i) for i in range(env.num_values)}
    state, entity = first_state(env, 8)
    seen = []
    step = jitted_steps(env)[2]
    for action in [0, 0, SEARCH, env.entity_token(entity), 0, 0, 0, ANSWER]:  # 0: forced steps ignore it
        observation, state, *_ = step(jax.random.key(0), state, jnp.int32(action), ())
        seen.append(set(np.flatnonzero(np.asarray(observation.legal)).tolist()))
    everything = set(range(env.num_actions))
    assert seen == [
        everything,
        {SEARCH, ANSWER},
        entities,
        everything,
        everything,
        everything,
        {SEARCH, ANSWER},
        values,
    ]
    _, free = SearchTask(grammar=False).reset(jax.random.key(0), ())
    assert bool(SearchTask(grammar=False).legal_actions(free.replace(queue_length=jnp.int32(0))).all())


@pytest.mark.parametrize("architecture", [pytest.param("lm", marks=pytest.mark.slow), "transformer"])
def test_illegal_tokens_get_zero_probability_and_losses_stay_finite(architecture):
    env = SearchTask()
    policy = history_policy(architecture, env)
    observation, _ = env.reset(jax.random.key(0), ())
    history = jax.tree.map(lambda leaf: jnp.broadcast_to(leaf, (env.max_steps,) + leaf.shape), observation)
    legal = jnp.zeros((env.max_steps, env.num_actions), bool).at[:, SEARCH].set(True).at[:, ANSWER].set(True)
    history = history.replace(legal=legal)
    init, apply = jax.jit(policy.init), jax.jit(policy.apply)
    params = init(jax.random.key(1), history)
    logits = apply(params, history)
    probabilities = jax.nn.softmax(logits)
    np.testing.assert_array_equal(np.asarray(probabilities)[:, [BOS, RESULT, env.entity_token(0)]], 0.0)
    np.testing.assert_allclose(np.asarray(probabilities[:, SEARCH] + probabilities[:, ANSWER]), 1.0, rtol=1e-6)
    other = apply(init(jax.random.key(2), history), history)
    mask = jnp.ones((env.max_steps,), bool)
    kl, step_entropy = np.asarray(categorical_kl(logits, other, mask)), np.asarray(entropy(logits, mask))
    assert np.isfinite(kl).all() and (kl >= 0).all() and kl.max() < 1.0  # over two actions, not over 1e9-sized logits
    assert np.isfinite(step_entropy).all() and (step_entropy <= np.log(2) + 1e-6).all()


@pytest.mark.slow
@pytest.mark.usefixtures("unchecked_key_reuse")
def test_the_lm_acting_through_its_cache_logs_the_log_probs_of_a_full_pass():
    """A rollout feeds the LM one token a step through its KV cache; the update re-reads whole trajectories.
    Both must give the same per-step log-probabilities, or every importance ratio would be off."""
    env = SearchTask(hops=2)  # longer episodes: more cache slots in use
    policy = history_policy("lm", env)
    observation, _ = env.reset(jax.random.key(0), ())
    history = jax.tree.map(lambda leaf: jnp.broadcast_to(leaf, (env.max_steps,) + leaf.shape), observation)
    params = jax.jit(policy.init)(jax.random.key(1), history)
    keys = jax.random.split(jax.random.key(2), 16)
    batch, _ = jax.jit(jax.vmap(lambda k: rollout(k, Player(env, (), policy, params, jnp.int32(0)))))(keys)
    logits = jax.jit(jax.vmap(lambda o: policy.apply(params, o)))(batch.observation)
    full_pass = jnp.take_along_axis(jax.nn.log_softmax(logits), batch.action[..., None], -1)[..., 0]
    mask = np.asarray(batch.mask)
    assert mask[:, 5:].any()  # steps past the question were acted on
    np.testing.assert_allclose(np.asarray(batch.behaviour_logp)[mask], np.asarray(full_pass)[mask], atol=1e-5)
    assert np.ptp(np.asarray(full_pass)[mask]) > 0.5  # fresh weights are far from uniform: a wrong slot would show


def test_the_lm_critic_reads_its_own_head_off_the_hidden_state():
    env = SearchTask()
    critic = history_policy("lm", env, num_outputs=1)
    tokens = jnp.arange(env.max_steps) % env.vocabulary_size
    params = jax.jit(critic.init)(jax.random.key(0), tokens)
    assert jax.jit(critic.apply)(params, tokens).shape == (env.max_steps, 1)
    assert params["params"]["head"]["kernel"].shape == (64, 1) and "lm_head" not in params["params"]["lm"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(hops=3), "hops"),
        (dict(step_limit=5), "step_limit"),
        (dict(hops=2, step_limit=16, max_searches=1), "max_searches"),
    ],
)
def test_bad_options(options, message):
    with pytest.raises(ValueError, match=message):
        SearchTask(**options)
