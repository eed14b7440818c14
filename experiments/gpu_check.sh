#!/usr/bin/env bash
# The GPU check (about 5 minutes on one GPU; nothing here needs a GPU to run, it is just slower on a CPU):
# the device, the update benchmark, 64 seeds vmapped vs sequential, Sokoban's profile, a 64-member sweep, the
# compilation cache, the bandit against NumPy, a Qwen2.5-0.5B-sized LM (tokens/s) and the memory XLA counts for
# lm learn's update at Qwen2.5-0.5B, 1.5B and 3B (bfloat16 compute, float32 master weights, chunked loss), and
# three iterations of retrieval QA (Search-R1's protocol) at Qwen2.5-0.5B's shape on a generated world.
# Prints the device name, compile times and env steps per second. Run from a checkout with the project
# installed against a CUDA jax (pip install -e . "jax[cuda12]"): bash experiments/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out="${TMPDIR:-/tmp}/ftw_jax_gpu_check"
rm -rf "$out"
python -c "import jax; print('jax', jax.__version__, '|', jax.device_count(), 'x', jax.devices()[0].device_kind)"
echo; echo "== update vs floor (experiments/benchmarks/bench_update.py --repeats 10)"
timeout 120 python experiments/benchmarks/bench_update.py --repeats 10
echo; echo "== 64 Sokoban seeds in one program vs one after another (experiments/benchmarks/bench_seeds.py)"
timeout 150 python experiments/benchmarks/bench_seeds.py --env sokoban --iterations 10 --seeds 1,64
echo; echo "== where Sokoban's program spends its time: acting, updates, evaluation (experiments/benchmarks/profile_train.py)"
timeout 120 python experiments/benchmarks/profile_train.py --env sokoban --repeats 3
echo; echo "== a 64-member search sweep (4 grid points x 16 seeds), one compiled program"
timeout 240 ftw-jax sweep --env search --grid 'C=8,32 K=1,2' --num-seeds 16 --iterations 80 --eval-every 40 \
    --no-checkpoint --out "$out"
echo; echo "== the compilation cache: CartPole, first run vs second (experiments/benchmarks/bench_compile_cache.py)"
timeout 150 python experiments/benchmarks/bench_compile_cache.py --cases cartpole
echo; echo "== ftw-jax bandit over 1000 seeds against plain NumPy, whole processes (experiments/benchmarks/bench_bandit.py)"
timeout 200 python experiments/benchmarks/bench_bandit.py --repeats 1
echo; echo "== a Qwen2.5-0.5B-sized LM, random weights, bfloat16: forward, train step, sampling (experiments/lm/lm_benchmark.py)"
timeout 240 python experiments/lm/lm_benchmark.py --sizes qwen2.5-0.5B --dtype bfloat16 --batch 8 --length 512
echo; echo "== lm learn's update at Qwen2.5's sizes compiled for this device: XLA's memory count (experiments/lm/lm_compiled_memory.py)"
timeout 240 python experiments/lm/lm_compiled_memory.py --models 0.5B,1.5B,3B --mesh 1x1 --losses chunked
echo; echo "== retrieval QA, Search-R1's protocol, at Qwen2.5-0.5B's shape (random weights) on a generated world: 3 iterations"
timeout 200 python experiments/search_r1/make_tiny.py "$out/qa" --shape 0.5B --people 200
timeout 500 ftw-jax lm retrieval-qa --model "$out/qa/model" --questions "$out/qa/train.parquet" \
    --test-questions "$out/qa/test.parquet" --corpus "$out/qa/corpus.jsonl" --iterations 3 --eval-every 3 \
    --eval-questions 64 --no-checkpoint --no-plot --out "$out" --name qa
python -c "import json; rows = [json.loads(l) for l in open('$out/qa/metrics.jsonl')]; print('seconds per iteration (rollout, learn):', [(round(r['rollout_seconds'], 1), round(r['learn_seconds'], 1)) for r in rows])"
