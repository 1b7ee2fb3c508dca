//! Bytes and counts as people read them. One rounding rule for every unit:
//! to the nearest shown digit, halves away from zero, in integer arithmetic.

use crate::units::Bytes;

/// `1234567` → `"1,234,567"`.
pub fn thousands(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (idx, ch) in digits.chars().enumerate() {
        if idx > 0 && (digits.len() - idx) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// `value / unit` with `decimals` decimals, rounded to nearest (halves up).
fn fixed(value: u64, unit: u64, decimals: u32) -> String {
    let scale = 10_u128.pow(decimals);
    let unit = u128::from(unit.max(1));
    let scaled = (u128::from(value) * scale + unit / 2) / unit;
    let whole = scaled / scale;
    let whole = thousands(u64::try_from(whole).unwrap_or(u64::MAX));
    if decimals == 0 {
        return whole;
    }
    let frac = scaled % scale;
    format!("{whole}.{frac:0width$}", width = decimals as usize)
}

/// GiB with two decimals, without the unit: `"38.75"`.
pub fn gib_number(bytes: Bytes) -> String {
    fixed(bytes.get(), Bytes::GIB, 2)
}

/// MiB with one decimal, without the unit: `"663.0"`.
pub fn mib_number(bytes: Bytes) -> String {
    fixed(bytes.get(), Bytes::MIB, 1)
}

/// `"38.75 GiB"`.
pub fn gib(bytes: Bytes) -> String {
    format!("{} GiB", gib_number(bytes))
}

/// `"663.0 MiB"`.
pub fn mib(bytes: Bytes) -> String {
    format!("{} MiB", mib_number(bytes))
}

/// GiB from 1 GiB up, MiB below: whichever reads better.
pub fn short(bytes: Bytes) -> String {
    if bytes.get() >= Bytes::GIB {
        gib(bytes)
    } else {
        mib(bytes)
    }
}

/// Exact bytes with thousands separators: `"1,234 B"`.
pub fn exact(bytes: Bytes) -> String {
    format!("{} B", thousands(bytes.get()))
}

/// A signed difference in the [`short`] unit: `"+1.5 MiB"`, `"−2.00 GiB"`.
pub fn signed(delta: i64) -> String {
    let magnitude = short(Bytes(delta.unsigned_abs()));
    if delta < 0 {
        format!("−{magnitude}")
    } else {
        format!("+{magnitude}")
    }
}

/// `part / whole` as a percentage with one decimal: `"12.5 %"`; `"–"` for
/// a zero whole.
pub fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "–".to_owned();
    }
    format!("{} %", fixed(part.saturating_mul(100), whole, 1))
}

/// Basis points (hundredths of a percent) as a percentage: `"2.50 %"`.
pub fn percent_bp(bp: u32) -> String {
    format!("{}.{:02} %", bp / 100, bp % 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_rounds_to_nearest_with_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(gib(Bytes(Bytes::GIB * 3 / 2)), "1.50 GiB");
        // 38.745 GiB rounds up, as does 663.05 MiB.
        assert_eq!(
            gib(Bytes((38_745 * Bytes::GIB).div_ceil(1000))),
            "38.75 GiB"
        );
        assert_eq!(gib(Bytes(38_745 * Bytes::GIB / 1000 - 1)), "38.74 GiB");
        assert_eq!(mib(Bytes((66_305 * Bytes::MIB).div_ceil(100))), "663.1 MiB");
        assert_eq!(gib(Bytes(1200 * Bytes::GIB)), "1,200.00 GiB");
        assert_eq!(short(Bytes(Bytes::GIB - 1)), "1,024.0 MiB");
        assert_eq!(short(Bytes(Bytes::GIB)), "1.00 GiB");
        assert_eq!(exact(Bytes(1024)), "1,024 B");
        assert_eq!(signed(-(Bytes::MIB as i64)), "−1.0 MiB");
        assert_eq!(signed(0), "+0.0 MiB");
        assert_eq!(percent(1, 8), "12.5 %");
        assert_eq!(percent(1, 0), "–");
        assert_eq!(gib(Bytes(u64::MAX)), "17,179,869,184.00 GiB");
    }
}
