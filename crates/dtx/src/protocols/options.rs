//! Per-protocol options and protocol variants.
//!
//! A protocol declares its options ([`OptionSpec`]: a name, a type, a default and a help line) in
//! its registry entry. A user names a *variant* on the command line as `NAME[:KEY=VALUE]...`
//! (`2pl-waitdie:lock_wait_us=200`, `sundial:cache=none`); each variant is a run of its own, and
//! its full name is what the table and the JSON call it. [`Variant::parse`](crate::protocols::registry::Variant::parse) checks every key
//! against the protocol's options and every value against its type, so a typo is a one-line
//! error naming the options the protocol has, before anything runs.

use anyhow::bail;
use std::collections::BTreeMap;

/// The type of an option's value, with its bounds.
#[derive(Debug, Clone, Copy)]
pub enum OptionKind {
    Bool,
    /// An integer within `min..=max`.
    U64 {
        min: u64,
        max: u64,
    },
    /// A fraction or rate within `min..=max`.
    F64 {
        min: f64,
        max: f64,
    },
    /// One of the listed words.
    Choice(&'static [&'static str]),
}

/// One option a protocol understands.
#[derive(Debug, Clone, Copy)]
pub struct OptionSpec {
    pub name: &'static str,
    pub kind: OptionKind,
    /// The value when the variant does not set it, written as a user would write it.
    pub default: &'static str,
    pub help: &'static str,
}

impl OptionSpec {
    /// Parse `text` as this option's value.
    fn parse(&self, text: &str) -> anyhow::Result<OptionValue> {
        let bad =
            |why: String| anyhow::anyhow!("option `{}`: {why} (`{}`: {})", self.name, self.name, self.kind_help());
        Ok(match self.kind {
            OptionKind::Bool => match text {
                "true" | "on" | "yes" | "1" => OptionValue::Bool(true),
                "false" | "off" | "no" | "0" => OptionValue::Bool(false),
                _ => return Err(bad(format!("`{text}` is not on or off"))),
            },
            OptionKind::U64 { min, max } => {
                let v: u64 = text.parse().map_err(|_| bad(format!("`{text}` is not a whole number")))?;
                if !(min..=max).contains(&v) {
                    return Err(bad(format!("{v} is out of range")));
                }
                OptionValue::U64(v)
            }
            OptionKind::F64 { min, max } => {
                let v: f64 = text.parse().map_err(|_| bad(format!("`{text}` is not a number")))?;
                if !(min..=max).contains(&v) {
                    return Err(bad(format!("{v} is out of range")));
                }
                OptionValue::F64(v)
            }
            OptionKind::Choice(words) => match words.iter().find(|w| **w == text) {
                Some(w) => OptionValue::Choice(w),
                None => return Err(bad(format!("`{text}` is not a known value"))),
            },
        })
    }

    /// The type as a user reads it: `on|off`, `0..=1000000`, `none|reuse|request|hybrid`.
    pub fn kind_help(&self) -> String {
        match self.kind {
            OptionKind::Bool => "on|off".into(),
            OptionKind::U64 { min, max } => format!("{min}..={max}"),
            OptionKind::F64 { min, max } => format!("{min}..={max}"),
            OptionKind::Choice(words) => words.join("|"),
        }
    }
}

/// A parsed option value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OptionValue {
    Bool(bool),
    U64(u64),
    F64(f64),
    Choice(&'static str),
}

/// Every option of one protocol with its value: the defaults, overridden by the variant.
#[derive(Debug, Clone, Default)]
pub struct Options {
    values: BTreeMap<&'static str, OptionValue>,
}

impl Options {
    /// The defaults of `specs`, then `overrides` (`KEY=VALUE` strings) on top.
    pub fn parse(protocol: &str, specs: &'static [OptionSpec], overrides: &[&str]) -> anyhow::Result<Self> {
        let mut values = BTreeMap::new();
        for s in specs {
            let v = s.parse(s.default).unwrap_or_else(|e| panic!("protocol {protocol}: bad default: {e}"));
            values.insert(s.name, v);
        }
        for kv in overrides {
            let Some((key, text)) = kv.split_once('=') else {
                bail!("protocol `{protocol}`: `{kv}` is not KEY=VALUE (its options: {})", names(specs));
            };
            let Some(spec) = specs.iter().find(|s| s.name == key.trim()) else {
                bail!("protocol `{protocol}` has no option `{}` (its options: {})", key.trim(), names(specs));
            };
            let v = spec.parse(text.trim()).map_err(|e| anyhow::anyhow!("protocol `{protocol}`: {e}"))?;
            values.insert(spec.name, v);
        }
        Ok(Options { values })
    }

    fn get(&self, name: &str) -> OptionValue {
        // Protocols ask only for options they declared; a miss is a bug in the protocol.
        *self.values.get(name).unwrap_or_else(|| panic!("option `{name}` is not declared"))
    }

    /// Does the protocol declare option `name`?
    pub fn has(&self, name: &str) -> bool {
        self.values.contains_key(name)
    }

    pub fn bool(&self, name: &str) -> bool {
        match self.get(name) {
            OptionValue::Bool(b) => b,
            other => panic!("option `{name}` is {other:?}, not on/off"),
        }
    }

    pub fn u64(&self, name: &str) -> u64 {
        match self.get(name) {
            OptionValue::U64(v) => v,
            other => panic!("option `{name}` is {other:?}, not a whole number"),
        }
    }

    pub fn f64(&self, name: &str) -> f64 {
        match self.get(name) {
            OptionValue::F64(v) => v,
            other => panic!("option `{name}` is {other:?}, not a number"),
        }
    }

    pub fn choice(&self, name: &str) -> &'static str {
        match self.get(name) {
            OptionValue::Choice(v) => v,
            other => panic!("option `{name}` is {other:?}, not a choice"),
        }
    }
}

fn names(specs: &[OptionSpec]) -> String {
    if specs.is_empty() {
        return "none".into();
    }
    specs.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
}

/// The lines `dtx protocols --options NAME` prints.
pub fn describe(specs: &[OptionSpec]) -> Vec<String> {
    specs.iter().map(|s| format!("{:<18} {:<16} default {:<9} {}", s.name, s.kind_help(), s.default, s.help)).collect()
}

/// `NAME[:KEY=VALUE]...` split into the protocol's name and its overrides.
pub fn split_variant(text: &str) -> (&str, Vec<&str>) {
    let mut parts = text.split(':').map(str::trim);
    let name = parts.next().unwrap_or("");
    (name, parts.filter(|p| !p.is_empty()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPECS: &[OptionSpec] = &[
        OptionSpec { name: "wait_us", kind: OptionKind::U64 { min: 1, max: 100 }, default: "10", help: "h" },
        OptionSpec { name: "cache", kind: OptionKind::Choice(&["none", "reuse"]), default: "reuse", help: "h" },
        OptionSpec { name: "fast", kind: OptionKind::Bool, default: "on", help: "h" },
        OptionSpec { name: "ratio", kind: OptionKind::F64 { min: 0.0, max: 1.0 }, default: "0.8", help: "h" },
    ];

    #[test]
    fn defaults_then_overrides() {
        let o = Options::parse("p", SPECS, &[]).unwrap();
        assert_eq!((o.u64("wait_us"), o.choice("cache"), o.bool("fast"), o.f64("ratio")), (10, "reuse", true, 0.8));
        let o = Options::parse("p", SPECS, &["wait_us=20", "cache=none", "fast=off", "ratio=0.5"]).unwrap();
        assert_eq!((o.u64("wait_us"), o.choice("cache"), o.bool("fast"), o.f64("ratio")), (20, "none", false, 0.5));
    }

    #[test]
    fn an_unknown_option_names_the_protocols_options() {
        let e = Options::parse("p", SPECS, &["wiat_us=3"]).unwrap_err().to_string();
        assert_eq!(e, "protocol `p` has no option `wiat_us` (its options: wait_us, cache, fast, ratio)");
        let e = Options::parse("p", &[], &["x=1"]).unwrap_err().to_string();
        assert!(e.contains("its options: none"), "{e}");
    }

    #[test]
    fn a_bad_value_says_what_the_option_takes() {
        let e = Options::parse("p", SPECS, &["wait_us=0"]).unwrap_err().to_string();
        assert!(e.contains("out of range") && e.contains("1..=100"), "{e}");
        let e = Options::parse("p", SPECS, &["cache=lru"]).unwrap_err().to_string();
        assert!(e.contains("none|reuse"), "{e}");
        let e = Options::parse("p", SPECS, &["wait_us"]).unwrap_err().to_string();
        assert!(e.contains("not KEY=VALUE"), "{e}");
    }

    #[test]
    fn variants_split_into_name_and_overrides() {
        assert_eq!(split_variant("occ"), ("occ", vec![]));
        assert_eq!(split_variant("2pl-waitdie:lock_wait_us=200:x=1"), ("2pl-waitdie", vec!["lock_wait_us=200", "x=1"]));
    }
}
