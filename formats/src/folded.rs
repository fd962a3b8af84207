//! Folded stacks: one line per distinct stack, frames from the root joined
//! by `;`, then a space and the stack's integer weight
//! (`main;solve;kernel 1234`).
//!
//! Readers split frames at every `;` and take the weight after the last
//! space, skip lines with weight 0 and truncate fractions; so a `;` in a
//! name (Rust's `[u8; 8]`) becomes `:`, line breaks and tabs become spaces,
//! and weights are integers.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::{self, Write};

/// A frame name as folded stacks can carry it: `;` becomes `:`, control
/// characters become spaces, and an empty name becomes `[unknown]`.
pub fn frame_name(name: &str) -> Cow<'_, str> {
    if name.is_empty() {
        return Cow::Borrowed("[unknown]");
    }
    crate::one_field(name, ';', ':')
}

/// `frames` (root first) joined by `;`, each as [`frame_name`] gives it.
pub(crate) fn join<S, F>(frames: S) -> String
where
    S: IntoIterator<Item = F>,
    F: AsRef<str>,
{
    let mut line = String::new();
    for (i, f) in frames.into_iter().enumerate() {
        if i > 0 {
            line.push(';');
        }
        line.push_str(&frame_name(f.as_ref()));
    }
    line
}

/// The folded lines of `stacks` (frames root first, weight), identical
/// stacks merged, zero weights left out, in sorted order.
pub fn lines<I, S, F>(stacks: I) -> BTreeMap<String, u64>
where
    I: IntoIterator<Item = (S, u64)>,
    S: IntoIterator<Item = F>,
    F: AsRef<str>,
{
    let mut merged = BTreeMap::new();
    for (frames, weight) in stacks {
        if weight == 0 {
            continue;
        }
        let mut line = join(frames);
        if line.is_empty() {
            line.push_str("[unknown]");
        }
        let w: &mut u64 = merged.entry(line).or_default();
        *w = w.saturating_add(weight);
    }
    merged
}

/// Writes `stacks` as folded lines (see [`lines`]).
pub fn write<W, I, S, F>(mut out: W, stacks: I) -> io::Result<()>
where
    W: Write,
    I: IntoIterator<Item = (S, u64)>,
    S: IntoIterator<Item = F>,
    F: AsRef<str>,
{
    for (line, weight) in lines(stacks) {
        writeln!(out, "{line} {weight}")?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_sorts_and_sanitizes() {
        let stacks = vec![
            (vec!["main", "solve", "kernel"], 5),
            (vec!["main", "io"], 0),
            (vec!["main", "solve", "kernel"], 2),
            (vec!["main", "<[u8; 8] as Debug>::fmt", "line\nbreak"], 1),
            (vec!["main", ""], 3),
        ];
        let mut out = Vec::new();
        write(&mut out, stacks).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "main;<[u8: 8] as Debug>::fmt;line break 1\nmain;[unknown] 3\nmain;solve;kernel 7\n"
        );
    }

    #[test]
    fn an_empty_stack_is_unknown_not_an_empty_line() {
        let l = lines([(Vec::<&str>::new(), 4)]);
        assert_eq!(l.into_iter().collect::<Vec<_>>(), vec![("[unknown]".to_string(), 4)]);
    }
}
