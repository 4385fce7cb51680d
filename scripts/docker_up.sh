#!/usr/bin/env bash
# Start a Docker engine (if none answers) and build the base sandbox image (if missing).
# Idempotent; run as root. Used by CI (.ci/run) and by hand:  sudo scripts/docker_up.sh
#
#   AGENTRL_BASE_IMAGE   image tag to build        (default agentrl-base:bookworm)
#   AGENTRL_DEBIAN_MIRROR                          (default http://deb.debian.org/debian)
set -euo pipefail

IMAGE="${AGENTRL_BASE_IMAGE:-agentrl-base:bookworm}"
MIRROR="${AGENTRL_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
DATA_ROOT=/var/lib/agentrl-docker
LOG=/tmp/dockerd.log
# Enough for SWE tasks: python3 (+venv for per-task pytest), git, patch; procps for `ps`/`kill`.
INCLUDE=python3,python3-venv,git,patch,procps

say() { echo "[docker_up] $*"; }

if [ "$(id -u)" -ne 0 ]; then
    echo "[docker_up] must run as root (it starts dockerd and runs debootstrap)" >&2
    exit 1
fi
for bin in docker dockerd debootstrap; do
    command -v "$bin" >/dev/null || { echo "[docker_up] '$bin' not found: apt-get install -y docker.io debootstrap" >&2; exit 1; }
done

if docker info >/dev/null 2>&1; then
    say "docker engine already answers"
else
    say "starting dockerd (data root $DATA_ROOT, log $LOG)"
    mkdir -p "$DATA_ROOT"
    # A dockerd that died (a machine restored from a snapshot, a kill -9) leaves its pid file, and a
    # new dockerd refuses to start while it exists: drop it when no dockerd runs under that pid.
    PIDFILE=/var/run/docker.pid
    if [ -f "$PIDFILE" ] && [ "$(cat "/proc/$(cat "$PIDFILE")/comm" 2>/dev/null)" != dockerd ]; then
        say "removing the stale $PIDFILE (no dockerd runs under its pid)"
        rm -f "$PIDFILE"
    fi
    # No bridge and no iptables: sandboxes run with --network none; builds use --network host.
    # setsid: dockerd must outlive this script and any `timeout` wrapping it.
    setsid nohup dockerd --bridge=none --iptables=false --data-root "$DATA_ROOT" >"$LOG" 2>&1 &
    for _ in $(seq 1 120); do
        docker info >/dev/null 2>&1 && break
        sleep 0.5
    done
    if ! docker info >/dev/null 2>&1; then
        echo "[docker_up] dockerd did not answer within 60 s; last log lines:" >&2
        tail -n 20 "$LOG" >&2
        exit 1
    fi
    say "dockerd is up"
fi

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    say "image $IMAGE already present"
else
    ROOTFS="$(mktemp -d /tmp/agentrl-rootfs.XXXXXX)"
    trap 'rm -rf "$ROOTFS"' EXIT
    say "debootstrapping bookworm into $ROOTFS (a few minutes)"
    debootstrap --variant=minbase --include="$INCLUDE" bookworm "$ROOTFS" "$MIRROR" >/tmp/debootstrap.log 2>&1 \
        || { echo "[docker_up] debootstrap failed; see /tmp/debootstrap.log" >&2; tail -n 20 /tmp/debootstrap.log >&2; exit 1; }
    # Slim the image: apt caches and docs are not needed inside a sandbox.
    rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* \
           "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/*
    say "importing rootfs as $IMAGE"
    tar -C "$ROOTFS" -c . | docker import -c 'CMD ["/bin/bash"]' -c 'ENV LANG=C.UTF-8' - "$IMAGE" >/dev/null
    rm -rf "$ROOTFS"
    trap - EXIT
    say "built image $IMAGE"
fi
docker image inspect --format '[docker_up] {{index .RepoTags 0}} {{.Size}} bytes' "$IMAGE"
