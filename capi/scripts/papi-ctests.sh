#!/usr/bin/env bash
# Runs PAPI 7.0's own C tests (src/ctests of the PAPI distribution, fetched
# from Debian, never part of this repository) three ways and prints each
# test's verdict and the totals:
#   debian   built against Debian's papi.h, run on Debian's libpapi
#   papirus  built against papirus' papi.h, linked with papirus' libpapi
#   subst    the debian binaries run with papirus' libpapi first on
#            LD_LIBRARY_PATH (an existing PAPI binary switched unchanged)
#
# Usage: capi/scripts/papi-ctests.sh [WORKDIR]
#   Needs: cargo build --release -p papirus-capi; gcc; Debian's libpapi-dev
#   (installed with apt-get if missing); network access to deb.debian.org.
#   PAPIRUS_CTESTS_TIMEOUT (default 120) bounds each test in seconds;
#   PAPI_EVENTS_FOR_HL, when set, is PAPI_EVENTS for every test (e.g.
#   perf::TASK-CLOCK, so PAPI's high-level tests have an event here).
set -euo pipefail

here=$(cd "$(dirname "$0")/../.." && pwd)
lib="$here/target/release/libpapi.so"
inc="$here/capi/include"
timeout_s=${PAPIRUS_CTESTS_TIMEOUT:-120}
[ -f "$lib" ] || { echo "build papirus first: cargo build --release -p papirus-capi" >&2; exit 2; }
[ -f /usr/include/papi.h ] || apt-get install -y -q --no-install-recommends libpapi-dev >/dev/null

work=${1:-$(mktemp -d)}
mkdir -p "$work"
cd "$work"
tarball=papi_7.0.0.orig.tar.gz
sha=799dcc317a47da96beaeed445812ecb6ae49df7c0504a4569797c1f7d74c4fd2
if [ ! -d papi-7.0.0 ]; then
    [ -f $tarball ] || curl -sSfL -o $tarball "https://deb.debian.org/debian/pool/main/p/papi/$tarball"
    echo "$sha  $tarball" | sha256sum -c --quiet
    tar xzf $tarball
fi
src=$work/papi-7.0.0/src
mkdir -p subst-lib
ln -sf "$lib" subst-lib/libpapi.so.7.0

# The test programs of ctests/Makefile.recipies (MPI ones excluded: no MPI here).
tests="pthread_hl pthrtough pthrtough2 thrspecific profile_pthreads overflow_pthreads zero_pthreads
clockres_pthreads overflow3_pthreads locks_pthreads krentel_pthreads serial_hl serial_hl_ll_comb all_events
all_native_events branches calibrate case1 case2 cmpinfo code2name derived describe destroy disable_component
dmem_info eventname exeinfo failed_events first get_event_component inherit hwinfo johnmay2 low-level memory
realtime remove_events reset second tenth version virttime zero zero_flip zero_named fork fork2 exec exec2
forkexec forkexec2 forkexec3 forkexec4 fork_overflow exec_overflow child_overflow system_child_overflow
system_overflow burn zero_fork overflow overflow_force_software overflow_single_event overflow_twoevents
timer_overflow overflow2 overflow_index overflow_one_and_read overflow_allcounters profile
profile_force_software sprofile profile_twoevents byte_profile max_multiplex multiplex1 multiplex2 mendes-alt
sdsc-mpx sdsc2-mpx sdsc2-mpx-noreset sdsc4-mpx reset_multiplex multiplex1_pthreads multiplex3_pthreads kufrin
omp_hl zero_omp omptough zero_smp zero_shmem shlib earprofile data_range p4_lst_ins multiattach multiattach2
zero_attach attach3 attach2 attach_target attach_cpu attach_validate attach_cpu_validate
attach_cpu_sys_validate"

build() { # build DIR INCLUDE LINK...
    local dir=$1 incdir=$2; shift 2
    mkdir -p "$dir"
    local cflags=(-O1 -g -w -pthread -fopenmp -I"$incdir" -I"$src/testlib" -I"$src/ctests"
        -I"$src/validation_tests" -I"$src")
    # What the tests link: the test library, the loops, the validation
    # workloads and profil's helpers, as an archive (only what is used).
    local objs=()
    for f in testlib/test_utils testlib/do_loops testlib/clockcore ctests/prof_utils \
        validation_tests/flops_testcode validation_tests/instructions_testcode \
        validation_tests/branches_testcode validation_tests/busy_work validation_tests/display_error; do
        gcc "${cflags[@]}" -c "$src/$f.c" -o "$dir/${f##*/}.o" && objs+=("$dir/${f##*/}.o")
    done
    ar rcs "$dir/libctest.a" "${objs[@]}"
    for t in $tests; do
        local s=$t extra=()
        case $t in
            sdsc2-mpx) s=sdsc2; extra=(-DMPX) ;;
            sdsc2-mpx-noreset) s=sdsc2; extra=(-DMPX -DSTARTSTOP) ;;
            sdsc-mpx | sdsc4-mpx) extra=(-DMPX) ;;
            mendes-alt) extra=(-DMULTIPLEX) ;;
        esac
        gcc "${cflags[@]}" "${extra[@]}" "$src/ctests/$s.c" "$dir/libctest.a" "$@" -lm -ldl \
            -o "$dir/$t" 2>"$dir/$t.build" ||
            echo "build failed: $t (see $dir/$t.build)" >&2
    done
}

echo "building against Debian's papi.h and libpapi..." >&2
build debian /usr/include -lpapi
echo "building against papirus' papi.h and libpapi..." >&2
build papirus "$inc" -L"$here/target/release" -Wl,-rpath,"$work/subst-lib" -lpapi

verdict() { # verdict DIR TEST [LD_LIBRARY_PATH]
    local dir=$1 t=$2 llp=${3:-} out rc
    [ -x "$dir/$t" ] || { echo "NOBUILD"; return; }
    local log="$dir/$t.${llp:+subst.}out" pid
    # Each test runs in a session of its own (its id is the test's pid), so
    # whatever it forked and left behind, stopped under ptrace say, is
    # killed with it; the output goes to a file no child can hold open.
    (cd "$dir" && exec env ${llp:+LD_LIBRARY_PATH=$llp} ${PAPI_EVENTS_FOR_HL:+PAPI_EVENTS=$PAPI_EVENTS_FOR_HL} \
        setsid timeout -s KILL "$timeout_s" "./$t" TESTS_QUIET) >"$log" 2>&1 </dev/null &
    pid=$!
    wait "$pid" && rc=0 || rc=$?
    pkill -KILL -s "$pid" 2>/dev/null || true
    out=$(cat "$log")
    if [ $rc -eq 137 ]; then echo HANG
    elif [ $rc -gt 128 ]; then echo "CRASH($((rc - 128)))"
    elif grep -q "FAILED" <<<"$out"; then echo FAILED
    elif grep -q "SKIPPED" <<<"$out"; then echo SKIPPED
    elif [ $rc -eq 0 ] && grep -q "PASSED" <<<"$out"; then echo PASSED
    elif [ $rc -eq 0 ]; then echo "PASSED?"
    else echo FAILED
    fi
}

printf '%-26s %-10s %-10s %-10s\n' test debian papirus subst
declare -A count
for t in $tests; do
    d=$(verdict debian "$t")
    p=$(verdict papirus "$t")
    s=$(verdict debian "$t" "$work/subst-lib")
    printf '%-26s %-10s %-10s %-10s\n' "$t" "$d" "$p" "$s"
    count[debian.$d]=$(( ${count[debian.$d]:-0} + 1 ))
    count[papirus.$p]=$(( ${count[papirus.$p]:-0} + 1 ))
    count[subst.$s]=$(( ${count[subst.$s]:-0} + 1 ))
done
echo
for m in debian papirus subst; do
    line="$m:"
    for v in PASSED "PASSED?" SKIPPED FAILED HANG NOBUILD; do
        line+=" $v ${count[$m.$v]:-0}"
    done
    for k in "${!count[@]}"; do
        case $k in $m.CRASH*) line+=" ${k#*.} ${count[$k]}" ;; esac
    done
    echo "$line"
done
