//! A Fortran program on papirus' libpapi: gfortran (Debian) with fpapi.h.

use papirus_testkit::{Cc, debian_package, runs, skip};

use crate::common::{Lib, assert_ok, env, include_dir, run};

const PROGRAM: &str = r#"
#include "fpapi.h"
      program ftest
      implicit none
      integer check, es, code, n
      integer*8 values(2), t0, t1, v0, v1
      character*(PAPI_MAX_STR_LEN) name
      check = PAPI_VER_CURRENT
      call PAPIF_library_init(check)
      if (check .ne. PAPI_VER_CURRENT) stop 1
      es = PAPI_NULL
      call PAPIF_create_eventset(es, check)
      if (check .ne. PAPI_OK) stop 2
      call PAPIF_add_named_event(es, 'perf::TASK-CLOCK', check)
      if (check .ne. PAPI_OK) stop 3
      call PAPIF_event_name_to_code('perf::PAGE-FAULTS', code, check)
      if (check .ne. PAPI_OK) stop 4
      call PAPIF_add_event(es, code, check)
      if (check .ne. PAPI_OK) stop 5
      call PAPIF_event_code_to_name(code, name, check)
      if (name .ne. 'perf::PAGE-FAULTS') stop 6
      call PAPIF_num_events(es, n)
      if (n .ne. 2) stop 7
      call PAPIF_get_real_nsec(t0)
      call PAPIF_get_virt_usec(v0)
      call PAPIF_start(es, check)
      if (check .ne. PAPI_OK) stop 8
      call work()
      call PAPIF_stop(es, values, check)
      if (check .ne. PAPI_OK) stop 9
      call PAPIF_get_real_nsec(t1)
      call PAPIF_get_virt_usec(v1)
      if (values(1) .le. 0 .or. t1 .le. t0 .or. v1 .lt. v0) stop 10
      call PAPIF_add_event(es, PAPI_TOT_CYC, check)
      print *, 'task-clock', values(1), 'page-faults', values(2), 'add TOT_CYC', check
      end program

      subroutine work()
      implicit none
      double precision x
      integer i
      x = 0
      do i = 1, 20000000
        x = x + sqrt(dble(i))
      end do
      if (x .lt. 0) print *, x
      end subroutine
"#;

#[test]
fn gfortran_program_runs_on_papirus() {
    if let Err(e) = debian_package("gfortran", || runs("gfortran", &["--version"])) {
        skip(format!("gfortran is not available: {e}"));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = Cc::from_text(dir.path(), "ftest.F", PROGRAM)
        .arg("-ffixed-line-length-none")
        .arg(format!("-I{}", include_dir().display()))
        .arg(format!("-L{}", env().papirus_lib.display()))
        .arg("-lpapi")
        .build(dir.path(), "ftest");
    let r = run(&exe, Lib::Papirus, &[]);
    assert_ok("the Fortran program", &r);
    let out = String::from_utf8_lossy(&r.stdout);
    println!("{out}");
    assert!(out.contains("task-clock"), "{out}");
}
