//! Human-readable formatting of counts, rates, latencies and byte sizes, shared by the table and
//! the plot. All functions accept any `f64` and never panic: non-finite values print as `-`.

/// `987.3`, `12.3k`, `123.4k`, `1.23M`, `4.56G`.
pub fn count(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let sign = if v < 0.0 { "-" } else { "" };
    let a = v.abs();
    // Pick the unit after rounding so that 999_960 prints as `1.00M`, not `1000.0k`.
    let s = if round_to(a, 1) < 1e3 {
        format!("{a:.1}")
    } else if round_to(a / 1e3, 1) < 1e3 {
        format!("{:.1}k", a / 1e3)
    } else if round_to(a / 1e6, 2) < 1e3 {
        format!("{:.2}M", a / 1e6)
    } else {
        format!("{:.2}G", a / 1e9)
    };
    format!("{sign}{s}")
}

/// Like [`count`] but without a fractional part for small integers: `0`, `12`, `1.5k`.
/// Used for axis ticks, where `20000.0` would be noise.
pub fn axis_count(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let a = v.abs();
    if a < 1e3 && (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else if (1e3..1e6).contains(&a) && ((a / 1e3) - (a / 1e3).round()).abs() < 1e-9 {
        format!("{:.0}k", v / 1e3)
    } else if (1e6..1e9).contains(&a) && ((a / 1e6) - (a / 1e6).round()).abs() < 1e-9 {
        format!("{:.0}M", v / 1e6)
    } else {
        count(v)
    }
}

/// A latency given in microseconds: `3.2µs`, `812µs`, `1.52ms`, `15.2ms`, `152ms`, `1.52s`.
pub fn latency_us(us: f64) -> String {
    if !us.is_finite() {
        return "-".into();
    }
    let a = us.abs();
    if round_to(a, 1) < 10.0 {
        format!("{us:.1}µs")
    } else if round_to(a, 0) < 1e3 {
        format!("{us:.0}µs")
    } else if round_to(a / 1e3, 0) < 1e3 {
        format!("{}ms", three_digits(us / 1e3))
    } else {
        format!("{}s", three_digits(us / 1e6))
    }
}

/// A byte size: `350B`, `1.2KiB`, `12.5MiB`.
pub fn bytes(b: f64) -> String {
    if !b.is_finite() {
        return "-".into();
    }
    let a = b.abs();
    if round_to(a, 0) < 1024.0 {
        format!("{b:.0}B")
    } else if round_to(a / 1024.0, 1) < 1024.0 {
        format!("{:.1}KiB", b / 1024.0)
    } else if round_to(a / (1024.0 * 1024.0), 1) < 1024.0 {
        format!("{:.1}MiB", b / (1024.0 * 1024.0))
    } else {
        format!("{:.1}GiB", b / (1024.0 * 1024.0 * 1024.0))
    }
}

/// A fraction in `0..=1` as a percentage with one decimal: `2.1%`.
pub fn percent(frac: f64) -> String {
    if !frac.is_finite() {
        return "-".into();
    }
    format!("{:.1}%", frac * 100.0)
}

/// A share in `0..=1` as a whole percentage; tiny non-zero shares print as `<1%`.
pub fn share(frac: f64) -> String {
    if !frac.is_finite() {
        return "-".into();
    }
    let p = frac * 100.0;
    if p > 0.0 && p < 0.5 {
        "<1%".into()
    } else {
        format!("{p:.0}%")
    }
}

/// A generic value (workload-specific extra counters): rates and counts get [`count`], small
/// integers print bare, other small values with two decimals.
pub fn generic(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    if v.abs() >= 1e3 {
        count(v)
    } else if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// Three significant digits for values in `1..1000` (after unit scaling): `1.52`, `15.2`, `152`.
fn three_digits(v: f64) -> String {
    let a = v.abs();
    if round_to(a, 2) < 10.0 {
        format!("{v:.2}")
    } else if round_to(a, 1) < 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

fn round_to(v: f64, decimals: i32) -> f64 {
    let m = 10f64.powi(decimals);
    (v * m).round() / m
}

/// Column header for an `extra` counter key: `new_order_tps` -> `NewOrder/s`,
/// `payment_per_s` -> `Payment/s`; other keys are shown as they are.
pub fn extra_header(key: &str) -> String {
    let rate_prefix = key.strip_suffix("_tps").or_else(|| key.strip_suffix("_per_s")).filter(|p| !p.is_empty());
    match rate_prefix {
        Some(prefix) => {
            let camel: String = prefix
                .split(['_', '-'])
                .filter(|w| !w.is_empty())
                .map(|w| {
                    let mut cs = w.chars();
                    match cs.next() {
                        Some(c) => c.to_uppercase().chain(cs).collect::<String>(),
                        None => String::new(),
                    }
                })
                .collect();
            format!("{camel}/s")
        }
        None => key.to_string(),
    }
}

/// Whether an `extra` key names a rate (formatted like throughput).
pub fn extra_is_rate(key: &str) -> bool {
    key.ends_with("_tps") || key.ends_with("_per_s")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts() {
        assert_eq!(count(0.0), "0.0");
        assert_eq!(count(987.34), "987.3");
        assert_eq!(count(999.96), "1.0k");
        assert_eq!(count(12_345.0), "12.3k");
        assert_eq!(count(123_400.0), "123.4k");
        assert_eq!(count(999_960.0), "1.00M");
        assert_eq!(count(1_234_000.0), "1.23M");
        assert_eq!(count(f64::NAN), "-");
        assert_eq!(axis_count(20_000.0), "20k");
        assert_eq!(axis_count(2_500.0), "2.5k");
        assert_eq!(axis_count(0.0), "0");
    }

    #[test]
    fn latencies() {
        assert_eq!(latency_us(3.21), "3.2µs");
        assert_eq!(latency_us(812.4), "812µs");
        assert_eq!(latency_us(999.7), "1.00ms");
        assert_eq!(latency_us(1520.0), "1.52ms");
        assert_eq!(latency_us(15_240.0), "15.2ms");
        assert_eq!(latency_us(152_400.0), "152ms");
        assert_eq!(latency_us(1_520_000.0), "1.52s");
    }

    #[test]
    fn sizes_and_shares() {
        assert_eq!(bytes(350.0), "350B");
        assert_eq!(bytes(1229.0), "1.2KiB");
        assert_eq!(percent(0.021), "2.1%");
        assert_eq!(share(0.8), "80%");
        assert_eq!(share(0.001), "<1%");
        assert_eq!(generic(3.0), "3");
        assert_eq!(generic(0.126), "0.13");
    }

    #[test]
    fn extra_headers() {
        assert_eq!(extra_header("new_order_tps"), "NewOrder/s");
        assert_eq!(extra_header("payment_per_s"), "Payment/s");
        assert_eq!(extra_header("retries"), "retries");
        assert_eq!(extra_header("_tps"), "_tps");
    }
}
