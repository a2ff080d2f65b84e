#!/bin/bash
# How long a new user takes from a table to a served model (issue 49): keel new → scripts/setup → the Definitions
# snapshot → KEEL_LIVE=0 KEEL_USECASES=NAME scripts/up until it prints the model live on the gateway; then one request
# through the edge with a tenant's key. Run it from a checkout you can reset — it writes usecases/NAME and registers
# it, as a user would; `git checkout pyproject.toml tests/snapshots && rm -rf usecases/NAME && scripts/setup` undoes it.
#
#   bench/new_usecase.sh NAME PORT keel-new-arguments…
#   bench/new_usecase.sh penguins 3960 --from "$(.venv/bin/python -c 'import palmerpenguins, os; \
#       print(os.path.dirname(palmerpenguins.__file__))')/data/penguins-raw.csv" --label "Body Mass (g)" \
#       --time "Date Egg" --months 0
set -u
NAME=$1; PORT=$2; shift 2
HOME_DIR=$(mktemp -d "/tmp/keel-new-$NAME.XXXX")
EDGE=$((PORT + 5000))
t0=$(date +%s)
.venv/bin/keel new "$NAME" "$@" || exit 1
t1=$(date +%s)
scripts/setup | tail -3
t2=$(date +%s)
KEEL_UPDATE_SNAPSHOT=1 .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_definitions.py | tail -1
t3=$(date +%s)
(KEEL_LIVE=0 KEEL_USECASES=$NAME KEEL_HOME=$HOME_DIR KEEL_PORT=$PORT KEEL_GATEWAY_PORT=$EDGE setsid scripts/up \
  > "$HOME_DIR.up.log" 2>&1 &)
for _ in $(seq 1 180); do  # at most 30 minutes
  grep -q "live: rel-" "$HOME_DIR.up.log" 2>/dev/null && break
  sleep 10
done
t4=$(date +%s)
grep "live: rel-" "$HOME_DIR.up.log" || { echo "not served: $HOME_DIR.up.log"; exit 1; }
echo "keel new $((t1 - t0)) s, setup $((t2 - t1)) s, snapshot $((t3 - t2)) s, scripts/up → served $((t4 - t3)) s;" \
     "in all $((t4 - t0)) s"
KEY=$(KEEL_HOME=$HOME_DIR .venv/bin/keel tenant add bench --reason "bench/new_usecase.sh" | tail -1)
BODY=$(.venv/bin/python -c "import json, usecases.$NAME.replay as r; m = __import__('usecases.$NAME', fromlist=['usecase']).usecase.months; print(json.dumps({'entities': r.requests(m[-1])[:1]}))")
curl -s -m 10 -H "Authorization: Bearer $KEY" -H 'content-type: application/json' -d "$BODY" \
  "http://127.0.0.1:$EDGE/v1/models/$(.venv/bin/python -c "from usecases.$NAME import usecase; print(usecase.model.name)")/predict"
echo
echo "the platform it started keeps running (UI http://127.0.0.1:$PORT): stop it as any scripts/up (Ctrl-C in its"
echo "session, then the runtime under $HOME_DIR: pkill -f $HOME_DIR)"
