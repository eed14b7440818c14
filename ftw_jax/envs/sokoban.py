"""Sokoban, JAX-native: procedurally generated levels that are solvable by construction.

Level generation (deterministic from a key): carve a room by a random walk inside the walled border, put
the boxes on targets (the solved state), place the player, then play the game *backwards* for a number of
moves — walk, and with some probability pull a box along. Every pull undoes a push, so replaying the
moves forwards solves the level: a solution of at most `reverse_moves` moves exists, and `reverse_moves`
<= `step_limit` keeps it within the episode. Levels without a box off its target are redrawn.

Observation: [H, W, 4] float32 one-hot planes (wall, target, box, player). Actions: 0 up, 1 down, 2 left,
3 right; moving into a box pushes it if the cell beyond is free; illegal moves are no-ops (they still cost
a step). Rewards: "binary" pays 1 on the step that solves the level, else 0 (the tied-reward regime);
"shaped" pays −0.1 per step, +1 for a box onto a target, −1 for a box off one, +10 for solving. An episode
ends when the level is solved or after `step_limit` steps.

Splits: training levels come from one key stream, held-out test levels from another (`params.split`: 0 train,
1 test); `num_train_levels` > 0 fixes a finite training set (level ids 0..n−1), 0 draws a fresh level at every
reset. The test set is finite too, `num_test_levels` ids (0: a fresh test level at every reset, as before),
and then held out by *room*: a level's room is its walls, targets and boxes, everything but the player. The
policy sees only the board, and a training level with a test level's room differs from it only in where the
player stands, usually a walk apart without pushing: the same boards. Small grids have few rooms: without the
exclusion, a default run's 19,200 training resets on 6×6 with one box made 628 of the 919 distinct rooms of
the 1,000 test levels (14.6% of the resets had a test room, 2.7% a test start;
experiments/protocol/held_out_levels.py). So a training reset whose room is a test level's (`room_hash`) draws again,
whatever its player's start. Evaluation plays the test levels by index, not drawn with replacement: episode i
of an evaluation plays test level i mod `num_test_levels` (`evaluation_params(params, episode)`), so E
episodes play min(E, n) distinct test levels; Sokoban's run defaults evaluate on E = 1,000 = n episodes
(`ftw_jax.algos.defaults`), each test level once.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from ftw_jax.envs.base import Environment

# up, down, left, right (numpy, so importing the package starts no JAX backend: jax.distributed needs that)
MOVES = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]], np.int32)
_GENERATION_ATTEMPTS = 32
_PULL_PROBABILITY = 0.8
# A training reset draws again while its room is a test level's, at most this many times (then it keeps the last
# draw): at the defaults (6×6, one box, 1,000 test levels) 14.6-14.8% of first draws have a test room (measured
# over 19,200 and 20,000 draws), so 0.17 redraws a reset on average, a reset needs k or more with probability
# 0.15**k (about 5 at most in a run's 19,200), and all 64 failing (0.15**65 ≈ 1e-54) would take a test set
# covering most of the rooms the generator makes. A batch of 64 training resets takes about 2.6x as long as with
# no exclusion (46 ms against 18 ms on 2 CPU cores): the loop runs until its batch's last reset is done.
_REDRAWS = 64
# The settings the test levels depend on (`generate_level`'s, and the step limit that bounds reverse_moves).
_LAYOUT = ("height", "width", "num_boxes", "step_limit", "reverse_moves", "num_test_levels", "level_seed")


# Bounds beyond which level generation and the policy would only hang or run out of memory on a CPU.
MAX_SIDE, MAX_STEPS = 64, 1000


class Level(flax.struct.PyTreeNode):
    walls: jax.Array  # [H, W] bool
    targets: jax.Array  # [H, W] bool
    boxes: jax.Array  # [H, W] bool
    player: jax.Array  # [2] int32 (row, column)


class SokobanState(flax.struct.PyTreeNode):
    level: Level  # walls and targets fixed; boxes and player as the episode goes
    time: jax.Array  # [] int32


class SokobanParams(flax.struct.PyTreeNode):
    split: jax.Array  # [] int32: 0 training levels, 1 held-out test levels
    level_id: jax.Array  # [] int32: the level of the split to play (its first draw), -1: one drawn at random


@dataclasses.dataclass(frozen=True)
class Sokoban(Environment):
    has_success = True

    height: int = 6
    width: int = 6
    num_boxes: int = 1
    step_limit: int = 20
    reward: str = "shaped"  # or "binary"
    reverse_moves: int = 16
    num_train_levels: int = 0
    num_test_levels: int = 1000
    level_seed: int = 0

    def __post_init__(self):
        if not (4 <= self.height <= MAX_SIDE and 4 <= self.width <= MAX_SIDE):
            raise ValueError(f"the grid must be between 4x4 and {MAX_SIDE}x{MAX_SIDE}, got {self.height}x{self.width}.")
        if not 1 <= self.step_limit <= MAX_STEPS:
            raise ValueError(f"step_limit must be in [1, {MAX_STEPS}], got {self.step_limit}.")
        if not 1 <= self.num_boxes <= (self.height - 2) * (self.width - 2) // 3:
            raise ValueError(f"num_boxes must be between 1 and a third of the interior, got {self.num_boxes}.")
        if self.reward not in ("shaped", "binary"):
            raise ValueError(f"reward must be 'shaped' or 'binary', got {self.reward!r}.")
        if not 1 <= self.reverse_moves <= self.step_limit:
            raise ValueError(
                f"reverse_moves must be in [1, step_limit={self.step_limit}] so a solution fits, "
                f"got {self.reverse_moves}."
            )
        for name in ("num_train_levels", "num_test_levels"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}.")

    @property
    def num_actions(self) -> int:
        return 4

    @property
    def max_steps(self) -> int:
        return self.step_limit

    def default_params(self) -> SokobanParams:
        return SokobanParams(split=jnp.zeros((), jnp.int32), level_id=jnp.full((), -1, jnp.int32))

    def evaluation_params(self, params: SokobanParams, episode: jax.Array | None = None) -> SokobanParams:
        """Evaluation runs on the held-out test levels: episode `episode` ([] int32) of an evaluation on test level
        `episode` mod `num_test_levels` (so E episodes play min(E, n) distinct ones); without `episode`, or with
        `num_test_levels=0`, on one drawn at random."""
        level_id = params.level_id
        if episode is not None and self.num_test_levels:
            level_id = (jnp.asarray(episode, jnp.int32) % self.num_test_levels).astype(jnp.int32)
        return params.replace(split=jnp.ones((), jnp.int32), level_id=level_id)

    def level_key(self, split: jax.Array, index: jax.Array) -> jax.Array:
        return jax.random.fold_in(jax.random.fold_in(jax.random.key(self.level_seed), split), index)

    def is_test_room(self, level: Level) -> jax.Array:
        """[] bool: `level`'s room (walls, targets, boxes) is one of the test levels' rooms, wherever its player
        stands (or, rarely, shares a 64-bit hash with one)."""
        # The levels do not depend on the reward: one set of hashes serves both rewards.
        layout = dataclasses.replace(Sokoban(), **{name: getattr(self, name) for name in _LAYOUT})
        return jnp.any(jnp.all(jnp.asarray(held_out_rooms(layout)) == room_hash(level), axis=-1))

    def reset(self, key: jax.Array, params: SokobanParams) -> tuple[jax.Array, SokobanState]:
        unlimited = jnp.iinfo(jnp.int32).max
        training = params.split == 0
        levels = jnp.where(training, self.num_train_levels or unlimited, self.num_test_levels or unlimited)
        first_key, redraw_key = jax.random.split(key)

        def draw(index_key, level_id):
            index = jnp.where(level_id >= 0, level_id, jax.random.randint(index_key, (), 0, levels))
            return generate_level(self.level_key(params.split, index), self)

        if not self.num_test_levels:
            level = draw(first_key, params.level_id)
        else:  # draw, and again (at random) while a training draw has a test level's room: in one loop, so the
            # program holds one copy of the generator (a second doubled the compile time of a reset)
            keys = jnp.concatenate([first_key[None], jax.random.split(redraw_key, _REDRAWS)])
            shapes = jax.eval_shape(functools.partial(generate_level, env=self), first_key)
            level = jax.lax.while_loop(
                lambda loop: (loop[0] == 0) | (training & self.is_test_room(loop[1]) & (loop[0] <= _REDRAWS)),
                lambda loop: (loop[0] + 1, draw(keys[loop[0]], jnp.where(loop[0] == 0, params.level_id, -1))),
                (jnp.zeros((), jnp.int32), jax.tree.map(lambda shape: jnp.zeros(shape.shape, shape.dtype), shapes)),
            )[1]
        return observe(level), SokobanState(level=level, time=jnp.zeros((), jnp.int32))

    def step(
        self, key: jax.Array, state: SokobanState, action: jax.Array, params: SokobanParams
    ) -> tuple[jax.Array, SokobanState, jax.Array, jax.Array, dict[str, jax.Array]]:
        del key, params
        level = state.level
        move = jnp.asarray(MOVES)[action]
        here = level.player
        ahead = here + move
        beyond = jnp.clip(here + 2 * move, 0, jnp.array([self.height - 1, self.width - 1]))
        wall_ahead = level.walls[ahead[0], ahead[1]]
        box_ahead = level.boxes[ahead[0], ahead[1]]
        beyond_free = ~level.walls[beyond[0], beyond[1]] & ~level.boxes[beyond[0], beyond[1]]
        push = box_ahead & beyond_free & ~wall_ahead
        moves = ~wall_ahead & (~box_ahead | push)
        pushed = level.boxes.at[ahead[0], ahead[1]].set(False).at[beyond[0], beyond[1]].set(True)
        boxes = jnp.where(push, pushed, level.boxes)
        new_level = level.replace(boxes=boxes, player=jnp.where(moves, ahead, here))
        on_target_before = jnp.sum(level.boxes & level.targets)
        on_target_after = jnp.sum(boxes & level.targets)
        solved = is_solved(new_level)
        time = state.time + 1
        if self.reward == "shaped":
            reward = -0.1 + (on_target_after - on_target_before) + 10.0 * solved
        else:
            reward = solved.astype(jnp.float32)
        done = solved | (time >= self.step_limit)
        info = {"solved": solved}
        return observe(new_level), SokobanState(level=new_level, time=time), jnp.float32(reward), done, info


def observe(level: Level) -> jax.Array:
    """[H, W, 4] float32 planes: wall, target, box, player."""
    player = jnp.zeros_like(level.walls).at[level.player[0], level.player[1]].set(True)
    return jnp.stack([level.walls, level.targets, level.boxes, player], axis=-1).astype(jnp.float32)


def is_solved(level: Level) -> jax.Array:
    return ~jnp.any(level.boxes & ~level.targets)


# Fixed odd multipliers of `level_hash` (two 32-bit hashes, so that distinct levels rarely collide).
_HASH_WEIGHTS = np.random.default_rng(0).integers(0, 2**31, size=(2, 3 * MAX_SIDE * MAX_SIDE + 2)) * 2 + 1


def room_hash(level: Level) -> jax.Array:
    """[2] uint32: a hash of the level's room, its walls, targets and boxes, not its player (levels that differ
    only in where the player stands hash alike)."""
    bits = jnp.concatenate([level.walls.reshape(-1), level.targets.reshape(-1), level.boxes.reshape(-1)])
    weights = jnp.asarray(_HASH_WEIGHTS[:, : bits.shape[0]], jnp.uint32)
    return jnp.sum(weights * bits.astype(jnp.uint32), axis=-1, dtype=jnp.uint32)


def level_hash(level: Level) -> jax.Array:
    """[2] uint32: a hash of the level's walls, targets, boxes and player (equal levels hash alike; arithmetic
    modulo 2**32)."""
    bits = jnp.concatenate([level.walls.reshape(-1), level.targets.reshape(-1), level.boxes.reshape(-1)])
    values = jnp.concatenate([bits.astype(jnp.uint32), level.player.astype(jnp.uint32)])
    weights = jnp.asarray(_HASH_WEIGHTS[:, : values.shape[0]], jnp.uint32)
    return jnp.sum(weights * values, axis=-1, dtype=jnp.uint32)


@functools.lru_cache(maxsize=16)
def held_out_rooms(env: Sokoban) -> np.ndarray:
    """[num_test_levels, 2] uint32: `room_hash` of every test level of `env`, computed once per process and
    setting on the host (also when first asked for inside a traced program)."""
    with jax.ensure_compile_time_eval():
        return np.asarray(jax.jit(jax.vmap(room_hash))(held_out_levels(env)))


@functools.lru_cache(maxsize=16)
def held_out_levels(env: Sokoban) -> Level:
    """The `num_test_levels` test levels of `env` in order of id, leaves [num_test_levels, ...] (computed once per
    process and setting, as `held_out_rooms`)."""
    with jax.ensure_compile_time_eval():
        indices = jnp.arange(env.num_test_levels)
        keys = jax.vmap(lambda index: env.level_key(jnp.ones((), jnp.int32), index))(indices)
        return jax.jit(jax.vmap(lambda key: generate_level(key, env)))(keys)


def _random_cells(key: jax.Array, allowed: jax.Array, count: int) -> jax.Array:
    """`count` distinct cells chosen uniformly among `allowed` ([H, W] bool): [count, 2] int32."""
    height, width = allowed.shape
    scores = jnp.where(allowed.reshape(-1), jax.random.uniform(key, (height * width,)), -1.0)
    _, flat = jax.lax.top_k(scores, count)
    return jnp.stack([flat // width, flat % width], axis=-1).astype(jnp.int32)


def _generate_once(key: jax.Array, env: Sokoban) -> tuple[Level, jax.Array]:
    """One attempt: (level, acceptable). Acceptable: enough floor and a box off its target."""
    height, width = env.height, env.width
    carve_key, place_key, player_key, reverse_key = jax.random.split(key, 4)
    interior_low = jnp.array([1, 1])
    interior_high = jnp.array([height - 2, width - 2])

    # 1. Carve the room with a random walk inside the border.
    start_key, walk_key = jax.random.split(carve_key)
    start = jax.random.randint(start_key, (2,), interior_low, interior_high + 1)
    carve_steps = 3 * (height - 2) * (width - 2)

    def carve(carry, step_key):
        floor, position = carry
        position = jnp.clip(
            position + jnp.asarray(MOVES)[jax.random.randint(step_key, (), 0, 4)], interior_low, interior_high
        )
        return (floor.at[position[0], position[1]].set(True), position), None

    floor = jnp.zeros((height, width), bool).at[start[0], start[1]].set(True)
    (floor, _), _ = jax.lax.scan(carve, (floor, start), jax.random.split(walk_key, carve_steps))
    walls = ~floor

    # 2. The solved state: boxes on targets, the player beside one (as if it had just pushed it there).
    cells = _random_cells(place_key, floor, env.num_boxes)
    targets = jnp.zeros((height, width), bool).at[cells[:, 0], cells[:, 1]].set(True)
    beside_target = jnp.zeros_like(targets)
    for move in ((-1, 0), (1, 0), (0, -1), (0, 1)):
        beside_target = beside_target | jnp.roll(targets, move, axis=(0, 1))
    free = floor & ~targets
    player = _random_cells(player_key, jnp.where(jnp.any(free & beside_target), free & beside_target, free), 1)[0]

    # 3. Play backwards: walk, and pull the box behind the player along with some probability.
    def reverse(carry, step_key):
        boxes, player = carry
        move_key, pull_key = jax.random.split(step_key)
        move = jnp.asarray(MOVES)[jax.random.randint(move_key, (), 0, 4)]
        ahead = player + move
        behind = player - move
        can_walk = ~walls[ahead[0], ahead[1]] & ~boxes[ahead[0], ahead[1]]
        pull = can_walk & boxes[behind[0], behind[1]] & jax.random.bernoulli(pull_key, _PULL_PROBABILITY)
        pulled = boxes.at[behind[0], behind[1]].set(False).at[player[0], player[1]].set(True)
        boxes = jnp.where(pull, pulled, boxes)
        return (boxes, jnp.where(can_walk, ahead, player)), None

    (boxes, player), _ = jax.lax.scan(reverse, (targets, player), jax.random.split(reverse_key, env.reverse_moves))
    level = Level(walls=walls, targets=targets, boxes=boxes, player=player)
    acceptable = (jnp.sum(floor) >= env.num_boxes + 2) & ~is_solved(level)
    return level, acceptable


def generate_level(key: jax.Array, env: Sokoban) -> Level:
    """A level from `key`: the first acceptable of a few attempts (the last one if none is)."""
    levels, acceptable = jax.vmap(_generate_once, in_axes=(0, None))(jax.random.split(key, _GENERATION_ATTEMPTS), env)
    choice = jnp.where(jnp.any(acceptable), jnp.argmax(acceptable), _GENERATION_ATTEMPTS - 1)
    return jax.tree.map(lambda leaf: leaf[choice], levels)


# RGB of the cell kinds drawn by `render`.
_COLOURS = {
    "floor": (235, 232, 222),
    "wall": (92, 84, 76),
    "target": (214, 69, 65),
    "box": (196, 142, 62),
    "box_on_target": (86, 160, 90),
    "player": (52, 101, 164),
}


def render(observation: jax.Array | np.ndarray, cell: int = 16) -> np.ndarray:
    """An RGB picture of Sokoban observations: [..., H, W, 4] one-hot planes -> uint8 [..., H·cell, W·cell, 3].

    Walls dark, floor light, a target a red dot, a box a brown square (green on its target), the player a blue
    disc. Works on one observation, a trajectory's [T, H, W, 4] (one frame per step), or any leading axes.
    """
    planes = np.asarray(observation)
    if planes.ndim < 3 or planes.shape[-1] != 4:
        raise ValueError(f"expected Sokoban observations [..., H, W, 4], got shape {planes.shape}.")
    if not (isinstance(cell, int) and cell >= 4):
        raise ValueError(f"cell must be an int >= 4 pixels, got {cell!r}.")
    wall, target, box, player = (planes[..., i] > 0.5 for i in range(4))
    # Pixel masks of one cell: an inset square (box), a small centred square (target dot) and a disc (player).
    centre = (np.arange(cell) + 0.5 - cell / 2) / (cell / 2)
    radius = np.hypot(centre[:, None], centre[None, :])
    inset = (np.abs(centre)[:, None] < 0.8) & (np.abs(centre)[None, :] < 0.8)
    dot, disc = radius < 0.35, radius < 0.7
    upsample = lambda cells: np.repeat(np.repeat(cells, cell, axis=-2), cell, axis=-1)  # noqa: E731
    tile = lambda mask: np.tile(mask, wall.shape[-2:])  # noqa: E731  one cell's mask on every cell
    image = np.empty(wall.shape[:-2] + (wall.shape[-2] * cell, wall.shape[-1] * cell, 3), np.uint8)
    image[...] = _COLOURS["floor"]
    for kind, where in (
        ("wall", upsample(wall)),
        ("target", upsample(target) & tile(dot)),
        ("box", upsample(box & ~target) & tile(inset)),
        ("box_on_target", upsample(box & target) & tile(inset)),
        ("player", upsample(player) & tile(disc)),
    ):
        image[where] = _COLOURS[kind]
    return image
