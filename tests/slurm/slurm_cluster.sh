#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A Slurm cluster on one machine, for the tests: Debian's slurmctld, slurmd and munged, each host a network
# namespace of tests/multihost/netns.sh (its bridge, its private 198.18.0.0/24). Sourced by tests/slurm/slurm_test.sh.
#
#   host 0 "ctl"    munged (its socket a file, so every host reaches it) and slurmctld
#   host k "nodek"  slurmd, k = 1..NODES
#
# Each daemon runs in a UTS and mount namespace of its own: its hostname is the node's name (slurmctld and slurmd
# check theirs), /etc/hosts is bind-mounted with the cluster's names (what a cluster's DNS gives; titan resolves the
# first node of the job to find rank 0), and /sys/fs/cgroup gets a freezer hierarchy of its own (slurmd's cgroup
# plugin refuses to start without one, though the cluster tracks processes with proctrack/linuxproc). Nothing of
# the machine's own configuration is touched. Jobs start under slurmd and so inherit all of it.
#
# Functions (the caller sets SLURM_WORK, an empty folder, and NODES):
#   cluster_up       namespaces, configuration, daemons; returns once every node is idle
#   on_host K CMD... runs CMD on host K (its network, hostname and /etc/hosts)
#   slurm CMD...     a Slurm client command (sbatch, scontrol, squeue, ...) from host 0
#   cluster_down     stops everything (also the EXIT trap), then checks that nothing is left

cluster_fail() {
  echo "[slurm_cluster] $*" >&2
  exit 1
}

cluster_up() {
  [[ -n ${SLURM_WORK:-} && -d $SLURM_WORK ]] || cluster_fail "expected SLURM_WORK to name an empty folder, got '${SLURM_WORK:-}'"
  local netns="$(dirname "${BASH_SOURCE[0]}")/../multihost/netns.sh" hosts=$((NODES + 1)) k
  for program in slurmctld slurmd munged sbatch scontrol; do
    command -v "$program" >/dev/null ||
      cluster_fail "expected $program on PATH (Debian's slurmctld, slurmd, slurm-client and munge), got none. Run scripts/setup.sh."
  done
  export TMPDIR="$SLURM_WORK"  # netns.sh keeps its state there
  # The holder's parent is this shell: however the test ends, the holder sees it gone and tears everything down.
  coproc SLURM_HOLD { exec bash "$netns" hold "$hosts"; }
  local ready
  read -r -t 60 ready CLUSTER_TAG <&"${SLURM_HOLD[0]}" || cluster_fail "expected netns.sh to print 'ready TAG', got nothing"
  [[ $ready == ready ]] || cluster_fail "expected 'ready TAG' from netns.sh, got '$ready $CLUSTER_TAG'"
  trap cluster_down EXIT

  local conf="$SLURM_WORK/etc"
  mkdir -p "$conf" "$SLURM_WORK/state" "$SLURM_WORK/log"
  {
    echo "127.0.0.1 localhost"
    echo "198.18.0.1 ctl"
    for ((k = 1; k <= NODES; k++)); do echo "198.18.0.$((k + 1)) node$k"; done
  } >"$conf/hosts"
  head -c 1024 /dev/urandom >"$conf/munge.key"
  chmod 400 "$conf/munge.key"
  echo "CgroupPlugin=cgroup/v1" >"$conf/cgroup.conf"
  cat >"$conf/slurm.conf" <<EOF
ClusterName=titan
SlurmctldHost=ctl(198.18.0.1)
AuthType=auth/munge
AuthInfo=socket=$SLURM_WORK/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$SLURM_WORK/state
SlurmdSpoolDir=$SLURM_WORK/spool/%n
SlurmctldPidFile=$SLURM_WORK/slurmctld.pid
SlurmdPidFile=$SLURM_WORK/slurmd.%n.pid
SlurmctldLogFile=$SLURM_WORK/log/slurmctld.log
SlurmdLogFile=$SLURM_WORK/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
# Each node claims 2 CPUs of the machine's 2 (the nodes share them).
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
SlurmdTimeout=5
KillWait=15
MessageTimeout=5
MinJobAge=3600
NodeName=node[1-$NODES] NodeAddr=198.18.0.[2-$((NODES + 1))] CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=node[1-$NODES] Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF="$conf/slurm.conf"

  on_host 0 munged --force --socket="$SLURM_WORK/munge.socket" --key-file="$conf/munge.key" \
    --pid-file="$SLURM_WORK/munged.pid" --log-file="$SLURM_WORK/log/munged.log" --seed-file="$SLURM_WORK/munge.seed" ||
    cluster_fail "expected munged to start, got status $? ($SLURM_WORK/log/munged.log)"
  on_host 0 slurmctld -D >"$SLURM_WORK/log/slurmctld.out" 2>&1 &
  for ((k = 1; k <= NODES; k++)); do
    mkdir -p "$SLURM_WORK/spool/node$k"
    on_host "$k" slurmd -D >"$SLURM_WORK/log/slurmd.node$k.out" 2>&1 &
  done
  local tries idle
  for tries in $(seq 150); do
    idle=$(slurm sinfo -h -t idle -o '%D' 2>/dev/null | head -1)
    [[ $idle == "$NODES" ]] && return 0
    sleep 0.2
  done
  tail -n 20 "$SLURM_WORK"/log/*.out >&2
  cluster_fail "expected $NODES idle nodes within 30 s, got '${idle:-none}' (logs in $SLURM_WORK/log, above)"
}

on_host() {
  local k=$1 name=ctl
  shift
  ((k > 0)) && name="node$k"
  ip netns exec "titan-mh-$CLUSTER_TAG-$k" unshare --uts --mount bash -c '
    set -e
    hostname "$1"
    mount --bind "$2" /etc/hosts
    mount -t tmpfs cgroup /sys/fs/cgroup
    mkdir /sys/fs/cgroup/freezer
    mount -t cgroup -o freezer freezer /sys/fs/cgroup/freezer
    shift 2
    exec "$@"' _ "$name" "$SLURM_WORK/etc/hosts" "$@"
}

slurm() { on_host 0 "$@"; }

cluster_down() {
  local status=$?
  trap - EXIT
  if [[ -n ${SLURM_HOLD_PID:-} ]]; then
    kill "$SLURM_HOLD_PID" 2>/dev/null || true
    wait "$SLURM_HOLD_PID" 2>/dev/null || true  # the holder's teardown is done once it has exited
  fi
  if [[ -n ${CLUSTER_TAG:-} ]]; then
    bash "$(dirname "${BASH_SOURCE[0]}")/../multihost/netns.sh" check "$CLUSTER_TAG" >&2 || status=1
  fi
  # The logs stay for a failed run (the test printed where); a passed one leaves nothing behind.
  if ((status == 0)); then rm -rf "$SLURM_WORK"; else echo "[slurm_cluster] logs: $SLURM_WORK/log" >&2; fi
  exit "$status"
}
