#!/usr/bin/env bash
# The sensitivity campaign (configs/params-sensitivity.yaml, params-sensitivity-c2.yaml and
# params-niid-bench-c2.yaml): every grid in a clone of its own at one commit, one stage at a time in
# the order below, skipping a run whose metrics are already in the clone or published under
# docs/results/<grid>/ of REPO. A run cut short resumes from its last round with the same command.
#
#   cp docs/results/sensitivity/campaign.sh /tmp/ && nohup nice -n 19 bash /tmp/campaign.sh REPO COMMIT WORKDIR > campaign.log 2>&1 &
#
# (bash reads a script as it runs: run a copy, so that a checkout or an edit of this file cannot change it.)
# REPO: the repository to clone (and to read published metrics from); COMMIT: the commit every run
# trains at; WORKDIR: where the clones live (one .venv, made by the first clone's `make install`).
set -uo pipefail
repo=$(cd "$1" && pwd) commit=$2 work=$3
mkdir -p "$work"
# The offline dataset mirror (as the Makefile finds it beside the checkout).
export FEDCME_DATA_MIRROR=${FEDCME_DATA_MIRROR:-$(cd "$repo/.." && pwd)/shared/data}
export DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false MLFLOW_DISABLE_TELEMETRY=true DVC_NO_ANALYTICS=1

checkout() {  # grid name -> a clone at $commit whose params.yaml is configs/params-<grid>.yaml
    local dir="$work/$1"
    if [ ! -d "$dir" ]; then
        git clone -q "$repo" "$dir" && git -C "$dir" checkout -q "$commit" || return 1
    fi
    cp "$dir/configs/params-$1.yaml" "$dir/params.yaml"
    if [ ! -e "$dir/.venv" ]; then
        if [ -d "$work/sensitivity/.venv" ] && [ "$1" != sensitivity ]; then
            ln -s "$work/sensitivity/.venv" "$dir/.venv"
        else
            (cd "$dir" && make install) || return 1
        fi
    fi
}

run() {  # grid, method, partition tag, K, M, seed[, stage kind]
    local grid=$1 method=$2 partition=$3 clients=$4 per_round=$5 seed=$6 kind=${7:-train}
    local experiment="cifar10-$partition-k${clients}m$per_round-$method-s$seed"
    if [ -f "$work/$grid/metrics/$experiment.json" ] || [ -f "$repo/docs/results/$grid/$experiment.json" ]; then
        echo "$(date -u +%FT%TZ) skip $grid $experiment (done)"; return 0
    fi
    checkout "$grid" || { echo "$(date -u +%FT%TZ) cannot prepare the clone of $grid"; return 1; }
    echo "$(date -u +%FT%TZ) start $grid $experiment"
    (cd "$work/$grid" && PATH="$PWD/.venv/bin:$PATH" .venv/bin/python -m flows.repro \
        "$kind@$method-cifar10-$partition-clients0-$seed")
    local status=$?
    echo "$(date -u +%FT%TZ) end $grid $experiment rc=$status"
}

# 1. The seed-0 screen: the references, then every factor (reading factors, then setup factors).
for method in fedavg fedcme-mu001 fedcme-no-exchange fedrs-a05; do run sensitivity $method a0.1 50 20 0; done
for method in sample-mean sample-mean-nx sample-sum sample-sum-nx sample-sum-mu01 sample-sum-mu01-nx \
              class-mean-sum class-mean-sum-nx classifier2 classifier2-nx optimizer-swap class-counts \
              class-counts-nx fedavg-e4 fedcme-e4 fedcme-e4-nx fedavg-noaug fedcme-noaug fedcme-noaug-nx; do
    run sensitivity $method a0.1 50 20 0 ablation
done
for method in fedavg fedcme-mu001 fedcme-no-exchange; do run sensitivity-c2 $method c2 50 20 0; done
# 2. The references on seeds 1 and 2, paired seed by seed.
for seed in 1 2; do
    for method in fedavg fedcme-mu001 fedcme-no-exchange fedrs-a05; do run sensitivity $method a0.1 50 20 $seed; done
done
# 3. NIID-Bench's #C=2 check: FedAvg, 10 clients, seeds 0-2.
for seed in 0 1 2; do run niid-bench-c2 fedavg c2 10 10 $seed; done
echo "$(date -u +%FT%TZ) campaign: every listed run is done"
