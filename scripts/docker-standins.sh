#!/usr/bin/env bash
# Stand-in base images for a machine that cannot pull from Docker Hub (the demo test's harness,
# tests/docker/): builds `python:3.11-slim-bookworm` from Debian bookworm's own packages, so
# docker/Dockerfile builds unchanged. Users with Docker Hub never need this.
#
#   1. local/debian:bookworm     debootstrap --variant=minbase bookworm, then `docker import`
#   2. python:3.11-slim-bookworm on it: python3 + python3-venv (Debian's 3.11), a venv's
#                                python/pip first on PATH, this machine's CA bundle named by
#                                PIP_CERT (a TLS-intercepting proxy's CA; the stand-in only)
#
# Each image is built only when missing (a real python:3.11-slim-bookworm, if present, is
# kept). Needs root (debootstrap) and a running Docker engine. Env: DEBIAN_MIRROR,
# STANDIN_CA_BUNDLE (default /etc/ssl/certs/ca-certificates.crt).
set -euo pipefail

DEBIAN_IMAGE=local/debian:bookworm
PYTHON_IMAGE=python:3.11-slim-bookworm
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
CA_BUNDLE="${STANDIN_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

if have_image "$PYTHON_IMAGE"; then
  echo "docker-standins: $PYTHON_IMAGE present"
  exit 0
fi

work="$(mktemp -d /var/tmp/tidelake-standins.XXXXXX)"
trap 'rm -rf "$work"' EXIT

if ! have_image "$DEBIAN_IMAGE"; then
  if ! command -v debootstrap >/dev/null; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    else
      echo "docker-standins: debootstrap is missing (apt-get install debootstrap, as root)" >&2
      exit 1
    fi
  fi
  echo "docker-standins: debootstrap bookworm (minbase) from $MIRROR"
  debootstrap --variant=minbase bookworm "$work/rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  rm -rf "$work/rootfs"/var/cache/apt/archives/*.deb "$work/rootfs"/var/lib/apt/lists/*
  tar -C "$work/rootfs" -c . | docker import - "$DEBIAN_IMAGE" >/dev/null
  rm -rf "$work/rootfs"
fi

mkdir -p "$work/context"
if [ -f "$CA_BUNDLE" ]; then
  cp "$CA_BUNDLE" "$work/context/ca-certificates.crt"
else
  : >"$work/context/ca-certificates.crt"  # no extra CA: pip uses its own bundle
fi
cat >"$work/context/Dockerfile" <<EOF
FROM $DEBIAN_IMAGE
LABEL org.tidelake.stand-in="python:3.11-slim-bookworm from Debian bookworm's python3"
COPY ca-certificates.crt /usr/local/share/tidelake-standin-ca.crt
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
      python3 python3-venv ca-certificates \\
 && rm -rf /var/lib/apt/lists/* \\
 && python3 -m venv /usr/local/python
ENV PATH=/usr/local/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    LANG=C.UTF-8
ENV PIP_CERT=/usr/local/share/tidelake-standin-ca.crt
CMD ["python3"]
EOF
if [ ! -s "$work/context/ca-certificates.crt" ]; then
  sed -i '/PIP_CERT/d' "$work/context/Dockerfile"
fi
echo "docker-standins: building $PYTHON_IMAGE (stand-in)"
docker build -q -t "$PYTHON_IMAGE" "$work/context" >/dev/null
echo "docker-standins: $PYTHON_IMAGE built"
