#!/usr/bin/env bash
# The sensitivity campaign (configs/params-sensitivity.yaml, params-sensitivity-c2.yaml,
# params-niid-bench-c2.yaml and params-sensitivity-t100.yaml): every grid in a clone of its own whose code is at one commit, one stage at
# a time in the order below, skipping a run whose metrics are already in the clone or published under
# docs/results/<grid>/ of REPO. A run cut short resumes from its last round with the same command.
#
#   cp docs/results/sensitivity/campaign.sh /tmp/ && nohup nice -n 19 bash /tmp/campaign.sh REPO COMMIT WORKDIR > campaign.log 2>&1 &
#
# (bash reads a script as it runs: run a copy, so that a checkout or an edit of this file cannot change it.)
# REPO: the repository to clone (and to read published metrics and the grid files from); COMMIT: the
# commit every run trains at; WORKDIR: where the clones live (one .venv, made by the first clone's
# `make install`). A fourth argument, --list, prints the runs still to train, in order, and trains none.
# The runs are the `grid` and `ablation` sections of the grid files in REPO's HEAD, read before each run
# (every other setting is COMMIT's): a factor that the seed-0 screen moves to `grid` (seeds 1 and 2) joins
# the campaign with the commit that moves it.
set -uo pipefail
repo=$(cd "$1" && pwd) commit=$2 work=$3
mkdir -p "$work"
# The offline dataset mirror (as the Makefile finds it beside the checkout).
export FEDCME_DATA_MIRROR=${FEDCME_DATA_MIRROR:-$(cd "$repo/.." && pwd)/shared/data}
export DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false MLFLOW_DISABLE_TELEMETRY=true DVC_NO_ANALYTICS=1

checkout() {  # grid name -> a clone at $commit whose params.yaml trains the runs of REPO HEAD's grid file
    local dir="$work/$1"
    if [ ! -d "$dir" ]; then
        git clone -q "$repo" "$dir" && git -C "$dir" checkout -q "$commit" || return 1
    fi
    if [ ! -e "$dir/.venv" ]; then
        if [ -d "$work/sensitivity/.venv" ] && [ "$1" != sensitivity ]; then
            ln -s "$work/sensitivity/.venv" "$dir/.venv"
        else
            (cd "$dir" && make install) || return 1
        fi
    fi
    # COMMIT's grid file (its schema is COMMIT's) with REPO HEAD's list of runs, `grid` and `ablation`; a
    # grid file that COMMIT lacks (the T=100 combination's) is HEAD's, in COMMIT's schema.
    "$dir/.venv/bin/python" - "$repo" "$dir" "$1" <<'PY'
import os, subprocess, sys, yaml
repo, clone, name = sys.argv[1:]
head = yaml.safe_load(subprocess.run(["git", "-C", repo, "show", f"HEAD:configs/params-{name}.yaml"],
                                     check=True, capture_output=True, text=True).stdout)
own = f"{clone}/configs/params-{name}.yaml"
params = yaml.safe_load(open(own)) if os.path.exists(own) else head
params.update({section: head[section] for section in ("grid", "ablation")})
with open(f"{clone}/params.yaml", "w") as file:
    yaml.safe_dump(params, file, sort_keys=False)
PY
}

runs() {  # the campaign's runs in order, a line each: grid kind method dataset partition K M clients-index seed
    "$work/sensitivity/.venv/bin/python" - "$repo" <<'PY'
import subprocess, sys, yaml
def grid_file(name):
    return yaml.safe_load(subprocess.run(["git", "-C", sys.argv[1], "show", f"HEAD:configs/params-{name}.yaml"],
                                         check=True, capture_output=True, text=True).stdout)
def cells(name, kind, seeds):
    section = grid_file(name)[kind]
    for seed in seeds:
        for method in section["methods"]:
            for dataset in section["datasets"]:
                for partition in section["partitions"]:
                    for index, (clients, per_round) in enumerate(section["clients"]):
                        if seed in section["seeds"]:
                            print(name, kind, method, dataset, partition, clients, per_round, index, seed)
# 1. The seed-0 screen: the references and the factors moved to `grid`, every factor's cells, the #C=2 factor.
cells("sensitivity", "grid", [0]); cells("sensitivity", "ablation", [0]); cells("sensitivity-c2", "grid", [0])
# 2. Seeds 1 and 2, paired seed by seed: the references and every factor moved to `grid`.
cells("sensitivity", "grid", [1, 2]); cells("sensitivity-c2", "grid", [1, 2])
# 3. NIID-Bench's #C=2 check: FedAvg, 10 clients, seeds 0-2.
cells("niid-bench-c2", "grid", [0, 1, 2])
# 4. The readings that helped, combined at T=100: FedCME(0.01), FedCME(0.1) and its twin, seeds 0-2.
cells("sensitivity-t100", "grid", [0, 1, 2])
PY
}

name() {  # a line of runs -> the run's experiment name
    echo "$4-$5-k$6m$7-$3-s$9"
}

published() {  # grid experiment: its metrics are in the clone or published in REPO
    [ -f "$work/$1/metrics/$2.json" ] || [ -f "$repo/docs/results/$1/$2.json" ]
}

run() {  # grid kind method dataset partition K M clients-index seed -> the run's exit status
    local grid=$1 kind=$2 method=$3 dataset=$4 partition=$5 index=$8 seed=$9
    checkout "$grid" || { echo "$(date -u +%FT%TZ) cannot prepare the clone of $grid"; return 1; }
    echo "$(date -u +%FT%TZ) start $grid $(name "$@")"
    # The stage: `train` for a grid run, `ablation` for a screen run (dvc.yaml's foreach stages).
    local stage=${kind/grid/train}
    (cd "$work/$grid" && PATH="$PWD/.venv/bin:$PATH" .venv/bin/python -m flows.repro \
        "$stage@$method-$dataset-$partition-clients$index-$seed")
    local status=$?
    echo "$(date -u +%FT%TZ) end $grid $(name "$@") rc=$status"
    return $status
}

if [ "${4:-}" = --list ]; then
    runs | while read -r line; do
        set -- $line
        published "$1" "$(name $line)" || echo "$1 $2 $(name $line)"
    done
    exit 0
fi
checkout sensitivity || { echo "$(date -u +%FT%TZ) cannot prepare the clone of sensitivity"; exit 1; }
# The list is read again before every run, so that a commit to REPO changes what comes next; a run that
# fails is not tried again by this process.
failed=" "
while true; do
    list=$(runs) || { echo "$(date -u +%FT%TZ) cannot read the grid files of $repo"; exit 1; }
    next=""
    while read -r line; do
        set -- $line
        if ! published "$1" "$(name $line)" && [[ $failed != *" $1/$(name $line) "* ]]; then
            next=$line; break
        fi
    done <<< "$list"
    [ -n "$next" ] || break
    run $next || failed+="${next%% *}/$(name $next) "
done
if [ "$failed" = " " ]; then
    echo "$(date -u +%FT%TZ) campaign: every listed run is done"
else
    echo "$(date -u +%FT%TZ) campaign: every listed run is done, but these failed:$failed"
fi
