//! Readable names for C++ (Itanium ABI) and Rust (legacy and v0) symbols.

use std::panic::{AssertUnwindSafe, catch_unwind};

/// Longest mangled name worth demangling; longer ones are kept as stored.
const MAX_MANGLED: usize = 4096;
/// Nesting depth beyond which the C++ demangler gives up, so a crafted
/// name cannot exhaust the stack.
const CPP_RECURSION_LIMIT: u32 = 128;
/// Longest demangled C++ name kept; template-heavy names can expand
/// exponentially through substitutions.
const MAX_DEMANGLED: usize = 16 * 1024;

/// The demangled form of `name`, or `None` when it is not mangled (C
/// names) or cannot be demangled within the limits above.
pub fn demangle(name: &str) -> Option<String> {
    if name.len() > MAX_MANGLED {
        return None;
    }
    if (name.starts_with("_R") || is_rust_legacy(name))
        && let Ok(d) = rustc_demangle::try_demangle(name)
    {
        // `{:#}` leaves out the hash suffix.
        return Some(format!("{d:#}"));
    }
    if name.starts_with("_Z") {
        return demangle_cpp(name);
    }
    None
}

/// Rust's legacy scheme is Itanium-shaped but ends every path with a
/// `17h<16 hex digits>E` hash segment (before any `.llvm.` suffix).
fn is_rust_legacy(name: &str) -> bool {
    let base = name.split('.').next().unwrap_or(name);
    let Some(body) = base.strip_prefix("_ZN").and_then(|b| b.strip_suffix('E')) else {
        return false;
    };
    body.len() >= 19 && {
        let tail = &body[body.len() - 19..];
        tail.starts_with("17h") && tail[3..].bytes().all(|b| b.is_ascii_hexdigit())
    }
}

fn demangle_cpp(name: &str) -> Option<String> {
    let parse = cpp_demangle::ParseOptions::default().recursion_limit(CPP_RECURSION_LIMIT);
    let print = cpp_demangle::DemangleOptions::new().recursion_limit(CPP_RECURSION_LIMIT);
    // The demangler is third-party code fed with file contents: a panic
    // inside it must cost one name, not the listing.
    catch_unwind(AssertUnwindSafe(|| {
        let sym = cpp_demangle::Symbol::new_with_options(name.as_bytes(), &parse).ok()?;
        let mut out = Bounded(String::new());
        sym.structured_demangle(&mut out, &print).ok()?;
        Some(out.0)
    }))
    .ok()
    .flatten()
}

/// A sink that refuses to grow past [`MAX_DEMANGLED`], which stops the
/// demangler early on names whose substitutions expand exponentially.
struct Bounded(String);

impl cpp_demangle::DemangleWrite for Bounded {
    fn write_string(&mut self, s: &str) -> std::fmt::Result {
        if self.0.len() + s.len() > MAX_DEMANGLED {
            return Err(std::fmt::Error);
        }
        self.0.push_str(s);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpp_rust_and_c() {
        assert_eq!(demangle("_ZN3foo3barEi").as_deref(), Some("foo::bar(int)"));
        assert_eq!(
            demangle("_ZNSt6vectorIiSaIiEE9push_backERKi").as_deref(),
            Some("std::vector<int, std::allocator<int> >::push_back(int const&)")
        );
        assert_eq!(demangle("_ZN4core3fmt5write17h0123456789abcdefE").as_deref(), Some("core::fmt::write"));
        assert_eq!(demangle("_RNvCs1234_7mycrate3foo").as_deref(), Some("mycrate::foo"));
        assert_eq!(demangle("main"), None);
        assert_eq!(demangle("_Z"), None);
        assert_eq!(demangle("_Zgarbage!!"), None);
    }

    #[test]
    fn pathological_names_are_refused() {
        // Deep nesting of pointer-to-pointer types: the limit stops it.
        let deep = format!("_Z1f{}i", "P".repeat(5000));
        assert_eq!(demangle(&deep), None);
        let nested = format!("_Z1f{}", "PFv".repeat(1000) + &"E".repeat(1000));
        assert_eq!(demangle(&nested), None);
        // A substitution bomb: level k is pair<level k-1, level k-1>, which
        // `S<k+1>_` names (`S_` is `f`, `S0_` is `std::pair`), so 30 levels would print 2^30 pairs.
        let bomb = |levels: u32| {
            let mut s = String::from("_Z1fISt4pairIiiE");
            for level in 0..levels {
                let sub = std::char::from_digit(level + 1, 36).unwrap().to_ascii_uppercase();
                s.push_str(&format!("S0_IS{sub}_S{sub}_E"));
            }
            s + "EvT_"
        };
        let small = demangle(&bomb(3)).expect("a valid mangled name");
        assert!(small.contains("std::pair<std::pair<std::pair<int, int>"), "{small}");
        let bomb = bomb(30);
        assert_eq!(demangle(&bomb), None);
    }
}
