#!/usr/bin/env bash
# One rerun of the reviewed protocol (docs/results.md), started or resumed, in any session:
#   bash experiments/rerun.sh NAME      # sokoban-shaped, sokoban-binary, text-search-guess, search-2hop, search-1hop
# The library runs at the protocol's commit, checked out in a git worktree beside this repository, so that later
# changes on main cannot move a rerun's numbers between its phases (every phase record names the commit). The
# run folder is runs/NAME; where it is gone (another machine), the finished phase records committed in
# results/compare-reference-recipes/NAME are copied in first, and only the phases without one run again.
# After a phase finishes: bash experiments/publish_phases.sh NAME, then commit.
#   bash experiments/rerun.sh all       # every unfinished rerun in the protocol's order, each logged to
#                                       # runs/NAME-K.log; an interrupted one stops the chain
set -euo pipefail
name="$1"
if [ "$name" = all ]; then
  mkdir -p runs
  for name in sokoban-shaped sokoban-binary text-search-guess search-2hop search-1hop; do
    # A finished one is left as it is: a resume would add to its config.json and rewrite its summary.
    if [ -f "runs/$name/summary.json" ] || [ -f "results/compare-reference-recipes/$name/summary.json" ]; then
      echo "$name: finished"
      continue
    fi
    k=1
    while [ -e "runs/$name-$k.log" ]; do k=$((k + 1)); done  # a new log, never an earlier one
    echo "$name: running, logged to runs/$name-$k.log"
    bash "$0" "$name" > "runs/$name-$k.log" 2>&1
  done
  exit
fi
commit=124644591de8b649103eddbfe86422e791c6fa96
code="$(cd .. && pwd)/ftw-rerun-${commit:0:7}"
[ -d "$code" ] || git worktree add --detach "$code" "$commit"
seeds10=0,1,2,3,4,5,6,7,8,9
case "$name" in
  sokoban-shaped) task=(--env sokoban --iterations 300 --seeds "$seeds10") ;;
  sokoban-binary) task=(--env sokoban --env-options reward=binary --iterations 300 --seeds "$seeds10") ;;
  text-search-guess) task=(--env text-search --env-options guess_rate=0.9 --algos ftw,grpo,ppo --seeds "$seeds10") ;;
  search-2hop) task=(--env search --env-options hops=2 --policy transformer --iterations 800 --seeds "$seeds10") ;;
  search-1hop) task=(--env search --policy transformer --iterations 400 --seeds "$(seq -s, 0 29)") ;;
  *) echo "unknown rerun $name" >&2; exit 2 ;;
esac
protocol=(--search 21 --rungs 3 --tuning-seeds 1000,1001,1002 --max-grad-norm 0.5 --anneal-learning-rate yes
          --eval-greedy true)
run="runs/$name"
records="results/compare-reference-recipes/$name"
if [ ! -f "$run/config.json" ] && [ -f "$records/config.json" ]; then
  mkdir -p "$run/checkpoints"
  cp "$records/config.json" "$run/"
  shopt -s nullglob
  for record in "$records"/checkpoints/*.json; do cp "$record" "$run/checkpoints/"; done
fi
if [ -f "$run/config.json" ]; then where=(--resume "$run"); else where=(--name "$name"); fi
# -P: the worktree on PYTHONPATH comes before this checkout (the current folder), not after it.
PYTHONPATH="$code" exec .venv/bin/python -P -m ftw_jax.cli compare "${task[@]}" "${protocol[@]}" "${where[@]}"
