"""Sokoban: hand-made dynamics and rewards, and generated levels checked by a breadth-first solver."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ftw_jax.envs.sokoban import (
    Level,
    Sokoban,
    SokobanState,
    _generate_once,
    generate_level,
    held_out_levels,
    held_out_rooms,
    is_solved,
    level_hash,
    observe,
    render,
    room_hash,
)
from ftw_jax.lab import train
from ftw_jax.lab.rollout import rollouts
from ftw_jax.lab.train import TrainConfig, make_train

UP, DOWN, LEFT, RIGHT = range(4)
# generate_level vmaps its attempts, each a scan over split keys: the checker's false positive (conftest).
pytestmark = pytest.mark.usefixtures("unchecked_key_reuse")


def test_one_generation_attempt_reuses_no_key():
    with jax.debug_key_reuse(True):
        level, _ = jax.jit(lambda key: _generate_once(key, Sokoban()))(jax.random.key(0))
    assert level.walls.shape == (6, 6)


def make_level(rows):
    """A level from text: # wall, . target, $ box, * box on target, @ player, space floor."""
    grid = np.array([list(row) for row in rows])
    player = np.argwhere(grid == "@")[0]
    return Level(
        walls=jnp.asarray(grid == "#"),
        targets=jnp.asarray(np.isin(grid, [".", "*"])),
        boxes=jnp.asarray(np.isin(grid, ["$", "*"])),
        player=jnp.asarray(player, jnp.int32),
    )


ROOM = ["######", "#    #", "#@$. #", "#    #", "#    #", "######"]


def play(env, level, actions):
    state = SokobanState(level=level, time=jnp.zeros((), jnp.int32))
    rewards, dones = [], []
    for action in actions:
        _, state, reward, done, info = env.step(jax.random.key(0), state, jnp.int32(action), env.default_params())
        rewards.append(float(reward))
        dones.append(bool(done))
    return state, rewards, dones


def test_push_onto_target_solves_with_the_shaped_bonus():
    state, rewards, dones = play(Sokoban(), make_level(ROOM), [RIGHT])
    assert bool(is_solved(state.level)) and dones == [True]
    np.testing.assert_allclose(rewards, [-0.1 + 1 + 10], rtol=1e-6)
    assert state.level.player.tolist() == [2, 2]


def test_binary_reward_pays_only_the_solve():
    level = make_level(["######", "#    #", "#@ $.#", "#    #", "#    #", "######"])
    _, rewards, dones = play(Sokoban(reward="binary"), level, [UP, RIGHT, DOWN, RIGHT])
    assert rewards == [0.0, 0.0, 0.0, 1.0] and dones == [False, False, False, True]


def test_walls_and_blocked_boxes_are_no_ops_that_cost_a_step():
    level = make_level(["######", "#@   #", "#   $#", "#  . #", "#    #", "######"])
    state, rewards, _ = play(Sokoban(), level, [UP, LEFT])  # into the wall twice
    assert state.level.player.tolist() == [1, 1] and int(state.time) == 2
    np.testing.assert_allclose(rewards, [-0.1, -0.1], rtol=1e-6)
    level = make_level(["######", "#    #", "#  @$#", "#  . #", "#    #", "######"])
    state, rewards, _ = play(Sokoban(), level, [RIGHT])  # the box is against the wall
    assert state.level.player.tolist() == [2, 3] and bool(state.level.boxes[2, 4])


def test_box_cannot_push_a_box_and_pushing_off_a_target_costs_one():
    env = Sokoban(num_boxes=2)
    level = make_level(["######", "#    #", "#@$$.#", "#   .#", "#    #", "######"])
    state, _, _ = play(env, level, [RIGHT])
    assert state.level.player.tolist() == [2, 1]  # two boxes in a row do not move
    level = make_level(["######", "#    #", "#@*  #", "#  . #", "#    #", "######"])
    _, rewards, dones = play(Sokoban(), level, [RIGHT])
    np.testing.assert_allclose(rewards, [-0.1 - 1.0], rtol=1e-6)
    assert dones == [False]


def test_episode_ends_at_the_step_limit():
    _, _, dones = play(Sokoban(step_limit=3, reverse_moves=3), make_level(ROOM), [UP, DOWN, UP])
    assert dones == [False, False, True]


def test_observation_planes():
    level = make_level(ROOM)
    planes = np.asarray(observe(level))
    assert planes.shape == (6, 6, 4) and planes.dtype == np.float32
    assert planes[..., 0].sum() == 20 and planes[2, 3, 1] == 1 and planes[2, 2, 2] == 1 and planes[2, 1, 3] == 1


def shortest_solution(level, limit):
    """Breadth-first search over (player, boxes) with the game's rules; moves to solve, or None."""
    walls = np.asarray(level.walls)
    targets = frozenset(map(tuple, np.argwhere(np.asarray(level.targets))))
    start = (tuple(np.asarray(level.player).tolist()), frozenset(map(tuple, np.argwhere(np.asarray(level.boxes)))))
    frontier, seen = collections.deque([(start, 0)]), {start}
    while frontier:
        (player, boxes), depth = frontier.popleft()
        if boxes <= targets:
            return depth
        if depth == limit:
            continue
        for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
            ahead = (player[0] + dr, player[1] + dc)
            if walls[ahead]:
                continue
            new_boxes = boxes
            if ahead in boxes:
                beyond = (ahead[0] + dr, ahead[1] + dc)
                if walls[beyond] or beyond in boxes:
                    continue
                new_boxes = (boxes - {ahead}) | {beyond}
            state = (ahead, new_boxes)
            if state not in seen:
                seen.add(state)
                frontier.append((state, depth + 1))
    return None


@pytest.mark.slow
@pytest.mark.parametrize("env", [Sokoban(), Sokoban(height=7, width=7, num_boxes=2, step_limit=30, reverse_moves=24)])
@pytest.mark.parametrize("split", [0, 1])
def test_generated_levels_are_solvable_within_the_step_limit(env, split):
    keys = jnp.stack([env.level_key(jnp.int32(split), jnp.int32(i)) for i in range(150)])
    levels = jax.jit(jax.vmap(lambda key: generate_level(key, env)))(keys)
    lengths = []
    for i in range(150):
        level = jax.tree.map(lambda leaf: leaf[i], levels)  # noqa: B023
        assert not bool(is_solved(level))
        assert int(level.boxes.sum()) == env.num_boxes == int(level.targets.sum())
        assert np.all(np.asarray(level.walls)[[0, -1], :]) and np.all(np.asarray(level.walls)[:, [0, -1]])
        length = shortest_solution(level, env.step_limit)
        assert length is not None and 1 <= length <= env.reverse_moves
        lengths.append(length)
    assert len(set(lengths)) > 2  # not all the same difficulty


@pytest.mark.slow
def test_levels_are_deterministic_and_splits_differ():
    env = Sokoban()
    first = generate_level(env.level_key(jnp.int32(0), jnp.int32(5)), env)
    again = generate_level(env.level_key(jnp.int32(0), jnp.int32(5)), env)
    test = generate_level(env.level_key(jnp.int32(1), jnp.int32(5)), env)
    jax.tree.map(np.testing.assert_array_equal, first, again)
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(test)))


@pytest.mark.slow
def test_reset_draws_from_the_split():
    env = Sokoban(num_train_levels=3)
    params = env.default_params()
    reset = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))
    keys = jax.random.split(jax.random.key(0), 40)
    training = {np.asarray(observation).tobytes() for observation in reset(keys, params)[0]}
    assert len(training) <= 3  # a finite training set
    held_out = {np.asarray(observation).tobytes() for observation in reset(keys, env.evaluation_params(params))[0]}
    assert len(held_out) > 10 and not held_out & training


@pytest.mark.slow
def test_no_training_reset_draws_a_test_levels_room():
    """At the defaults, training resets never make the room (walls, targets, boxes) of one of the 1,000 test
    levels, wherever its player stands: they draw again. The check can fail: the same stream without the
    exclusion makes test rooms (about 15% of its draws) and more than half of them with another start."""
    env = Sokoban()
    keys = jax.random.split(jax.random.key(0), 1000)
    test_rooms = {tuple(row) for row in held_out_rooms(env).tolist()}
    test_starts = {tuple(row) for row in np.asarray(jax.vmap(level_hash)(held_out_levels(env))).tolist()}

    def drawn(env):  # (room, level) hashes of the training resets
        levels = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))(keys, env.default_params())[1].level
        rooms, starts = (np.asarray(jax.vmap(hash_of)(levels)).tolist() for hash_of in (room_hash, level_hash))
        return [(tuple(room), tuple(start)) for room, start in zip(rooms, starts)]

    training = drawn(env)
    assert len(set(training)) > 500 and not {room for room, _ in training} & test_rooms
    unfiltered = [(room, start) for room, start in drawn(Sokoban(num_test_levels=0)) if room in test_rooms]
    assert len(unfiltered) > 100  # without the exclusion they would be there: 148 of these 1,000 draws
    assert sum(start not in test_starts for _, start in unfiltered) > len(unfiltered) / 2  # most, other starts


@pytest.mark.slow
def test_an_evaluation_plays_each_test_level_once(monkeypatch):
    """Evaluation episode i starts on test level i mod `num_test_levels`: an evaluation of as many episodes as
    test levels plays each once, in order, not a draw with replacement."""
    config = TrainConfig.for_env("sokoban", num_iterations=1, eval_every=1, eval_episodes=24, eval_greedy=True)
    trainer = make_train(config, num_test_levels=16)
    starts = []  # the first observations of the episodes of each `rollouts` call, in the traced program

    def recording(*args, **kwargs):
        batch, success = rollouts(*args, **kwargs)
        starts.append(batch.observation[:, 0])
        return batch, success

    monkeypatch.setattr(train, "rollouts", recording)
    evaluate = jax.jit(lambda key, carry: (trainer.evaluate(key, carry), starts[-2:]))
    _, (greedy, sampled) = evaluate(jax.random.key(1), jax.jit(trainer.init)(jax.random.key(0)))
    test_boards = np.asarray(jax.vmap(observe)(held_out_levels(Sokoban(num_test_levels=16))))
    for played in (greedy, sampled):
        np.testing.assert_array_equal(played, test_boards[np.arange(24) % 16])
    assert len({board.tobytes() for board in test_boards}) == 16  # 16 distinct levels


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(reward="dense"), "reward"),
        (dict(reverse_moves=30), "reverse_moves"),
        (dict(height=3), "4x4"),
        (dict(num_boxes=0), "num_boxes"),
        (dict(num_test_levels=-1), "num_test_levels must be >= 0"),
    ],
)
def test_bad_options(options, message):
    with pytest.raises(ValueError, match=message):
        Sokoban(**options)


def test_render_draws_each_cell_kind_in_its_colour():
    level = make_level(["####", "#@$#", "#.*#", "####"])
    image = render(observe(level), cell=8)
    assert image.shape == (32, 32, 3) and image.dtype == np.uint8
    centre = lambda row, column: tuple(image[8 * row + 4, 8 * column + 4])  # noqa: E731
    corner = lambda row, column: tuple(image[8 * row, 8 * column])  # noqa: E731
    assert centre(0, 0) == (92, 84, 76)  # wall
    assert centre(1, 1) == (52, 101, 164) and corner(1, 1) == (235, 232, 222)  # player disc on floor
    assert centre(1, 2) == (196, 142, 62)  # box
    assert centre(2, 1) == (214, 69, 65) and corner(2, 1) == (235, 232, 222)  # target dot on floor
    assert centre(2, 2) == (86, 160, 90)  # box on its target
    frames = render(np.stack([observe(level)] * 3))  # a trajectory: one frame per step
    assert frames.shape == (3, 64, 64, 3)
    with pytest.raises(ValueError, match=r"expected Sokoban observations \[..., H, W, 4\], got shape \(6, 6\)"):
        render(np.zeros((6, 6)))
