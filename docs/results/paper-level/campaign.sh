#!/usr/bin/env bash
# The campaign of issue #52 (docs/results-paper-level.md): the like-for-like baselines of the sensitivity
# study first, then the setup screen at the paper's quoted point, then the closest setup over 3 seeds.
#
#   cp docs/results/paper-level/campaign.sh /tmp/ && nohup nice -n 19 bash /tmp/campaign.sh REPO WORKDIR > campaign.log 2>&1 &
#
# (bash reads a script as it runs: run a copy, so that a checkout or an edit of this file cannot change it.)
# REPO: the repository to clone, and to read the plan, the grid files and the published metrics from;
# WORKDIR: where the clones live. A third argument, --list, prints the runs still to train, in order, and
# trains none.
#
# The plan is docs/results/paper-level/PLAN in REPO's HEAD, read again before every run, so that a commit
# that adds a stage (the closest setup, once the screen has chosen it) joins the running campaign. Each line
# is `grid kind seeds commit`: the runs of the `grid` or `ablation` section (kind) of
# configs/params-<grid>.yaml in REPO's HEAD, for those seeds, each trained in a clone of REPO at `commit`
# (one clone per grid and commit, `WORKDIR/<grid>@<commit>`) with that commit's grid file, whose `grid` and
# `ablation` sections are replaced by HEAD's, less the methods that the commit's file does not define.
# Stages train in plan order; a run whose metrics are already in its clone or published under
# REPO/docs/results/<grid>/ is skipped, and a run cut short resumes from its last round with the same command.
#
# Every clone runs with WORKDIR/.venv (made once from the first clone's requirements.txt) and its own code
# first on PYTHONPATH, so that clones at different commits share one install.
set -uo pipefail
repo=$(cd "$1" && pwd) work=$(mkdir -p "$2" && cd "$2" && pwd)
plan_path=docs/results/paper-level/PLAN
# The offline dataset mirror (as the Makefile finds it beside the checkout).
export FEDCME_DATA_MIRROR=${FEDCME_DATA_MIRROR:-$(cd "$repo/.." && pwd)/shared/data}
export DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false MLFLOW_DISABLE_TELEMETRY=true DVC_NO_ANALYTICS=1
python=$work/.venv/bin/python

install() {  # WORKDIR/.venv with the pinned stack of REPO's HEAD
    [ -x "$python" ] && [ -f "$work/.venv/.installed" ] && return 0
    python3 -m venv "$work/.venv" || return 1
    git -C "$repo" show HEAD:requirements.txt > "$work/requirements.txt" || return 1
    "$python" -m pip install --quiet --upgrade pip && "$python" -m pip install --quiet -r "$work/requirements.txt" \
        && touch "$work/.venv/.installed"
}

checkout() {  # grid commit -> a clone at commit whose params.yaml trains the runs of REPO HEAD's grid file
    local dir="$work/$1@$2"
    if [ ! -d "$dir" ]; then
        git clone -q "$repo" "$dir" && git -C "$dir" checkout -q "$2" || { rm -rf "$dir"; return 1; }
        ln -s "$work/.venv" "$dir/.venv"
    fi
    # COMMIT's grid file (its schema is COMMIT's) with REPO HEAD's `grid` and `ablation` sections, less the
    # methods that COMMIT's file does not define (a later commit's methods train in a later stage).
    "$python" - "$repo" "$dir" "$1" <<'PY'
import os, subprocess, sys, yaml
repo, clone, name = sys.argv[1:]
head = yaml.safe_load(subprocess.run(["git", "-C", repo, "show", f"HEAD:configs/params-{name}.yaml"],
                                     check=True, capture_output=True, text=True).stdout)
own = f"{clone}/configs/params-{name}.yaml"
params = yaml.safe_load(open(own)) if os.path.exists(own) else head
for section in ("grid", "ablation"):
    params[section] = {**head[section],
                       "methods": [method for method in head[section]["methods"] if method in params["methods"]]}
with open(f"{clone}/params.yaml", "w") as file:
    yaml.safe_dump(params, file, sort_keys=False)
PY
}

runs() {  # the campaign's runs in plan order, a line each: grid kind method dataset partition K M index seed commit
    "$python" - "$repo" "$plan_path" <<'PY'
import subprocess, sys, yaml
repo, plan_path = sys.argv[1:]
def show(path, commit="HEAD"):
    return subprocess.run(["git", "-C", repo, "show", f"{commit}:{path}"], check=True, capture_output=True,
                          text=True).stdout
def defined(name, commit):  # the methods of the grid file at commit (HEAD's where commit lacks the file)
    try:
        return yaml.safe_load(show(f"configs/params-{name}.yaml", commit))["methods"]
    except subprocess.CalledProcessError:
        return yaml.safe_load(show(f"configs/params-{name}.yaml"))["methods"]
for line in show(plan_path).splitlines():
    if not line.strip() or line.lstrip().startswith("#"):
        continue
    name, kind, seeds, commit = line.split()
    section = yaml.safe_load(show(f"configs/params-{name}.yaml"))[kind]
    methods = [method for method in section["methods"] if method in defined(name, commit)]
    for seed in (int(seed) for seed in seeds.split(",")):
        if seed not in section["seeds"]:
            continue
        for method in methods:
            for dataset in section["datasets"]:
                for partition in section["partitions"]:
                    for index, (clients, per_round) in enumerate(section["clients"]):
                        print(name, kind, method, dataset, partition, clients, per_round, index, seed, commit)
PY
}

name() {  # a line of runs -> the run's experiment name
    echo "$4-$5-k$6m$7-$3-s$9"
}

published() {  # grid commit experiment: its metrics are in the clone or published in REPO
    [ -f "$work/$1@$2/metrics/$3.json" ] || [ -f "$repo/docs/results/$1/$3.json" ]
}

run() {  # grid kind method dataset partition K M index seed commit -> the run's exit status
    local grid=$1 kind=$2 method=$3 dataset=$4 partition=$5 index=$8 seed=$9 commit=${10}
    checkout "$grid" "$commit" || { echo "$(date -u +%FT%TZ) cannot prepare the clone of $grid at $commit"; return 1; }
    echo "$(date -u +%FT%TZ) start $grid@$commit $(name "$@")"
    # The stage: `train` for a grid run, `ablation` for a screen run (dvc.yaml's foreach stages).
    local stage=${kind/grid/train}
    (cd "$work/$grid@$commit" && PYTHONPATH="$PWD" PATH="$work/.venv/bin:$PATH" "$python" -m flows.pipeline.repro \
        "$stage@$method-$dataset-$partition-clients$index-$seed")
    local status=$?
    echo "$(date -u +%FT%TZ) end $grid@$commit $(name "$@") rc=$status"
    return $status
}

install || { echo "$(date -u +%FT%TZ) cannot install $work/.venv"; exit 1; }
if [ "${3:-}" = --list ]; then
    runs | while read -r line; do
        set -- $line
        published "$1" "${10}" "$(name $line)" || echo "$1 $2 $(name $line) @${10}"
    done
    exit 0
fi
# The list is read again before every run, so that a commit to REPO changes what comes next; a run that
# fails is not tried again by this process.
failed=" "
while true; do
    list=$(runs) || { echo "$(date -u +%FT%TZ) cannot read the plan of $repo"; exit 1; }
    next=""
    while read -r line; do
        [ -n "$line" ] || continue
        set -- $line
        if ! published "$1" "${10}" "$(name $line)" && [[ $failed != *" $1/$(name $line) "* ]]; then
            next=$line; break
        fi
    done <<< "$list"
    [ -n "$next" ] || break
    run $next || failed+="${next%% *}/$(name $next) "
done
if [ "$failed" = " " ]; then
    echo "$(date -u +%FT%TZ) campaign: every planned run is done"
else
    echo "$(date -u +%FT%TZ) campaign: every planned run is done, but these failed:$failed"
fi
