#!/usr/bin/env bash
# Run README's CPU pipeline through a real one-node SLURM cluster on this host, and check it against a local run.
#
# Why: profiles/slurm is what users run on clusters; this proves it works with real daemons (munged,
# slurmctld, slurmd; select/cons_tres, no accounting), not a mock. Debian/Ubuntu, as root (it installs
# slurm-wlm and munge with apt-get and writes /etc/slurm/slurm.conf unless one not written by us exists).
#
#   tests/slurm/run_pipeline_on_localhost_slurm.sh [WORKDIR]      (default: a new directory under /tmp)
#
# Steps: install + start the cluster (idempotent) -> copy the workflow twice -> `snakemake --cores 2` in
# one copy (the reference) -> `snakemake --profile profiles/slurm` in the other, profile unchanged ->
# tests/slurm/check_slurm_run.py: every job of the SLURM run went through sbatch and completed in SLURM,
# and the databases equal the local run's (same files, columns and rows; durations present).
# Exit 0 only if all of that holds. Run by tests/test_slurm_cluster.py when OPPERF_SLURM_TEST=1.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
WORKDIR=${1:-$(mktemp -d /tmp/opperf-slurm.XXXXXX)}
PYTHON=${PYTHON:-$(command -v python)}
NODE=$(hostname -s)
MARK="# written by opperf tests/slurm/run_pipeline_on_localhost_slurm.sh"
say() { printf '[slurm-test %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }

if [ "$(id -u)" -ne 0 ]; then echo "run as root: it installs packages and starts the SLURM daemons" >&2; exit 2; fi
"$PYTHON" -c "import snakemake_executor_plugin_slurm" 2>/dev/null || {
  echo "$PYTHON lacks snakemake-executor-plugin-slurm (pip install snakemake-executor-plugin-slurm)" >&2; exit 2; }

# --- 1. packages ---------------------------------------------------------------------------------------
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  say "installing slurm-wlm and munge"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
fi

# --- 2. configuration: one node with all CPUs, cons_tres, no accounting ---------------------------------
if [ -f /etc/slurm/slurm.conf ] && ! grep -qF "$MARK" /etc/slurm/slurm.conf; then
  echo "/etc/slurm/slurm.conf exists and is not ours: refusing to overwrite a real cluster's configuration" >&2
  exit 2
fi
CPUS=$(nproc)
MEMORY_MB=$(( $(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo) - 1024 ))
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
cat > /etc/slurm/slurm.conf <<EOF
$MARK
ClusterName=opperf-test
SlurmctldHost=$NODE
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.log
ReturnToService=2
MinJobAge=600
NodeName=$NODE CPUs=$CPUS RealMemory=$MEMORY_MB State=UNKNOWN
PartitionName=opperf Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF

# --- 3. daemons (started once; a second run reuses them) ------------------------------------------------
if ! pgrep -x munged >/dev/null; then
  say "starting munged"
  [ -s /etc/munge/munge.key ] || { mungekey --create --keyfile /etc/munge/munge.key 2>/dev/null \
      || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; }
  chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
  mkdir -p /run/munge && chown munge:munge /run/munge
  runuser -u munge -- /usr/sbin/munged
fi
munge -n | unmunge >/dev/null
if ! pgrep -x slurmctld >/dev/null; then say "starting slurmctld"; /usr/sbin/slurmctld; fi
if ! pgrep -x slurmd >/dev/null; then say "starting slurmd"; /usr/sbin/slurmd; fi
for _ in $(seq 60); do
  state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null || true)
  case "$state" in idle*|mixed*|allocated*) break ;; esac
  sleep 1
done
case "$state" in idle*|mixed*|allocated*) ;; *) echo "node $NODE did not come up (state '$state')" >&2; exit 1 ;; esac
say "cluster up: $(sinfo -h -o '%P %D nodes %c CPUs %m MB %T')"

# --- 4. the same workflow twice: a local reference run and the SLURM run --------------------------------
copy_workflow() {
  mkdir -p "$1"
  (cd "$REPO" && tar --exclude=__pycache__ -cf - Snakefile rules scripts opperf config templates resources envs \
      report profiles) | tar -xf - -C "$1"
}
rm -rf "$WORKDIR/local" "$WORKDIR/slurm"
copy_workflow "$WORKDIR/local"
copy_workflow "$WORKDIR/slurm"
export PATH="$(dirname "$PYTHON"):$PATH"

say "local reference run: snakemake --cores 2 (in $WORKDIR/local)"
(cd "$WORKDIR/local" && "$PYTHON" -m snakemake --cores 2 --quiet > "$WORKDIR/local.log" 2>&1) || {
  tail -30 "$WORKDIR/local.log" >&2; exit 1; }

say "SLURM run: snakemake --profile profiles/slurm (in $WORKDIR/slurm)"
start=$(date +%s)
# --slurm-keep-successful-logs only keeps the evidence the check reads (which jobs ran in which SLURM job).
(cd "$WORKDIR/slurm" && "$PYTHON" -m snakemake --profile profiles/slurm --slurm-keep-successful-logs \
    > "$WORKDIR/slurm.log" 2>&1) || {
  tail -40 "$WORKDIR/slurm.log" >&2; exit 1; }
say "SLURM run finished in $(( $(date +%s) - start )) s"

"$PYTHON" "$REPO/tests/slurm/check_slurm_run.py" --local "$WORKDIR/local" --slurm "$WORKDIR/slurm" \
  --snakemake-log "$WORKDIR/slurm.log" --jobcomp /var/log/slurm/jobcomp.log
