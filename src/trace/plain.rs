//! The fast path of the entry reader: one entry of `traceEvents` read
//! straight from its bytes when it is as plain as the profiler writes it.
//!
//! The exporter writes every event the same way: an object of ASCII keys and
//! values without escapes, integers, and decimals of at most sixteen
//! significant digits. For those, serde's general machinery (a visitor call
//! per value, a UTF-8 check per string, a second scan of each argument list
//! kept as raw text) was most of the parse time. This reader takes an entry
//! only when it reads it exactly as the serde visitors of [`super::raw`] do,
//! and gives up (`None`) on anything else: an escape, a control or non-ASCII
//! byte in a string, a field of another JSON type than the profiler writes,
//! a number it cannot convert here as serde_json does, nesting deeper than
//! [`MAX_DEPTH`], a syntax error, the end of the buffer. The serde visitors
//! then read the entry from its start, so wherever this reader gives up the
//! result (and any error message) is serde's by construction; where it does
//! not, the tests check both agree (every fixture, and random entries,
//! malformed ones included).

use std::borrow::Cow;

use super::loose::integral;
use super::raw::{
    classify_cat, classify_ph, ArgKey, ArgsKeptFor, Entry, EventKey, RawArgs, RawEvent,
};

/// Nesting deeper than this is left to serde (whose own limit is 128, an
/// error this reader must not skip over).
const MAX_DEPTH: u32 = 32;

/// Below 2^53 an integer is exact as an `f64`, and so is 10^k up to k = 22:
/// one division is then correctly rounded. That is what serde_json computes
/// for such a decimal (`f64_from_parts`, significand over a power of ten),
/// and also what its correctly rounded `float_roundtrip` parser gives.
const EXACT_SIGNIFICAND: u64 = 1 << 53;

const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// Reads one entry from the front of `item` (which starts at the entry, no
/// whitespace before it): the event and the bytes it used, or `None` when
/// the serde reader must read it.
pub(super) fn entry(item: &[u8]) -> Option<(Entry<'_>, usize)> {
    let mut scan = Scan {
        bytes: item,
        at: 0,
        depth: 0,
    };
    let event = scan.event()?;
    Some((Entry::Event(event), scan.at))
}

/// A JSON number as serde_json's parser hands it to a visitor.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Number {
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Number {
    /// As [`super::loose::LooseInt`] reads it.
    fn loose_int(self) -> Option<i64> {
        match self {
            // Addresses above i64::MAX keep their bit pattern.
            Number::U64(v) => Some(v as i64),
            Number::I64(v) => Some(v),
            Number::F64(v) => integral(v),
        }
    }

    /// As [`super::loose::LooseF64`] reads it.
    fn loose_f64(self) -> Option<f64> {
        match self {
            Number::U64(v) => Some(v as f64),
            Number::I64(v) => Some(v as f64),
            Number::F64(v) => v.is_finite().then_some(v),
        }
    }
}

struct Scan<'de> {
    bytes: &'de [u8],
    at: usize,
    depth: u32,
}

impl<'de> Scan<'de> {
    fn event(&mut self) -> Option<RawEvent<'de>> {
        self.open(b'{')?;
        let mut ev = RawEvent::empty();
        self.members(|s, key| {
            match EventKey::of(key) {
                EventKey::Ph => ev.ph = classify_ph(s.string()?),
                EventKey::Cat => ev.cat = classify_cat(s.string()?),
                EventKey::Name => {
                    ev.name = Some(Cow::Borrowed(std::str::from_utf8(s.string()?).ok()?));
                }
                EventKey::Tid => ev.tid = s.number()?.loose_int(),
                EventKey::Ts => ev.ts = s.number()?.loose_f64(),
                EventKey::Dur => ev.dur = s.number()?.loose_f64(),
                EventKey::Id => ev.id = s.number()?.loose_int(),
                EventKey::Args => {
                    let kept = ArgsKeptFor::event(ev.name.as_deref());
                    s.args(&mut ev.args, kept)?;
                }
                EventKey::Other => s.skip_value()?,
            }
            Some(())
        })?;
        Some(ev)
    }

    /// `args`: the integer fields, and the argument lists kept as raw text.
    fn args(&mut self, args: &mut RawArgs<'de>, kept: ArgsKeptFor) -> Option<()> {
        self.open(b'{')?;
        self.members(|s, key| {
            let key = ArgKey::of(key);
            if let Some(slot) = args.int_slot(key) {
                *slot = s.number()?.loose_int();
            } else if let Some(slot) = args.op_args.raw_slot(key, kept) {
                s.skip_whitespace();
                let start = s.at;
                s.skip_value()?;
                *slot = Some(s.bytes.get(start..s.at)?);
            } else {
                s.skip_value()?;
            }
            Some(())
        })
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.bytes.get(self.at) {
            self.at += 1;
        }
    }

    /// The next byte after whitespace (not consumed).
    fn peek(&mut self) -> Option<u8> {
        self.skip_whitespace();
        self.bytes.get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        if found {
            self.at += 1;
        }
        found
    }

    /// Enters an object (`{`) or a list (`[`).
    fn open(&mut self, byte: u8) -> Option<()> {
        (self.depth < MAX_DEPTH && self.eat(byte)).then(|| self.depth += 1)
    }

    /// The members of an object whose `{` was read, up to its `}`: `member`
    /// reads the value of each key.
    fn members(
        &mut self,
        mut member: impl FnMut(&mut Self, &'de [u8]) -> Option<()>,
    ) -> Option<()> {
        if !self.eat(b'}') {
            loop {
                let key = self.string()?;
                if !self.eat(b':') {
                    return None;
                }
                member(self, key)?;
                if self.eat(b'}') {
                    break;
                }
                if !self.eat(b',') {
                    return None;
                }
            }
        }
        self.depth -= 1;
        Some(())
    }

    /// The elements of a list whose `[` was read, up to its `]`.
    fn elements(&mut self) -> Option<()> {
        if !self.eat(b']') {
            loop {
                self.skip_value()?;
                if self.eat(b']') {
                    break;
                }
                if !self.eat(b',') {
                    return None;
                }
            }
        }
        self.depth -= 1;
        Some(())
    }

    /// Steps over one value, checking its syntax as strictly as serde_json.
    fn skip_value(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'{' => {
                self.open(b'{')?;
                self.members(|s, _| s.skip_value())
            }
            b'[' => {
                self.open(b'[')?;
                self.elements()
            }
            b't' => self.word(b"true"),
            b'f' => self.word(b"false"),
            b'n' => self.word(b"null"),
            _ => self.number_token().map(drop),
        }
    }

    fn word(&mut self, word: &[u8]) -> Option<()> {
        let end = self.at.checked_add(word.len())?;
        (self.bytes.get(self.at..end)? == word).then(|| self.at = end)
    }

    /// A string of printable ASCII without escapes: its bytes, quotes
    /// excluded.
    fn string(&mut self) -> Option<&'de [u8]> {
        if !self.eat(b'"') {
            return None;
        }
        let start = self.at;
        loop {
            match *self.bytes.get(self.at)? {
                b'"' => break,
                b'\\' | 0..0x20 | 0x80.. => return None,
                _ => self.at += 1,
            }
        }
        let text = self.bytes.get(start..self.at);
        self.at += 1;
        text
    }

    /// A number, checked against JSON's grammar, converted as serde_json
    /// converts it.
    fn number(&mut self) -> Option<Number> {
        let token = self.number_token()?;
        let text = self.bytes.get(token.start..self.at)?;
        let float = token.fraction_digits > 0 || token.exponent;
        let significand = text
            .iter()
            .filter(|b| b.is_ascii_digit())
            .try_fold(0_u64, |v, &d| super::loose::push_digit(v, d - b'0'));
        let pow10 = POW10.get(token.fraction_digits);
        let exact = significand
            .filter(|&v| !token.exponent && (!float || (v < EXACT_SIGNIFICAND && pow10.is_some())));
        let (Some(significand), Some(pow10)) = (exact, pow10) else {
            // Rare in a trace: serde_json converts this number alone.
            return serde_json::from_slice::<f64>(text).ok().map(Number::F64);
        };
        if float {
            let f = significand as f64 / pow10;
            return Some(Number::F64(if token.negative { -f } else { f }));
        }
        Some(if !token.negative {
            Number::U64(significand)
        } else {
            // serde_json: a negative integer that does not fit (or `-0`)
            // becomes a float.
            let negated = (significand as i64).wrapping_neg();
            if negated >= 0 {
                Number::F64(-(significand as f64))
            } else {
                Number::I64(negated)
            }
        })
    }

    /// Steps over a number, checking it against JSON's grammar: `-`, one
    /// `0` or digits not starting with `0` (serde_json refuses `01`; here
    /// the `1` is left for the caller, who refuses it), a fraction, an
    /// exponent.
    fn number_token(&mut self) -> Option<NumberToken> {
        self.skip_whitespace();
        let start = self.at;
        let negative = self.bytes.get(self.at) == Some(&b'-');
        if negative {
            self.at += 1;
        }
        match self.bytes.get(self.at) {
            Some(b'0') => self.at += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return None,
        };
        let mut fraction_digits = 0;
        if self.bytes.get(self.at) == Some(&b'.') {
            self.at += 1;
            let from = self.at;
            self.digits();
            fraction_digits = self.at - from;
            if fraction_digits == 0 {
                return None;
            }
        }
        let exponent = matches!(self.bytes.get(self.at), Some(b'e' | b'E'));
        if exponent {
            self.at += 1;
            if let Some(b'+' | b'-') = self.bytes.get(self.at) {
                self.at += 1;
            }
            let from = self.at;
            self.digits();
            if self.at == from {
                return None;
            }
        }
        Some(NumberToken {
            start,
            negative,
            fraction_digits,
            exponent,
        })
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.bytes.get(self.at) {
            self.at += 1;
        }
    }
}

/// Where a number starts and its shape (it ends where the scan stands).
struct NumberToken {
    start: usize,
    negative: bool,
    fraction_digits: usize,
    exponent: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// serde's reading of an entry: `None` for an error.
    fn by_serde(item: &[u8]) -> Option<(Entry<'_>, usize)> {
        let mut stream = serde_json::Deserializer::from_slice(item).into_iter::<Entry>();
        let entry = stream.next()?.ok()?;
        Some((entry, stream.byte_offset()))
    }

    /// Whenever the fast path reads an entry, serde reads the same event
    /// and stops at the same byte.
    fn agrees(text: &str) -> bool {
        let fast = entry(text.as_bytes());
        if let Some(fast) = &fast {
            assert_eq!(Some(fast), by_serde(text.as_bytes()).as_ref(), "{text}");
        }
        fast.is_some()
    }

    #[test]
    fn a_profiler_op_is_read_here_as_serde_reads_it() {
        let op = r#"{
    "ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 25382, "tid": 25382,
    "ts": 4461759354830.176, "dur": 31.136,
    "args": {
      "External id": 2,"Record function id": 0, "Concrete Inputs": ["", "", ""],
      "Input type": ["float", "float", "float"], "Input Strides": [[64, 1], [64, 1], [1]],
      "Input Dims": [[2, 64], [10, 64], [10]], "Ev Idx": 1
    }
  },"#;
        assert!(agrees(op));
        let (Entry::Event(ev), used) = entry(op.as_bytes()).unwrap() else {
            panic!("an event")
        };
        assert_eq!(used, op.len() - 1);
        assert_eq!(ev.ts, Some(4_461_759_354_830.176));
        assert_eq!(ev.args.external_id, Some(2));
        assert_eq!(
            ev.args.op_args.dims,
            Some(&b"[[2, 64], [10, 64], [10]]"[..])
        );
        let memory = r#"{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
            "pid": 1, "tid": 1, "ts": 12.5,
            "args": {"Total Reserved": 0, "Total Allocated": 512, "Bytes": -512,
                     "Addr": 18446744073709551615, "Device Id": -1, "Device Type": 0}}"#;
        assert!(agrees(memory));
    }

    #[test]
    fn numbers_convert_as_serde_converts_them() {
        for n in [
            "0",
            "-0",
            "7",
            "-7",
            "0.5",
            "-0.0",
            "1.25",
            "4461759354534.858",
            "9007199254740993.5",
            "123456789012345678901",
            "1e3",
            "2.5E-3",
            "0.1234567890123456789012",
            "0.000000000000000000000001",
            "18446744073709551615",
            "18446744073709551616",
            "-9223372036854775808",
            "-9223372036854775809",
            "1.0",
            "100000000000000000000000.5",
        ] {
            for field in ["ts", "tid"] {
                let text = format!(r#"{{"ph": "X", "{field}": {n}, "args": {{"Addr": {n}}}}}"#);
                assert!(agrees(&text), "{text}");
            }
        }
    }

    #[test]
    fn anything_unusual_is_left_to_serde() {
        for text in [
            r#"{"name": "a\"b"}"#,
            r#"{"name": "caf\u00e9"}"#,
            "{\"name\": \"café\"}",
            "{\"name\": \"tab\there\"}",
            r#"{"tid": "7"}"#,
            r#"{"ph": 1}"#,
            r#"{"args": []}"#,
            r#"{"ts": 1.}"#,
            r#"{"ts": 01}"#,
            r#"{"ts": -}"#,
            r#"{"ts": 1e}"#,
            r#"{"x": [1, 2,]}"#,
            r#"{"x": {"a": 1,}}"#,
            r#"{"x": tru}"#,
            r#"{"a": 1,}"#,
            r#"{"a" 1}"#,
            r#"[1, 2]"#,
            r#"{"ts": 1e400}"#,
            r#"{"ph": "X""#,
            "{\"x\": \x0c1}",
        ] {
            assert!(!agrees(text), "{text}");
        }
        let deep = format!(r#"{{"x": {}1{}}}"#, "[".repeat(40), "]".repeat(40));
        assert!(!agrees(&deep));
    }

    /// Keys, values and broken pieces of the entries below: the profiler's
    /// own, odd ones (escapes, non-ASCII, numbers serde converts its own
    /// way, other types) and bad syntax.
    const KEYS: &[&str] = &[
        "ph", "cat", "name", "ts", "dur", "tid", "id", "pid", "s", "a\\\"b", "n\u{e9}",
    ];
    const ARG_KEYS: &[&str] = &[
        "Addr",
        "Bytes",
        "Total Allocated",
        "Device Type",
        "External id",
        "Sequence number",
        "Python id",
        "Input Dims",
        "Input type",
        "Input Strides",
        "Concrete Inputs",
        "Ev Idx",
    ];
    const VALUES: &[&str] = &[
        "\"X\"",
        "\"i\"",
        "\"cpu_op\"",
        "\"python_function\"",
        "\"aten::mm\"",
        "\"[memory]\"",
        "\"\"",
        "\"float\"",
        "\"[2, 2]\"",
        "0",
        "12",
        "-3",
        "0.5",
        "4461759354534.858",
        "31.136",
    ];
    const ODD_VALUES: &[&str] = &[
        "\"7\"",
        "\"a\\\"b\"",
        "\"caf\u{e9}\"",
        "-0",
        "-0.0",
        "1e3",
        "2.5E-3",
        "18446744073709551615",
        "18446744073709551616",
        "-9223372036854775809",
        "9007199254740993.5",
        "true",
        "false",
        "null",
        "{}",
        "[]",
    ];
    const BROKEN: &[&str] = &[
        "{", "}", "[", "]", ",", ":", "\"", "01", "1.", "-", "nul", "\\", "\u{1}",
    ];

    /// An entry-shaped text: an event object of those fields (an `args`
    /// object among them), sometimes with a broken piece inserted or cut
    /// short.
    fn arbitrary_entry() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::collection::vec;
        use proptest::prelude::*;
        use proptest::sample::select;
        let scalar = prop_oneof![
            8 => select(VALUES).prop_map(str::to_owned),
            1 => select(ODD_VALUES).prop_map(str::to_owned),
        ];
        let value = prop_oneof![
            3 => scalar.clone(),
            1 => vec(scalar.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(", "))),
            1 => vec(vec(scalar.clone(), 0..3), 0..3).prop_map(|v| {
                let lists: Vec<String> = v.iter().map(|l| format!("[{}]", l.join(","))).collect();
                format!("[{}]", lists.join(", "))
            }),
        ];
        let arg = (select(ARG_KEYS), value.clone()).prop_map(|(k, v)| format!("\"{k}\": {v}"));
        let args = vec(arg, 0..6).prop_map(|a| format!("\"args\": {{{}}}", a.join(", ")));
        let string = select(&VALUES[..9]);
        let number = select(&VALUES[9..]);
        let field = prop_oneof![
            2 => (select(&KEYS[..3]), string).prop_map(|(k, v)| format!("\"{k}\": {v}")),
            2 => (select(&KEYS[3..7]), number).prop_map(|(k, v)| format!("\"{k}\": {v}")),
            2 => (select(KEYS), value).prop_map(|(k, v)| format!("\"{k}\": {v}")),
            1 => args,
        ];
        (
            vec(field, 0..8),
            vec((any::<proptest::sample::Index>(), select(BROKEN)), 0..2),
            any::<proptest::sample::Index>(),
            0..4_u8,
        )
            .prop_map(|(fields, broken, cut_at, cut)| {
                let mut text = format!("{{{}}}", fields.join(",\n "));
                for (at, piece) in broken {
                    let at = at.index(text.len() + 1);
                    if text.is_char_boundary(at) {
                        text.insert_str(at, piece);
                    }
                }
                if cut == 0 {
                    let mut end = cut_at.index(text.len() + 1);
                    while !text.is_char_boundary(end) {
                        end -= 1;
                    }
                    text.truncate(end);
                }
                text
            })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]
        #[test]
        fn random_entries_read_as_serde_reads_them(text in arbitrary_entry()) {
            agrees(&text);
        }
    }

    #[test]
    fn duplicate_fields_and_unknown_values_read_as_serde_reads_them() {
        assert!(agrees(
            r#"{"name": "a", "args": {"Input Dims": [[1]]}, "name": "b", "args": {"Addr": 3},
                "other": {"k": [true, false, null, "s", -1.5e-3, {"d": []}]}, "ts": 1}"#
        ));
        assert!(agrees("{}"));
        assert!(agrees(" { \"ph\" :\t\"s\" ,\r\n\"id\":9 } "));
    }
}
