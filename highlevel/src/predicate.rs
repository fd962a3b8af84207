//! Paradyn's predicates: guards on primitives, built from counters and
//! integer constants.
//!
//! The operators are those of Paradyn's predicate language: arithmetic
//! `+ - * / %`, comparisons `== != < <= > >=`, logic `&& || !`, unary minus
//! and parentheses. An expression used as a predicate is true when non-zero,
//! so `fooActive` alone means `fooActive != 0`. Arithmetic that would
//! overflow or divide by zero makes the whole predicate false rather than
//! panic inside instrumented code.

use std::collections::HashMap;
use std::sync::Arc;

use crate::timer::Counter;

/// An integer expression over counters and constants.
#[derive(Debug, Clone)]
pub enum Expr {
    /// A constant.
    Const(i64),
    /// A counter's current value.
    Counter(Arc<Counter>),
    /// Unary minus.
    Neg(Box<Expr>),
    /// Logical not: 1 when the operand is 0, else 0.
    Not(Box<Expr>),
    /// A binary operation.
    Bin(Op, Box<Expr>, Box<Expr>),
}

/// Binary operators, loosest binding first in the grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `||`
    Or,
    /// `&&`
    And,
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/`
    Div,
    /// `%`
    Rem,
}

impl Expr {
    /// The value, or `None` on overflow or division by zero.
    pub fn eval(&self) -> Option<i64> {
        Some(match self {
            Expr::Const(c) => *c,
            Expr::Counter(c) => c.get(),
            Expr::Neg(e) => e.eval()?.checked_neg()?,
            Expr::Not(e) => i64::from(e.eval()? == 0),
            Expr::Bin(op, a, b) => {
                // Short-circuit like C, so `p && q / p` is safe.
                let a = a.eval()?;
                match op {
                    Op::And if a == 0 => return Some(0),
                    Op::Or if a != 0 => return Some(1),
                    _ => {}
                }
                let b = b.eval()?;
                match op {
                    Op::Or | Op::And => i64::from(b != 0),
                    Op::Eq => i64::from(a == b),
                    Op::Ne => i64::from(a != b),
                    Op::Lt => i64::from(a < b),
                    Op::Le => i64::from(a <= b),
                    Op::Gt => i64::from(a > b),
                    Op::Ge => i64::from(a >= b),
                    Op::Add => a.checked_add(b)?,
                    Op::Sub => a.checked_sub(b)?,
                    Op::Mul => a.checked_mul(b)?,
                    Op::Div => a.checked_div(b)?,
                    Op::Rem => a.checked_rem(b)?,
                }
            }
        })
    }

    /// Builds `self op rhs`.
    pub fn op(self, op: Op, rhs: Expr) -> Expr {
        Expr::Bin(op, Box::new(self), Box::new(rhs))
    }
}

/// A guard: an expression read as true when non-zero.
#[derive(Debug, Clone)]
pub struct Predicate(Expr);

impl Predicate {
    /// A predicate from an expression.
    pub fn new(e: Expr) -> Self {
        Predicate(e)
    }

    /// Parses `text`, resolving names through `counters`.
    pub fn parse(text: &str, counters: &HashMap<String, Arc<Counter>>) -> Result<Self, ParseError> {
        let tokens = lex(text)?;
        let mut p = Parser { tokens, pos: 0, counters };
        let e = p.expr(0)?;
        match p.tokens.get(p.pos) {
            None => Ok(Predicate(e)),
            Some((at, t)) => {
                Err(ParseError { at: *at, what: format!("unexpected `{t}` after a complete expression") })
            }
        }
    }

    /// Whether the guard holds now; false when arithmetic fails.
    #[inline]
    pub fn holds(&self) -> bool {
        self.0.eval().is_some_and(|v| v != 0)
    }

    /// Runs `action` only when the guard holds; returns whether it ran.
    #[inline]
    pub fn guard(&self, action: impl FnOnce()) -> bool {
        let ok = self.holds();
        if ok {
            action();
        }
        ok
    }
}

/// A predicate that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("predicate syntax error at byte {at}: {what}")]
pub struct ParseError {
    /// Byte offset in the text.
    pub at: usize,
    /// What is wrong.
    pub what: String,
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(i64),
    Name(String),
    Sym(&'static str),
}

impl std::fmt::Display for Tok {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tok::Num(n) => write!(f, "{n}"),
            Tok::Name(n) => f.write_str(n),
            Tok::Sym(s) => f.write_str(s),
        }
    }
}

const SYMBOLS: [&str; 18] =
    ["||", "&&", "==", "!=", "<=", ">=", "<", ">", "+", "-", "*", "/", "%", "!", "(", ")", "=", "|"];

fn lex(text: &str) -> Result<Vec<(usize, Tok)>, ParseError> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() {
            let s = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            let n = text[s..i].parse().map_err(|_| ParseError {
                at: s,
                what: format!("`{}` does not fit in 64 bits", &text[s..i]),
            })?;
            out.push((s, Tok::Num(n)));
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let s = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'.') {
                i += 1;
            }
            out.push((s, Tok::Name(text[s..i].to_string())));
        } else {
            let sym = SYMBOLS.iter().find(|s| text[i..].starts_with(**s)).copied();
            match sym {
                Some("=") | Some("|") | None => {
                    let ch = text[i..].chars().next().unwrap_or('?');
                    let hint = match sym {
                        Some("=") => " (comparison is `==`)",
                        Some("|") => " (logical or is `||`)",
                        _ => "",
                    };
                    return Err(ParseError { at: i, what: format!("unexpected character `{ch}`{hint}") });
                }
                Some(s) => {
                    out.push((i, Tok::Sym(s)));
                    i += s.len();
                }
            }
        }
    }
    Ok(out)
}

struct Parser<'a> {
    tokens: Vec<(usize, Tok)>,
    pos: usize,
    counters: &'a HashMap<String, Arc<Counter>>,
}

fn binary(sym: &str) -> Option<(Op, u8)> {
    Some(match sym {
        "||" => (Op::Or, 1),
        "&&" => (Op::And, 2),
        "==" => (Op::Eq, 3),
        "!=" => (Op::Ne, 3),
        "<" => (Op::Lt, 4),
        "<=" => (Op::Le, 4),
        ">" => (Op::Gt, 4),
        ">=" => (Op::Ge, 4),
        "+" => (Op::Add, 5),
        "-" => (Op::Sub, 5),
        "*" => (Op::Mul, 6),
        "/" => (Op::Div, 6),
        "%" => (Op::Rem, 6),
        _ => return None,
    })
}

impl Parser<'_> {
    fn end_offset(&self) -> usize {
        self.tokens.last().map_or(0, |(at, t)| at + t.to_string().len())
    }

    /// Precedence climbing: operators binding tighter than `min` are taken here.
    fn expr(&mut self, min: u8) -> Result<Expr, ParseError> {
        let mut lhs = self.unary()?;
        while let Some((_, Tok::Sym(s))) = self.tokens.get(self.pos) {
            let Some((op, prec)) = binary(s) else { break };
            if prec <= min {
                break;
            }
            self.pos += 1;
            let rhs = self.expr(prec)?;
            lhs = lhs.op(op, rhs);
        }
        Ok(lhs)
    }

    fn unary(&mut self) -> Result<Expr, ParseError> {
        let Some((at, tok)) = self.tokens.get(self.pos).cloned() else {
            return Err(ParseError { at: self.end_offset(), what: "expression expected".into() });
        };
        self.pos += 1;
        match tok {
            Tok::Num(n) => Ok(Expr::Const(n)),
            Tok::Name(n) => match self.counters.get(&n) {
                Some(c) => Ok(Expr::Counter(c.clone())),
                None => Err(ParseError { at, what: format!("unknown counter `{n}`") }),
            },
            Tok::Sym("-") => Ok(Expr::Neg(Box::new(self.unary()?))),
            Tok::Sym("!") => Ok(Expr::Not(Box::new(self.unary()?))),
            Tok::Sym("(") => {
                let e = self.expr(0)?;
                match self.tokens.get(self.pos) {
                    Some((_, Tok::Sym(")"))) => {
                        self.pos += 1;
                        Ok(e)
                    }
                    _ => Err(ParseError { at, what: "unclosed `(`".into() }),
                }
            }
            Tok::Sym(s) => Err(ParseError { at, what: format!("expression expected before `{s}`") }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, i64)]) -> HashMap<String, Arc<Counter>> {
        pairs.iter().map(|(n, v)| (n.to_string(), Arc::new(Counter::new(*v)))).collect()
    }

    #[test]
    fn every_operator() {
        let e = env(&[("a", 6), ("b", 3), ("z", 0)]);
        let table: &[(&str, bool)] = &[
            ("a == 6", true),
            ("a == b", false),
            ("a != b", true),
            ("a != 6", false),
            ("b < a", true),
            ("a < b", false),
            ("b <= 3", true),
            ("b <= 2", false),
            ("a > b", true),
            ("b > a", false),
            ("a >= 6", true),
            ("a >= 7", false),
            ("a + b == 9", true),
            ("a - b == 3", true),
            ("a * b == 18", true),
            ("a / b == 2", true),
            ("a % 4 == 2", true),
            ("-a == 0 - 6", true),
            ("!z", true),
            ("!a", false),
            ("a && b", true),
            ("a && z", false),
            ("z || b", true),
            ("z || z", false),
            ("a", true),
            ("z", false),
            ("1 + 2 * 3 == 7", true),
            ("(1 + 2) * 3 == 9", true),
            ("a > 1 && b > 1 || z", true),
            ("z && 1 / z", false),
            ("a / z", false),
            ("9223372036854775807 + 1", false),
        ];
        for (text, want) in table {
            let p = Predicate::parse(text, &e).unwrap_or_else(|err| panic!("{text}: {err}"));
            assert_eq!(p.holds(), *want, "{text}");
        }
    }

    #[test]
    fn syntax_errors_say_where() {
        let e = env(&[("a", 1)]);
        for (text, at, what) in [
            ("a = 1", 2, "`==`"),
            ("a | 1", 2, "`||`"),
            ("b > 1", 0, "unknown counter `b`"),
            ("(a > 1", 0, "unclosed"),
            ("a >", 3, "expression expected"),
            ("a 1", 2, "unexpected `1`"),
            ("a $ 1", 2, "unexpected character"),
            ("99999999999999999999", 0, "64 bits"),
        ] {
            let err = Predicate::parse(text, &e).unwrap_err();
            assert_eq!(err.at, at, "{text}: {err}");
            assert!(err.what.contains(what), "{text}: {err}");
        }
    }

    #[test]
    fn guard_follows_counter() {
        let e = env(&[("fooActive", 0)]);
        let p = Predicate::parse("fooActive > 0", &e).unwrap();
        let mut ran = 0;
        assert!(!p.guard(|| ran += 1));
        e["fooActive"].add(1);
        assert!(p.guard(|| ran += 1));
        assert_eq!(ran, 1);
    }
}
