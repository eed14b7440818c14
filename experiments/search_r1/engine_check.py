"""The engine path of retrieval QA on a CPU, end to end, with a real model on the other side: transformers serves
`/v1/completions` (`completions_server.py`, in the parity venv), `engine_driver.py` runs the retriever between
its turns and appends episodes, and `ftw-jax lm learn --follow` learns from them and writes versions the server
reloads.

    .venv/bin/python experiments/search_r1/engine_check.py --out results/engine-retrieval-qa
    .venv/bin/python experiments/search_r1/engine_check.py --algorithm grpo   # G = 4 episodes a question

On a small generated world (`make_tiny.py`'s, 80 people, in runs/engine-retrieval-qa/) and a tiny random chat
checkpoint. It checks, and writes to OUT/engine_check.json: every round's episodes were learnt from (one
iteration a round), on the first version the importance log-ratio of the kept episodes (`elite_log_weight_mean`:
the learner's log-prob minus the engine's, per episode) is about 0, the behaviour log-probs being the learner's
own, and SIGTERM stops the learner checkpointed. Exit status 1 where a check fails. With `--algorithm grpo`,
`reinforce` (RLOO) or `ppo` the learner runs that baseline, the driver asks each question G times and writes
its `group` (grpo, reinforce), the log-ratio checked is the baseline's `log_ratio` over every model token, and
the file is OUT/engine_check_ALGORITHM.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SIZES = {"response-tokens": 16, "information-tokens": 64, "prompt-tokens": 320}


def wait_for(url: str, process: subprocess.Popen, seconds: float = 300) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode} before it answered")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"no answer from {url} in {seconds} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("results/engine-retrieval-qa"))
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--algorithm", default="ftw", choices=("ftw", "grpo", "reinforce", "ppo"))
    parser.add_argument(
        "--group-size", type=int, default=4, help="G for grpo and reinforce (RLOO): each question G times"
    )
    args = parser.parse_args()
    grouped = args.algorithm in ("grpo", "reinforce")
    sys.path.insert(0, str(ROOT / "experiments" / "lm"))  # build_venv, a sibling folder's
    from lm_parity import build_venv

    work = ROOT / "runs" / "engine-retrieval-qa"  # the world, the model, the episodes and the learner's run
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    subprocess.run(
        [sys.executable, str(HERE / "make_tiny.py"), str(work), "--people", "80", "--vocab-size", "600"], check=True
    )
    engine_python = build_venv(ROOT / "runs" / "parity-venv")
    server = subprocess.Popen(
        [
            str(engine_python),
            str(HERE / "completions_server.py"),
            "--model",
            str(work / "model"),
            "--port",
            str(args.port),
        ]
    )
    url = f"http://127.0.0.1:{args.port}"
    episodes = work / "episodes.jsonl"
    episodes.touch()
    length = SIZES["prompt-tokens"] + 3 * SIZES["response-tokens"] + 2 * SIZES["information-tokens"]
    algorithm = {
        "ftw": ["--pool-capacity", str(2 * args.batch), "--num-batches", "4", "--batch-size", "4", "--num-elites", "1"],
        "grpo": ["--group-size", str(args.group_size)],
        "reinforce": ["--leave-one-out", str(args.group_size)],
        "ppo": ["--num-minibatches", "1"],  # one step a batch: the logged log-ratio is the first version's
    }[args.algorithm]
    learner = subprocess.Popen(
        [str(pathlib.Path(sys.executable).parent / "ftw-jax"), "lm", "learn", "--episodes", str(episodes), "--model",
         str(work / "model"), "--follow", "--idle-timeout", "600", "--max-length", str(length),
         "--episodes-per-iteration", str(args.batch), "--algorithm", args.algorithm, *algorithm,
         "--learning-rate", "1e-3", "--out", str(work), "--name", "learner"]
    )  # fmt: skip
    started = time.perf_counter()
    try:
        wait_for(f"{url}/health", server)
        driver = [sys.executable, str(HERE / "engine_driver.py"), "--server", url, "--model", str(work / "model")]
        driver += ["--questions", str(work / "train.parquet"), "--corpus", str(work / "corpus.jsonl")]
        driver += ["--episodes", str(episodes), "--learner-run", str(work / "learner"), "--rounds", str(args.rounds)]
        driver += ["--batch", str(args.batch), *(f"--{name}={value}" for name, value in SIZES.items())]
        driver += ["--group-size", str(args.group_size if grouped else 1)]
        subprocess.run(driver, check=True)
        metrics = work / "learner" / "metrics.jsonl"
        while not metrics.exists() or len(metrics.read_text().splitlines()) < args.rounds:
            if learner.poll() is not None:
                raise SystemExit(f"the learner exited with {learner.returncode}")
            time.sleep(0.5)
    finally:
        server.terminate()
        if learner.poll() is None:
            learner.send_signal(signal.SIGTERM)
        learner_status = learner.wait(timeout=120)
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    ratio = "elite_log_weight_mean" if args.algorithm == "ftw" else "log_ratio"  # log π/q: FTW's elites', or all
    first = rows[0][ratio]
    versions = subprocess.run(
        [str(engine_python), "-c", "import transformers, torch; print(transformers.__version__, torch.__version__)"],
        capture_output=True,
        text=True,
    )
    result = {
        "rounds": args.rounds,
        "batch": args.batch,
        "versions": [row["version"] for row in rows],
        "reward_mean": [row["reward_mean"] for row in rows],
        "algorithm": args.algorithm,
        ratio: [row[ratio] for row in rows],
        "learner_exit_status": learner_status,
        "seconds": round(time.perf_counter() - started, 1),
        "engine": "transformers, torch " + versions.stdout.strip(),
    }
    checks = {
        "every round learnt from": [row["episodes"] for row in rows]
        == [args.batch * (i + 1) for i in range(len(rows))],
        "importance log-ratio on the first version within 1e-3 of 0": abs(first) < 1e-3,
        "the learner stopped on SIGTERM, checkpointed (143)": learner_status == 128 + signal.SIGTERM,
    }
    result["checks"] = checks
    args.out.mkdir(parents=True, exist_ok=True)
    name = "engine_check.json" if args.algorithm == "ftw" else f"engine_check_{args.algorithm}.json"
    (args.out / name).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    sys.exit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
