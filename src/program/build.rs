//! A [`Program`] from the schedules of a rebuilt job at a few small counts
//! of copies: each schedule as a sequence of items ([`Atoms`]), how it
//! grows per dimension ([`super::derive`]), and the two dimensions nested
//! (a decode step holds one call of every block).

use std::borrow::Borrow;
use std::hash::Hash;

use rustc_hash::FxHashMap;

use super::derive::{derive, Atom, Derived, Grown, Line, Name, Plane};
use super::{Dim, EventKey, Leaf, Node, Poly, C_DEPTH, C_TOKENS, J_DEPTH, J_TOKENS};
use crate::orchestrator::{EventKind, Schedule};

/// Items numbered in the order they were first seen.
#[derive(Debug)]
pub(crate) struct Table<K> {
    ids: FxHashMap<K, u32>,
    pub(crate) items: Vec<K>,
}

impl<K> Default for Table<K> {
    fn default() -> Self {
        Table {
            ids: FxHashMap::default(),
            items: Vec::new(),
        }
    }
}

impl<K: Hash + Eq> Table<K> {
    /// The number of `item`, given it when new.
    pub(crate) fn id<Q>(&mut self, item: &Q) -> u32
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Some(&id) = self.ids.get(item) {
            return id;
        }
        let id = u32::try_from(self.items.len()).unwrap_or(u32::MAX);
        self.items.push(item.to_owned());
        self.ids.insert(item.to_owned(), id);
        id
    }
}

/// The sequences of items of a job's schedules: the keys and the names
/// (ops, layer templates) shared by all.
#[derive(Debug, Default)]
pub(crate) struct Atoms {
    pub(crate) keys: Table<EventKey>,
    pub(crate) names: Table<String>,
}

/// The leading numbers of an event: its time, and its size (an
/// allocation) or how many events back its block was allocated (a free).
/// A layer's module numbers follow.
pub(crate) const TIME: usize = 0;
pub(crate) const SIZE_OR_BACK: usize = 1;
pub(crate) const LAYER_NUMBERS: usize = 2;

impl Atoms {
    /// The items of a schedule's events. A block's key (but its kind) and
    /// its layer's numbers are found once, at its allocation.
    pub(crate) fn of(&mut self, schedule: &Schedule) -> Vec<Atom> {
        /// A block's keys (allocation, free) and where its layer's numbers
        /// lie in `numbers`.
        struct Seen {
            made_at: usize,
            keys: [u32; 2],
            numbers: std::ops::Range<usize>,
        }
        let mut seen: Vec<Option<Seen>> = Vec::new();
        seen.resize_with(schedule.blocks.len(), || None);
        // Each layer's template and numbers, split once: many blocks share
        // a layer.
        let mut layers: FxHashMap<&str, (u32, std::ops::Range<usize>)> = FxHashMap::default();
        let mut numbers: Vec<i64> = Vec::new();
        let mut out = Vec::with_capacity(schedule.events.len());
        for (i, e) in schedule.events.iter().enumerate() {
            let Some(slot) = seen.get_mut(e.block.index()) else {
                continue;
            };
            if slot.is_none() || e.kind == EventKind::Alloc {
                let Some(block) = schedule.block(e.block) else {
                    continue;
                };
                let (template, range) = match block.layer.as_deref() {
                    Some(layer) => {
                        let (t, range) = layers.entry(layer).or_insert_with(|| {
                            let (t, n) = split_numbers(layer);
                            let from = numbers.len();
                            numbers.extend_from_slice(&n);
                            (self.names.id(&t), from..numbers.len())
                        });
                        (Some(*t), range.clone())
                    }
                    None => (None, 0..0),
                };
                let key = |kind| EventKey {
                    kind,
                    category: block.category,
                    phase: block.phase,
                    iteration: block.iteration,
                    op: None,
                    layer: template,
                    numbers: u32::try_from(range.len()).unwrap_or(u32::MAX),
                    on: block.on,
                    per_gpu: block.per_gpu,
                };
                let op = block.op.as_deref().map(|op| self.names.id(op));
                let keys = [EventKind::Alloc, EventKind::Free]
                    .map(|kind| self.keys.id(&EventKey { op, ..key(kind) }));
                *slot = Some(Seen {
                    made_at: i,
                    keys,
                    numbers: range,
                });
            }
            let Some(block) = slot.as_ref() else {
                continue;
            };
            let (key, second) = match e.kind {
                EventKind::Alloc => (
                    block.keys[0],
                    schedule
                        .block(e.block)
                        .map_or(0, |b| i64::try_from(b.size.get()).unwrap_or(i64::MAX)),
                ),
                EventKind::Free => (
                    block.keys[1],
                    i64::try_from(i.saturating_sub(block.made_at)).unwrap_or(i64::MAX),
                ),
            };
            let layer = numbers.get(block.numbers.clone()).unwrap_or(&[]);
            let mut attrs = Vec::with_capacity(LAYER_NUMBERS + layer.len());
            attrs.extend([e.time.get(), second]);
            attrs.extend_from_slice(layer);
            out.push(Atom { key, attrs });
        }
        out
    }
}

/// A run of digits as a number where it is a plain one: no leading zero,
/// short enough for an `i64` with room to grow (`None`: it stays text).
pub(crate) fn plain_number(digits: &str) -> Option<i64> {
    let plain = digits.len() < 18 && !(digits.len() > 1 && digits.starts_with('0'));
    plain.then(|| digits.parse::<i64>().ok()).flatten()
}

/// A text as its digit runs (numbers) and what is between them, the
/// numbers replaced by `#`.
pub(crate) fn split_numbers(text: &str) -> (String, Vec<i64>) {
    let mut template = String::with_capacity(text.len());
    let mut numbers = Vec::new();
    let mut digits = String::new();
    for ch in text.chars().chain(std::iter::once('\0')) {
        if ch.is_ascii_digit() {
            digits.push(ch);
            continue;
        }
        if !digits.is_empty() {
            match plain_number(&digits) {
                Some(n) => {
                    template.push('#');
                    numbers.push(n);
                }
                None => template.push_str(&digits),
            }
            digits.clear();
        }
        if ch != '\0' {
            if ch == '#' {
                // A `#` of the text is escaped so that it is not a number.
                template.push('\\');
            }
            template.push(ch);
        }
    }
    (template, numbers)
}

/// The text of `split_numbers` with its numbers put back.
pub(crate) fn join_numbers(template: &str, numbers: &[i64]) -> String {
    let mut out = String::with_capacity(template.len() + 4 * numbers.len());
    let mut next = numbers.iter();
    let mut escaped = false;
    for ch in template.chars() {
        if escaped {
            out.push(ch);
            escaped = false;
        } else if ch == '\\' {
            escaped = true;
        } else if ch == '#' {
            if let Some(n) = next.next() {
                use std::fmt::Write as _;
                let _ = write!(out, "{n}");
            }
        } else {
            out.push(ch);
        }
    }
    out
}

/// One job (a sequence, a text) at four consecutive counts of copies of
/// the dimension `dim`.
#[derive(Debug, Clone)]
pub(crate) struct Grid<T> {
    pub dim: Dim,
    pub at: [T; 4],
}

impl<T> Grid<T> {
    pub(crate) fn map<U>(&self, f: impl FnMut(&T) -> U) -> Grid<U> {
        Grid {
            dim: self.dim,
            at: self.at.each_ref().map(f),
        }
    }
}

/// The program of the sequences of a grid; `name`: the numbers that tell
/// an item from others of its key ([`derive`]).
pub(crate) fn program_of(
    grid: &Grid<Vec<Atom>>,
    name: Option<Name<'_>>,
) -> Option<(Vec<Node>, Vec<Leaf>)> {
    let derived = derive(&grid.at, name)?;
    let dim = grid.dim;
    let (c, j) = match dim {
        Dim::Depth => (C_DEPTH, J_DEPTH),
        Dim::Tokens => (C_TOKENS, J_TOKENS),
    };
    let mut leaves = Vec::new();
    let base = |g: &Grown<Line>| Leaf {
        key: g.key,
        attrs: g.attrs.iter().map(|l| line(0, j, l)).collect(),
    };
    let run = |g: &Grown<Plane>| Leaf {
        key: g.key,
        attrs: g.attrs.iter().map(|p| plane(0, c, j, p)).collect(),
    };
    let nodes = nodes_of(&derived, dim, &mut leaves, base, run)?;
    Some((nodes, leaves))
}

/// A line in the variable `j`, times the term `times`.
fn line(times: usize, j: usize, l: &Line) -> Poly {
    let mut p = Poly::default();
    p.add(times, l.base);
    p.add(times | j, l.slope);
    p
}

/// A plane in the variables `c` and `j`, times the term `times`.
fn plane(times: usize, c: usize, j: usize, q: &Plane) -> Poly {
    let mut p = Poly::default();
    p.add(times, q.a);
    p.add(times | c, q.b);
    p.add(times | j, q.d);
    p.add(times | c | j, q.e);
    p
}

/// The nodes of a derivation: its base items as leaves (`base`), each run
/// of `dim` before its place with its items as leaves (`run`).
fn nodes_of(
    derived: &Derived,
    dim: Dim,
    leaves: &mut Vec<Leaf>,
    base: impl Fn(&Grown<Line>) -> Leaf,
    run: impl Fn(&Grown<Plane>) -> Leaf,
) -> Option<Vec<Node>> {
    let push = |leaf: Leaf, leaves: &mut Vec<Leaf>| -> Option<Node> {
        leaves.push(leaf);
        Some(Node::Leaf(u32::try_from(leaves.len() - 1).ok()?))
    };
    let mut nodes = Vec::new();
    let mut runs = derived.runs.iter().peekable();
    let run_node = |body: &[Grown<Plane>], leaves: &mut Vec<Leaf>| -> Option<Node> {
        let mut out = Vec::with_capacity(body.len());
        for g in body {
            out.push(push(run(g), leaves)?);
        }
        Some(Node::Run { dim, body: out })
    };
    for (i, g) in derived.base.iter().enumerate() {
        while let Some((_, body)) = runs.next_if(|(pos, _)| *pos == i) {
            nodes.push(run_node(body, leaves)?);
        }
        nodes.push(push(base(g), leaves)?);
    }
    for (_, body) in runs {
        nodes.push(run_node(body, leaves)?);
    }
    Some(nodes)
}
