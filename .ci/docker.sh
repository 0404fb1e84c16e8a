#!/usr/bin/env bash
# The Docker image, built from docker/Dockerfile and run, with no Docker engine and no image
# registry (CI has neither): buildah builds the Dockerfile as it is, with only BASE_IMAGE set,
# and runs commands in the image the way `docker run` would (its entrypoint, its user, its
# workdir, a folder mounted from outside, a 64 MB /dev/shm as Docker gives by default).
#
#   .ci/docker.sh        build the base (cached) and the image, run it, check what it wrote
#
# The published image starts from pytorch/pytorch (CUDA), which cannot be pulled here. The base
# here stands in for it: Debian (debootstrap) with Python, pip and the torch and torchvision of
# the project's venv, installed by pip from the same package index and settings pip has on this
# machine (bind-mounted into the build, so nothing large is downloaded twice). The base is kept in
# buildah's store under $CACHE, tagged with a hash of its recipe (make_base, the suite, torch's
# pins, pip's constraints): a change to the recipe builds a new one and drops the old. Measured on
# 2 cores: 4.5 minutes cold (the base takes 3 of them), 1.5 warm, plus ~15 s of apt-get once.
#
# Needs root. Where buildah cannot be installed or cannot build here, it says so in one line and
# exits 0, so that the rest of CI runs; once it builds, any failure fails CI.
#
# Environment: DISTSEQ_DOCKER_CACHE (default /var/cache/distseq-docker): buildah's store; it
# keeps 6.3 GB (base and image) between runs.
set -euo pipefail
SELF=$(realpath "${BASH_SOURCE[0]}")
cd "$(dirname "$SELF")/.."

CACHE=${DISTSEQ_DOCKER_CACHE:-/var/cache/distseq-docker}
SUITE=bookworm           # its Python is 3.11, as the cp311 torch wheels on this machine's disk need
IMAGE=localhost/distseq:ci
BASE_NAME=localhost/distseq-ci-base
SHM=64m                  # Docker's default --shm-size
RUN_TIMEOUT=300          # seconds for one command in the image (each takes under a minute)
NEED_GB=16               # free disk a cold build takes (the base's 6 GB layer is written twice)
export BUILDAH_ISOLATION=chroot  # the OCI runtime (crun) cannot run containers in this kernel

say() { echo "docker.sh: $*"; }
fail() { echo "docker.sh: FAILED: $*" >&2; exit 1; }
skip() { echo "docker.sh: SKIPPED: this machine cannot build images: $*"; exit 0; }
bah() { buildah --root "$CACHE/storage" --runroot /run/distseq-docker "$@"; }

# --- Can this machine build images? -----------------------------------------------------------
if ! command -v buildah >/dev/null || ! command -v debootstrap >/dev/null; then
    log=$(mktemp)
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah debootstrap; } \
        >"$log" 2>&1 || skip "apt-get install buildah debootstrap failed: $(tail -1 "$log")"
    rm -f "$log"
fi
mkdir -p "$CACHE"
unshare --mount --fork chroot / true 2>/dev/null || skip "no mount namespace or chroot for buildah"
free_gb=$(df --output=avail -BG "$CACHE" | tail -1 | tr -dc 0-9)

# Everything below runs in a mount namespace of its own: a 64 MB tmpfs on /dev/shm there is the
# /dev/shm that buildah's chroot isolation gives the container (its --mount cannot replace that
# one), and mounts left by a failed step go when the script ends.
if [[ -z ${DISTSEQ_DOCKER_NS:-} ]]; then
    exec 9>"$CACHE/lock"
    flock 9  # one run at a time per store
    DISTSEQ_DOCKER_NS=1 exec unshare --mount --propagation private bash "$SELF" "$@"
fi
mount -t tmpfs -o "size=$SHM,mode=1777" shm /dev/shm
start=$SECONDS
out=$(mktemp -d /tmp/distseq-docker.XXXXXX)  # the folder mounted into the image, and the logs
trap 'bah rm --all >/dev/null 2>&1 || true' EXIT

# step LOG WHAT CMD...: CMD's output goes to $out/LOG.log; if CMD fails, the end of it is printed.
# CMD runs as a background job: bash ignores `set -e` in a function run as an `if` or `||`
# condition, and make_base relies on it.
step() {
    local log=$out/$1.log what=$2 t0=$SECONDS status=0
    shift 2
    "$@" >"$log" 2>&1 &
    wait $! || status=$?
    if ((status)); then
        tail -40 "$log" >&2
        fail "$what (log above; all logs in $out)"
    fi
    say "$what: $((SECONDS - t0)) s"
}

# --- pip as this machine has it, for inside the build ----------------------------------------
# pip's settings here (config files and PIP_* variables, the latter winning) become one pip.conf,
# bind-mounted as /etc/pip.conf into every RUN; each local path they name (find-links folders,
# file:// indexes, constraint and CA files) is bind-mounted read-only at the same path. The CA
# file matters: this network's TLS proxy signs with its own CA.
py=python3
[[ -x .venv/bin/python ]] && py=.venv/bin/python
"$py" - "$out/pip.conf" "$out/pip-mounts" <<'EOF'
import ast, os, subprocess, sys
listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                        text=True, check=True).stdout
files, env = {}, {}
for line in listed.splitlines():
    name, _, value = line.partition("=")
    section, _, key = name.rpartition(".")
    if section in (":env:", "global", "install"):
        (env if section == ":env:" else files)[key] = ast.literal_eval(value)
keys = ("index-url", "extra-index-url", "find-links", "constraint", "cert", "trusted-host",
        "no-index", "default-timeout")
conf = {k: v for k in keys if (v := env.get(k, files.get(k)))}
mounts = set()
for key in ("index-url", "extra-index-url", "find-links", "constraint", "cert"):
    for token in conf.get(key, "").split():
        path = token.removeprefix("file://")
        if path.startswith("/") and os.path.exists(path):
            # an index's pages link to files beside its simple/ folder
            mounts.add(os.path.dirname(path) if os.path.basename(path) == "simple" else path)
with open(sys.argv[1], "w") as f:
    f.write("[global]\n" + "".join(f"{k} = {v}\n" for k, v in conf.items()))
with open(sys.argv[2], "w") as f:
    f.write("".join(f"{m}\n" for m in sorted(mounts)))
EOF
# (They leave empty mount points in the image: /etc/pip.conf, /opt/pypi, ... CI's image only.)
pip_mounts=(-v "$out/pip.conf:/etc/pip.conf:ro")
while read -r path; do pip_mounts+=(-v "$path:$path:ro"); done <"$out/pip-mounts"

# --- The base: Debian + Python + pip + torch, as pytorch/pytorch has them ---------------------
# The project's own torch and torchvision: those its venv has, else whatever pip picks here.
torch_pins=(torch torchvision)
if versions=$("$py" -c 'from importlib.metadata import version as v; print(v("torch"), v("torchvision"))' 2>/dev/null); then
    read -r tv tvv <<<"$versions"
    torch_pins=("torch==$tv" "torchvision==$tvv")
fi
# Debian's packages from the mirror apt uses here (debootstrap's default where apt names none).
# shellcheck disable=SC2016  # $(REPO_URI) is apt's field, not the shell's
mirror=$(apt-get indextargets --format '$(REPO_URI)' "Release: $SUITE" "Identifier: Packages" 2>/dev/null |
    grep -v security | head -1) || true

make_base() {
    local ctr mnt
    ctr=$(bah from scratch)
    mnt=$(bah mount "$ctr")
    debootstrap --variant=minbase --include=python3,python3-pip,python-is-python3,ca-certificates \
        "$SUITE" "$mnt" ${mirror:+"$mirror"}
    # pytorch/pytorch's Python (conda's) lets root `pip install` into it; Debian's refuses
    # (PEP 668) unless this marker goes.
    rm -f "$mnt"/usr/lib/python3*/EXTERNALLY-MANAGED
    # A user with UID 1000 already, as Ubuntu 24.04 bases have (ubuntu): the Dockerfile must
    # replace it with its own, so that branch of it runs here too.
    chroot "$mnt" useradd --create-home --uid 1000 ubuntu
    bah run "${pip_mounts[@]}" "$ctr" -- pip install --no-cache-dir "${torch_pins[@]}"
    bah run "$ctr" -- python -c 'import torch, torchvision; print("base: torch", torch.__version__, "torchvision", torchvision.__version__)'
    # the mount points that the bind mounts above left, where they are empty
    local path
    while read -r path; do
        if [[ -d $mnt$path ]]; then
            rmdir "$mnt$path" 2>/dev/null || true
        elif [[ ! -s $mnt$path ]]; then
            rm -f "$mnt$path"
        fi
    done < <(cat "$out/pip-mounts"; echo /etc/pip.conf)
    rm -rf "$mnt"/var/cache/apt/archives/*.deb "$mnt"/var/lib/apt/lists/* "$mnt"/root/.cache
    bah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --cmd /bin/bash "$ctr"
    bah commit --rm "$ctr" "$BASE"
}

# Where pip's index lives does not change what the base holds, so it is not in the key: a session
# and CI, whose PIP_* variables may differ, share one base.
key=$( {
    declare -f make_base
    echo "$SUITE $(uname -m) ${torch_pins[*]}"
    sed -n 's/^constraint = //p' "$out/pip.conf" | xargs -r cat
} | sha256sum | cut -c1-16)
BASE=$BASE_NAME:$key

bah rm --all >/dev/null  # working containers of a run that was killed
if bah inspect --type image "$BASE" >/dev/null 2>&1; then
    say "base $BASE cached (${torch_pins[*]})"
else
    ((free_gb >= NEED_GB)) || skip "$free_gb GB free under $CACHE, a first build needs $NEED_GB"
    # the bases of other recipes go first: 6 GB each
    for old in $(bah images --format '{{.Name}}:{{.Tag}}' | grep "^$BASE_NAME:" || true); do
        bah rmi -f "$old" >/dev/null
    done
    step base "base ($SUITE, ${torch_pins[*]}) built" make_base
fi

# --- The image, from the repository's Dockerfile as it is -------------------------------------
step image "image built from docker/Dockerfile" bah build --pull=never -f docker/Dockerfile \
    --build-arg BASE_IMAGE="$BASE" -t "$IMAGE" "${pip_mounts[@]}" .
bah rmi --prune >/dev/null  # the image this one replaced
say "in the image: $(grep -m1 '^torch ' "$out/image.log")"  # the Dockerfile's own import check
say "image size: $(bah images --format '{{.Size}}' "$IMAGE") (base: $(bah images --format '{{.Size}}' "$BASE"))"

# --- Run it as `docker run --rm -v $out:/mnt/out IMAGE ARGS...` would -------------------------
config=$(bah inspect --type image "$IMAGE")
field() { "$py" -c 'import json, sys; v = json.loads(sys.argv[1])["OCIv1"]["config"].get(sys.argv[2])
print("\0".join(v) if isinstance(v, list) else v or "", end="")' "$config" "$1"; }
user=$(field User)
workdir=$(field WorkingDir)
mapfile -d '' -t entrypoint < <(field Entrypoint)
mapfile -d '' -t cmd < <(field Cmd)
[[ $user == 1000 ]] || fail "the image's user is '$user', not 1000"
[[ ${entrypoint[*]} == /usr/local/bin/distseq-entrypoint ]] || fail "entrypoint: ${entrypoint[*]}"
# Docker names a container's host in its /etc/hosts; buildah does not, and torchrun's store
# listens on that name.
ctr=$(bah from --pull=never --add-host distseq-ci:127.0.0.1 "$IMAGE")
chown 1000:1000 "$out"  # as a user would make a mounted folder writable by the image's user

# docker_run NAME ARGS...: run the image with ARGS (its Cmd if none), output to $out/NAME.log; the
# peak use of /dev/shm while it ran goes to $out/NAME.shm (bytes).
docker_run() {
    local name=$1 sampler status=0
    shift
    (($#)) || set -- "${cmd[@]}"
    (
        peak=0
        while :; do
            used=$(df --output=used -B1 /dev/shm | tail -1)
            ((used > peak)) && peak=$used && echo "$peak" >"$out/$name.shm"
            sleep 0.05
        done
    ) &
    sampler=$!
    echo 0 >"$out/$name.shm"
    timeout -k 10 "$RUN_TIMEOUT" buildah --root "$CACHE/storage" --runroot /run/distseq-docker \
        run --hostname distseq-ci --user "$user" --workingdir "$workdir" -v "$out:/mnt/out" \
        "$ctr" -- "${entrypoint[@]}" "$@" >"$out/$name.log" 2>&1 || status=$?
    kill "$sampler"
    wait "$sampler" 2>/dev/null || true
    if ((status)); then
        tail -40 "$out/$name.log" >&2
        fail "docker run IMAGE $* exited $status"
    fi
}
expect_out() {  # expect_out NAME TEXT: the run's output contains TEXT
    grep -qF -- "$2" "$out/$1.log" || { cat "$out/$1.log" >&2; fail "$1: no '$2' in its output"; }
}
shm() { echo "$(($(cat "$out/$1.shm") / 1024))"; }

t0=$SECONDS
# The entrypoint: no arguments gives the Cmd (--help); a distseq command, `distseq ...`,
# `torchrun ...` and `python ...` all pass their arguments through as they are.
docker_run help
expect_out help "usage: distseq"
docker_run help2 distseq --help
expect_out help2 "usage: distseq"
docker_run args python -c 'import os, sys; print("uid", os.getuid(), "args", sys.argv[1:])' 'a b' '' c
expect_out args "uid 1000 args ['a b', '', 'c']"
# The demo at a tiny size (data.num_workers=1: batches cross /dev/shm), three 2-step trainings.
docker_run demo demo --out /mnt/out/demo --train-sequences 8 --val-sequences 4 train.steps=2 \
    data.batch_size=2
expect_out demo "recall a cue"
# Two ranks of FSDP2 on the CPU (gloo) under torchrun, from the demo's shards, then an export.
docker_run torchrun torchrun --standalone --nproc_per_node=2 -m distseq train \
    /mnt/out/demo/end_to_end/config.yaml train.out_dir=/mnt/out/fsdp parallel.mode=fsdp
expect_out torchrun "step 2: loss"
docker_run export distseq export /mnt/out/fsdp --out /mnt/out/model.pt
say "runs in the image: $((SECONDS - t0)) s"

# --- What they left in the mounted folder, checked from outside -------------------------------
for run in demo/per_frame demo/tbptt demo/end_to_end fsdp; do
    [[ $(cat "$out/$run/checkpoints/latest" 2>/dev/null) == step_00000002 ]] ||
        fail "$run: no checkpoint of step 2 (checkpoints/latest)"
    [[ -d $out/$run/checkpoints/step_00000002 ]] || fail "$run: checkpoints/step_00000002 missing"
    grep -q '"step": 2' "$out/$run/metrics.jsonl" 2>/dev/null || fail "$run: metrics.jsonl has no step 2"
done
[[ -s $out/model.pt ]] || fail "distseq export wrote no model.pt"
foreign=$(find "$out"/demo "$out"/fsdp "$out"/model.pt ! -uid 1000 | head -3)
[[ -z $foreign ]] || fail "files not owned by UID 1000: $foreign"
say "checkpoints, metrics.jsonl and model.pt written to the mounted folder, all owned by UID 1000"
say "peak /dev/shm use ($SHM, Docker's default): demo $(shm demo) KiB, torchrun 2 ranks $(shm torchrun) KiB"
say "passed in $((SECONDS - start)) s"
rm -rf "$out"
