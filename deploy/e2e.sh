#!/usr/bin/env bash
# deploy/e2e.sh -- container end-to-end test for netcoll (Docker + Compose).
#
# What it does, in order (each step is skipped when already satisfied):
#   1. needs root; installs docker.io docker-compose (and debootstrap, only if
#      the base image must be built) with apt-get when missing
#   2. starts dockerd in the background if no engine answers (and stops it
#      again on exit -- only the one it started, by PID)
#   3. builds the base image netcoll-base:bookworm with debootstrap + docker
#      import when that tag is missing (no image registry is needed)
#   4. makes deploy/wheelhouse/ on the host: `pip download` of this repo's
#      dependencies (with the `metrics` extra, and E2E_EXTRAS) and of its build
#      backend, for the base image's Python/glibc; the image builds netcoll itself
#      from the source in a layer after them (deploy/Dockerfile)
#   5. docker build -f deploy/Dockerfile --build-arg BASE_IMAGE=... --build-arg WHEELHOUSE=wheelhouse
#   6. compose up with --scale rank=4; waits for 4 members in `netcoll status --json`
#   7. submits every collective and checks state=succeeded, verified=true (null
#      for barrier) and world_size;
#      checks the stack's own credentials: a wrong client token is refused, the
#      client token cannot act as a member, and a coordinator off loopback with
#      no token refuses to start
#   8. starts a long all_reduce, `docker kill`s one rank, expects the job to fail
#      naming that daemon (address or member id), then a job on the 3 survivors
#      to succeed
#   9. --scale rank=5, expects a job on 5 ranks to succeed
#  10. `docker stop`s one rank: SIGTERM must drain it (exit 0) and it must leave
#  11. prints a summary and tears down everything it started (trap)
#
# It SKIPS (loud banner, exit 0) when not root, when apt-get is needed but
# unavailable, when no Docker engine can be started, or when the engine cannot
# run a container. E2E_STRICT=1 turns skips into failures (exit 1). Anything
# else that goes wrong, once it could run, exits 1.
#
# Usage: deploy/e2e.sh [--build-only | --no-build] [--keep] [--rmi] [-h]
#   --build-only  stop after step 5 (+ a smoke check of the image)
#   --no-build    skip steps 3-5 and test an existing $E2E_IMAGE
#   --keep        leave the compose project (and a dockerd it started) running
#   --rmi         also remove the image it built (the base image is kept: it is the cache)
#
# Environment (defaults in brackets):
#   E2E_PROJECT [netcoll-e2e]    E2E_IMAGE [netcoll:e2e]    E2E_RANKS [4]
#   E2E_BASE_IMAGE [netcoll-base:bookworm]  E2E_SUITE [bookworm]
#   E2E_MIRROR [first Debian URI in /etc/apt/sources.list*, else deb.debian.org]
#   E2E_EXTRAS [] (e.g. uvloop)  E2E_TOKEN [unset: the stack makes its own; set: passed as NETCOLL_TOKEN]
#   E2E_OPS [all_reduce broadcast reduce all_gather gather scatter reduce_scatter all_to_all barrier]
#   E2E_SIZE [1MiB]  E2E_LONG_SIZE [16MiB]  E2E_LONG_ITERS [1000]
#     (the long job only has to outlive the kill; it is not a bandwidth test)
#   E2E_WAIT [120] seconds to wait for membership changes
#   E2E_LONG_TIMEOUT [300] seconds to wait for the killed job to end
#   E2E_CMD_TIMEOUT [300] seconds for any one netcoll command in a container
#   E2E_TIMEOUT [2400] seconds for the whole run (watchdog: then it fails and cleans up)
#   E2E_COMPOSE [docker-compose, else "docker compose"]  E2E_DOCKER [docker]
#   E2E_DOCKERD [dockerd] command line that starts an engine when none answers.
#     A private engine next to another one: set DOCKER_HOST to its socket and e.g.
#     E2E_DOCKERD="nsenter --net=/run/netns/NS dockerd --host unix:///run/x/docker.sock
#       --data-root /var/lib/x --exec-root /run/x --pidfile /run/x/docker.pid"
#     (nsenter, not `ip netns exec`: that remounts /sys and hides the cgroups)
#   E2E_STRICT [0]
set -euo pipefail

# --------------------------------------------------------------------------- config
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEPLOY="$REPO/deploy"
WHEELHOUSE_NAME=wheelhouse                 # relative to deploy/, see deploy/Dockerfile
WHEELHOUSE_DIR="$DEPLOY/$WHEELHOUSE_NAME"
JSON_HELPER="$DEPLOY/e2e_json.py"

PROJECT=${E2E_PROJECT:-netcoll-e2e}
IMAGE=${E2E_IMAGE:-netcoll:e2e}
SUITE=${E2E_SUITE:-bookworm}
BASE_IMAGE=${E2E_BASE_IMAGE:-netcoll-base:$SUITE}
RANKS=${E2E_RANKS:-4}
EXTRAS=${E2E_EXTRAS:-}
OPS=${E2E_OPS:-all_reduce broadcast reduce all_gather gather scatter reduce_scatter all_to_all barrier}
SIZE=${E2E_SIZE:-1MiB}
LONG_SIZE=${E2E_LONG_SIZE:-16MiB}
LONG_ITERS=${E2E_LONG_ITERS:-1000}
WAIT=${E2E_WAIT:-120}
LONG_TIMEOUT=${E2E_LONG_TIMEOUT:-300}
CMD_TIMEOUT=${E2E_CMD_TIMEOUT:-300}
RUN_TIMEOUT=${E2E_TIMEOUT:-2400}
STRICT=${E2E_STRICT:-0}
DOCKER=${E2E_DOCKER:-docker}
DOCKERD=${E2E_DOCKERD:-dockerd}
DOCKERD_LOG=${E2E_DOCKERD_LOG:-/tmp/netcoll-e2e-dockerd.log}

BUILD_ONLY=0 NO_BUILD=0 KEEP=0 RMI=0
for arg in "$@"; do
  case $arg in
    --build-only) BUILD_ONLY=1 ;;
    --no-build) NO_BUILD=1 ;;
    --keep) KEEP=1 ;;
    --rmi) RMI=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $arg (try --help)" >&2; exit 2 ;;
  esac
done

# --------------------------------------------------------------------------- state + teardown
STARTED_DOCKERD_PID=""   # set only if this script started dockerd
POLICY_RC_D=""           # a policy-rc.d this script put in place (removed again)
COMPOSE_STARTED=0
KILLED=0
BUILT_IMAGE=0
WORKDIR=""
BG_PIDS=()
SUMMARY=()
TIMINGS=()
FAILURES=0
VERDICT=""
T_START=$SECONDS

log()  { printf '[e2e %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
banner() {
  local line="########################################################################"
  printf '\n%s\n### netcoll e2e: %s\n%s\n\n' "$line" "$*" "$line" >&2
}
# skip/die only record the verdict; cleanup (the EXIT trap) prints it last.
skip() {
  if [[ $STRICT == 1 ]]; then
    VERDICT="FAILED (E2E_STRICT=1, would have skipped): $*"
    exit 1
  fi
  VERDICT="SKIPPED -- NOTHING WAS TESTED: $*"
  exit 0
}
die() { VERDICT="FAILED: $*"; log "FAILED: $*"; exit 1; }
note() { SUMMARY+=("$*"); log "$*"; }
fail_check() { FAILURES=$((FAILURES + 1)); SUMMARY+=("FAIL  $*"); log "FAIL: $*"; }
timed() {  # timed LABEL CMD...: run CMD, record its wall time, keep its status
  local label=$1 t0=$SECONDS rc
  shift
  # Not `"$@" || rc=$?`: that would switch errexit off inside CMD. When the
  # caller is itself a condition (`timed ... || x`) errexit is off anyway.
  "$@"
  rc=$?
  TIMINGS+=("$(printf '%-28s %4ss' "$label" $((SECONDS - t0)))")
  return "$rc"
}

compose() { "${COMPOSE[@]}" -p "$PROJECT" -f "$REPO/docker-compose.yml" "$@"; }

print_summary() {
  ((${#TIMINGS[@]} + ${#SUMMARY[@]})) || return 0
  {
    echo
    echo "==================== netcoll e2e summary ===================="
    local s
    for s in "${TIMINGS[@]}"; do echo "  time  $s"; done
    for s in "${SUMMARY[@]}"; do echo "  $s"; done
    echo "  total $((SECONDS - T_START))s, $FAILURES failed check(s)"
    echo "=============================================================="
  } >&2
}

cleanup() {
  local rc=$?
  set +e
  trap - EXIT INT TERM
  local pid
  for pid in "${BG_PIDS[@]}"; do
    pkill -P "$pid" 2>/dev/null   # its children first (the watchdog's sleep)
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  [[ -n $WORKDIR && -e $WORKDIR/watchdog ]] &&
    VERDICT="FAILED: the run took longer than E2E_TIMEOUT=${RUN_TIMEOUT}s (watchdog)"
  if ((COMPOSE_STARTED)); then
    if ((rc != 0 || FAILURES != 0)); then
      log "--- compose ps / last logs (for the failure above) ---"
      compose ps >&2
      compose logs --no-color --tail=40 >&2
    fi
    if ((KEEP)); then
      log "--keep: leaving compose project '$PROJECT' up (tear down: ${COMPOSE[*]} -p $PROJECT down -v)"
    else
      log "tearing down compose project '$PROJECT'"
      compose --profile bench down -v --remove-orphans >/dev/null 2>&1 ||
        compose down -v --remove-orphans >/dev/null 2>&1
    fi
  fi
  if ((RMI && BUILT_IMAGE && !KEEP)); then
    log "removing image $IMAGE"
    "$DOCKER" image rm "$IMAGE" >/dev/null 2>&1
  fi
  [[ -n $WORKDIR ]] && rm -rf --one-file-system "$WORKDIR"
  [[ -n $POLICY_RC_D ]] && rm -f "$POLICY_RC_D"
  if [[ -n $STARTED_DOCKERD_PID ]]; then
    if ((KEEP)); then
      log "--keep: leaving dockerd (pid $STARTED_DOCKERD_PID) running"
    else
      log "stopping the dockerd this script started (pid $STARTED_DOCKERD_PID)"
      kill -TERM "$STARTED_DOCKERD_PID" 2>/dev/null
      local i
      for i in $(seq 1 30); do
        kill -0 "$STARTED_DOCKERD_PID" 2>/dev/null || break
        sleep 1
      done
      kill -0 "$STARTED_DOCKERD_PID" 2>/dev/null && kill -KILL "$STARTED_DOCKERD_PID"
    fi
  fi
  print_summary
  if [[ -n $VERDICT ]]; then
    banner "$VERDICT"
  elif ((rc == 0 && FAILURES == 0)); then
    if ((BUILD_ONLY)); then
      banner "BUILD OK (--build-only: no cluster was started)"
    else
      banner "PASSED"
    fi
  elif ((rc == 0)); then
    banner "FAILED: $FAILURES check(s) failed"
    rc=1
  else
    banner "FAILED or interrupted (exit $rc)"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --------------------------------------------------------------------------- 1. prerequisites
[[ $(id -u) -eq 0 ]] || skip "must run as root (installs packages, may start dockerd, runs debootstrap)"

WORKDIR=$(mktemp -d /tmp/netcoll-e2e.XXXXXX)

# Watchdog: a stuck step must fail this run (and clean up), not eat the CI budget.
# Its output goes nowhere: it must not hold a pipe (`e2e.sh | tee`) open.
( sleep "$RUN_TIMEOUT" && touch "$WORKDIR/watchdog" && kill -TERM $$ ) </dev/null >/dev/null 2>&1 &
BG_PIDS+=($!)

APT_UPDATED=0
apt_install() {  # apt_install PKG...: install what is missing, or skip
  command -v apt-get >/dev/null || skip "need to install $* but apt-get is not available"
  log "apt-get install $*"
  # Packages must not start services (docker.io would start its own dockerd,
  # which this script then could not tell from one it must leave alone).
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    POLICY_RC_D=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' >"$POLICY_RC_D" && chmod 755 "$POLICY_RC_D"
  fi
  local try
  for try in 1 2; do
    # No package lists yet, or an install failed on stale ones: update first.
    if ((!APT_UPDATED)) &&
       { ((try == 2)) || [[ -z $(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -print -quit 2>/dev/null) ]]; }; then
      APT_UPDATED=1
      apt-get update -qq >"$WORKDIR/apt.log" 2>&1 || { tail -5 "$WORKDIR/apt.log" >&2; skip "apt-get update failed"; }
    fi
    if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" \
         </dev/null >"$WORKDIR/apt.log" 2>&1; then
      break
    fi
    ((try == 1 && !APT_UPDATED)) && continue
    tail -5 "$WORKDIR/apt.log" >&2
    skip "apt-get install $* failed"
  done
  if [[ -n $POLICY_RC_D ]]; then
    rm -f "$POLICY_RC_D"
    POLICY_RC_D=""
  fi
}

install_tools() {
  local need=()
  command -v dockerd >/dev/null || need+=(docker.io)
  command -v "$DOCKER" >/dev/null || need+=(docker.io)
  if [[ -z ${E2E_COMPOSE:-} ]] && ! command -v docker-compose >/dev/null &&
     ! "$DOCKER" compose version >/dev/null 2>&1; then
    need+=(docker-compose)
  fi
  command -v python3 >/dev/null || need+=(python3)
  if ((${#need[@]})); then
    mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
    apt_install "${need[@]}"
  fi
  python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip
}
timed "install tools" install_tools

if [[ -n ${E2E_COMPOSE:-} ]]; then
  read -r -a COMPOSE <<<"$E2E_COMPOSE"
elif command -v docker-compose >/dev/null; then
  COMPOSE=(docker-compose)
else
  COMPOSE=("$DOCKER" compose)
fi

# --------------------------------------------------------------------------- 2. engine
start_engine() {
  if "$DOCKER" info >/dev/null 2>&1; then
    log "using the running Docker engine"
    return
  fi
  local launcher="" dockerd_cmd pidfile=/var/run/docker.pid
  read -r -a dockerd_cmd <<<"$DOCKERD"
  # A dockerd that is still starting serves the default socket; with DOCKER_HOST
  # set, some other engine's process says nothing about ours.
  if [[ -z ${DOCKER_HOST:-} ]] && pgrep -x dockerd >/dev/null; then
    log "a dockerd is running but does not answer yet; waiting"
  else
    command -v "${dockerd_cmd[0]}" >/dev/null || skip "cannot start an engine: ${dockerd_cmd[0]} not found"
    log "starting ${dockerd_cmd[*]} (log: $DOCKERD_LOG)"
    # setsid: Ctrl-C on this script must not reach the engine before `compose down`.
    setsid "${dockerd_cmd[@]}" >"$DOCKERD_LOG" 2>&1 </dev/null &
    launcher=$!
    STARTED_DOCKERD_PID=$launcher
    local i
    for ((i = 1; i < ${#dockerd_cmd[@]}; i++)); do
      case ${dockerd_cmd[i]} in
        -p|--pidfile) pidfile=${dockerd_cmd[i + 1]:-$pidfile} ;;
        --pidfile=*) pidfile=${dockerd_cmd[i]#--pidfile=} ;;
      esac
    done
  fi
  local i pid
  for i in $(seq 1 60); do
    if "$DOCKER" info >/dev/null 2>&1; then
      if [[ -n $launcher ]]; then
        # setsid execs in place unless it is a process-group leader (job control
        # on), when it forks; then the engine's own pid file is authoritative.
        if [[ $(ps -o comm= -p "$launcher" 2>/dev/null) != dockerd ]]; then
          pid=$(cat "$pidfile" 2>/dev/null || true)
          if [[ $pid =~ ^[0-9]+$ && $(ps -o comm= -p "$pid" 2>/dev/null) == dockerd ]]; then
            STARTED_DOCKERD_PID=$pid
          else
            log "WARNING: cannot tell the pid of the dockerd started (launcher $launcher, $pidfile)"
          fi
        fi
      fi
      return
    fi
    if [[ -n $launcher ]] && ! kill -0 "$launcher" 2>/dev/null &&
       ! { [[ -z ${DOCKER_HOST:-} ]] && pgrep -x dockerd >/dev/null; }; then
      STARTED_DOCKERD_PID=""
      tail -15 "$DOCKERD_LOG" >&2
      skip "dockerd exited at start (see $DOCKERD_LOG)"
    fi
    sleep 1
  done
  tail -15 "$DOCKERD_LOG" >&2 || true
  skip "no Docker engine answered within 60s (see $DOCKERD_LOG)"
}
timed "start engine" start_engine
note "engine: $("$DOCKER" version -f '{{.Server.Version}}' 2>/dev/null)," \
     "compose: ${COMPOSE[*]} $("${COMPOSE[@]}" version --short 2>/dev/null || true)" \
     "${STARTED_DOCKERD_PID:+(dockerd pid $STARTED_DOCKERD_PID started by this run)}"

# --------------------------------------------------------------------------- 3. base image
detect_mirror() {  # first plain Debian archive URI from the apt sources
  local f uri
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -r $f ]] || continue
    uri=$(awk '
      /^[[:space:]]*#/ { next }
      $1 == "URIs:" { for (i = 2; i <= NF; i++) print $i }
      $1 == "deb"   { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z+]+:\/\//) { print $i; break } }
    ' "$f" | grep -E '/debian/?$' | head -n1 || true)
    if [[ -n $uri ]]; then
      echo "${uri%/}"
      return
    fi
  done
  echo http://deb.debian.org/debian
}

build_base_image() {
  if "$DOCKER" image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    note "base image $BASE_IMAGE: cached"
    return
  fi
  if [[ $BASE_IMAGE != netcoll-base:* ]]; then
    note "base image $BASE_IMAGE: not local; docker build will try to pull it"
    return
  fi
  command -v debootstrap >/dev/null || apt_install debootstrap
  local mirror=${E2E_MIRROR:-$(detect_mirror)}
  local rootfs="$WORKDIR/rootfs"
  log "debootstrap --variant=minbase $SUITE from $mirror (a minute or so)"
  local t0=$SECONDS
  if ! debootstrap --variant=minbase --include=python3,python3-venv,python3-pip \
       "$SUITE" "$rootfs" "$mirror" >"$WORKDIR/debootstrap.log" 2>&1; then
    tail -20 "$WORKDIR/debootstrap.log" >&2
    # debootstrap can leave /proc etc. mounted inside the target on failure
    findmnt -rn -o TARGET | grep -F "$rootfs" | sort -r | xargs -r umount -l || true
    die "debootstrap failed (log above)"
  fi
  TIMINGS+=("$(printf '%-28s %4ss' "  debootstrap" $((SECONDS - t0)))")
  # Like the official Debian images: no package cache or lists in the image.
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin \
         "$rootfs"/var/lib/apt/lists/* "$rootfs"/tmp/* 2>/dev/null || true
  t0=$SECONDS
  tar --numeric-owner -C "$rootfs" -c . |
    "$DOCKER" import \
      -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      -c 'ENV LANG=C.UTF-8' \
      -c 'CMD ["/bin/bash"]' \
      -m "debootstrap --variant=minbase $SUITE + python3 python3-venv python3-pip" \
      - "$BASE_IMAGE" >/dev/null
  TIMINGS+=("$(printf '%-28s %4ss' "  docker import" $((SECONDS - t0)))")
  findmnt -rn -o TARGET | grep -F "$rootfs" | sort -r | xargs -r umount -l || true
  rm -rf --one-file-system "$rootfs"
  note "base image $BASE_IMAGE: built ($("$DOCKER" image inspect -f '{{.Size}}' "$BASE_IMAGE" | awk '{printf "%d MB", $1/1e6}'))"
}
# An engine that answers but cannot start a container (no cgroups, no overlay
# and no vfs fallback, seccomp/apparmor trouble...) is a host limit: skip.
probe_containers() {  # probe_containers IMAGE
  if ! "$DOCKER" run --rm --entrypoint /bin/sh "$1" -c 'exit 0' >"$WORKDIR/probe.log" 2>&1; then
    tail -5 "$WORKDIR/probe.log" >&2
    skip "the Docker engine answers but cannot run a container (see above and $DOCKERD_LOG)"
  fi
}

if ((NO_BUILD)); then
  "$DOCKER" image inspect "$IMAGE" >/dev/null 2>&1 || die "--no-build but there is no image $IMAGE"
  probe_containers "$IMAGE"
  note "image $IMAGE: existing (--no-build)"
else
timed "base image" build_base_image
"$DOCKER" image inspect "$BASE_IMAGE" >/dev/null 2>&1 && probe_containers "$BASE_IMAGE"

# --------------------------------------------------------------------------- 4. wheelhouse
make_wheelhouse() {
  mkdir -p "$WHEELHOUSE_DIR"
  # Dependencies only: the image installs them in a layer before the code (a
  # netcoll wheel in here would change with every edit and rebuild that layer).
  rm -f "$WHEELHOUSE_DIR"/netcoll-*.whl
  # Build from a snapshot, not the work tree: no build/ or *.egg-info left in
  # the repo, and no half-written file picked up mid-edit.
  local snap="$WORKDIR/src"
  mkdir -p "$snap"
  (
    cd "$REPO"
    items=()
    for f in pyproject.toml setup.cfg setup.py MANIFEST.in README.md LICENSE* netcoll; do
      [[ -e $f ]] && items+=("$f")
    done
    tar -c --exclude=__pycache__ --exclude='*.pyc' --exclude='*.egg-info' "${items[@]}"
  ) | tar -x -C "$snap"
  log "pip wheel --no-deps (netcoll from this repo, to read its dependencies)"
  python3 -m pip wheel -q --no-deps -w "$WORKDIR/dist" "$snap" >"$WORKDIR/wheel.log" 2>&1 ||
    { tail -20 "$WORKDIR/wheel.log" >&2; die "pip wheel of the project failed"; }
  local wheel extras="metrics${EXTRAS:+,$EXTRAS}"
  wheel=$(ls "$WORKDIR"/dist/netcoll-*.whl)

  # Dependencies as binary wheels for the *image's* interpreter and glibc, which
  # need not match the host's: ask the base image.
  local pyver glibc arch
  read -r pyver glibc arch < <("$DOCKER" run --rm --entrypoint python3 "$BASE_IMAGE" -c \
    'import platform,sys; print("%d.%d" % sys.version_info[:2], platform.libc_ver()[1], platform.machine())')
  [[ -n $pyver && -n $glibc && -n $arch ]] || die "could not read python/glibc/arch from $BASE_IMAGE"
  local abi="cp${pyver/./}" minor=${glibc#2.} plat=() v
  for ((v = minor; v >= 5; v--)); do plat+=(--platform "manylinux_2_${v}_${arch}"); done
  plat+=(--platform "manylinux2014_${arch}" --platform "manylinux2010_${arch}" --platform "manylinux1_${arch}")
  log "pip download dependencies for CPython $pyver, glibc $glibc, $arch"
  # + the build backend (pyproject's build-system.requires): the image builds netcoll offline
  local build_reqs
  mapfile -t build_reqs < <(python3 -c 'import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["build-system"]["requires"]))' "$REPO/pyproject.toml") ||
    die "could not read build-system.requires from pyproject.toml"
  python3 -m pip download -q -d "$WHEELHOUSE_DIR" --only-binary=:all: \
      --python-version "$pyver" --implementation cp --abi "$abi" --abi abi3 --abi none "${plat[@]}" \
      "$wheel[$extras]" "${build_reqs[@]}" >"$WORKDIR/download.log" 2>&1 ||
    { tail -20 "$WORKDIR/download.log" >&2; die "pip download of the dependencies failed"; }
  rm -f "$WHEELHOUSE_DIR"/netcoll-*.whl
  note "wheelhouse: $(find "$WHEELHOUSE_DIR" -name '*.whl' | wc -l) wheels, $(du -sh "$WHEELHOUSE_DIR" | cut -f1) in deploy/$WHEELHOUSE_NAME"
}
timed "wheelhouse" make_wheelhouse

# --------------------------------------------------------------------------- 5. image
build_image() {
  log "docker build $IMAGE (BASE_IMAGE=$BASE_IMAGE WHEELHOUSE=$WHEELHOUSE_NAME)"
  "$DOCKER" build -f "$DEPLOY/Dockerfile" -t "$IMAGE" \
      --build-arg "BASE_IMAGE=$BASE_IMAGE" \
      --build-arg "WHEELHOUSE=$WHEELHOUSE_NAME" \
      --build-arg "EXTRAS=$EXTRAS" \
      "$REPO" >"$WORKDIR/build.log" 2>&1 ||
    { tail -30 "$WORKDIR/build.log" >&2; die "docker build failed"; }
  BUILT_IMAGE=1
  # Smoke check that needs no CLI behaviour: venv on PATH, console script, non-root.
  local smoke
  smoke=$("$DOCKER" run --rm --entrypoint sh "$IMAGE" -c \
    'command -v netcoll && python -c "import netcoll, sys; print(sys.version.split()[0])" && id -u') ||
    die "image smoke check failed: $smoke"
  note "image $IMAGE: built ($("$DOCKER" image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%d MB", $1/1e6}')), smoke: $(echo "$smoke" | paste -sd' ')"
}
timed "docker build" build_image
fi

export NETCOLL_IMAGE=$IMAGE NETCOLL_BASE_IMAGE=$BASE_IMAGE NETCOLL_WHEELHOUSE=$WHEELHOUSE_NAME \
       NETCOLL_EXTRAS=$EXTRAS
# Random host ports: do not collide with anything already on 29400/29401.
export NETCOLL_PUBLISH_RPC=127.0.0.1: NETCOLL_PUBLISH_HTTP=127.0.0.1:
# By default no token is passed in: `compose up` must need no edits, so the stack's
# `credentials` service makes its own member and client tokens (secure by default).
unset NETCOLL_TOKEN NETCOLL_CLIENT_TOKEN
if [[ -n ${E2E_TOKEN:-} ]]; then
  export NETCOLL_TOKEN=$E2E_TOKEN
fi

compose config -q || die "compose file does not validate with ${COMPOSE[*]}"
note "compose file validates with ${COMPOSE[*]}"

if ((BUILD_ONLY)); then
  exit 0
fi

# --------------------------------------------------------------------------- helpers for the run
nc_exec() {  # netcoll CLI inside the coordinator container (bounded: CI must never hang)
  timeout --kill-after=10 "$CMD_TIMEOUT" "${COMPOSE[@]}" -p "$PROJECT" -f "$REPO/docker-compose.yml" \
    exec -T coordinator netcoll "$@"
}

status_to() {  # status_to FILE: `netcoll status --json` into FILE; non-zero on failure
  nc_exec status --json >"$1" 2>"$1.err"
}

wait_members() {  # wait_members N: until status shows exactly N live members
  local want=$1 deadline=$((SECONDS + WAIT)) have="?" t0=$SECONDS
  while ((SECONDS < deadline)); do
    if status_to "$WORKDIR/status.json"; then
      have=$(python3 "$JSON_HELPER" members "$WORKDIR/status.json" 2>/dev/null || echo "?")
      if [[ $have == "$want" ]]; then
        note "ok    status shows $want members (after $((SECONDS - t0))s)"
        return 0
      fi
    fi
    sleep 2
  done
  cat "$WORKDIR/status.json" "$WORKDIR/status.json.err" >&2 2>/dev/null || true
  fail_check "status shows $have members after ${WAIT}s, want $want"
  return 1
}

submit_check() {  # submit_check LABEL EXPECT WORLD OP [ARGS...]
  local label=$1 expect=$2 world=$3 op=$4
  shift 4
  local out="$WORKDIR/job-$label.json" line rc=0
  nc_exec submit "$op" "$@" --json >"$out" 2>"$out.err" || rc=$?
  if line=$(python3 "$JSON_HELPER" job "$out" "$expect" "$world" 2>&1) && ((rc == 0)); then
    note "ok    $label: $line"
  else
    [[ -s $out.err ]] && tail -5 "$out.err" >&2
    fail_check "$label (netcoll submit exit $rc, want 0): $line"
    return 1
  fi
}

rank_containers() {
  "$DOCKER" ps -q --filter "label=com.docker.compose.project=$PROJECT" \
                  --filter "label=com.docker.compose.service=rank"
}

# --------------------------------------------------------------------------- 6. cluster up
# Leftovers of an interrupted earlier run would be reused by `up`: start clean.
compose --profile bench down -v --remove-orphans >/dev/null 2>&1 || true
log "compose up --scale rank=$RANKS"
COMPOSE_STARTED=1
timed "compose up ($RANKS ranks)" compose up -d --no-build --scale "rank=$RANKS" >&2 ||
  die "compose up failed"
timed "form $RANKS members" wait_members "$RANKS" || die "the cluster never formed"

# --------------------------------------------------------------------------- 7. every collective
run_all_ops() {
  local op
  for op in $OPS; do
    if [[ $op == barrier ]]; then
      submit_check "$op" succeeded "$RANKS" "$op" || true
    else
      submit_check "$op" succeeded "$RANKS" "$op" --size "$SIZE" || true
    fi
  done
}
timed "all collectives" run_all_ops

check_credentials() {  # secure by default: the stack's own tokens, and their roles
  local out=$WORKDIR/badtoken.out
  if timeout 60 "${COMPOSE[@]}" -p "$PROJECT" -f "$REPO/docker-compose.yml" \
       exec -T -e NETCOLL_CLIENT_TOKEN=not-the-token coordinator netcoll status --json >"$out" 2>&1; then
    fail_check "a client with a wrong token was served (status exited 0)"
  else
    note "ok    wrong token refused: $(tail -n1 "$out" | cut -c1-120)"
  fi
  # the client token offered as a member credential (what a rank daemon would do)
  if timeout 60 "${COMPOSE[@]}" -p "$PROJECT" -f "$REPO/docker-compose.yml" \
       exec -T -e NETCOLL_TOKEN= -e NETCOLL_TOKEN_FILE=/run/netcoll/client-token -e NETCOLL_CLIENT_TOKEN_FILE= \
       coordinator netcoll status --json >"$out" 2>&1; then
    fail_check "the client token was accepted as a member credential"
  elif grep -q "client token" "$out"; then
    note "ok    client token refused as a member: $(tail -n1 "$out" | cut -c1-120)"
  else
    fail_check "client token as a member: refused, but not saying why: $(tail -n1 "$out" | cut -c1-160)"
  fi
  local rc=0
  timeout 60 "$DOCKER" run --rm "$IMAGE" coordinator --host 0.0.0.0 --port 0 --http-port off >"$out" 2>&1 || rc=$?
  if ((rc == 2)) && grep -q "without credentials" "$out"; then
    note "ok    coordinator with no token off loopback refuses to start (exit 2)"
  else
    fail_check "coordinator with no token off loopback: exit $rc, want 2: $(tail -n1 "$out" | cut -c1-160)"
  fi
}
check_credentials

# --------------------------------------------------------------------------- 8. lose a rank mid-job
lose_a_rank() {
  local out="$WORKDIR/job-long.json" pid rc=0 i busy=2
  log "long job: all_reduce --size $LONG_SIZE --iters $LONG_ITERS"
  nc_exec submit all_reduce --size "$LONG_SIZE" --iters "$LONG_ITERS" --json >"$out" 2>"$out.err" &
  pid=$!
  BG_PIDS+=("$pid")
  # Wait until a member reports the job (or fall back to a fixed delay).
  for i in $(seq 1 30); do
    sleep 1
    kill -0 "$pid" 2>/dev/null || break
    status_to "$WORKDIR/status-busy.json" || continue
    busy=0
    python3 "$JSON_HELPER" busy "$WORKDIR/status-busy.json" || busy=$?
    ((busy == 0)) && break
    ((busy == 2 && i >= 5)) && break   # status has no current-job field: 5s is enough
  done
  kill -0 "$pid" 2>/dev/null ||
    { fail_check "long job ended before a rank could be killed (raise E2E_LONG_ITERS)"; return 1; }
  ((busy == 0)) || log "no member reported the job as running; killing anyway"
  local victim name host ip
  victim=$(rank_containers | tail -n1)
  [[ -n $victim ]] || { fail_check "no rank container to kill"; return 1; }
  # The job's error must name this daemon: by its address (what the coordinator
  # saw) or its member id (which starts with the container's hostname).
  name=$("$DOCKER" inspect -f '{{.Name}}' "$victim" | tr -d /)
  host=$("$DOCKER" inspect -f '{{.Config.Hostname}}' "$victim")
  ip=$("$DOCKER" inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}' "$victim" | awk '{print $1}')
  note "kill  rank container $name (hostname $host, $ip) while the job runs"
  "$DOCKER" kill "$victim" >/dev/null
  KILLED=1
  local deadline=$((SECONDS + LONG_TIMEOUT)) t0=$SECONDS
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 1; done
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    fail_check "the job never ended after a rank was killed (${LONG_TIMEOUT}s)"
    return 1
  fi
  wait "$pid" || rc=$?
  local line
  if line=$(python3 "$JSON_HELPER" job "$out" failed-rank - "${ip:+$ip:}" "$host-" 2>&1) && ((rc == 1)); then
    note "ok    job failed $((SECONDS - t0))s after the kill (netcoll submit exit $rc): $line"
  else
    tail -5 "$out.err" >&2 || true
    fail_check "job with a killed rank (netcoll submit exit $rc, want 1): $line"
  fi
}
timed "kill a rank mid-job" lose_a_rank || true

SURVIVORS=$((RANKS - KILLED))
if timed "shrink to $SURVIVORS members" wait_members "$SURVIVORS"; then
  submit_check "after-kill" succeeded "$SURVIVORS" all_reduce --size "$SIZE" || true
fi

# --------------------------------------------------------------------------- 9. scale up
GROWN=$((RANKS + 1))
log "compose up --scale rank=$GROWN"
timed "scale to $GROWN" compose up -d --no-build --scale "rank=$GROWN" >&2 || die "compose scale failed"
if timed "grow to $GROWN members" wait_members "$GROWN"; then
  submit_check "after-scale" succeeded "$GROWN" all_reduce --size "$SIZE" || true
fi

# --------------------------------------------------------------------------- 10. graceful stop
# SIGTERM (through `init: true`) must drain the daemon: it leaves and exits 0
# well before the stop timeout (after which Docker would SIGKILL it: 137).
stop_a_rank() {
  local victim name t0=$SECONDS code
  victim=$(rank_containers | head -n1)
  [[ -n $victim ]] || { fail_check "no rank container to stop"; return 1; }
  name=$("$DOCKER" inspect -f '{{.Name}}' "$victim" | tr -d /)
  "$DOCKER" stop -t 30 "$victim" >/dev/null
  code=$("$DOCKER" inspect -f '{{.State.ExitCode}}' "$victim")
  if [[ $code == 0 ]]; then
    note "ok    docker stop $name: exit 0 after $((SECONDS - t0))s (SIGTERM drained)"
  else
    fail_check "docker stop $name: exit $code after $((SECONDS - t0))s (want 0: SIGTERM should drain)"
  fi
}
if timed "graceful stop" stop_a_rank; then
  timed "shrink to $RANKS members" wait_members "$RANKS" || true
fi

# cleanup (trap) prints the summary and tears down
