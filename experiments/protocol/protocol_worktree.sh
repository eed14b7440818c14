# Sourced by the reviewed protocol's scripts (rerun.sh, shaped_choices.sh): the library at the protocol's commit,
# checked out once in a git worktree beside this repository, so that later changes on main cannot move its runs.
# Sets $code, the worktree (for PYTHONPATH).
commit=124644591de8b649103eddbfe86422e791c6fa96
code="$(cd .. && pwd)/ftw-rerun-${commit:0:7}"
[ -d "$code" ] || git worktree add --detach "$code" "$commit"
