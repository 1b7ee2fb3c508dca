//! The tensor arguments of an op (`Input Dims`, `Input type`, `Input Strides`,
//! `Concrete Inputs`), read from the raw JSON text of those four values by a
//! small hand-written parser straight into the trace's arenas: no serde value
//! per dimension, no allocation per op.
//!
//! The values are lists with one entry per argument: a shape (a list of
//! integers, `[]` for a non-tensor), a list of shapes (a `TensorList`), a
//! dtype name, a concrete value as a string (`"[2, 2]"`, `"1"`, `""`). The
//! parser is tolerant: anything else in an entry makes that entry empty, and
//! it never reads past its input.

use super::{ConcreteArg, NameId, OpArgs, Span, TensorArg};

/// Types in `Input type` that are not tensors.
const NOT_TENSOR_TYPES: &[&str] = &["", "Scalar", "ScalarList", "TensorList", "GenericList"];

/// The most arguments, list elements or dimensions read per op; the rest
/// are ignored (real ops have a handful).
const MAX_ITEMS: usize = 4096;

/// One shape of `Input Dims` or `Input Strides`: argument, tensor-list
/// element, numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ShapeItem {
    pub arg: u16,
    pub list_index: Option<u16>,
    pub span: Span,
}

/// Reusable buffers of the parser (kept by the builder between ops).
#[derive(Debug, Default)]
pub(super) struct Scratch {
    dims: Vec<ShapeItem>,
    strides: Vec<ShapeItem>,
    stride_numbers: Vec<i64>,
    /// Byte ranges of the dtype names in `Input type`.
    types: Vec<(usize, usize)>,
    /// The dtype names met so far and their interned ids: a trace names a
    /// handful of dtypes millions of times, so a byte comparison here saves
    /// a UTF-8 check and a hash per tensor.
    dtype_ids: Vec<(Box<[u8]>, NameId)>,
}

/// At most this many dtype names are remembered (more go through `intern`).
const DTYPE_IDS_KEPT: usize = 64;

impl Scratch {
    /// The id of the dtype name `name`, interned on first sight.
    fn dtype_id(&mut self, name: &[u8], intern: &mut dyn FnMut(&str) -> NameId) -> Option<NameId> {
        if let Some((_, id)) = self.dtype_ids.iter().find(|(n, _)| **n == *name) {
            return Some(*id);
        }
        let id = intern(std::str::from_utf8(name).ok()?);
        if self.dtype_ids.len() < DTYPE_IDS_KEPT {
            self.dtype_ids.push((name.into(), id));
        }
        Some(id)
    }
}

/// A cursor over raw JSON bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes, at: 0 }
    }

    fn peek(&mut self) -> Option<u8> {
        while let Some(&b) = self.bytes.get(self.at) {
            if b.is_ascii_whitespace() {
                self.at += 1;
            } else {
                return Some(b);
            }
        }
        None
    }

    fn eat(&mut self, byte: u8) -> bool {
        if self.peek() == Some(byte) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    /// An integer (a JSON number without fraction or exponent).
    fn int(&mut self) -> Option<i64> {
        self.peek()?;
        let negative = self.bytes.get(self.at) == Some(&b'-');
        if negative {
            self.at += 1;
        }
        // Accumulated as a negative number so that i64::MIN fits; digits are
        // read in place (no UTF-8 check or `str::parse` per number: a trace has
        // millions of them).
        let mut value: Option<i64> = Some(0);
        let mut digits = 0_usize;
        while let Some(&b) = self.bytes.get(self.at) {
            if !b.is_ascii_digit() {
                break;
            }
            value = value.and_then(|v| super::loose::push_negative_digit(v, b - b'0'));
            digits += 1;
            self.at += 1;
        }
        match self.bytes.get(self.at) {
            Some(b'.' | b'e' | b'E') => None,
            _ if digits == 0 => None,
            _ if negative => value,
            _ => value.and_then(i64::checked_neg),
        }
    }

    /// A string without escapes (the profiler writes none in these fields).
    fn string(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.string_bytes()?).ok()
    }

    /// The bytes of a string without escapes, not checked as UTF-8 (the
    /// caller compares them with known names or checks them itself).
    fn string_bytes(&mut self) -> Option<&'a [u8]> {
        if !self.eat(b'"') {
            return None;
        }
        let start = self.at;
        while let Some(&b) = self.bytes.get(self.at) {
            match b {
                b'"' => {
                    let text = self.bytes.get(start..self.at);
                    self.at += 1;
                    return text;
                }
                b'\\' => return None,
                _ => self.at += 1,
            }
        }
        None
    }

    /// Skips one JSON value of any kind (used after something unexpected).
    fn skip_value(&mut self) {
        let mut depth = 0_usize;
        while let Some(b) = self.peek() {
            match b {
                b'[' | b'{' => depth += 1,
                b']' | b'}' => {
                    if depth == 0 {
                        return;
                    }
                    depth -= 1;
                    if depth == 0 {
                        self.at += 1;
                        return;
                    }
                }
                b'"' => {
                    self.at += 1;
                    while let Some(&c) = self.bytes.get(self.at) {
                        self.at += 1;
                        if c == b'\\' {
                            self.at += 1;
                        } else if c == b'"' {
                            break;
                        }
                    }
                    if depth == 0 {
                        return;
                    }
                    continue;
                }
                b',' if depth == 0 => return,
                _ => {}
            }
            self.at += 1;
        }
    }

    /// Steps over a `,` between list items; `false` at the end of the list.
    fn next_item(&mut self, first: bool) -> bool {
        if self.eat(b']') {
            return false;
        }
        if !first && !self.eat(b',') {
            // malformed: stop reading this list
            self.at = self.bytes.len();
            return false;
        }
        self.peek().is_some()
    }
}

/// Reads a list of integers into `numbers`; `None` (and nothing kept) when
/// the value is not one.
fn int_list(c: &mut Cursor<'_>, numbers: &mut Vec<i64>) -> Option<Span> {
    if !c.eat(b'[') {
        return None;
    }
    let start = numbers.len();
    let mut first = true;
    while c.next_item(first) {
        first = false;
        match c.int() {
            Some(v) if numbers.len() - start < MAX_ITEMS => numbers.push(v),
            Some(_) => {}
            None => {
                numbers.truncate(start);
                c.skip_value();
                while c.next_item(false) {
                    c.skip_value();
                }
                return None;
            }
        }
    }
    span(start, numbers.len())
}

fn span(start: usize, end: usize) -> Option<Span> {
    Some(Span {
        start: u32::try_from(start).ok()?,
        len: u32::try_from(end.checked_sub(start)?).ok()?,
    })
}

/// Parses `Input Dims` or `Input Strides`: one shape per argument, or a list
/// of shapes for a tensor list. Returns the length of the first argument's
/// list when it is a tensor list.
fn shapes(raw: &[u8], numbers: &mut Vec<i64>, out: &mut Vec<ShapeItem>) -> Option<u32> {
    out.clear();
    let mut c = Cursor::new(raw);
    if !c.eat(b'[') {
        return None;
    }
    let mut first_list_len = None;
    let mut arg = 0_usize;
    let mut first = true;
    while c.next_item(first) && arg < MAX_ITEMS {
        first = false;
        let position = u16::try_from(arg).unwrap_or(u16::MAX);
        // A list of lists (a tensor list) or a list of integers (a shape).
        let save = c.at;
        if c.eat(b'[') && c.peek() == Some(b'[') {
            let mut n = 0_usize;
            let mut first_el = true;
            while c.next_item(first_el) {
                first_el = false;
                match int_list(&mut c, numbers) {
                    Some(s) if n < MAX_ITEMS => out.push(ShapeItem {
                        arg: position,
                        list_index: Some(u16::try_from(n).unwrap_or(u16::MAX)),
                        span: s,
                    }),
                    _ => c.skip_value(),
                }
                n += 1;
            }
            if arg == 0 {
                first_list_len = u32::try_from(n).ok();
            }
        } else {
            c.at = save;
            match int_list(&mut c, numbers) {
                Some(s) => out.push(ShapeItem {
                    arg: position,
                    list_index: None,
                    span: s,
                }),
                None => c.skip_value(),
            }
        }
        arg += 1;
    }
    first_list_len
}

/// Parses `Input type` into the byte range of each argument's dtype name.
fn types(raw: &[u8], out: &mut Vec<(usize, usize)>) {
    out.clear();
    let mut c = Cursor::new(raw);
    if !c.eat(b'[') {
        return;
    }
    let mut first = true;
    while c.next_item(first) && out.len() < MAX_ITEMS {
        first = false;
        let start = c.peek().map(|_| c.at + 1);
        match (start, c.string_bytes()) {
            (Some(start), Some(s)) => out.push((start, start + s.len())),
            _ => {
                c.skip_value();
                out.push((0, 0));
            }
        }
    }
}

/// Parses `Concrete Inputs`: the integer and integer-list values; with
/// `flags`, also `True`/`False` (1/0) and floating values in millionths
/// (see [`super::FLAG_OPS`]).
fn concrete(raw: &[u8], flags: bool, numbers: &mut Vec<i64>, out: &mut Vec<ConcreteArg>) {
    let mut c = Cursor::new(raw);
    if !c.eat(b'[') {
        return;
    }
    let mut first = true;
    let mut arg = 0_usize;
    while c.next_item(first) && arg < MAX_ITEMS {
        first = false;
        let position = u16::try_from(arg).unwrap_or(u16::MAX);
        arg += 1;
        let Some(text) = c.string() else {
            c.skip_value();
            continue;
        };
        let text = text.trim();
        let start = numbers.len();
        let flag = if flags { flag_value(text) } else { None };
        if let Some(v) = text.parse::<i64>().ok().or(flag) {
            numbers.push(v);
            if let Some(values) = span(start, numbers.len()) {
                out.push(ConcreteArg {
                    position,
                    values,
                    list: false,
                });
            }
        } else if text.starts_with('[') {
            let mut inner = Cursor::new(text.as_bytes());
            if let Some(values) = int_list(&mut inner, numbers) {
                out.push(ConcreteArg {
                    position,
                    values,
                    list: true,
                });
            }
        }
    }
}

/// A boolean as 1/0, or a finite floating value in millionths (rounded,
/// within ±1e12): how [`super::FLAG_OPS`] keep theirs.
fn flag_value(text: &str) -> Option<i64> {
    match text {
        "True" | "true" => return Some(1),
        "False" | "false" => return Some(0),
        _ => {}
    }
    let v: f64 = text.parse().ok()?;
    let micro = (v * 1e6).round();
    (micro.is_finite() && micro.abs() <= 1e12).then_some(micro as i64)
}

/// The raw JSON text of an op's argument fields.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(super) struct RawOpArgs<'de> {
    pub dims: Option<&'de [u8]>,
    pub types: Option<&'de [u8]>,
    pub strides: Option<&'de [u8]>,
    pub concrete: Option<&'de [u8]>,
}

/// What [`read_op_args`] appended for one op.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct ReadArgs {
    pub tensors: Span,
    pub concrete: Span,
    /// The length of the first argument when it is a tensor list.
    pub first_list_len: Option<u32>,
}

/// Reads an op's tensor arguments into `args`, interning dtype names with
/// `intern`; `keep_concrete` also keeps its integer concrete values, and
/// `keep_flags` its boolean and floating ones.
pub(super) fn read_op_args(
    raw: RawOpArgs<'_>,
    keep_concrete: bool,
    keep_flags: bool,
    args: &mut OpArgs,
    scratch: &mut Scratch,
    intern: &mut dyn FnMut(&str) -> NameId,
) -> ReadArgs {
    let mut read = ReadArgs::default();
    let tensors_start = args.tensors.len();
    if let Some(dims) = raw.dims {
        read.first_list_len = shapes(dims, &mut args.numbers, &mut scratch.dims);
        let type_text = raw.types.unwrap_or_default();
        types(type_text, &mut scratch.types);
        scratch.stride_numbers.clear();
        if let Some(s) = raw.strides {
            shapes(s, &mut scratch.stride_numbers, &mut scratch.strides);
        } else {
            scratch.strides.clear();
        }
        for i in 0..scratch.dims.len() {
            let Some(&item) = scratch.dims.get(i) else {
                break;
            };
            let ty: &[u8] = scratch
                .types
                .get(usize::from(item.arg))
                .and_then(|&(a, b)| type_text.get(a..b))
                .unwrap_or_default();
            let dtype = match item.list_index {
                None if !NOT_TENSOR_TYPES.iter().any(|t| t.as_bytes() == ty) => {
                    match scratch.dtype_id(ty, intern) {
                        Some(id) => Some(id),
                        None => continue,
                    }
                }
                Some(_) if ty == b"TensorList" => None,
                _ => continue,
            };
            let strides = scratch
                .strides
                .iter()
                .find(|s| s.arg == item.arg && s.list_index == item.list_index)
                .filter(|s| s.span.len == item.span.len)
                .and_then(|s| {
                    let from = usize::try_from(s.span.start).ok()?;
                    let to = from.checked_add(usize::try_from(s.span.len).ok()?)?;
                    let values = scratch.stride_numbers.get(from..to)?;
                    let start = args.numbers.len();
                    args.numbers.extend_from_slice(values);
                    span(start, args.numbers.len())
                });
            args.tensors.push(TensorArg {
                position: item.arg,
                list_index: item.list_index,
                dtype,
                dims: item.span,
                strides,
            });
        }
    }
    read.tensors = span(tensors_start, args.tensors.len()).unwrap_or_default();
    if keep_concrete {
        if let Some(raw) = raw.concrete {
            let start = args.concrete.len();
            concrete(raw, keep_flags, &mut args.numbers, &mut args.concrete);
            read.concrete = span(start, args.concrete.len()).unwrap_or_default();
        }
    }
    read
}

/// Bytes per element of a dtype name as `record_shapes` writes it.
pub fn dtype_size(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "float" | "int" | "unsigned int" | "c10::complex<c10::Half>" => 4,
        "double" | "long int" | "long long int" | "unsigned long" | "c10::complex<float>" => 8,
        "c10::Half" | "c10::BFloat16" | "short int" | "unsigned short" => 2,
        "bool"
        | "signed char"
        | "unsigned char"
        | "c10::Float8_e4m3fn"
        | "c10::Float8_e5m2"
        | "c10::Float8_e4m3fnuz"
        | "c10::Float8_e5m2fnuz" => 1,
        "c10::complex<double>" => 16,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(
        dims: &str,
        types: &str,
        strides: &str,
        concrete: &str,
    ) -> (OpArgs, ReadArgs, Vec<String>) {
        let mut args = OpArgs::default();
        let mut names: Vec<String> = Vec::new();
        let mut intern = |s: &str| {
            names.push(s.to_owned());
            NameId(u32::try_from(names.len() - 1).unwrap())
        };
        let raw = RawOpArgs {
            dims: Some(dims.as_bytes()),
            types: Some(types.as_bytes()),
            strides: Some(strides.as_bytes()),
            concrete: Some(concrete.as_bytes()),
        };
        let r = read_op_args(
            raw,
            true,
            false,
            &mut args,
            &mut Scratch::default(),
            &mut intern,
        );
        (args, r, names)
    }

    #[test]
    fn attention_keeps_its_flags_as_integers() {
        let raw = RawOpArgs {
            dims: Some(b"[[2, 12, 8, 64], [2, 4, 8, 64], [2, 4, 8, 64], [], [], [], [], []]"),
            types: Some(
                br#"["float", "float", "float", "", "Scalar", "Scalar", "Scalar", "Scalar"]"#,
            ),
            strides: None,
            concrete: Some(br#"["", "", "", "", "0.10000000000000001", "True", "0.125", "False"]"#),
        };
        let mut names: Vec<String> = Vec::new();
        let mut intern = |s: &str| {
            names.push(s.to_owned());
            NameId(u32::try_from(names.len() - 1).unwrap())
        };
        let mut values = |flags: bool| {
            let mut args = OpArgs::default();
            read_op_args(
                raw,
                true,
                flags,
                &mut args,
                &mut Scratch::default(),
                &mut intern,
            );
            args.concrete
                .iter()
                .map(|c| (c.position, args.slice(c.values).to_vec()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            values(true),
            vec![
                (4, vec![100_000]),
                (5, vec![1]),
                (6, vec![125_000]),
                (7, vec![0])
            ]
        );
        // Other ops keep integers only.
        assert_eq!(values(false), vec![]);
    }

    #[test]
    fn a_conv_keeps_its_three_tensors_and_their_strides() {
        let (args, r, names) = read(
            "[[16, 3, 64, 64], [64, 3, 7, 7], [], [], [], [], []]",
            r#"["float", "float", "", "ScalarList", "ScalarList", "ScalarList", "Scalar"]"#,
            "[[12288, 4096, 64, 1], [147, 49, 7, 1], [], [], [], [], []]",
            r#"["", "", "", "[2, 2]", "[3, 3]", "[1, 1]", "1"]"#,
        );
        assert_eq!(r.tensors.len, 2);
        let w = &args.tensors[1];
        assert_eq!(w.position, 1);
        assert_eq!(names[w.dtype.unwrap().index()], "float");
        assert_eq!(args.slice(w.dims), &[64, 3, 7, 7]);
        assert_eq!(args.slice(w.strides.unwrap()), &[147, 49, 7, 1]);
        let c: Vec<(u16, Vec<i64>, bool)> = args
            .concrete
            .iter()
            .map(|c| (c.position, args.slice(c.values).to_vec(), c.list))
            .collect();
        assert_eq!(
            c,
            vec![
                (3, vec![2, 2], true),
                (4, vec![3, 3], true),
                (5, vec![1, 1], true),
                (6, vec![1], false)
            ]
        );
    }

    #[test]
    fn tensor_lists_zero_dim_tensors_and_bad_values() {
        let (args, r, _) = read(
            "[[], [[8, 64], [0]], [], [1.5, 2]]",
            r#"["float", "TensorList", "Scalar", "float"]"#,
            "[[], [[64, 1], [1]], [], []]",
            r#"["", "", "9223372036854775807", "x"]"#,
        );
        // a 0-dim float, two list elements (no dtype), the malformed shape dropped
        assert_eq!(r.tensors.len, 3);
        assert_eq!(args.tensors[0].position, 0);
        assert!(args.slice(args.tensors[0].dims).is_empty());
        assert_eq!(args.tensors[1].list_index, Some(0));
        assert_eq!(args.tensors[1].dtype, None);
        assert_eq!(args.slice(args.tensors[2].dims), &[0]);
        assert_eq!(r.first_list_len, None);
        assert_eq!(args.concrete.len(), 1);
        assert_eq!(args.slice(args.concrete[0].values), &[i64::MAX]);
        let (_, r, _) = read(
            "[[[3], [3], [3]], []]",
            r#"["TensorList", "Scalar"]"#,
            "",
            "",
        );
        assert_eq!(r.first_list_len, Some(3));
    }

    #[test]
    fn garbage_never_panics() {
        for text in [
            "",
            "[",
            "]",
            "[[[",
            "[1,",
            "[\"a\\",
            "{}",
            "[[1, [2]], 3]",
            "[[-], [--1]]",
            "[,]",
        ] {
            let _ = read(text, text, text, text);
        }
    }

    #[test]
    fn integers_are_read_in_place_with_their_limits() {
        let int = |text: &str| Cursor::new(text.as_bytes()).int();
        assert_eq!(int("0"), Some(0));
        assert_eq!(int(" 42,"), Some(42));
        assert_eq!(int("-7]"), Some(-7));
        assert_eq!(int("9223372036854775807"), Some(i64::MAX));
        assert_eq!(int("-9223372036854775808"), Some(i64::MIN));
        assert_eq!(int("9223372036854775808"), None);
        assert_eq!(int("-"), None);
        assert_eq!(int("1.5"), None);
        assert_eq!(int("2e3"), None);
        assert_eq!(int("x"), None);
    }

    #[test]
    fn dtype_names_are_interned_once_and_checked() {
        let mut scratch = Scratch::default();
        let calls = std::cell::Cell::new(0);
        let mut intern = |name: &str| {
            calls.set(calls.get() + 1);
            NameId(u32::try_from(name.len()).unwrap_or(0))
        };
        let a = scratch.dtype_id(b"float", &mut intern);
        let b = scratch.dtype_id(b"float", &mut intern);
        assert_eq!(a, b);
        assert_eq!(scratch.dtype_id(&[0xff, 0xfe], &mut intern), None);
        assert_eq!(calls.get(), 1);
    }
}
