#!/usr/bin/env bash
# The default thread count (--threads 0): one per core this process may use. A narrower affinity mask
# (taskset) gives fewer, the processes an MPI launcher starts on one machine share its cores, and
# --threads N overrides both. Usage: threads_test.sh path/to/lingtrain
source "$(dirname "$0")/common.sh"

# threads_of CMD...: the pool size CMD (a `lingtrain version`) reports.
threads_of() { "$@" | sed -n 's/^threads: \([0-9]*\);.*/\1/p' | head -1; }

cores=$(threads_of "$bin" version)
cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # the affinity mask's CPUs
{ [ -n "$cores" ] && [ "$cores" -ge 1 ] && [ "$cores" -le "$cpus" ]; } ||
  fail "default: '$cores' threads for $cpus CPUs in the affinity mask"
"$bin" version | grep -Eq "^threads: $cores; this machine gives this process [0-9]+ cores? \([0-9]+ of [0-9]+ CPUs" ||
  fail "version does not say which cores it counted: $("$bin" version | grep threads)"
[ "$(threads_of "$bin" version --threads 3)" = 3 ] || fail "--threads 3 is not 3 threads"
if command -v taskset >/dev/null; then
  # The first CPU of this process's own mask (a container's cpuset need not hold CPU 0).
  first=$(taskset -cp $$ | sed 's/.*: //; s/[-,].*//')
  [ "$(threads_of taskset -c "$first" "$bin" version)" = 1 ] || fail "taskset -c $first: not 1 thread"
  [ "$(threads_of taskset -c "$first" "$bin" version --threads 2)" = 2 ] ||
    fail "taskset -c $first --threads 2: not 2 threads"
fi
share=$((cores / 2 > 0 ? cores / 2 : 1))
[ "$(MPI_LOCALNRANKS=2 threads_of "$bin" version)" = "$share" ] || fail "2 processes on this machine: not $share threads each"
[ "$(OMPI_COMM_WORLD_LOCAL_SIZE=64 threads_of "$bin" version)" = 1 ] || fail "64 processes on this machine: not 1 thread each"
if command -v mpiexec >/dev/null; then
  mpiexec -n 2 "$bin" version >ranks.txt 2>&1 || fail "mpiexec -n 2 version"
  [ "$(grep -c "^threads: $share;" ranks.txt)" = 2 ] || fail "mpiexec -n 2: each rank should take $share threads: $(cat ranks.txt)"
fi
finish threads_test
