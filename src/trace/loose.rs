//! Tolerant scalar readers for the serde visitors ([`super::raw`], the
//! stream's header fields): a value of an unexpected JSON type reads as
//! missing (`None`, or an empty count) instead of failing the whole file. The
//! fast path ([`super::plain`]) reads numbers as [`LooseInt`] and
//! [`LooseF64`] do.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// `value * 10 + digit`, or `None` past `u64::MAX`. The bound is compared,
/// not found by an overflowing multiply: on wasm32 a checked 64-bit multiply
/// is a call to a 128-bit multiply routine, and a trace has millions of
/// numbers.
pub(super) fn push_digit(value: u64, digit: u8) -> Option<u64> {
    const MAX_TENTH: u64 = u64::MAX / 10;
    const MAX_LAST: u64 = u64::MAX % 10;
    let digit = u64::from(digit);
    if value > MAX_TENTH || (value == MAX_TENTH && digit > MAX_LAST) {
        return None;
    }
    Some(value * 10 + digit)
}

/// `value * 10 - digit` for a number accumulated as a negative one (so that
/// `i64::MIN` fits), or `None` below `i64::MIN`; compared as [`push_digit`]
/// is.
pub(super) fn push_negative_digit(value: i64, digit: u8) -> Option<i64> {
    const MIN_TENTH: i64 = i64::MIN / 10;
    const MIN_LAST: i64 = i64::MIN % 10;
    let digit = i64::from(digit);
    if value < MIN_TENTH || (value == MIN_TENTH && -digit < MIN_LAST) {
        return None;
    }
    Some(value * 10 - digit)
}

/// Skips the rest of a list.
pub(super) fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

/// Skips the rest of an object.
fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

/// Implements the visit methods of a tolerant visitor that maps every JSON
/// type it does not list to `None`.
macro_rules! none_for_other_types {
    () => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            drain_seq(seq)?;
            Ok(Default::default())
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            drain_map(map)?;
            Ok(Default::default())
        }
    };
}

/// A string, borrowed from the input when it has no escapes.
#[derive(Default)]
pub(super) struct LooseStr<'de>(pub(super) Option<Cow<'de, str>>);

impl<'de> de::Deserialize<'de> for LooseStr<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LooseStr<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(LooseStr(Some(Cow::Borrowed(s))))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(LooseStr(Some(Cow::Owned(s.to_owned()))))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Self::Value, E> {
                Ok(LooseStr(Some(Cow::Owned(s))))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(LooseStr(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(LooseStr(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(LooseStr(None))
            }
            none_for_other_types!();
        }
        deserializer.deserialize_any(V)
    }
}

/// A float that is a whole number, as an integer (`as` saturates the
/// out-of-range ones).
pub(super) fn integral(v: f64) -> Option<i64> {
    (v.is_finite() && v.fract() == 0.0).then_some(v as i64)
}

/// An integer; integral floats, booleans and numeric strings are accepted too.
/// Integers above `i64::MAX` keep their bit pattern (addresses are opaque).
#[derive(Default)]
pub(super) struct LooseInt(pub(super) Option<i64>);

impl<'de> de::Deserialize<'de> for LooseInt {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LooseInt;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an integer")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(LooseInt(Some(v)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(LooseInt(Some(v as i64)))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                Ok(LooseInt(integral(v)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(LooseInt(s.trim().parse().ok()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
                Ok(LooseInt(Some(i64::from(v))))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(LooseInt(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                drain_seq(seq)?;
                Ok(LooseInt(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                drain_map(map)?;
                Ok(LooseInt(None))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A finite number; numeric strings are accepted too.
#[derive(Default)]
pub(super) struct LooseF64(pub(super) Option<f64>);

impl<'de> de::Deserialize<'de> for LooseF64 {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LooseF64;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(LooseF64(Some(v as f64)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(LooseF64(Some(v as f64)))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                Ok(LooseF64(v.is_finite().then_some(v)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(LooseF64(
                    s.trim().parse().ok().filter(|v: &f64| v.is_finite()),
                ))
            }
            none_for_other_types!();
        }
        deserializer.deserialize_any(V)
    }
}

/// Counts the entries of a list (for `deviceProperties`).
#[derive(Default)]
pub(super) struct CountSeq(pub(super) usize);

impl<'de> de::Deserialize<'de> for CountSeq {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = CountSeq;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut n = 0;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    n += 1;
                }
                Ok(CountSeq(n))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                drain_map(map)?;
                Ok(CountSeq(0))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(CountSeq(0))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(CountSeq(0))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(CountSeq(0))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(CountSeq(0))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(CountSeq(0))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(CountSeq(0))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// `distributedInfo`: the process group's backend, rank and world size; any
/// other shape is ignored (`None`).
#[derive(Default)]
pub(super) struct LooseDistributed(pub(super) Option<super::DistributedInfo>);

impl<'de> de::Deserialize<'de> for LooseDistributed {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LooseDistributed;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut info = super::DistributedInfo::default();
                while let Some(key) = map.next_key::<LooseStr<'de>>()? {
                    match key.0.as_deref() {
                        Some("backend") => {
                            info.backend =
                                map.next_value::<LooseStr<'de>>()?.0.map(Cow::into_owned);
                        }
                        Some("rank") => info.rank = map.next_value::<LooseInt>()?.0,
                        Some("world_size") => info.world_size = map.next_value::<LooseInt>()?.0,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(LooseDistributed(Some(info)))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(LooseDistributed(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(LooseDistributed(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                drain_seq(seq)?;
                Ok(LooseDistributed(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(LooseDistributed(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(LooseDistributed(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(LooseDistributed(None))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(LooseDistributed(None))
            }
        }
        deserializer.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_one<T: de::DeserializeOwned>(json: &str) -> T {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn loose_numbers_accept_what_exporters_write() {
        assert_eq!(parse_one::<LooseInt>("12").0, Some(12));
        assert_eq!(parse_one::<LooseInt>("-3").0, Some(-3));
        assert_eq!(parse_one::<LooseInt>("4.0").0, Some(4));
        assert_eq!(parse_one::<LooseInt>("4.5").0, None);
        assert_eq!(parse_one::<LooseInt>("\"77\"").0, Some(77));
        assert_eq!(parse_one::<LooseInt>("true").0, Some(1));
        assert_eq!(parse_one::<LooseInt>("null").0, None);
        assert_eq!(parse_one::<LooseInt>("[1, 2]").0, None);
        assert_eq!(parse_one::<LooseInt>("18446744073709551615").0, Some(-1));
        assert_eq!(parse_one::<LooseF64>("\"1.5\"").0, Some(1.5));
        assert_eq!(parse_one::<LooseF64>("{}").0, None);
    }

    proptest::proptest! {
        /// The compared bounds give what checked arithmetic gives, at the
        /// edges (values near a tenth of the bound) and anywhere.
        #[test]
        fn a_digit_pushed_is_the_checked_product(
            value in proptest::prop_oneof![
                0..u64::MAX,
                (u64::MAX / 10 - 2)..=(u64::MAX / 10 + 2),
            ],
            negative in proptest::prop_oneof![
                i64::MIN..=0,
                (i64::MIN / 10 - 2)..=(i64::MIN / 10 + 2),
            ],
            digit in 0u8..10,
        ) {
            proptest::prop_assert_eq!(
                push_digit(value, digit),
                value.checked_mul(10).and_then(|v| v.checked_add(u64::from(digit)))
            );
            proptest::prop_assert_eq!(
                push_negative_digit(negative, digit),
                negative.checked_mul(10).and_then(|v| v.checked_sub(i64::from(digit)))
            );
        }
    }
}
