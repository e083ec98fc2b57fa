#!/usr/bin/env bash
# Counts the admin server's instructions for one job through two worker
# processes (docs/PERFORMANCE.md, "Instructions a task"): the server runs
# under callgrind on a fresh data directory in /dev/shm, its counters are
# zeroed once both workers are connected and dumped once the job ended, to
# OUT.1 (OUT itself gets what follows, up to the server's exit).
#
#   bash benches/count-server.sh target/release/jobcenter layered.json out.cg
#   grep ^summary out.cg.1
set -euo pipefail
BIN=$1 JOB=$2 OUT=$3
D=$(mktemp -d /dev/shm/sc.XXXX)
HTTP=127.0.0.1:24646 GRPC=24647
valgrind --tool=callgrind --callgrind-out-file=$OUT $BIN server --data-dir $D/data --http $HTTP --grpc $GRPC > $D/server.log 2>&1 &
SP=$!
for i in $(seq 1 600); do curl -sf http://$HTTP/readyz >/dev/null 2>&1 && break; sleep 0.5; done
$BIN worker --admin $HTTP --job-types noop --max-execute 256 > $D/w1.log 2>&1 & W1=$!
$BIN worker --admin $HTTP --job-types noop --max-execute 256 > $D/w2.log 2>&1 & W2=$!
for i in $(seq 1 600); do n=$(curl -sf http://$HTTP/api/workers | python3 -c "import json,sys;print(len(json.load(sys.stdin)['workers']))" 2>/dev/null || echo 0); [ "$n" = 2 ] && break; sleep 0.5; done
sleep 2
callgrind_control -z $SP >/dev/null
START=$(date +%s.%N)
# The job's end is read from the jobs list (no task records), once a second.
$BIN submit --admin $HTTP $JOB > $D/submit.log 2>&1
for i in $(seq 1 3600); do
  s=$(curl -sf "http://$HTTP/api/jobs?limit=1" | python3 -c "import json,sys;print(json.load(sys.stdin)['jobs'][0]['state'])" 2>/dev/null || echo none)
  case $s in succeeded|failed|canceled) break;; esac; sleep 1
done
END=$(date +%s.%N)
callgrind_control -d $SP >/dev/null
echo "job $s"
echo "job took $(echo "$END - $START" | bc) s under callgrind"
kill $W1 $W2; kill -TERM $SP; wait $SP || true
rm -rf $D
