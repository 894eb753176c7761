#!/usr/bin/env bash
# Check the Docker image's two stages (./Dockerfile) in chroots, as far as this machine allows.
#
#   scripts/check_image.sh [WORKDIR]      (as root; ~8 minutes the first time)
#
# No container engine runs here and no registry serves python:3.11-slim-bookworm,
# so the stages are rebuilt from a Debian 12 base that debootstrap makes, with
# Debian's own Python 3.11 (/usr/bin/python3) standing in for the image's
# /usr/local/bin/python3 (the same minor version and Debian release):
#
# 1. base:  debootstrap --variant=minbase bookworm, plus python3, python3-venv
#           and ca-certificates, apt lists removed (what the slim image holds);
# 2. build: a copy of base; the checkout's tracked files in /opt/zerolake/src
#           (the Dockerfile's COPY); operations/vm/install.sh --accelerator cpu
#           --package /opt/zerolake/src --prefix /opt/zerolake (its RUN),
#           which adds the compiler and headers, builds the Cython engine and
#           installs the pinned packages into /opt/zerolake/venv;
# 3. final: a fresh copy of base; /opt/zerolake taken from build (COPY
#           --from=build); the user zerolake made as the Dockerfile makes it;
# 4. checks on final: no compiler, no apt lists, no pip cache; the code
#           belongs to root and cannot be changed by the role's user; the
#           worker role, run as that user through operations/vm/run-role.sh (the
#           ENTRYPOINT) with its state in /var/lib/zerolake (the VOLUME),
#           plays games into a local lake whose chunks `format.inspect verify`
#           accepts, and writes nothing outside the volume.
# Prints one JSON line at the end: {"check": "image", "ok": ..., sizes, timings}.
#
#   scripts/check_image.sh --entries [WORKDIR]   (no root, no Docker; about a minute)
#
# Each role's entry run as the image runs it on a VM: operations/vm/startup-image.sh (every Compute
# Engine VM's start-up script) is run for the worker, the follower and the trainer against a stand-in
# `docker` that records its `docker run`; that command line is then executed as Docker would run it
# in the image: the final stage's ENTRYPOINT (exec form) with the recorded arguments after the image,
# the Dockerfile's ENV overlaid by the recorded --env, its WORKDIR, and the recorded --volume.  The
# image's paths are mapped onto this checkout (/opt/zerolake/src -> the checkout, /opt/zerolake/venv ->
# .venv, the volume -> a folder under WORKDIR), so a wrong ENTRYPOINT path, a role the entry does not
# know, a module that does not import or a flag the role rejects fails here.  The worker plays two
# real games into a local lake whose chunks `format.inspect verify` accepts; the follower and the
# trainer answer --help (their real runs follow a lake forever); a role the entry does not know must
# exit 2, and the Dockerfile's CMD must name a role.  Prints {"check": "image-entries", "ok": ...}.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
if [[ "${1:-}" == --entries ]]; then
    WORK="${2:-/tmp/zerolake-image-entries}"
    rm -rf "$WORK" && mkdir -p "$WORK"
    exec "$REPO/.venv/bin/python" - "$REPO" "$WORK" <<'PY'
import json, os, pathlib, shlex, socket, subprocess, sys

repo, work = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])


def final_stage(dockerfile: pathlib.Path) -> dict:
    """ENTRYPOINT, CMD (exec form), ENV, WORKDIR and VOLUME of the Dockerfile's last stage."""
    lines, joined = dockerfile.read_text().splitlines(), []
    for line in lines:
        if joined and joined[-1].endswith("\\"):
            joined[-1] = joined[-1][:-1] + " " + line.strip()
        elif line.strip() and not line.lstrip().startswith("#"):
            joined.append(line.strip())
    stage: dict = {}
    for line in joined:
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            stage = {"ENV": {}}
        elif word in ("ENTRYPOINT", "CMD"):
            stage[word] = json.loads(rest)          # exec form only: a shell form would put sh -c before the role
        elif word == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                stage["ENV"][key] = value
        elif word in ("WORKDIR", "VOLUME"):
            stage[word] = rest.strip()
    return stage


# ZEROLAKE_CHECK_DOCKERFILE: another Dockerfile to check (the tests give a broken one, which must fail).
stage = final_stage(pathlib.Path(os.environ.get("ZEROLAKE_CHECK_DOCKERFILE", repo / "Dockerfile")))
prefix = stage["ENV"].get("ZEROLAKE_PREFIX", "/opt/zerolake")
image_prefix = work / "opt-zerolake"
image_prefix.mkdir()
(image_prefix / "venv").symlink_to(repo / ".venv")
(image_prefix / "src").symlink_to(repo)
results, ok = {}, True


def in_image(path: str, volume: tuple[str, pathlib.Path]) -> str:
    """An image path as this checkout has it: /opt/zerolake/... and the volume's folder."""
    if path == prefix or path.startswith(prefix + "/"):
        return str(image_prefix) + path[len(prefix):]
    if path == volume[0] or path.startswith(volume[0] + "/"):
        return str(volume[1]) + path[len(volume[0]):]
    return path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def docker_run_of(role: str, args: str, root: str) -> list[str]:
    """The `docker run` argv startup-image.sh gives `role`, recorded by a stand-in docker."""
    bin_dir, calls = work / f"bin-{role}", work / f"calls-{role}"
    bin_dir.mkdir()
    image = "us-central1-docker.pkg.dev/check/zerolake-images/zerolake-cpu@sha256:" + "0" * 64
    # %q: each argument quoted as bash would read it back, so shlex.split gives the argv again.
    stand_ins = {"docker": f'{{ printf "%q " "$@"; echo; }} >> {shlex.quote(str(calls))}\n'
                           f'[[ $1 == image ]] && echo {image.split("@")[0]}@{image.split("@")[1]}\nexit 0\n',
                 "docker-credential-gcr": "exit 0\n", "curl": "exit 22\n"}
    for name, body in stand_ins.items():
        (bin_dir / name).write_text("#!/usr/bin/env bash\n" + body)
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "ZEROLAKE_ROLE": role, "ZEROLAKE_ROOT": root,
           "ZEROLAKE_IMAGE": image, "ZEROLAKE_ACCELERATOR": "cpu", "ZEROLAKE_PROCESSES": "1",
           "ZEROLAKE_ARGS": args, "ZEROLAKE_STATE": str(work / f"state-{role}"),
           "ZEROLAKE_DOCKER_HOME": str(work / "docker-home"), "ZEROLAKE_SPOOL_DEVICE": str(work / "no-disk"),
           "ZEROLAKE_HEALTH_PORT": str(free_port())}    # the worker's health answer (run-role.sh: process 0)
    subprocess.run(["bash", str(repo / "operations/vm/startup-image.sh")], env=env, check=True,
                   capture_output=True, text=True, timeout=60)
    [run] = [shlex.split(line) for line in calls.read_text().splitlines() if line.startswith("run ")]
    return run


def run_as_image(run: list[str], timeout: int) -> subprocess.CompletedProcess:
    """Execute a recorded `docker run` argv as Docker runs it in the image (ENTRYPOINT + the arguments)."""
    env, volume, i = dict(stage["ENV"]), None, 1
    while i < len(run) and run[i].startswith("-"):
        flag = run[i]
        if flag in ("-d", "--detach"):
            i += 1
            continue
        name, eq, value = flag.partition("=")
        if not eq:
            value, i = run[i + 1], i + 1
        if name in ("--env", "-e"):
            key, _, val = value.partition("=")
            env[key] = val
        elif name in ("--volume", "-v"):
            host, _, inside = value.partition(":")
            volume = (inside, pathlib.Path(host))
        i += 1
    image, args = run[i], run[i + 1:]
    assert volume and volume[0] == stage.get("VOLUME"), f"the run mounts {volume}, the image's VOLUME is {stage.get('VOLUME')}"
    env = {k: in_image(v, volume) for k, v in env.items()}
    env.update(PATH=os.environ["PATH"], HOME=str(volume[1]), ZEROLAKE_PREFIX=str(image_prefix),
               ZEROLAKE_STATE=str(volume[1]))
    entry = [in_image(stage["ENTRYPOINT"][0], volume)] + stage["ENTRYPOINT"][1:]
    assert os.access(entry[0], os.X_OK), f"ENTRYPOINT {stage['ENTRYPOINT'][0]} is not an executable of the release"
    return subprocess.run(entry + args, env=env, cwd=in_image(stage.get("WORKDIR", "/"), volume),
                          capture_output=True, text=True, timeout=timeout)


lake = work / "state-worker" / "lake"
checks = {
    "worker": ("--max-games 2 --games 2 --visits 4 --fast-visits 2 --chunk-games 2 --board-size 9", str(lake)),
    "shuffle": ("--help", str(work / "lake-unused")),
    "trainer": ("--help", str(work / "lake-unused")),
}
for role, (args, root) in checks.items():
    try:
        run = docker_run_of(role, args, root)
        result = run_as_image(run, timeout=600)
        passed = result.returncode == 0 and (role == "worker" or "usage:" in result.stdout)
        if role == "worker" and passed:
            verify = subprocess.run([str(repo / ".venv/bin/python"), "-m", "format.inspect", "verify", str(lake)],
                                    cwd=repo, capture_output=True, text=True, timeout=300)
            chunks = len(list(lake.glob("games/**/*.tfrecord.zst")))
            passed = verify.returncode == 0 and chunks > 0
            results["worker_chunks"] = chunks
        if not passed:
            print(f"check_image.sh --entries: the {role} entry failed (exit {result.returncode}):\n"
                  + (result.stdout + result.stderr)[-1500:], file=sys.stderr)
        results[role] = passed
    except (AssertionError, subprocess.SubprocessError, ValueError) as exc:
        print(f"check_image.sh --entries: the {role} entry failed: {exc}", file=sys.stderr)
        results[role] = False
    ok = ok and results[role]
# A role the entry does not know is refused (exit 2), and CMD names a role it knows.
(work / "state-x").mkdir()
try:
    unknown = run_as_image(["run", "--volume", f"{work / 'state-x'}:{stage.get('VOLUME')}",
                            f"--env=ZEROLAKE_ROOT={work / 'lake-unused'}", "image", "nonsense", "0"],
                           timeout=60).returncode
except (AssertionError, subprocess.SubprocessError, ValueError) as exc:
    print(f"check_image.sh --entries: an unknown role: {exc}", file=sys.stderr)
    unknown = None
results["unknown_role_exit"] = unknown
results["cmd"] = stage.get("CMD")
if not (stage.get("CMD") and stage["CMD"][0] in checks):
    print(f"check_image.sh --entries: the Dockerfile's CMD {stage.get('CMD')} names no role of {sorted(checks)}",
          file=sys.stderr)
ok = ok and unknown == 2 and bool(stage.get("CMD")) and stage["CMD"][0] in checks
print(json.dumps({"check": "image-entries", "ok": ok, **results}))
sys.exit(0 if ok else 1)
PY
fi
WORK="${1:-/tmp/zerolake-image-check}"
VPY="$REPO/.venv/bin/python"
BASE="$WORK/base" BUILD="$WORK/build" FINAL="$WORK/final"
mkdir -p "$WORK"
[[ "$(id -u)" == 0 ]] || { echo "check_image.sh: run as root (debootstrap, chroot)" >&2; exit 2; }
log() { echo "[image-check $(date +%H:%M:%S)] $*"; }
t0=$(date +%s)
MOUNTED=()
mount_system() {   # proc, sys and dev inside a root, unmounted on exit
    for fs in proc sys dev; do
        mountpoint -q "$1/$fs" || { mount --bind "/$fs" "$1/$fs"; MOUNTED+=("$1/$fs"); }
    done
}
cleanup() {
    local i
    for (( i=${#MOUNTED[@]}-1; i>=0; i-- )); do umount -l "${MOUNTED[$i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
in_root() {   # in_root ROOT COMMAND...: run a command in a root with a clean environment
    local root="$1"; shift
    chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
        LANG=C.UTF-8 PIP_CONFIG_FILE=/etc/pip.conf PIP_CERT=/etc/zerolake-check/ca-bundle.crt "$@"
}

if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
if [[ ! -x "$BASE/usr/bin/python3" ]]; then
    log "base: debootstrap --variant=minbase bookworm, then Debian's python3"
    rm -rf "$BASE"
    debootstrap --variant=minbase bookworm "$BASE" http://deb.debian.org/debian >"$WORK/debootstrap.log" 2>&1 \
        || { tail -20 "$WORK/debootstrap.log"; exit 1; }
    cp /etc/resolv.conf "$BASE/etc/resolv.conf"
    mkdir -p "$BASE/etc/zerolake-check"
    # The host's CA bundle and pip settings, so that the build reaches the same package index
    # the host does (as scripts/check_vm_startup.sh does for its root).
    cp /etc/ssl/certs/ca-certificates.crt "$BASE/etc/zerolake-check/ca-bundle.crt"
    [[ -f /etc/pip.conf ]] && cp /etc/pip.conf "$BASE/etc/pip.conf"
    mount_system "$BASE"
    in_root "$BASE" bash -c "export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && \
        apt-get install -y -qq --no-install-recommends python3 python3-venv ca-certificates >/dev/null && \
        rm -rf /var/lib/apt/lists/*"
    cleanup; MOUNTED=()
fi
t_base=$(date +%s)

log "build: the checkout's tracked files into /opt/zerolake/src, then operations/vm/install.sh (the Dockerfile's RUN)"
rm -rf "$BUILD" && cp -a "$BASE" "$BUILD"
mkdir -p "$BUILD/opt/zerolake/src"
(cd "$REPO" && git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$BUILD/opt/zerolake/src")
mount_system "$BUILD"
set +e
in_root "$BUILD" bash -c "PYTHON=/usr/bin/python3 /opt/zerolake/src/operations/vm/install.sh --accelerator cpu \
    --package /opt/zerolake/src --prefix /opt/zerolake && rm -rf /root/.cache/pip" > "$WORK/build.log" 2>&1
build_status=$?
set -e
tail -5 "$WORK/build.log"
cleanup; MOUNTED=()
[[ $build_status == 0 ]] || { echo "{\"check\": \"image\", \"ok\": false, \"build_exit\": $build_status}"; exit 1; }
t_build=$(date +%s)

log "final: a fresh base, /opt/zerolake from build, the user zerolake (COPY --from=build, RUN useradd)"
rm -rf "$FINAL" && cp -a "$BASE" "$FINAL"
cp -a "$BUILD/opt/zerolake" "$FINAL/opt/zerolake"
in_root "$FINAL" useradd --system --uid 10001 --user-group --home-dir /var/lib/zerolake --create-home zerolake
mount_system "$FINAL"
compiler=false; apt_lists=false; pip_cache=false; code_writable=false
in_root "$FINAL" sh -c 'command -v gcc || command -v cc' >/dev/null && compiler=true
[[ -n "$(find "$FINAL/var/lib/apt/lists" -mindepth 1 -maxdepth 1 ! -name partial -print -quit 2>/dev/null || true)" ]] \
    && apt_lists=true
[[ -d "$FINAL/root/.cache/pip" ]] && pip_cache=true
in_root "$FINAL" setpriv --reuid=10001 --regid=10001 --clear-groups touch /opt/zerolake/src/probe 2>/dev/null \
    && code_writable=true
touch "$WORK/marker"
log "running the worker role as zerolake through run-role.sh, state in the volume /var/lib/zerolake"
set +e
in_root "$FINAL" setpriv --reuid=10001 --regid=10001 --clear-groups /usr/bin/env HOME=/var/lib/zerolake \
    PYTHONDONTWRITEBYTECODE=1 \
    ZEROLAKE_PREFIX=/opt/zerolake ZEROLAKE_STATE=/var/lib/zerolake ZEROLAKE_ACCELERATOR=cpu \
    ZEROLAKE_ROOT=/var/lib/zerolake/lake \
    ZEROLAKE_ARGS="--max-games 6 --games 6 --visits 4 --fast-visits 2 --chunk-games 3 --board-size 9" \
    /opt/zerolake/src/operations/vm/run-role.sh worker 0 > "$WORK/worker.log" 2>&1
worker_status=$?
set -e
grep -v '"schema": "zerolake.event"' "$WORK/worker.log" | tail -5
t_done=$(date +%s)
# What the role wrote outside the volume (and /tmp): nothing, in an image whose code is read-only to it.
outside=$(cd "$FINAL" && find . -xdev -newer "$WORK/marker" -type f \
    -not -path "./var/lib/zerolake/*" -not -path "./tmp/*" -not -path "./proc/*" -not -path "./sys/*" \
    -not -path "./dev/*" | head -5 | tr '\n' ' ')
set +e
verify=$(cd "$REPO" && "$VPY" -m format.inspect verify "$FINAL/var/lib/zerolake/lake" 2>&1)
verify_status=$?
set -e
echo "$verify" | tail -3
chunks=$(find "$FINAL/var/lib/zerolake/lake/games" -name '*.tfrecord.zst' 2>/dev/null | wc -l)
size_mb=$(du -sm "$FINAL/opt/zerolake" | cut -f1)
ok=false
[[ $worker_status == 0 && $verify_status == 0 && $chunks -gt 0 && $compiler == false && $apt_lists == false \
   && $pip_cache == false && $code_writable == false && -z "$outside" ]] && ok=true
echo "{\"check\": \"image\", \"ok\": $ok, \"build_exit\": $build_status, \"worker_exit\": $worker_status," \
     "\"verify_exit\": $verify_status, \"chunks\": $chunks, \"compiler_in_final\": $compiler," \
     "\"apt_lists_in_final\": $apt_lists, \"pip_cache_in_final\": $pip_cache," \
     "\"code_writable_by_role\": $code_writable, \"written_outside_volume\": \"$outside\"," \
     "\"opt_zerolake_mb\": $size_mb, \"base_s\": $((t_base - t0)), \"build_s\": $((t_build - t_base))," \
     "\"final_s\": $((t_done - t_build))}"
$ok
