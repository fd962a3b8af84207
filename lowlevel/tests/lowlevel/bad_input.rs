//! Bad input is a clear error with its PAPI code, never a panic.

use papirus_lowlevel::{Code, Error, init};

use crate::util::serial;

#[test]
fn bad_input_is_a_clear_error() {
    let _g = serial();
    let lib = init().unwrap();
    let mut s = lib.event_set();

    let e = s.add_named("task-clok").unwrap_err();
    assert_eq!(e.code(), Code::Enoevnt);
    assert!(e.to_string().contains("did you mean `task-clock`"), "{e}");
    let e = s.add_named("PAPI_TOT_CY").unwrap_err();
    assert!(e.to_string().contains("`PAPI_TOT_CYC`"), "{e}");
    let e = s.add_named("nosuchpmu/event=1/").unwrap_err();
    assert_eq!(e.code(), Code::Enoevnt, "{e}");

    for code in [0x8000_0fffu32, 0x4000_0000 | 0x3fff_fffe, 0x0000_0007] {
        let e = s.add_code(code).unwrap_err();
        assert!(matches!(e, Error::NoSuchCode { .. }), "{e}");
        assert_eq!(e.code(), Code::Enoevnt);
        assert!(e.to_string().contains(&format!("{code:#010x}")), "{e}");
    }

    let e = s.attach(4_000_000).unwrap_err();
    assert_eq!(e.code(), Code::Esys);
    assert!(e.to_string().contains("no process or thread 4000000"), "{e}");

    let cpus = lib.machine().cpus as u32;
    let e = s.set_cpu(Some(cpus)).unwrap_err();
    assert_eq!(e.code(), Code::Einval);
    assert!(e.to_string().contains(&format!("CPU {cpus} does not exist")), "{e}");

    let e = s.start().unwrap_err();
    assert!(matches!(e, Error::EmptySet), "{e}");
    assert!(e.to_string().contains("add at least one event"), "{e}");
    assert_eq!(e.code(), Code::Einval);
}
