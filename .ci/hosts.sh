#!/usr/bin/env bash
# A test bed of hosts on this one machine, for the multi-host tests (marked `hosts`):
# N network namespaces ds-h1 ... ds-hN, each its own host with the address 10.77.0.K/24 on its
# eth0, joined by a bridge that lives in a namespace of its own (ds-net). This machine joins
# the bridge as ds-ctl (10.77.0.254 on dsv0, for SLURM's controller); its other interfaces are
# untouched, and no packet leaves it. Every host resolves every host's
# name (/etc/netns/ds-hK/hosts, which `ip netns exec` mounts over /etc/hosts), and a command
# run with `hosts.sh run K` sees ds-hK as its hostname (a UTS namespace of its own).
#
#   .ci/hosts.sh up N          make the bed (N >= 2), replacing one made before
#   .ci/hosts.sh run K CMD...  run CMD on host K, as host K
#   .ci/hosts.sh down          remove what `up` made, and only that
#
# Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN). What `up` made is listed in $STATE.
set -euo pipefail

PREFIX=ds-h
NET=ds-net
SUBNET=10.77.0
STATE=${DISTSEQ_HOSTS_STATE:-/tmp/distseq-hosts}

down() {
    [[ -f $STATE ]] || return 0
    while read -r ns; do
        ip netns del "$ns" 2>/dev/null || true  # its veth ends go with it
        rm -rf "/etc/netns/$ns"
    done <"$STATE"
    rm -f "$STATE"
    rmdir /etc/netns 2>/dev/null || true  # made by up where there was none
}

up() {
    local n=$1
    [[ $n =~ ^[0-9]+$ && $n -ge 2 && $n -le 200 ]] || { echo "hosts.sh up N: N in 2..200" >&2; exit 2; }
    down
    : >"$STATE"
    ip netns add "$NET" && echo "$NET" >>"$STATE"
    ip -n "$NET" link add dsbr0 type bridge
    ip -n "$NET" link set dsbr0 up
    local hosts="127.0.0.1 localhost"$'\n'"$SUBNET.254 ds-ctl"$'\n'
    for k in $(seq 1 "$n"); do hosts+="$SUBNET.$k $PREFIX$k"$'\n'; done
    for k in $(seq 1 "$n"); do
        local ns=$PREFIX$k
        ip netns add "$ns" && echo "$ns" >>"$STATE"
        ip link add "dsv$k" type veth peer name "dsv$k-br"
        ip link set "dsv$k" netns "$ns"
        ip link set "dsv$k-br" netns "$NET"
        ip -n "$NET" link set "dsv$k-br" master dsbr0
        ip -n "$NET" link set "dsv$k-br" up
        ip -n "$ns" link set "dsv$k" name eth0
        ip -n "$ns" addr add "$SUBNET.$k/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        mkdir -p "/etc/netns/$ns"
        printf '%s' "$hosts" >"/etc/netns/$ns/hosts"
        echo "$ns" >"/etc/netns/$ns/hostname"
    done
    # ds-ctl: this machine's one end of the bed, for daemons that serve the hosts from here
    # (SLURM's controller). Its peer is on the bridge, so it goes when ds-net is removed.
    ip link add dsv0 type veth peer name dsv0-br
    ip link set dsv0-br netns "$NET"
    ip -n "$NET" link set dsv0-br master dsbr0
    ip -n "$NET" link set dsv0-br up
    ip addr add "$SUBNET.254/24" dev dsv0
    ip link set dsv0 up
    echo "hosts.sh: $n hosts up: $PREFIX""1..$PREFIX$n at $SUBNET.1..$SUBNET.$n; this machine is ds-ctl at $SUBNET.254"
}

run() {
    local k=$1
    shift
    [[ -f $STATE ]] && grep -qx "$PREFIX$k" "$STATE" || { echo "hosts.sh: no host $PREFIX$k (run: hosts.sh up N)" >&2; exit 2; }
    # `ip netns exec` mounts a fresh /sys, which hides this machine's cgroup hierarchies, and
    # slurmd will not start without them: they are mounted again, in the command's own mount
    # namespace only.
    local cgroups
    cgroups=$(awk '$3 ~ /^cgroup2?$/ && $2 ~ /^\/sys\/fs\/cgroup/ { print $3, $2, $4 }' /proc/self/mounts)
    CGROUPS=$cgroups exec ip netns exec "$PREFIX$k" unshare --uts sh -c '
        hostname "$0" || exit
        printf "%s\n" "$CGROUPS" | while read -r type dir opts; do
            [ -n "$type" ] || continue
            [ "$dir" = /sys/fs/cgroup ] || mountpoint -q /sys/fs/cgroup ||
                mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup || exit
            mkdir -p "$dir" && mount -t "$type" -o "$opts" "$type" "$dir" || exit
        done || exit
        unset CGROUPS
        exec "$@"' "$PREFIX$k" "$@"
}

case ${1:-} in
up) up "${2:?hosts.sh up N}" ;;
down) down ;;
run) shift && run "$@" ;;
*) echo "usage: hosts.sh up N | down | run K CMD..." >&2 && exit 2 ;;
esac
