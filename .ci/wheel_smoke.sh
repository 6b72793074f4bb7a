#!/usr/bin/env bash
# Build the wheel, install it (not editable) into a fresh venv, and run a small workflow
# through the installed CLI from a folder outside the checkout.
set -euo pipefail
checkout="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
worker=""
# (never `kill 0`: that signals this whole process group, CI included)
trap '[ -n "$worker" ] && kill "$worker" 2>/dev/null; rm -rf "$work"' EXIT
unset PYTHONPATH DURABLE_DB DURABLE_IMPORT

python3 -m pip wheel -q --no-deps "$checkout" -w "$work/dist" 2>"$work/wheel.log" \
  || { cat "$work/wheel.log"; exit 1; }
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q "$work"/dist/*.whl
py="$work/venv/bin/python"

mkdir "$work/app" && cd "$work/app"
"$py" - <<'PY'
import importlib.util, sys
leaked = [m for m in ("workflows", "activities", "scripts", "tests") if importlib.util.find_spec(m)]
if leaked:
    sys.exit(f"the wheel installs generic top-level packages: {leaked}")
import durable
assert durable.__file__.startswith(sys.prefix), durable.__file__
PY
"$work/venv/bin/durable" --version

cat > smoke_flow.py <<'PY'
import durable

@durable.activity()
async def greet(ctx: durable.ActivityContext, name: str) -> str:
    ctx.annotate(f"greeted {name}")
    return f"hello {name}"

@durable.workflow("smoke.hello")
async def hello(ctx: durable.WorkflowContext, name: str) -> str:
    return await greet(ctx, name)
PY
db="sqlite:///$work/app/smoke.db"
"$py" -m durable start smoke.hello '"wheel"' --import smoke_flow --id smoke-1 --db "$db"
"$py" -m durable.worker --db "$db" --import smoke_flow --poll 0.1 >"$work/worker.log" 2>&1 &
worker=$!
state=""
for _ in $(seq 1 300); do
  state="$("$py" -m durable show smoke-1 --db "$db" --json \
    | "$py" -c 'import json,sys; print(json.load(sys.stdin)["run"]["state"])')"
  [ "$state" = completed ] && break
  kill -0 "$worker" 2>/dev/null || { cat "$work/worker.log"; exit 1; }
  sleep 0.1
done
kill -TERM "$worker"; wait "$worker" || { cat "$work/worker.log"; exit 1; }
worker=""
[ "$state" = completed ] || { echo "smoke-1 is $state, not completed"; cat "$work/worker.log"; exit 1; }
"$py" -m durable show smoke-1 --db "$db" | tee "$work/show.txt"
grep -q "hello wheel" "$work/show.txt"
# the console's assets ship in the wheel; without the console extra it says what to install
"$py" - <<'PY'
import importlib.resources as r
static = r.files("durable.console") / "static"
assert (static / "console.js").is_file() and (static / "console.css").is_file(), "no assets"
PY
if "$py" -m durable console --db "$db" --bind 127.0.0.1:0 2>"$work/console.err"; then
  echo "the console ran without its extra"; exit 1
fi
grep -q "needs the console extra" "$work/console.err" || { cat "$work/console.err"; exit 1; }
[ "$(wc -l < "$work/console.err")" -eq 1 ] || { cat "$work/console.err"; exit 1; }
echo "wheel smoke: ok"
