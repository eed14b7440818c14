"""The text search agent's task: the protocol in words, exact-match reward, forced tool output, the tokenizer,
the demonstrator and the supervised warm start."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import jitted_steps

from ftw_jax.algos.imitation import imitation_loss
from ftw_jax.envs import make
from ftw_jax.envs.text_search import WORDS, TextSearchTask, text
from ftw_jax.lab.rollout import demonstration
from ftw_jax.lab.train import TrainConfig, make_train
from ftw_jax.lab.warm_start import WarmStart, demonstrations, fit_demonstrations
from ftw_jax.lm.load import load_pretrained

ID = {word: index for index, word in enumerate(WORDS)}


def play(env, seed, words):
    """Plays the model's `words` (one per free step) after reset(seed); returns (the whole text, forced flags,
    total reward, done)."""
    reset, forced_action, step = jitted_steps(env)
    observation, state = reset(jax.random.key(seed), ())
    tokens, forced_flags, total, script = [int(observation)], [], 0.0, iter(words)
    for _ in range(env.max_steps):
        forced, forced_token = forced_action(state, ())
        action = int(forced_token) if bool(forced) else ID[next(script)]
        observation, state, reward, done, _ = step(jax.random.key(0), state, jnp.int32(action), ())
        tokens.append(int(observation))
        forced_flags.append(bool(forced))
        total += float(reward)
        if bool(done):
            return text(tokens), forced_flags, total, True
    return text(tokens), forced_flags, total, False


def question(env, seed):
    """(asked name, attribute, two hops?, the right word) of episode `seed`."""
    _, state = jitted_steps(env)[0](jax.random.key(seed), ())
    words = text(state.queue[: int(state.queue_length)]).split()
    return words[-2], words[5], bool(state.two_hop), WORDS[int(state.answer)]


def find(env, seed, two_hop):
    return next(seed for seed in range(seed, seed + 100) if question(env, seed)[2] == two_hop)


def test_one_hop_search_then_the_right_answer_scores_one():
    env = TextSearchTask()
    seed = find(env, 0, two_hop=False)
    name, attribute, _, right = question(env, seed)
    story, forced, reward, done = play(env, seed, ["<search>", name, "</search>", "<answer>", right, "</answer>"])
    assert story.startswith(
        f"<bos> question : what is the {attribute} of {name} ? <search> {name} </search> <information> {name} : city "
    )
    assert story.endswith(f"</information> <answer> {right} </answer>") and f"{attribute} {right}" in story
    assert (reward, done) == (1.0, True)
    assert forced == [True] * 9 + [False] * 3 + [True] * 12 + [False] * 3  # the question and the tool's output


def test_two_hops_read_the_friend_then_answer():
    env = TextSearchTask()
    seed = find(env, 0, two_hop=True)
    name, attribute, _, right = question(env, seed)
    _, state = jitted_steps(env)[0](jax.random.key(seed), ())
    friend = WORDS[ID["alice"] + int(state.friend[ID[name] - ID["alice"]])]
    words = ["<search>", name, "</search>", "<search>", friend, "</search>", "<answer>", right, "</answer>"]
    story, _, reward, _ = play(env, seed, words)
    assert f"of the friend of {name} ?" in story and f"friend {friend} </information>" in story
    assert reward == 1.0


@pytest.mark.parametrize(
    "answer",
    [
        ["<answer>", "WRONG", "</answer>"],  # another value
        ["<answer>", "RIGHT", "RIGHT", "</answer>"],  # not exactly the one word
        ["<answer>", "</answer>"],  # nothing
    ],
)
def test_only_the_exact_answer_scores(answer):
    env = TextSearchTask()
    seed = find(env, 0, two_hop=False)
    _, attribute, _, right = question(env, seed)
    values = [word for word in WORDS if (word in ("paris", "rome") if attribute == "city" else word in ("red", "blue"))]
    wrong = values[0] if values[0] != right else values[1]
    words = [{"RIGHT": right, "WRONG": wrong}.get(word, word) for word in answer]
    _, _, reward, done = play(env, seed, words)
    assert (reward, done) == (0.0, True)


def test_a_guess_is_scored_as_any_answer_and_words_outside_tags_are_ignored():
    env = TextSearchTask()
    seed = find(env, 0, two_hop=False)
    _, _, _, right = question(env, seed)
    _, _, reward, _ = play(env, seed, ["what", right, "?", "<answer>", right, "</answer>"])
    assert reward == 1.0


def test_a_query_that_is_not_one_name_finds_nothing_and_the_search_cap_ends_the_episode():
    env = TextSearchTask(max_searches=2)
    story, _, reward, done = play(
        env, 0, ["<search>", "paris", "</search>", "<search>", "alice", "bob", "</search>", "<search>"]
    )
    assert story.count("<information> no result </information>") == 2
    assert (reward, done) == (0.0, True)
    _, forced, reward, done = play(env, 0, ["the"] * 200)  # never answering: the step limit ends it
    assert (len(forced), reward, done) == (env.step_limit, 0.0, True)


def test_the_tokenizer_reads_and_writes_the_environments_ids():
    env = TextSearchTask()
    trajectory, _ = jax.jit(demonstration, static_argnums=1)(jax.random.key(3), env, ())
    steps = int(trajectory.alive.sum())
    ids = [int(trajectory.observation[0])] + [int(token) for token in trajectory.action[:steps]]
    tokenizer = env.tokenizer()
    assert tokenizer.encode(text(ids)) == ids and tokenizer.decode(ids) == text(ids)
    assert tokenizer.vocab_size == env.vocabulary_size == len(WORDS)


@pytest.mark.slow
@pytest.mark.usefixtures("unchecked_key_reuse")
def test_the_demonstrator_is_right_unless_it_guesses():
    demonstrate = jax.jit(demonstrations, static_argnums=(1, 3))
    _, success = demonstrate(jax.random.key(0), TextSearchTask(guess_rate=0.0), (), 64)
    assert bool(jnp.all(success))
    _, success = demonstrate(jax.random.key(0), TextSearchTask(guess_rate=1.0, num_values=2), (), 256)
    assert 0.35 < float(jnp.mean(success)) < 0.65  # right by chance: 1 in 2


@pytest.mark.slow
@pytest.mark.usefixtures("unchecked_key_reuse")
def test_a_warm_start_imitates_the_demonstrator():
    # Each piece jitted whole: run eagerly, every scan and while loop in it would be compiled on its own.
    env = TextSearchTask(guess_rate=0.0)
    config = TrainConfig.for_env("text-search", warm_start_demonstrations=0, eval_episodes=64)
    trainer = make_train(config, guess_rate=0.0)
    fresh = jax.jit(trainer.init)(jax.random.key(0))
    fit = jax.jit(fit_demonstrations, static_argnums=(1, 3, 5))
    params, losses = fit(
        jax.random.key(1),
        env,
        (),
        trainer.policy,
        fresh.learner.policy.params,
        WarmStart(256, steps=80, learning_rate=3e-3, batch_size=32),
    )
    assert float(losses[-1]) < 0.3 * float(losses[0])
    demos, _ = jax.jit(demonstrations, static_argnums=(1, 3))(jax.random.key(2), env, (), 32)  # held out
    assert float(jax.jit(imitation_loss, static_argnums=0)(trainer.policy, params, demos)) < 0.3 * float(losses[0])
    fitted = fresh.replace(learner=fresh.learner.replace(policy=fresh.learner.policy.replace(params=params)))
    evaluate = jax.jit(trainer.evaluate)
    before = evaluate(jax.random.key(3), fresh)["success"]
    after = evaluate(jax.random.key(3), fitted)["success"]
    assert float(before) < 0.1 < 0.3 < float(after)


def test_a_warm_start_needs_a_demonstrator():
    with pytest.raises(ValueError, match="warm_start_demonstrations needs an environment with a demonstrator"):
        make_train(TrainConfig.for_env("search", warm_start_demonstrations=16))
    with pytest.raises(ValueError, match="warm_start_steps must be"):
        TrainConfig.for_env("text-search", warm_start_steps=0)
    with pytest.raises(ValueError, match="model must be a Hugging Face folder's path or None, got ''"):
        TrainConfig.for_env("text-search", model="")
    with pytest.raises(ValueError, match=r"model='x' needs a policy that starts from .*\(lm\), got policy 'transf"):
        TrainConfig.for_env("search", policy="transformer", model="x")


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    from conftest import write_tiny_bpe_checkpoint

    return write_tiny_bpe_checkpoint(tmp_path_factory.mktemp("chat") / "tiny-chat")


@pytest.mark.slow
@pytest.mark.usefixtures("unchecked_key_reuse")
def test_the_task_in_a_chat_models_tokens_reads_words_of_several_tokens(chat_model):
    pretrained = load_pretrained(chat_model)
    env = TextSearchTask(guess_rate=0.0, step_limit=240).written_in(pretrained.tokenizer, pretrained.config.vocab_size)
    assert env.lexicon.max_pieces > 1 and env.num_actions == 320  # words of several tokens; the model's vocabulary
    demos, success = jax.jit(demonstrations, static_argnums=(1, 3))(jax.random.key(0), env, (), 8)
    assert bool(jnp.all(success))  # the demonstrator's multi-token words are read back as the words they spell
    tokenizer = env.tokenizer()
    steps = int(demos.alive[0].sum())
    story = tokenizer.decode([int(demos.observation[0, 0])] + [int(a) for a in demos.action[0, :steps]])
    assert story.startswith("<|im_start|>user\n") and "<|im_start|>assistant\n <search> " in story
    assert story.endswith("</answer>")
    with pytest.raises(ValueError, match="step_limit must be in"):
        TextSearchTask().written_in(pretrained.tokenizer, 320)  # 64 steps cannot hold a two-hop episode in these tokens
    with pytest.raises(ValueError, match="lexicon is a pretrained model's tokens"):
        TextSearchTask(lexicon=str(chat_model))  # not an --env-options option
    with pytest.raises(ValueError, match="Sokoban is not written in text"):
        make("sokoban").written_in(pretrained.tokenizer, 320)


@pytest.mark.slow
def test_a_checkpoint_too_long_for_the_step_limit_is_refused_before_its_weights_are_read(chat_model, tmp_path):
    import shutil

    shapes_only = tmp_path / "no-weights"  # config.json and the tokenizer: what decides the episodes' length
    shutil.copytree(chat_model, shapes_only, ignore=shutil.ignore_patterns("*.safetensors*"))
    with pytest.raises(ValueError, match="step_limit must be in"):  # not "no weights": none was read
        make_train(TrainConfig.for_env("text-search", model=str(shapes_only)))


@pytest.mark.slow
@pytest.mark.usefixtures("unchecked_key_reuse")
def test_a_checkpoints_weights_are_an_argument_of_the_compiled_init(chat_model):
    import dataclasses

    from ftw_jax.running.loop import MemberRun, seed_keys

    trainer = make_train(
        TrainConfig.for_env("text-search", warm_start_demonstrations=0, model=str(chat_model)), step_limit=240
    )
    other = jax.tree.map(lambda leaf: np.asarray(leaf) + 1.0, trainer.start_params)  # not the checkpoint's
    run = MemberRun(dataclasses.replace(trainer, start_params=other), seed_keys([0, 1]))
    for member in range(2):  # every member starts from the weights given, not from ones compiled in
        for a, b in zip(jax.tree.leaves(run.carry.learner.policy.params), jax.tree.leaves(other)):
            np.testing.assert_array_equal(np.asarray(a)[member], b)


@pytest.mark.slow
@pytest.mark.usefixtures("unchecked_key_reuse")
def test_lm_train_runs_on_a_checkpoint_from_its_weights(chat_model, tmp_path, capsys):
    import json

    from ftw_jax import cli
    from ftw_jax.lm import load

    config = TrainConfig.for_env("text-search", warm_start_demonstrations=0, model=str(chat_model))
    trainer = make_train(config, step_limit=240)
    _, params = load(chat_model)
    start = jax.jit(trainer.init)(jax.random.key(0)).learner.policy.params["params"]["lm"]
    for a, b in zip(jax.tree.leaves(start), jax.tree.leaves(params["params"])):
        np.testing.assert_array_equal(a, b)
    argv = [
        "lm",
        "train",
        "--model",
        str(chat_model),
        "--env-options",
        "step_limit=240",
        "--seeds",
        "0,1",
        "--iterations",
        "2",
        "--eval-every",
        "2",
        "--episodes-per-iteration",
        "8",
        "--eval-episodes",
        "8",
        "--pool-capacity",
        "16",
        "--num-batches",
        "4",
        "--batch-size",
        "4",
        "--warm-start-demonstrations",
        "16",
        "--warm-start-steps",
        "2",
        "--out",
        str(tmp_path),
        "--name",
        "run",
        "--eval-greedy",
        "true",
        "--no-plot",
        "--json",
    ]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["config"]["model"] == str(chat_model) and summary["updates_applied"][0] > 0
    # With --eval-greedy the warm start is evaluated greedily too, before any update: in start.json, the summary
    # and the line that announces it.
    start = summary["start"]
    assert sorted(start) == ["greedy_return", "greedy_success", "return", "success"]
    for values in start.values():
        assert len(values) == 2 and all(value * 8 == round(value * 8) and 0 <= value <= 1 for value in values)
    assert json.loads((tmp_path / "run" / "start.json").read_text()) == start
    greedy = f"(greedy {np.mean(start['greedy_success']):.1%})"
    assert any(line.startswith("starting policy") and greedy in line for line in captured.err.splitlines())
