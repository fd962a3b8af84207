//! Derived-event arithmetic: how a preset's value is computed from the
//! values of its native terms (PAPI's `DERIVED_ADD`, `DERIVED_SUB` and
//! `DERIVED_POSTFIX`).
//!
//! Arithmetic is exact integer arithmetic in `i128` (PAPI uses doubles, which
//! lose counts above 2^53); the result saturates into `i64`. Division
//! truncates toward zero, and a division by zero yields 0 rather than a panic.

use std::fmt;

use serde::Serialize;

/// The most native terms one derived event may have (PAPI's `PAPI_MAX_INFO_TERMS`).
pub const MAX_TERMS: usize = 12;

/// One token of a postfix expression.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Token {
    /// The value of the k-th native term (`Nk`).
    Term(usize),
    /// An integer literal.
    Literal(i64),
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/`
    Div,
}

/// A validated postfix expression such as `N0|N1|2|*|+|`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Postfix {
    tokens: Vec<Token>,
    text: String,
}

impl Postfix {
    /// Parses PAPI's `|`-separated postfix syntax for an expression over
    /// `terms` native terms. Rejects unknown tokens, references past the
    /// last term, and expressions that do not leave exactly one value.
    pub fn parse(text: &str, terms: usize) -> Result<Postfix, String> {
        let mut tokens = Vec::new();
        let mut depth = 0usize;
        for tok in text.split('|').filter(|t| !t.is_empty()) {
            let t = match tok {
                "+" => Token::Add,
                "-" => Token::Sub,
                "*" => Token::Mul,
                "/" => Token::Div,
                _ if tok.starts_with('N') => {
                    let k: usize = tok[1..].parse().map_err(|_| format!("bad term reference `{tok}`"))?;
                    if k >= terms {
                        return Err(format!("`{tok}` refers past the last of {terms} terms"));
                    }
                    Token::Term(k)
                }
                _ => Token::Literal(tok.parse().map_err(|_| format!("unknown postfix token `{tok}`"))?),
            };
            match t {
                Token::Term(_) | Token::Literal(_) => depth += 1,
                _ => {
                    if depth < 2 {
                        return Err(format!("operator `{tok}` lacks operands in `{text}`"));
                    }
                    depth -= 1;
                }
            }
            tokens.push(t);
        }
        if depth != 1 {
            return Err(format!("`{text}` leaves {depth} values on the stack, expected 1"));
        }
        Ok(Postfix { tokens, text: text.to_string() })
    }

    /// The tokens in order.
    pub fn tokens(&self) -> &[Token] {
        &self.tokens
    }

    /// Evaluates the expression over the terms' values.
    pub fn eval(&self, values: &[i64]) -> i64 {
        let mut stack: Vec<i128> = Vec::with_capacity(self.tokens.len());
        for t in &self.tokens {
            match *t {
                Token::Term(k) => stack.push(values.get(k).copied().unwrap_or(0).into()),
                Token::Literal(v) => stack.push(v.into()),
                op => {
                    // parse() guarantees two operands; stay total anyway.
                    let b = stack.pop().unwrap_or(0);
                    let a = stack.pop().unwrap_or(0);
                    stack.push(match op {
                        Token::Add => a.saturating_add(b),
                        Token::Sub => a.saturating_sub(b),
                        Token::Mul => a.saturating_mul(b),
                        _ => a.checked_div(b).unwrap_or(0),
                    });
                }
            }
        }
        saturate(stack.pop().unwrap_or(0))
    }
}

impl fmt::Display for Postfix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// How a preset combines its native terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Derivation {
    /// One term, its value as is (`NOT_DERIVED`).
    NotDerived,
    /// The sum of the terms (`DERIVED_ADD`).
    Add,
    /// The first term minus the others (`DERIVED_SUB`).
    Sub,
    /// A postfix expression (`DERIVED_POSTFIX`).
    Postfix(Postfix),
}

impl Derivation {
    /// PAPI's name of the derivation (`DERIVED_SUB`).
    pub fn papi_name(&self) -> &'static str {
        match self {
            Derivation::NotDerived => "NOT_DERIVED",
            Derivation::Add => "DERIVED_ADD",
            Derivation::Sub => "DERIVED_SUB",
            Derivation::Postfix(_) => "DERIVED_POSTFIX",
        }
    }

    /// Whether the value is computed from more than one term.
    pub fn is_derived(&self) -> bool {
        !matches!(self, Derivation::NotDerived)
    }

    /// The value from the terms' values (in term order).
    pub fn eval(&self, values: &[i64]) -> i64 {
        match self {
            Derivation::NotDerived => values.first().copied().unwrap_or(0),
            Derivation::Add => saturate(values.iter().map(|&v| i128::from(v)).sum()),
            Derivation::Sub => {
                let mut it = values.iter().map(|&v| i128::from(v));
                let first = it.next().unwrap_or(0);
                saturate(it.fold(first, |acc, v| acc - v))
            }
            Derivation::Postfix(p) => p.eval(values),
        }
    }

    /// The formula as text, with the term names filled in.
    pub fn formula(&self, terms: &[String]) -> String {
        match self {
            Derivation::NotDerived => terms.first().cloned().unwrap_or_default(),
            Derivation::Add => terms.join(" + "),
            Derivation::Sub => terms.join(" - "),
            Derivation::Postfix(p) => p.to_string(),
        }
    }
}

impl Serialize for Derivation {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.papi_name())
    }
}

fn saturate(v: i128) -> i64 {
    v.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postfix_matches_hand_arithmetic() {
        let p = Postfix::parse("N0|N1|2|*|+|N2|4|*|+|N3|8|*|+|", 4).unwrap();
        assert_eq!(p.eval(&[10, 20, 30, 40]), 10 + 40 + 120 + 320);
        let p = Postfix::parse("N0|N1|+|N2|-|N3|-|", 4).unwrap();
        assert_eq!(p.eval(&[100, 50, 30, 20]), 100);
        let p = Postfix::parse("N0|N1|/|", 2).unwrap();
        assert_eq!(p.eval(&[7, 2]), 3);
        assert_eq!(p.eval(&[7, 0]), 0, "division by zero yields 0");
    }

    #[test]
    fn postfix_rejects_malformed_expressions() {
        assert!(Postfix::parse("N0|N1|", 2).unwrap_err().contains("leaves 2 values"));
        assert!(Postfix::parse("N0|+|", 1).unwrap_err().contains("lacks operands"));
        assert!(Postfix::parse("N0|N3|+|", 2).unwrap_err().contains("refers past"));
        assert!(Postfix::parse("N0|N1|^|", 2).unwrap_err().contains("unknown postfix token"));
    }

    #[test]
    fn add_and_sub_are_exact_beyond_f64() {
        let big = (1i64 << 60) + 1;
        assert_eq!(Derivation::Sub.eval(&[big, 1]), 1i64 << 60);
        assert_eq!(Derivation::Add.eval(&[i64::MAX, 5]), i64::MAX, "saturates");
        assert_eq!(Derivation::Sub.eval(&[5, 7, 1]), -3);
        assert_eq!(Derivation::NotDerived.eval(&[42]), 42);
    }
}
