#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Several "hosts" on one machine: network namespaces, each with its own network stack, joined by a bridge.
#
#   netns.sh hold N    creates N host namespaces and prints "ready TAG" once they are up, then waits; on
#                      SIGTERM, SIGINT, its parent exiting (the test, however it ended) or any other exit it
#                      kills every process in them and deletes them (trap on EXIT INT TERM).
#   netns.sh down TAG  the same teardown, for a holder that was killed with SIGKILL.
#   netns.sh check TAG exits 0 when nothing of TAG remains (namespaces, links, processes), else names it.
#
# State (the namespaces' inodes, to find their processes) lives in $TMPDIR/titan-mh-TAG.inodes until a
# clean check removes it; the tests point TMPDIR at a folder of their own.
#
# Host k (0-based) is namespace titan-mh-TAG-k with interface tn0 at 198.18.0.(k+1)/24 and
# fd00:7e57::(k+1)/64, and loopback up.
# The bridge and every veth end sit in a namespace of their own (titan-mh-TAG-sw): the machine's own
# network namespace gets no link, route or address, so no packet can leave for a real network. The
# addresses come from 198.18.0.0/15, the range set aside for benchmarking networks (RFC 2544), and from
# the unique local range fd00::/8 (RFC 4193). TAG is the
# holder's PID, so two runs never clash. Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN).
set -u

prefix=titan-mh
state_dir=${TMPDIR:-/tmp}

die() {
  echo "netns.sh: $*" >&2
  exit 1
}

# Every process whose network namespace is one of the inodes in the state file.
processes_in() {
  local inodes=$1 pid ns
  for pid in /proc/[0-9]*; do
    ns=$(readlink "$pid/ns/net" 2>/dev/null) || continue
    for inode in $inodes; do
      [[ $ns == "net:[$inode]" ]] && echo "${pid#/proc/}"
    done
  done
}

teardown() {
  local tag=$1 state="$state_dir/$prefix-$1.inodes" inodes="" ns pids tries
  [[ -f $state ]] && inodes=$(cat "$state")
  # SIGTERM first (titan-run passes it to its ranks), then SIGKILL for whatever is left after 3 s.
  for signal in TERM KILL; do
    pids=$(processes_in "$inodes")
    [[ -z $pids ]] && break
    kill -"$signal" $pids 2>/dev/null
    for tries in $(seq 30); do
      [[ -z $(processes_in "$inodes") ]] && break
      sleep 0.1
    done
  done
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$prefix-$tag-"); do
    ip netns delete "$ns" 2>/dev/null
  done
}

hold() {
  local n=$1 tag=$$ k sw
  [[ $n =~ ^[1-9]$ ]] || die "expected 1..9 hosts, got '$n'"
  [[ $(id -u) == 0 ]] || die "expected to run as root to create network namespaces, got uid $(id -u). Run the multi-host tests as root (or in a container with CAP_SYS_ADMIN and CAP_NET_ADMIN)."
  local state="$state_dir/$prefix-$tag.inodes"
  : >"$state"
  trap 'teardown '"$tag" EXIT
  trap 'exit 143' TERM
  trap 'exit 130' INT
  sw=$prefix-$tag-sw
  ip netns add "$sw" || die "expected to create a network namespace ($sw), got the error above. The multi-host tests need root with CAP_SYS_ADMIN and CAP_NET_ADMIN (a container may need --privileged or --cap-add=SYS_ADMIN,NET_ADMIN)."
  stat -L -c %i "/run/netns/$sw" >>"$state"
  ip -n "$sw" link set lo up || die "expected to bring up loopback in $sw"
  ip -n "$sw" link add br0 type bridge || die "expected to create a bridge in $sw (is the bridge module available?)"
  ip -n "$sw" link set br0 up
  for ((k = 0; k < n; k++)); do
    local host=$prefix-$tag-$k
    ip netns add "$host" || die "expected to create the network namespace $host"
    stat -L -c %i "/run/netns/$host" >>"$state"
    ip -n "$host" link set lo up || die "expected to bring up loopback in $host"
    ip -n "$sw" link add "p$k" type veth peer name tn0 netns "$host" || die "expected a veth pair between $sw and $host"
    ip -n "$sw" link set "p$k" master br0 up
    ip -n "$host" addr add "198.18.0.$((k + 1))/24" dev tn0
    ip -n "$host" addr add "fd00:7e57::$((k + 1))/64" dev tn0 nodad  # usable at once: no duplicate detection
    ip -n "$host" link set tn0 up
  done
  # A veth end carries traffic once both ends are up (operstate UP); the bridge forwards at once (no STP).
  for ((k = 0; k < n; k++)); do
    local tries
    for tries in $(seq 100); do
      ip -n "$prefix-$tag-$k" -o link show tn0 | grep -q 'state UP' && break
      sleep 0.05
    done
  done
  echo "ready $tag"
  # Hold until told to stop, or until the parent (the test) is gone, whatever killed it.
  local parent=$PPID
  # (Reparenting tells, where kill -0 would not: a dead parent not yet reaped is still there.)
  while [[ $(cut -d' ' -f4 "/proc/$$/stat") == "$parent" ]]; do sleep 0.2; done
  exit 0
}

check() {
  local tag=$1 state="$state_dir/$prefix-$1.inodes" left=""
  [[ -f $state ]] || die "expected the state of run $tag in $state (the same TMPDIR as its holder), got none"
  local ns
  ns=$(ip netns list | awk '{print $1}' | grep -E "^$prefix-$tag-" | tr '\n' ' ')
  [[ -n $ns ]] && left+="namespaces $ns; "
  local links
  links=$(ip -o link show | grep -E "$prefix-$tag|tn0@" | awk -F': ' '{print $2}' | tr '\n' ' ')
  [[ -n $links ]] && left+="links in the machine's namespace: $links; "
  local pids
  pids=$( (processes_in "$(cat "$state")"; pgrep -f -- "$prefix-$tag-") | grep -v "^$$\$" | sort -u | tr '\n' ' ')
  [[ -n $pids ]] && left+="processes $pids; "
  [[ -z $left ]] || die "expected nothing of run $tag to remain, got: $left"
  rm -f "$state"
  echo "clean $tag"
}

case "${1:-}" in
  hold) hold "${2:-2}" ;;
  down) teardown "${2:?tag}" ;;
  check) check "${2:?tag}" ;;
  *) die "usage: netns.sh hold N | down TAG | check TAG" ;;
esac
