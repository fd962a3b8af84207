//! Gives the shared library PAPI 7.0's SONAME, the name binaries linked
//! against Debian's libpapi ask the loader for, and writes `papi.pc`
//! (pkg-config; also as Debian's `papi-7.0.pc` and `papi-7.0.0.0.pc`)
//! beside the libraries.

use std::path::PathBuf;

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libpapi.so.7.0");
    // Overflow handlers, TLS destructors and the exit handler point into the
    // library: it must never be unloaded (dlclose) while they may run.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rerun-if-changed=build.rs");
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    // OUT_DIR is target/<profile>/build/<pkg>-<hash>/out: the profile directory is three up.
    let Some(profile_dir) = out.ancestors().nth(3) else { return };
    let pc = format!(
        "prefix={prefix}\nlibdir={libdir}\nincludedir={inc}\n\n\
         Name: papi\n\
         Description: PAPI 7.0's C interface served by papirus (perf_event, TSC clocks)\n\
         Version: 7.0.0.0\n\
         Libs: -L${{libdir}} -lpapi\n\
         Libs.private: -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc\n\
         Cflags: -I${{includedir}}\n",
        prefix = manifest.display(),
        libdir = profile_dir.display(),
        inc = manifest.join("include").display(),
    );
    // Debian's names too; each written only when it changes.
    for name in ["papi.pc", "papi-7.0.pc", "papi-7.0.0.0.pc"] {
        let path = profile_dir.join(name);
        if std::fs::read_to_string(&path).ok().as_deref() != Some(pc.as_str()) {
            let _ = std::fs::write(&path, &pc);
        }
    }
}
