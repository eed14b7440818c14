#!/usr/bin/env bash
# One rerun of the reviewed protocol (docs/results.md), started or resumed, in any session:
#   bash experiments/protocol/rerun.sh NAME      # sokoban-shaped, sokoban-binary, text-search-guess, search-2hop, search-1hop
# The library runs at the protocol's commit, checked out in a git worktree beside this repository, so that later
# changes on main cannot move a rerun's numbers between its phases (every phase record names the commit). The
# run folder is runs/NAME; where it is gone (another machine), the finished phase records committed in
# results/compare-reference-recipes/NAME are copied in first, and only the phases without one run again.
# After a phase finishes: bash experiments/protocol/publish_phases.sh NAME (its seed groups too), then commit.
#   bash experiments/protocol/rerun.sh all       # every unfinished rerun in the protocol's order, each logged to
#                                       # runs/NAME-K.log; an interrupted one stops the chain
# The search tasks report their seeds in groups of five (experiments/protocol/seed_groups.py says why): the first group,
# runs/NAME-seeds-0-4, also runs the tuning; each other group takes the tuning from its records and runs its
# own report phases; then the groups merge into runs/NAME, whose resume writes the whole comparison's tables.
set -euo pipefail
name="${1:?usage: bash experiments/protocol/rerun.sh all | sokoban-shaped | sokoban-binary | text-search-guess | search-2hop | search-1hop}"
results=results/compare-reference-recipes
if [ "$name" = all ]; then
  mkdir -p runs
  for name in sokoban-shaped sokoban-binary text-search-guess search-2hop search-1hop; do
    # A finished one is left as it is: a resume would add to its config.json and rewrite its summary.
    if [ -f "runs/$name/summary.json" ] || [ -f "$results/$name/summary.json" ]; then
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
source "$(dirname "$0")/protocol_worktree.sh"  # sets $code, the worktree at the protocol's commit
group=""  # seeds per group; none: every seed in one report phase
case "$name" in
  sokoban-shaped) task=(--env sokoban --iterations 300); seeds=$(seq -s, 0 9) ;;
  sokoban-binary) task=(--env sokoban --env-options reward=binary --iterations 300); seeds=$(seq -s, 0 9) ;;
  text-search-guess) task=(--env text-search --env-options guess_rate=0.9 --algos ftw,grpo,ppo); seeds=$(seq -s, 0 9) ;;
  search-2hop) task=(--env search --env-options hops=2 --policy transformer --iterations 800); seeds=$(seq -s, 0 9)
    group=5 ;;
  search-1hop) task=(--env search --policy transformer --iterations 400); seeds=$(seq -s, 0 29); group=5 ;;
  *) echo "unknown rerun $name" >&2; exit 2 ;;
esac
protocol=(--search 21 --rungs 3 --tuning-seeds 1000,1001,1002 --max-grad-norm 0.5 --anneal-learning-rate yes
          --eval-greedy true)

# restore RUN RECORDS: where runs/RUN is gone, the committed phase records of RECORDS (and, for a seed group, the
# task's tuning records), then its files: config.json last, each copy whole, so that a restore cut short is
# done again rather than taken for a run folder.
restore() {
  local run="runs/$1" records="$2" file
  [ ! -f "$run/config.json" ] && [ -f "$records/config.json" ] || return 0
  mkdir -p "$run/checkpoints"
  shopt -s nullglob
  for file in "$records"/checkpoints/*.json; do copy "$file" "$run/checkpoints"; done
  if [ "$records" != "$results/$name" ]; then
    for file in "$results/$name"/checkpoints/*.json; do
      case "$file" in *-report.json) ;; *) [ -e "$run/checkpoints/${file##*/}" ] || copy "$file" "$run/checkpoints" ;; esac
    done
  fi
  for file in "$records"/*; do if [ -f "$file" ] && [ "${file##*/}" != config.json ]; then copy "$file" "$run"; fi; done
  shopt -u nullglob
  copy "$records/config.json" "$run"
}
copy() { cp "$1" "$2/${1##*/}.partial" && mv "$2/${1##*/}.partial" "$2/${1##*/}"; }

# compare RUN SEEDS: the comparison in runs/RUN, resumed where its folder has one.
compare() {
  local where=(--name "$1")
  [ -f "runs/$1/config.json" ] && where=(--resume "runs/$1")
  # -P: the worktree on PYTHONPATH comes before this checkout (the current folder), not after it.
  PYTHONPATH="$code" .venv/bin/python -P -m ftw_jax.cli compare "${task[@]}" --seeds "$2" "${protocol[@]}" "${where[@]}"
}

if [ -z "$group" ]; then
  restore "$name" "$results/$name"
  compare "$name" "$seeds"
  exit
fi
IFS=, read -r -a all <<< "$seeds"
groups=()
for ((i = 0; i < ${#all[@]}; i += group)); do
  part=("${all[@]:i:group}")
  listed=$(IFS=,; echo "${part[*]}")
  run="$name-seeds-${part[0]}-${part[-1]}"
  restore "$run" "$results/$name/seed-groups/seeds-${part[0]}-${part[-1]}"
  if [ ! -f "runs/$run/config.json" ] && [ ${#groups[@]} -gt 0 ]; then
    .venv/bin/python experiments/protocol/seed_groups.py start "runs/$run" --like "${groups[0]}" --seeds "$listed"
  fi
  if [ ! -f "runs/$run/summary.json" ]; then compare "$run" "$listed"; fi
  groups+=("runs/$run")
done
.venv/bin/python experiments/protocol/seed_groups.py merge "runs/$name" "${groups[@]}"
compare "$name" "$seeds"
