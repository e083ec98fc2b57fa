#!/usr/bin/env bash
# jobcenter beside `weed admin` on one SeaweedFS cluster (1 master, 5 volume
# servers on loopback, files on /dev/shm) with the same `weed worker`: the
# time from a detection being due to the last of its tasks finished, for a
# vacuum of the volumes a fresh load left with 60% garbage, and for the
# erasure coding of 4 volumes. `weed admin` goes first, through its
# detect-and-run call (`POST /api/plugin/job-types/TYPE/run`, which answers
# once the jobs have ended); then jobcenter, through
# `jobcenter detect TYPE --run --wait`. Each is run RUNS times (3), each run
# on its own fresh data (a collection of its own).
#
#   cargo build --release && bash benches/beside-weed-admin.sh
#
# Needs `weed` (4.48), curl and jq. Environment: JOBCENTER (the binary,
# target/release/jobcenter), RUNS, FILES (files per vacuum load, 120),
# PORT_BASE (24000: master PORT_BASE+333, volume servers +81..+85, admin
# +646, jobcenter +746, each gRPC port +10000).
set -euo pipefail

JOBCENTER=${JOBCENTER:-target/release/jobcenter}
RUNS=${RUNS:-3}
FILES=${FILES:-120}
BASE=${PORT_BASE:-24000}
MASTER_PORT=$((BASE + 333))
ADMIN_PORT=$((BASE + 646))
JC_PORT=$((BASE + 746))
MASTER=127.0.0.1:$MASTER_PORT
ROOT=/dev/shm
[ -d "$ROOT" ] || ROOT=${TMPDIR:-/tmp}
DIR=$(mktemp -d "$ROOT/beside-weed-admin-XXXXXX")
PIDS=()

for tool in weed curl jq; do
  command -v "$tool" >/dev/null || { echo "needs $tool on PATH" >&2; exit 2; }
done
[ -x "$JOBCENTER" ] || { echo "no $JOBCENTER: cargo build --release first" >&2; exit 2; }

stop() { # PID...: SIGKILL, quietly
  for pid in "$@"; do
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}
cleanup() {
  stop "${PIDS[@]}"
  rm -rf "$DIR"
}
trap cleanup EXIT

now_ms() { date +%s%3N; }

# start NAME DIR ARGS...: runs ARGS in DIR, logs to DIR/NAME.log.
start() {
  local name=$1 dir=$2
  shift 2
  mkdir -p "$dir"
  (cd "$dir" && exec "$@" >"$dir/$name.log" 2>&1) &
  PIDS+=("$!")
  eval "PID_$name=$!"
}

wait_port() {
  for _ in $(seq 1 300); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.2
  done
  echo "nothing listens on $1" >&2
  exit 1
}

wait_for() { # DESCRIPTION COMMAND...: retries COMMAND for up to 60 s
  local what=$1
  shift
  for _ in $(seq 1 300); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "timed out waiting for $what" >&2
  exit 1
}

median() { tr ' ' '\n' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# --- the cluster --------------------------------------------------------
start master "$DIR/master" weed master -ip=127.0.0.1 -ip.bind=127.0.0.1 -port=$MASTER_PORT \
  -port.grpc=$((MASTER_PORT + 10000)) -mdir="$DIR/master" -peers=none -volumeSizeLimitMB=16 \
  -defaultReplication=000 -vacuumIntervalSeconds=3600 -garbageThreshold=0.99
wait_port $((MASTER_PORT + 10000))
for i in 1 2 3 4 5; do
  port=$((BASE + 80 + i))
  start "volume$i" "$DIR/volume$i" weed volume -ip=127.0.0.1 -ip.bind=127.0.0.1 -port=$port \
    -port.grpc=$((port + 10000)) -dir="$DIR/volume$i" -max=40 -master=$MASTER -preStopSeconds=0 \
    -rack=rack$i -dataCenter=dc1 -volume.allowUntrustedRemoteEndpoints=true
  wait_port $((port + 10000))
done
wait_for "5 volume servers" sh -c "[ \"\$(curl -fsS http://$MASTER/dir/status | jq '[.Topology.DataCenters[].Racks[].DataNodes[]] | length')\" = 5 ]"

# load_garbage COLLECTION: FILES files of 64 KiB, 60% of them deleted, and
# waits until the master has heard of the deletions.
load_garbage() {
  local collection=$1 blob=$DIR/blob fids=() i
  head -c 65536 /dev/urandom >"$blob"
  for i in $(seq 1 "$FILES"); do
    local assign url fid
    assign=$(curl -fsS "http://$MASTER/dir/assign?collection=$collection&replication=000")
    url=$(jq -r .url <<<"$assign")
    fid=$(jq -r .fid <<<"$assign")
    curl -fsS -o /dev/null -F "file=@$blob" "http://$url/$fid"
    fids+=("$url/$fid")
  done
  for i in "${!fids[@]}"; do
    if [ $((i % 5)) -lt 3 ]; then curl -fsS -o /dev/null -X DELETE "http://${fids[$i]}"; fi
  done
  wait_for "the deletions of $collection at the master" sh -c \
    "curl -fsS http://$MASTER/vol/status | jq -e '[.Volumes.DataCenters[][][] | .[]? | select(.Collection == \"$collection\" and .DeleteCount > 0)] | length > 0'"
  sleep 6 # every volume server's next heartbeat
  echo "  $collection: $(garbage "$collection") deleted bytes before" >&2
}

# load_ec COLLECTION: 4 volumes of COLLECTION, each with about 2 MB.
load_ec() {
  local collection=$1 blob=$DIR/blob i
  head -c 131072 /dev/urandom >"$blob"
  curl -fsS -o /dev/null "http://$MASTER/vol/grow?count=4&collection=$collection&replication=000"
  for i in $(seq 1 64); do
    local assign
    assign=$(curl -fsS "http://$MASTER/dir/assign?collection=$collection&replication=000")
    curl -fsS -o /dev/null -F "file=@$blob" "http://$(jq -r .url <<<"$assign")/$(jq -r .fid <<<"$assign")"
  done
  sleep 6
}

plain_volumes() { # COLLECTION -> its volumes the master still knows as plain volumes
  curl -fsS "http://$MASTER/vol/status" |
    jq "[.Volumes.DataCenters[][][] | .[]? | select(.Collection == \"$1\")] | length"
}

garbage() { # COLLECTION -> deleted bytes the master knows of in its volumes
  curl -fsS "http://$MASTER/vol/status" |
    jq "[.Volumes.DataCenters[][][] | .[]? | select(.Collection == \"$1\") | .DeletedByteCount] | add // 0"
}

# check_vacuum COLLECTION / check_ec COLLECTION: what the cluster says after a run.
check_vacuum() {
  sleep 6
  echo "  $1: $(garbage "$1") deleted bytes left" >&2
}
check_ec() {
  sleep 6
  echo "  $1: $(plain_volumes "$1") plain volumes left of 4" >&2
}

declare -A RESULT

# measure SIDE RUN FILTER LETTER: RUNS vacuum and erasure-coding runs of
# one side, each on fresh data in collections vLETTER1, eLETTER1, …; RUN
# times one run of a job type, FILTER points erasure coding at a collection.
measure() {
  local side=$1 run_fn=$2 filter_fn=$3 letter=$4 run
  for run in $(seq 1 "$RUNS"); do
    load_garbage "v$letter$run"
    RESULT[${side}_vacuum]+="$($run_fn vacuum) "
    check_vacuum "v$letter$run"
    load_ec "e$letter$run"
    $filter_fn "e$letter$run"
    RESULT[${side}_ec]+="$($run_fn erasure_coding) "
    check_ec "e$letter$run"
  done
}

# --- weed admin ---------------------------------------------------------
start admin "$DIR/admin" weed admin -port=$ADMIN_PORT -port.grpc=$((ADMIN_PORT + 10000)) -master=$MASTER \
  -dataDir="$DIR/admin"
wait_port $ADMIN_PORT
start wadmin "$DIR/worker-a" weed worker -admin=127.0.0.1:$ADMIN_PORT -id=bench-worker \
  -jobType=vacuum,erasure_coding -heartbeat=1s -workingDir="$DIR/worker-a"
wait_for "the worker at weed admin" sh -c \
  "curl -fsS http://127.0.0.1:$ADMIN_PORT/api/plugin/workers | jq -e 'length > 0'"
wait_for "the descriptors at weed admin" sh -c \
  "curl -fsS http://127.0.0.1:$ADMIN_PORT/api/plugin/job-types/erasure_coding/config | jq -e .worker_config_values"

admin_config() { # JOB_TYPE JQ-FILTER: edits the job type's config in place
  local cfg
  cfg=$(curl -fsS "http://127.0.0.1:$ADMIN_PORT/api/plugin/job-types/$1/config" | jq "$2")
  curl -fsS -o /dev/null -X PUT -H 'Content-Type: application/json' --data "$cfg" \
    "http://127.0.0.1:$ADMIN_PORT/api/plugin/job-types/$1/config"
}
# The scheduler keeps out of the way: only the timed calls run anything.
for jt in vacuum erasure_coding; do
  admin_config $jt '.admin_runtime.detection_interval_minutes = 600'
done
admin_config erasure_coding '.worker_config_values.quiet_for_seconds = {"int64_value":"0"}
  | .worker_config_values.fullness_ratio = {"double_value":0.01}
  | .worker_config_values.min_size_mb = {"int64_value":"1"}'

admin_run() { # JOB_TYPE -> prints milliseconds
  local t0 t1 answer
  t0=$(now_ms)
  answer=$(curl -fsS -m 900 -X POST -H 'Content-Type: application/json' \
    --data '{"max_results":0,"timeout_seconds":900}' "http://127.0.0.1:$ADMIN_PORT/api/plugin/job-types/$1/run")
  t1=$(now_ms)
  echo "  weed admin $1: $((t1 - t0)) ms: $(jq -c '{detected_count, executed_count, success_count, error_count}' <<<"$answer" 2>/dev/null)" >&2
  echo $((t1 - t0))
}

admin_filter() { admin_config erasure_coding ".admin_config_values.collection_filter = {\"string_value\":\"$1\"}"; }
measure admin admin_run admin_filter a
stop "$PID_wadmin" "$PID_admin"
sleep 2

# --- jobcenter ----------------------------------------------------------
start jobcenter "$DIR/jobcenter" "$(realpath "$JOBCENTER")" server --data-dir "$DIR/jobcenter/data" \
  --http 127.0.0.1:$JC_PORT --master $MASTER
wait_port $JC_PORT
export JOBCENTER_ADMIN=127.0.0.1:$JC_PORT
jc() { "$JOBCENTER" "$@"; }
for jt in vacuum erasure_coding; do jc policy set $jt detection_enabled=0 >/dev/null; done
start wjc "$DIR/worker-j" weed worker -admin=127.0.0.1:$JC_PORT -id=bench-worker \
  -jobType=vacuum,erasure_coding -heartbeat=1s -workingDir="$DIR/worker-j"
wait_for "the worker at jobcenter" sh -c "'$JOBCENTER' workers --json | jq -e 'length > 0'"
wait_for "the descriptors at jobcenter" sh -c \
  "'$JOBCENTER' policy get erasure_coding | grep -q quiet_for_seconds"
jc policy set erasure_coding worker.quiet_for_seconds=0 worker.fullness_ratio=0.01 worker.min_size_mb=1 >/dev/null

jc_run() { # JOB_TYPE -> prints milliseconds
  local t0 t1 answer
  t0=$(now_ms)
  answer=$(jc detect "$1" --run --wait --json)
  t1=$(now_ms)
  echo "  jobcenter $1: $((t1 - t0)) ms: $(jq -c '{state, tasks: (.tasks | length)}' <<<"$answer" 2>/dev/null)" >&2
  echo $((t1 - t0))
}

jc_filter() { jc policy set erasure_coding "admin.collection_filter=$1" >/dev/null; }
measure jc jc_run jc_filter j

# --- figures ------------------------------------------------------------
echo
echo "| job | weed admin runs (ms) | median | jobcenter runs (ms) | median | weed admin / jobcenter |"
echo "|---|---|---|---|---|---|"
for what in vacuum ec; do
  a=$(echo ${RESULT[admin_$what]} | median)
  j=$(echo ${RESULT[jc_$what]} | median)
  echo "| $what | ${RESULT[admin_$what]}| $a | ${RESULT[jc_$what]}| $j | $(awk "BEGIN {printf \"%.2f\", $a / $j}") |"
done
