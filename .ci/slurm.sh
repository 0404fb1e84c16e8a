#!/usr/bin/env bash
# Single-node SLURM cluster for tests and CI (Debian/Ubuntu, as root, no systemd needed).
#
#   .ci/slurm.sh up       install (if missing) and start the daemons; wait until the node is idle
#   .ci/slurm.sh down     cancel jobs and stop the daemons (safe to call twice)
#   .ci/slurm.sh status   show the daemons, sinfo and squeue; exit 1 unless all are running
#
# After `up`:   source "${DISTSEQ_SLURM_DIR:-/tmp/distseq-slurm}/env"   (exports SLURM_CONF)
#
# Environment:
#   DISTSEQ_SLURM_DIR         state dir (default /tmp/distseq-slurm): slurm.conf, munge key,
#                             slurm state and spool, database, pid files and logs
#   DISTSEQ_SLURM_CPUS        CPUs of the node (default: nproc)
#   DISTSEQ_SLURM_TIMEOUT     seconds to wait for each daemon / the idle node (default 60)
#   DISTSEQ_SLURM_ACCOUNTING  1 (default): also run slurmdbd and a private MariaDB so that
#                             `sacct` works; 0: no accounting (saves ~25 s on a fresh machine)
#   DISTSEQ_SLURM_HOSTS       N > 0: also nodes ds-h1 ... ds-hN, one slurmd on each host of the
#                             bed (.ci/hosts.sh up, which must be up first), in a partition
#                             `hosts`; the controller is reached at the bed's ds-ctl address
#   DISTSEQ_SLURM_CTLD_PORT / _SLURMD_PORT / _DBD_PORT / _DB_PORT
#                             ports (defaults 6817 / 6818 / 6819 / 6820; MariaDB on 127.0.0.1)
#
# Why accounting is on by default: without slurmdbd `sacct` fails, so submitit sees every job as
# UNKNOWN, which it counts as "not finished". Results that were written still return, but
# `job.wait()` / `job.result()` on a job that died without writing a result never return, and
# `job.state` tells nothing. slurmdbd + MariaDB cost ~18 s of apt-get and ~6 s at first start.
#
# munged listens on the default socket (/run/munge/munge.socket.2): in Slurm 22.05 slurmctld's
# connection to slurmdbd ignores AuthInfo=socket=..., so a private socket breaks accounting. If a
# munged that is not ours already answers there, it is used as is and `down` leaves it running.
#
# The node is called "localhost" (slurmd -N localhost, NodeAddr=127.0.0.1) whatever the
# machine's hostname is, so the config works on any machine (with the bed's nodes, see NODE). The bed's nodes each run in their
# host's network namespace; they reach slurmctld, which runs here, at ds-ctl (10.77.0.254, the
# one end of the bed on this machine), and it reaches them at their addresses.
set -euo pipefail

DIR="${DISTSEQ_SLURM_DIR:-/tmp/distseq-slurm}"
CPUS="${DISTSEQ_SLURM_CPUS:-$(nproc)}"
TIMEOUT="${DISTSEQ_SLURM_TIMEOUT:-60}"
ACCOUNTING="${DISTSEQ_SLURM_ACCOUNTING:-1}"
CTLD_PORT="${DISTSEQ_SLURM_CTLD_PORT:-6817}"
SLURMD_PORT="${DISTSEQ_SLURM_SLURMD_PORT:-6818}"
DBD_PORT="${DISTSEQ_SLURM_DBD_PORT:-6819}"
DB_PORT="${DISTSEQ_SLURM_DB_PORT:-6820}"
HOSTS="${DISTSEQ_SLURM_HOSTS:-0}"
NODE=localhost
# Beside other nodes, slurmd 22.05 refuses a node called localhost ("Duplicated NodeHostName
# ds-h1"): then this machine's node takes the machine's short name, which submitit's jobs must
# resolve (their rendezvous is at the first node's name).
((HOSTS == 0)) || NODE=$(hostname -s)
BED=(); for ((k = 1; k <= HOSTS; k++)); do BED+=("ds-h$k"); done
CTL_ADDR=10.77.0.254  # ds-ctl in .ci/hosts.sh
HERE=$(cd "$(dirname "$0")" && pwd)
CONF="$DIR/slurm.conf"
DBD_CONF="$DIR/slurmdbd.conf"
MUNGE_DIR="$DIR/munge"
MUNGE_SOCKET=/run/munge/munge.socket.2
DB_DIR="$DIR/mysql"        # datadir
DB_RUN="$DIR/mysqld"       # socket, pid file and log, owned by the mysql user
DB_SOCKET="$DB_RUN/mysqld.sock"
DB_PASS=distseq-ci  # the database listens on 127.0.0.1 only and holds test accounting only

PACKAGES=(slurmctld slurmd slurm-client munge)
if [[ $ACCOUNTING == 1 ]]; then PACKAGES+=(slurmdbd mariadb-server); fi

log() { printf '[slurm.sh] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

need_root() {
    [[ $(id -u) -eq 0 ]] || die "must run as root (slurmd, munged and the daemons' users need it)"
}

# --- install ---------------------------------------------------------------------------------

missing_packages() {
    local p
    for p in "${PACKAGES[@]}"; do
        if [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true) != "install ok installed" ]]; then
            echo "$p"
        fi
    done
}

install_packages() {
    local missing
    missing=$(missing_packages | tr '\n' ' ')
    missing=${missing% }
    [[ -n $missing ]] || return 0
    command -v apt-get >/dev/null || die "missing packages: $missing; apt-get not found"
    log "installing: $missing"
    local t0=$SECONDS
    export DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes
    # Package lists may be absent or stale (404 on download): update once, then install.
    # Services do not start at install time where policy-rc.d forbids it or systemd is absent;
    # this script starts its own instances either way.
    apt-get update -qq
    # shellcheck disable=SC2086  # word splitting intended
    apt-get install -y -qq --no-install-recommends $missing >"$DIR/log/apt.log" 2>&1 ||
        { tail -n 30 "$DIR/log/apt.log" >&2; die "apt-get install failed (log: $DIR/log/apt.log)"; }
    log "installed in $((SECONDS - t0)) s"
}

# --- config ----------------------------------------------------------------------------------

real_memory_mb() {
    # 90 % of MemTotal, so that `--mem` requests validate; config_overrides keeps the node
    # from draining when this does not match what slurmd detects.
    awk '/^MemTotal:/ { printf "%d\n", $2 / 1024 * 0.9 }' /proc/meminfo
}

write_conf() {  # $1 = output path
    local accounting="AccountingStorageType=accounting_storage/none"
    if [[ $ACCOUNTING == 1 ]]; then
        accounting="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT"
    fi
    local ctld=localhost bed=""
    if ((HOSTS > 0)); then
        ctld="$NODE($CTL_ADDR)"  # slurmctld must find its own short hostname here
        local k
        for ((k = 1; k <= HOSTS; k++)); do
            bed+="NodeName=ds-h$k NodeAddr=10.77.0.$k CPUs=$CPUS RealMemory=$(real_memory_mb) State=UNKNOWN"$'\n'
        done
        bed+="PartitionName=hosts Nodes=ds-h[1-$HOSTS] MaxTime=INFINITE State=UP"
    fi
    cat >"$1" <<EOF
# Generated by .ci/slurm.sh: a test cluster on this machine. Edit the script, not this file.
ClusterName=distseq
SlurmctldHost=$ctld
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire=10: a requeued job may start again ~cred_expire s after it ends (default 120).
AuthInfo=cred_expire=10
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/slurmd-%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
# No cgroups: works in containers and without systemd.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
$accounting
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Fast scheduling and requeue (changing these needs a slurmctld restart, not reconfigure).
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=1
ReturnToService=2
SlurmdParameters=config_overrides
MaxJobCount=10000
MinJobAge=300
KillWait=5
InactiveLimit=0
Waittime=0
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$(real_memory_mb) State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
$bed
EOF
}

write_dbd_conf() {  # $1 = output path; slurmdbd reads slurmdbd.conf next to $SLURM_CONF
    cat >"$1" <<EOF
# Generated by .ci/slurm.sh. Edit the script, not this file.
AuthType=auth/munge
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=root
LogFile=$DIR/log/slurmdbd.log
PidFile=$DIR/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
}

# Install $1.new as $1 if it differs; return 0 when it changed.
replace_if_changed() {
    if [[ -f $1 ]] && cmp -s "$1.new" "$1"; then
        rm -f "$1.new"
        return 1
    fi
    mv "$1.new" "$1"
}

# --- processes -------------------------------------------------------------------------------

# Whether process $1 runs. A zombie does not: where PID 1 is not a prompt reaper (containers),
# stopped daemons linger as zombies for a while.
alive() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ ${stat:0:1} != Z ]]
}

# Print the pid in pid file $1 if that process is alive and is program $2, else fail.
live_pid() {
    local pid
    [[ -r $1 ]] || return 1
    pid=$(tr -dc '0-9' <"$1")
    [[ -n $pid ]] && alive "$pid" || return 1
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$2" ]] || return 1
    echo "$pid"
}

munged_pid() { live_pid "$MUNGE_DIR/munged.pid" munged; }
mariadbd_pid() { live_pid "$DB_RUN/mariadbd.pid" mariadbd; }
slurmdbd_pid() { live_pid "$DIR/run/slurmdbd.pid" slurmdbd; }
slurmctld_pid() { live_pid "$DIR/run/slurmctld.pid" slurmctld; }
slurmd_pid() { live_pid "$DIR/run/slurmd-${1:-$NODE}.pid" slurmd; }

stop_pid() {  # $1 = name, $2 = pid: SIGTERM, wait up to 20 s, then SIGKILL
    local name=$1 pid=$2 i
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < 200; i++)); do
        alive "$pid" || return 0
        sleep 0.1
    done
    log "$name did not stop in 20 s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
}

stop_named() {  # $1 = name of a *_pid function without the suffix
    local pid
    if pid=$("${1}_pid"); then stop_pid "$1" "$pid"; fi
}

wait_for() {  # $1 = what, rest = command that succeeds when ready; bounded by $TIMEOUT
    local what=$1 deadline=$((SECONDS + TIMEOUT))
    shift
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || fail "$what not ready after ${TIMEOUT} s"
        sleep 0.2
    done
}

show_logs() {
    local f
    for f in "$DIR/log/start.log" "$MUNGE_DIR/munged.log" "$DB_RUN/mariadbd.log" "$DIR/log/slurmdbd.log" \
        "$DIR/log/slurmctld.log" "$DIR/log/slurmd-$NODE.log" "${BED[@]/#/$DIR/log/slurmd-}"; do
        if [[ -f $f ]]; then
            printf '\n===== tail %s =====\n' "$f" >&2
            tail -n 25 "$f" >&2
        fi
    done
}

fail() { log "ERROR: $*"; show_logs; exit 1; }

# --- daemons ---------------------------------------------------------------------------------

munge_ok() { munge -n --socket="$MUNGE_SOCKET" | unmunge --socket="$MUNGE_SOCKET"; }

start_munged() {
    munged_pid >/dev/null && return 0
    if munge_ok >/dev/null 2>&1; then
        log "using the munged already listening on $MUNGE_SOCKET"
        return 0
    fi
    id munge >/dev/null 2>&1 || die "user 'munge' missing (is the munge package installed?)"
    # munged insists: its dirs owned by it and not writable by others; key readable only by it.
    install -d -o munge -g munge -m 0755 "$MUNGE_DIR" "$(dirname "$MUNGE_SOCKET")"
    if [[ ! -s $MUNGE_DIR/munge.key ]]; then
        log "creating munge key"
        (umask 077 && dd if=/dev/urandom of="$MUNGE_DIR/munge.key" bs=1024 count=1 status=none)
    fi
    chown munge:munge "$MUNGE_DIR/munge.key"
    chmod 0400 "$MUNGE_DIR/munge.key"
    rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
    log "starting munged (as user munge)"
    runuser -u munge -- /usr/sbin/munged \
        --socket="$MUNGE_SOCKET" --key-file="$MUNGE_DIR/munge.key" \
        --pid-file="$MUNGE_DIR/munged.pid" --log-file="$MUNGE_DIR/munged.log" \
        --seed-file="$MUNGE_DIR/munged.seed" || fail "munged failed to start"
    wait_for munged munge_ok
}

db_ok() { mariadb-admin --socket="$DB_SOCKET" ping; }

start_mariadb() {
    mariadbd_pid >/dev/null && return 0
    local user=root
    id mysql >/dev/null 2>&1 && user=mysql
    if [[ ! -d $DB_DIR/mysql ]]; then
        log "initialising MariaDB in $DB_DIR"
        rm -rf "$DB_DIR"
        mariadb-install-db --user="$user" --datadir="$DB_DIR" --skip-test-db \
            --auth-root-authentication-method=socket >"$DIR/log/mariadb-install.log" 2>&1 ||
            { tail -n 30 "$DIR/log/mariadb-install.log" >&2; die "mariadb-install-db failed"; }
    fi
    install -d -o "$user" -m 0755 "$DB_RUN"
    chown -R "$user:" "$DB_DIR"
    log "starting mariadbd (127.0.0.1:$DB_PORT)"
    # --no-defaults: ignore /etc/mysql (a system server's socket, port and datadir).
    setsid mariadbd --no-defaults --user="$user" --datadir="$DB_DIR" --socket="$DB_SOCKET" \
        --pid-file="$DB_RUN/mariadbd.pid" --bind-address=127.0.0.1 --port="$DB_PORT" \
        --log-error="$DB_RUN/mariadbd.log" --innodb-buffer-pool-size=64M \
        --skip-name-resolve </dev/null >/dev/null 2>&1 &
    wait_for mariadbd db_ok
    mariadb --socket="$DB_SOCKET" -e "
        CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" ||
        fail "could not create the slurm database user"
}

dbd_ok() { sacctmgr -n -P list cluster format=cluster; }

start_slurmdbd() {
    slurmdbd_pid >/dev/null && return 0
    log "starting slurmdbd"
    slurmdbd >>"$DIR/log/start.log" 2>&1 || fail "slurmdbd failed to start"
    wait_for slurmdbd dbd_ok
}

cluster_registered() { [[ $(sacctmgr -n -P list cluster format=cluster 2>/dev/null) == *distseq* ]]; }

node_state() { sinfo -h -N -n "${1:-$NODE}" -o '%T' 2>/dev/null | head -n 1 || true; }

# Whether process $1 runs in the network namespace of the bed's host $2 as it is now. A bed
# made again (hosts.sh up) leaves an earlier slurmd running in a namespace with no network.
on_host() {
    [[ $(readlink "/proc/$1/ns/net") == "net:[$(stat -L -c %i "/run/netns/$2" 2>/dev/null)]" ]]
}

any_bed_slurmd() {
    local node
    for node in "${BED[@]}"; do slurmd_pid "$node" && return 0; done
    return 1
}

stop_slurm() {
    local file node pid
    for file in "$DIR"/run/slurmd-*.pid; do  # every node's, also those of an earlier config
        node=${file##*/slurmd-} && node=${node%.pid}
        if pid=$(slurmd_pid "$node"); then stop_pid "slurmd $node" "$pid"; fi
    done
    stop_named slurmctld
    stop_named slurmdbd
}

# --- commands --------------------------------------------------------------------------------

# Wait until node $1 is idle (its slurmd, started at $2 (SECONDS), must stay alive).
wait_idle() {
    local node=$1 started=$2 deadline=$((SECONDS + TIMEOUT)) state="" resumed=0
    while ((SECONDS < deadline)); do
        # The daemons fork and write their pid files a moment after the launcher returns, so a
        # missing pid only means "exited" once they have had a few seconds.
        if ((SECONDS - started > 5)); then
            slurmctld_pid >/dev/null || fail "slurmctld exited"
            slurmd_pid "$node" >/dev/null || fail "slurmd on $node exited"
        fi
        state=$(node_state "$node")
        case $state in
            idle | mixed | allocated) return 0 ;;
            *drain* | down*)
                # A node left drained/down by an earlier run: ReturnToService does not undo DRAIN.
                if ((resumed == 0)); then
                    log "node $node is '$state': resuming it"
                    scontrol update NodeName="$node" State=RESUME >/dev/null 2>&1 || true
                    resumed=1
                fi
                ;;
        esac
        sleep 0.5
    done
    fail "node '$node' not idle after ${TIMEOUT} s (state: '${state:-none}')"
}

cmd_up() {
    need_root
    local t0=$SECONDS
    mkdir -p "$DIR"/{state,spool/slurmd-$NODE,run,log}
    local node
    ((HOSTS == 0)) || getent hosts "$NODE" >/dev/null ||
        die "DISTSEQ_SLURM_HOSTS=$HOSTS: this machine's name $NODE does not resolve (/etc/hosts)"
    for node in "${BED[@]}"; do
        mkdir -p "$DIR/spool/slurmd-$node"
        "$HERE/hosts.sh" run "${node#ds-h}" true 2>/dev/null ||
            die "DISTSEQ_SLURM_HOSTS=$HOSTS: no host $node on the bed (run .ci/hosts.sh up first)"
    done
    chmod 0755 "$DIR"
    install_packages
    local t1=$SECONDS

    write_conf "$CONF.new"
    local changed=0
    replace_if_changed "$CONF" && changed=1
    if [[ $ACCOUNTING == 1 ]]; then
        (umask 077 && write_dbd_conf "$DBD_CONF.new")
        replace_if_changed "$DBD_CONF" && changed=1
    else
        rm -f "$DBD_CONF"
    fi
    export SLURM_CONF="$CONF"
    printf 'export SLURM_CONF=%q\n' "$CONF" >"$DIR/env"
    if ((changed)) && { slurmctld_pid || slurmd_pid || slurmdbd_pid || any_bed_slurmd; } >/dev/null; then
        log "configuration changed: restarting the slurm daemons"
        stop_slurm
    fi

    start_munged
    if [[ $ACCOUNTING == 1 ]]; then
        start_mariadb
        start_slurmdbd
    else
        stop_named slurmdbd
        stop_named mariadbd
    fi
    if ! slurmctld_pid >/dev/null; then
        log "starting slurmctld"
        slurmctld >>"$DIR/log/start.log" 2>&1 || fail "slurmctld failed to start"
    fi
    if ! slurmd_pid >/dev/null; then
        log "starting slurmd -N $NODE"
        slurmd -N "$NODE" >>"$DIR/log/start.log" 2>&1 || fail "slurmd failed to start"
    fi
    local pid
    for node in "${BED[@]}"; do
        if pid=$(slurmd_pid "$node"); then
            on_host "$pid" "$node" && continue
            log "slurmd $node runs outside host $node (the bed was made again): restarting it"
            stop_pid "slurmd $node" "$pid"
        fi
        log "starting slurmd -N $node on host $node"
        "$HERE/hosts.sh" run "${node#ds-h}" slurmd -N "$node" >>"$DIR/log/start.log" 2>&1 ||
            fail "slurmd on $node failed to start"
    done

    local started=$SECONDS
    for node in "$NODE" "${BED[@]}"; do wait_idle "$node" "$started"; done
    if [[ $ACCOUNTING == 1 ]]; then  # slurmctld registers the cluster shortly after it starts
        local deadline=$((SECONDS + TIMEOUT))
        until cluster_registered || ((SECONDS >= deadline)); do sleep 0.5; done
    fi
    if [[ $ACCOUNTING == 1 ]] && ! cluster_registered; then
        fail "cluster 'distseq' not registered with slurmdbd after ${TIMEOUT} s"
    fi
    log "up in $((SECONDS - t0)) s (install $((t1 - t0)) s, start $((SECONDS - t1)) s):" \
        "node $NODE, partition debug${BED:+, nodes ${BED[*]} in partition hosts}, $CPUS CPUs, accounting $([[ $ACCOUNTING == 1 ]] && echo on || echo off)"
    log "to use it:  source $DIR/env"
    echo "export SLURM_CONF=$CONF"
}

cmd_down() {
    need_root
    if [[ -f $CONF ]] && slurmctld_pid >/dev/null; then
        export SLURM_CONF="$CONF"
        # Cancel jobs so that no slurmstepd or job processes outlive the daemons.
        if [[ -n $(squeue -h -o '%i' 2>/dev/null || true) ]]; then
            log "cancelling jobs"
            squeue -h -o '%i' 2>/dev/null | xargs -r scancel 2>/dev/null || true
            local i
            for ((i = 0; i < 30; i++)); do
                [[ -z $(squeue -h -o '%i' 2>/dev/null || true) ]] && break
                sleep 0.5
            done
        fi
    fi
    stop_slurm
    stop_named mariadbd
    if munged_pid >/dev/null; then
        stop_named munged
        rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
    fi
    log "down"
}

cmd_status() {
    local name pid rc=0 names=(munged)
    [[ -f $DBD_CONF ]] && names+=(mariadbd slurmdbd)  # as configured by the last `up`
    names+=(slurmctld slurmd)
    for name in "${names[@]}"; do
        if pid=$("${name}_pid"); then
            echo "$name: running (pid $pid)"
        elif [[ $name == munged ]] && munge_ok >/dev/null 2>&1; then
            echo "munged: running (not started by this script)"
        else
            echo "$name: stopped"
            rc=1
        fi
    done
    for name in "${BED[@]}"; do
        if pid=$(slurmd_pid "$name"); then echo "slurmd $name: running (pid $pid)"; else
            echo "slurmd $name: stopped"
            rc=1
        fi
    done
    if [[ -f $CONF ]] && slurmctld_pid >/dev/null; then
        export SLURM_CONF="$CONF"
        echo "SLURM_CONF=$CONF"
        sinfo || rc=1
        squeue || rc=1
    fi
    return "$rc"
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    *)
        echo "usage: $0 up|down|status" >&2
        exit 2
        ;;
esac
