#!/usr/bin/env bash
# Idempotent: the system packages agentrl's sandboxes need (bubblewrap; docker.io and debootstrap
# for the Docker backend and its base image). Needs root for apt-get; otherwise says what to run.
set -euo pipefail
missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
if [ "${1:-}" = "--docker" ]; then
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
fi
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "agentrl needs: ${missing[*]}. Install them with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "[system] apt-get install ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
