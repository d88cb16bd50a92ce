#!/usr/bin/env bash
# The official OpenAI JavaScript client (npm `openai`, test-only: installed here into the
# git-ignored tests/http_svc/node_modules, once) streams a completion through a real stack's
# http_svc and a chat completion (chatml template) and must get the tokens `duet generate` gets. No npm: the test fails saying so.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${1:?usage: openai_js_test.sh BUILD_BIN_DIR}"
command -v node >/dev/null && command -v npm >/dev/null ||
  { echo "FAIL: node and npm are needed (deploy/install-deps.sh installs them)"; exit 1; }
if [ ! -d "$here/node_modules/openai" ]; then
  (cd "$here" && npm install --no-save --no-audit --no-fund --silent openai@4) ||
    { echo "FAIL: npm could not install the openai package (registry unreachable?)"; exit 1; }
fi
stack="http_js_$$"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
trap '"$bin/duet" stack down --stack "$stack" >/dev/null 2>&1 || true' EXIT
"$bin/duet" stack up --stack "$stack" --http "$port"
prompt="Once upon a time"
want=$("$bin/duet" generate --stack "$stack" --json --max-tokens 24 "$prompt")
chat="Tell me a fortune"
want_chat=$("$bin/duet" generate --stack "$stack" --json --max-tokens 24 --chat --chat-template chatml "$chat")
got=$(node "$here/openai_client.mjs" "http://127.0.0.1:$port/v1" "$prompt" 24 "$chat")
python3 - "$want" "$got" "$want_chat" <<'PY'
import json, sys
want, got, want_chat = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
assert got["chat"] == want_chat["text"], f"openai js chat got {got['chat']!r}, duet generate --chat {want_chat['text']!r}"
assert got["completion"] == want["text"], f"openai js client got {got['completion']!r}, duet generate {want['text']!r}"
assert got["completion_usage"]["completion_tokens"] == want["stats"]["generated_tokens"], got
print("ok: the openai client streamed", repr(got["completion"]), "and chat", repr(got["chat"]))
PY
