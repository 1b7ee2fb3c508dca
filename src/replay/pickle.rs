//! A restricted pickle reader: plain data only (dicts, lists, tuples, sets,
//! strings, bytes, integers, floats, booleans, `None`). It interprets the
//! opcodes of protocols 0–5 that build such values and refuses every opcode
//! that would name or call a Python object, so reading a file never executes
//! anything. Values live in an arena and refer to each other by index, so the
//! memo (heavily used for repeated stack frames) costs nothing to share.

use super::ReplayError;

/// Index of a value in a [`Pickle`].
pub type ValueId = u32;

/// One unpickled value. Strings borrow from the input.
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'a> {
    None,
    Bool(bool),
    Int(i64),
    /// An integer that does not fit in `i64` (kept as its byte length only).
    BigInt(usize),
    Float(f64),
    Str(&'a str),
    Bytes(&'a [u8]),
    List(Vec<ValueId>),
    Tuple(Vec<ValueId>),
    Dict(Vec<(ValueId, ValueId)>),
}

/// A parsed pickle: an arena of values and the root.
#[derive(Debug, Clone)]
pub struct Pickle<'a> {
    values: Vec<Value<'a>>,
    root: ValueId,
}

impl<'a> Pickle<'a> {
    /// The top-level value.
    pub fn root(&self) -> ValueId {
        self.root
    }

    /// The value with this id (`None` for a dangling id).
    pub fn get(&self, id: ValueId) -> Option<&Value<'a>> {
        self.values.get(id as usize)
    }

    /// The value stored under a string key of a dict.
    pub fn dict_get(&self, dict: ValueId, key: &str) -> Option<ValueId> {
        let Some(Value::Dict(items)) = self.get(dict) else {
            return None;
        };
        items
            .iter()
            .find(|(k, _)| matches!(self.get(*k), Some(Value::Str(s)) if *s == key))
            .map(|&(_, v)| v)
    }

    /// The items of a list or tuple (empty for anything else).
    pub fn items(&self, id: ValueId) -> &[ValueId] {
        match self.get(id) {
            Some(Value::List(v) | Value::Tuple(v)) => v,
            _ => &[],
        }
    }

    /// The `(key, value)` pairs of a dict (empty for anything else).
    pub fn pairs(&self, id: ValueId) -> &[(ValueId, ValueId)] {
        match self.get(id) {
            Some(Value::Dict(v)) => v,
            _ => &[],
        }
    }

    pub fn as_str(&self, id: ValueId) -> Option<&'a str> {
        match self.get(id) {
            Some(Value::Str(s)) => Some(s),
            _ => None,
        }
    }

    pub fn as_i64(&self, id: ValueId) -> Option<i64> {
        match self.get(id) {
            Some(Value::Int(i)) => Some(*i),
            Some(Value::Bool(b)) => Some(i64::from(*b)),
            _ => None,
        }
    }

    pub fn as_f64(&self, id: ValueId) -> Option<f64> {
        match self.get(id) {
            Some(Value::Float(f)) => Some(*f),
            Some(Value::Int(i)) => Some(*i as f64),
            _ => None,
        }
    }

    pub fn as_bool(&self, id: ValueId) -> Option<bool> {
        match self.get(id) {
            Some(Value::Bool(b)) => Some(*b),
            Some(Value::Int(i)) => Some(*i != 0),
            _ => None,
        }
    }
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ReplayError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len());
        let out = end.and_then(|end| self.data.get(self.pos..end));
        let (Some(end), Some(out)) = (end, out) else {
            return Err(ReplayError::PickleTruncated(self.pos));
        };
        self.pos = end;
        Ok(out)
    }

    /// The next `N` bytes as an array.
    fn array<const N: usize>(&mut self) -> Result<[u8; N], ReplayError> {
        let at = self.pos;
        <[u8; N]>::try_from(self.take(N)?).map_err(|_| ReplayError::PickleTruncated(at))
    }

    fn u8(&mut self) -> Result<u8, ReplayError> {
        Ok(u8::from_le_bytes(self.array()?))
    }

    fn le_u16(&mut self) -> Result<u16, ReplayError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn le_u32(&mut self) -> Result<u32, ReplayError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn le_u64(&mut self) -> Result<u64, ReplayError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn len(&mut self, width: usize) -> Result<usize, ReplayError> {
        let n = match width {
            1 => u64::from(self.u8()?),
            4 => u64::from(self.le_u32()?),
            _ => self.le_u64()?,
        };
        usize::try_from(n).map_err(|_| ReplayError::PickleTruncated(self.pos))
    }

    fn line(&mut self) -> Result<&'a [u8], ReplayError> {
        let rest = self.data.get(self.pos..).unwrap_or_default();
        let Some(out) = rest
            .iter()
            .position(|&c| c == b'\n')
            .and_then(|n| rest.get(..n))
        else {
            return Err(ReplayError::PickleTruncated(self.pos));
        };
        self.pos += out.len() + 1;
        Ok(out)
    }
}

/// Parses a pickle (no globals, no object construction).
pub fn parse(data: &[u8]) -> Result<Pickle<'_>, ReplayError> {
    let mut r = Reader { data, pos: 0 };
    let mut values: Vec<Value> = Vec::new();
    let mut stack: Vec<ValueId> = Vec::new();
    let mut marks: Vec<usize> = Vec::new();
    let mut memo: Vec<ValueId> = Vec::new();

    fn push<'a>(values: &mut Vec<Value<'a>>, stack: &mut Vec<ValueId>, v: Value<'a>) {
        values.push(v);
        stack.push((values.len() - 1) as ValueId);
    }
    fn pop(stack: &mut Vec<ValueId>, at: usize) -> Result<ValueId, ReplayError> {
        stack
            .pop()
            .ok_or(ReplayError::PickleMalformed(at, "stack underflow"))
    }
    fn pop_mark(
        stack: &mut Vec<ValueId>,
        marks: &mut Vec<usize>,
        at: usize,
    ) -> Result<Vec<ValueId>, ReplayError> {
        let m = marks
            .pop()
            .ok_or(ReplayError::PickleMalformed(at, "missing mark"))?;
        if m > stack.len() {
            return Err(ReplayError::PickleMalformed(at, "mark above stack"));
        }
        Ok(stack.split_off(m))
    }
    // A pickler numbers memo entries from 0 and each PUT takes at least two
    // bytes, so no real index reaches the file's length; refusing larger ones
    // keeps a hostile index from allocating gigabytes.
    let max_memo = data.len();
    let memo_put = |memo: &mut Vec<ValueId>, idx: usize, id: ValueId, at: usize| {
        if idx > max_memo {
            return Err(ReplayError::PickleMalformed(
                at,
                "memo index beyond the file",
            ));
        }
        if memo.len() <= idx {
            memo.resize(idx + 1, ValueId::MAX);
        }
        if let Some(slot) = memo.get_mut(idx) {
            *slot = id;
        }
        Ok(())
    };
    fn utf8(bytes: &[u8], at: usize) -> Result<&str, ReplayError> {
        std::str::from_utf8(bytes)
            .map_err(|_| ReplayError::PickleMalformed(at, "invalid utf-8 string"))
    }
    fn int_from_le(bytes: &[u8]) -> Value<'static> {
        if bytes.is_empty() {
            return Value::Int(0);
        }
        if bytes.len() > 8 {
            return Value::BigInt(bytes.len());
        }
        let negative = bytes.last().is_some_and(|&last| last & 0x80 != 0);
        let mut a = if negative { [0xffu8; 8] } else { [0u8; 8] };
        for (slot, &byte) in a.iter_mut().zip(bytes) {
            *slot = byte;
        }
        Value::Int(i64::from_le_bytes(a))
    }

    loop {
        let at = r.pos;
        let op = r.u8()?;
        match op {
            0x80 => {
                r.u8()?; // PROTO
            }
            0x95 => {
                r.le_u64()?; // FRAME
            }
            b'.' => {
                let root = pop(&mut stack, at)?;
                return Ok(Pickle { values, root });
            }
            b'(' => marks.push(stack.len()),
            b'}' => push(&mut values, &mut stack, Value::Dict(Vec::new())),
            b']' => push(&mut values, &mut stack, Value::List(Vec::new())),
            b')' => push(&mut values, &mut stack, Value::Tuple(Vec::new())),
            0x8f => push(&mut values, &mut stack, Value::List(Vec::new())), // EMPTY_SET
            b'N' => push(&mut values, &mut stack, Value::None),
            0x88 => push(&mut values, &mut stack, Value::Bool(true)),
            0x89 => push(&mut values, &mut stack, Value::Bool(false)),
            b'J' => {
                let v = r.le_u32()? as i32;
                push(&mut values, &mut stack, Value::Int(i64::from(v)));
            }
            b'K' => {
                let v = r.u8()?;
                push(&mut values, &mut stack, Value::Int(i64::from(v)));
            }
            b'M' => {
                let v = r.le_u16()?;
                push(&mut values, &mut stack, Value::Int(i64::from(v)));
            }
            0x8a | 0x8b => {
                let n = r.len(if op == 0x8a { 1 } else { 4 })?;
                let bytes = r.take(n)?;
                push(&mut values, &mut stack, int_from_le(bytes));
            }
            b'I' | b'L' => {
                let line = utf8(r.line()?, at)?;
                let t = line.trim_end_matches('L');
                let v = match t {
                    "00" => Value::Bool(false),
                    "01" => Value::Bool(true),
                    _ => t
                        .parse::<i64>()
                        .map(Value::Int)
                        .unwrap_or(Value::BigInt(t.len())),
                };
                push(&mut values, &mut stack, v);
            }
            b'G' => {
                let b = r.take(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                push(&mut values, &mut stack, Value::Float(f64::from_be_bytes(a)));
            }
            b'F' => {
                let line = utf8(r.line()?, at)?;
                let f = line
                    .parse()
                    .map_err(|_| ReplayError::PickleMalformed(at, "bad float"))?;
                push(&mut values, &mut stack, Value::Float(f));
            }
            0x8c | b'X' | 0x8d => {
                let n = r.len(match op {
                    0x8c => 1,
                    b'X' => 4,
                    _ => 8,
                })?;
                let s = utf8(r.take(n)?, at)?;
                push(&mut values, &mut stack, Value::Str(s));
            }
            b'C' | b'B' | 0x8e => {
                let n = r.len(match op {
                    b'C' => 1,
                    b'B' => 4,
                    _ => 8,
                })?;
                let b = r.take(n)?;
                push(&mut values, &mut stack, Value::Bytes(b));
            }
            b'q' | b'r' => {
                let idx = r.len(if op == b'q' { 1 } else { 4 })?;
                let top = *stack
                    .last()
                    .ok_or(ReplayError::PickleMalformed(at, "memo of empty stack"))?;
                memo_put(&mut memo, idx, top, at)?;
            }
            0x94 => {
                let top = *stack
                    .last()
                    .ok_or(ReplayError::PickleMalformed(at, "memo of empty stack"))?;
                let idx = memo.len();
                memo_put(&mut memo, idx, top, at)?;
            }
            b'h' | b'j' => {
                let idx = r.len(if op == b'h' { 1 } else { 4 })?;
                let id = memo
                    .get(idx)
                    .copied()
                    .filter(|&v| v != ValueId::MAX)
                    .ok_or(ReplayError::PickleMalformed(at, "unknown memo entry"))?;
                stack.push(id);
            }
            b'0' => {
                pop(&mut stack, at)?;
            }
            b'1' => {
                pop_mark(&mut stack, &mut marks, at)?;
            }
            b'2' => {
                let top = *stack
                    .last()
                    .ok_or(ReplayError::PickleMalformed(at, "dup of empty stack"))?;
                stack.push(top);
            }
            b't' | 0x91 => {
                let items = pop_mark(&mut stack, &mut marks, at)?;
                push(&mut values, &mut stack, Value::Tuple(items));
            }
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                if stack.len() < n {
                    return Err(ReplayError::PickleMalformed(at, "stack underflow"));
                }
                let items = stack.split_off(stack.len() - n);
                push(&mut values, &mut stack, Value::Tuple(items));
            }
            b'l' => {
                let items = pop_mark(&mut stack, &mut marks, at)?;
                push(&mut values, &mut stack, Value::List(items));
            }
            b'd' => {
                let items = pop_mark(&mut stack, &mut marks, at)?;
                let pairs = pairs_of(&items).collect();
                push(&mut values, &mut stack, Value::Dict(pairs));
            }
            b'a' => {
                let v = pop(&mut stack, at)?;
                let list = *stack
                    .last()
                    .ok_or(ReplayError::PickleMalformed(at, "append without list"))?;
                match values.get_mut(list as usize) {
                    Some(Value::List(l)) => l.push(v),
                    _ => return Err(ReplayError::PickleMalformed(at, "append to a non-list")),
                }
            }
            b'e' | 0x90 => {
                let items = pop_mark(&mut stack, &mut marks, at)?;
                let list = *stack
                    .last()
                    .ok_or(ReplayError::PickleMalformed(at, "append without list"))?;
                match values.get_mut(list as usize) {
                    Some(Value::List(l)) => l.extend(items),
                    _ => return Err(ReplayError::PickleMalformed(at, "append to a non-list")),
                }
            }
            b's' | b'u' => {
                let items = if op == b's' {
                    let v = pop(&mut stack, at)?;
                    let k = pop(&mut stack, at)?;
                    vec![k, v]
                } else {
                    pop_mark(&mut stack, &mut marks, at)?
                };
                let dict = *stack
                    .last()
                    .ok_or(ReplayError::PickleMalformed(at, "setitem without dict"))?;
                match values.get_mut(dict as usize) {
                    Some(Value::Dict(d)) => d.extend(pairs_of(&items)),
                    _ => return Err(ReplayError::PickleMalformed(at, "setitem on a non-dict")),
                }
            }
            b'c'
            | 0x93
            | b'R'
            | b'b'
            | 0x81
            | 0x92
            | b'i'
            | b'o'
            | b'P'
            | b'Q'
            | 0x82..=0x84
            | 0x96..=0x98 => {
                return Err(ReplayError::PickleObject(at, op));
            }
            _ => return Err(ReplayError::PickleMalformed(at, "unknown opcode")),
        }
    }
}

/// The `(key, value)` pairs of a flat `key, value, key, value, ...` list (an
/// odd last item is dropped, as `chunks_exact` does).
fn pairs_of(items: &[ValueId]) -> impl Iterator<Item = (ValueId, ValueId)> + '_ {
    items
        .chunks_exact(2)
        .filter_map(|pair| <[ValueId; 2]>::try_from(pair).ok())
        .map(|[key, value]| (key, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_nested_plain_data() {
        // pickle.dumps({'a': [1, -2, 300, 2**40], 'b': (True, None, 1.5), 'c': 'x'}, protocol=4)
        let data: &[u8] = b"\x80\x04\x958\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01J\xfe\xff\xff\xffM,\x01\x8a\x06\x00\x00\x00\x00\x00\x01e\x8c\x01b\x94\x88NG?\xf8\x00\x00\x00\x00\x00\x00\x87\x94\x8c\x01c\x94\x8c\x01x\x94u.";
        let p = parse(data).unwrap();
        let a = p.dict_get(p.root(), "a").unwrap();
        let ints: Vec<i64> = p.items(a).iter().map(|&i| p.as_i64(i).unwrap()).collect();
        assert_eq!(ints, [1, -2, 300, 1 << 40]);
        let c = p.dict_get(p.root(), "c").unwrap();
        assert_eq!(p.as_str(c), Some("x"));
    }

    #[test]
    fn refuses_globals_and_truncation() {
        // pickle.dumps(print)
        let data: &[u8] = b"\x80\x04\x95\x16\x00\x00\x00\x00\x00\x00\x00\x8c\x08builtins\x94\x8c\x05print\x94\x93\x94.";
        assert!(matches!(
            parse(data),
            Err(ReplayError::PickleObject(_, 0x93))
        ));
        assert!(matches!(
            parse(&data[..5]),
            Err(ReplayError::PickleTruncated(_))
        ));
        assert!(parse(b"").is_err());
    }
}
