"""The memory plan of `ftw-jax lm retrieval-qa` (`ftw_jax.agent.memory_plan`): its terms counted from the
settings and the model's config.json alone, `--plan` printing them without loading or compiling anything, and a
run whose plan exceeds the device's memory refused in one line before its run folder exists."""

import json

import pytest

from ftw_jax import cli
from ftw_jax.agent.memory_plan import GiB, memory_plan
from ftw_jax.agent.retrieval_qa.learner import RetrievalTrainConfig
from ftw_jax.lm.load import hf_config
from ftw_jax.lm.memory import QWEN2_5, parameter_count


def plan_of(**settings):
    config = RetrievalTrainConfig.for_algorithm(**settings)
    learn = config.learn
    return memory_plan(
        learn, QWEN2_5["3B"], rollout_rows=learn.episodes_per_iteration, rollout_slots=config.task.max_length
    )


def sizes(plan) -> dict[str, int]:
    return {name: size for name, _, size, _ in plan.terms}


def test_the_plan_counts_qwen_3b_as_the_task_runs_it():
    plan = plan_of()  # FTW, float32 master weights, bfloat16 compute, B = 64 episodes of up to 4,548 tokens
    count, terms = parameter_count(QWEN2_5["3B"]), sizes(plan)
    assert terms["weights"] == terms["gradients"] == 4 * count and terms["optimizer state"] == 8 * count
    assert terms["KL reference"] == 2 * count  # in the compute dtype
    # keys and values of 36 layers, 2 heads of 128, bfloat16, for 64 conversations of 4,548 slots
    assert terms["rollouts' KV cache"] == 2 * 36 * 64 * 4548 * 2 * 128 * 2
    assert plan.total == plan.phase("state") + max(plan.phase("update"), plan.phase("rollouts"))
    assert 80 * GiB < plan.total < 90 * GiB  # the whole model with Adam in float32 does not fit one 80 GiB GPU
    with pytest.raises(ValueError, match=r"needs 85\.1 GiB a device, more than its 80\.0 GiB; the largest term is "):
        plan.check(80 * GiB)


@pytest.mark.parametrize(
    "settings, bound",
    [({"lora_rank": 16}, 60), ({"param_dtype": "bfloat16"}, 65), ({"algorithm": "ppo", "lora_rank": 16}, 65)],
)
def test_lora_or_bfloat16_masters_fit_one_80_gib_gpu(settings, bound):
    plan = plan_of(**settings)
    assert plan.total < bound * GiB
    plan.check(80 * GiB)


def test_ppo_holds_a_critic_and_lora_trains_the_adapters_alone():
    whole, lora = sizes(plan_of(algorithm="ppo")), sizes(plan_of(lora_rank=16))
    assert whole["critic"] == 4 * 4 * parameter_count(QWEN2_5["3B"])  # weights, gradients, two moments, float32
    assert lora["gradients"] < 0.01 * whole["gradients"] and "sampler's weights" in lora


@pytest.fixture
def qwen_3b_config(tmp_path):
    """A folder with Qwen2.5-3B's config.json and nothing else: what the plan reads."""
    (tmp_path / "qwen").mkdir()
    (tmp_path / "qwen" / "config.json").write_text(json.dumps(hf_config(QWEN2_5["3B"])))
    return tmp_path / "qwen"


def test_plan_prints_the_table_from_the_config_alone(qwen_3b_config, capsys):
    assert cli.main(["lm", "retrieval-qa", "--model", str(qwen_3b_config), "--plan", "--device-memory", "80"]) == 0
    out = capsys.readouterr().out
    assert "| rollouts' KV cache | rollouts | 9.99 |" in out and "| device | | 80.00 | does not fit |" in out
    assert cli.main(["lm", "retrieval-qa", "--model", str(qwen_3b_config), "--plan", "--lora-rank", "16"]) == 0
    assert "| sampler's weights | rollouts | 5.75 |" in capsys.readouterr().out


def test_a_run_that_does_not_fit_stops_in_one_line_before_its_folder_exists(qwen_3b_config, tmp_path, capsys):
    argv = ["lm", "retrieval-qa", "--model", str(qwen_3b_config), "--questions", "q.parquet"]
    argv += ["--test-questions", "t.parquet", "--corpus", "c.jsonl", "--out", str(tmp_path / "runs")]
    assert cli.main([*argv, "--device-memory", "80"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the largest term is activations (33.0 GiB)" in err
    assert "--num-batches x --num-elites" in err and "(--plan prints the whole table)" in err
    assert not (tmp_path / "runs").exists()
    assert cli.main([*argv, "--device-memory", "0"]) == 2
    assert "--device-memory must be a positive number of GiB, got 0.0" in capsys.readouterr().err
