#!/usr/bin/env bash
# score.sh DIR TREE: run every NAME.cmd of DIR plain, under `accumguard watch` of the source
# tree TREE (a git worktree taken before the round's scripts were written), and lint it.
# Leaves NAME.plain.log, NAME.watch.log, NAME.watch.json, NAME.lint.json beside the script.
set -u
dir=$(cd "$1" && pwd); tree=$(cd "$2" && pwd)
source /work/venv/bin/activate
export OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu PYTHONPATH="$tree/src"
cd "$dir"
for cmdfile in *.cmd; do
    name=${cmdfile%.cmd}
    read -ra cmd < "$cmdfile"
    timeout 600 "${cmd[@]}" > "$name.plain.log" 2>&1; echo "exit $?" >> "$name.plain.log"
    timeout 900 python -m accumguard.cli watch --json "$name.watch.json" -- "${cmd[@]}" \
        > "$name.watch.log" 2>&1; echo "exit $?" >> "$name.watch.log"
    python -m accumguard.cli lint --format json "$name.py" > "$name.lint.json" 2>&1
    echo "scored $name"
done
