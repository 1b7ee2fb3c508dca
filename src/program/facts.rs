//! The facts of a rebuilt job at its full size from the same facts at a few
//! small counts of copies: their JSON text as runs of text and numbers,
//! each number a line in the copies (parameters, calls, the KV cache's
//! bytes and positions, rule counts, times of windows, the numbers in
//! warnings), lists that grow with the copies grown by the same rule as
//! the events ([`super::derive`]).

use super::build::{self, Grid, Table};
use super::derive::Atom;

/// The text of `texts` (one text at each count of the grid) at `extra`
/// added copies, or `None` where its numbers do not grow on lines.
pub(crate) fn grown_text(texts: &Grid<String>, extra: [i64; 2]) -> Option<String> {
    let mut pieces = Pieces::default();
    let atoms = texts.map(|t| pieces.atoms(t));
    if let Some(text) = same_items(&pieces, &atoms, extra) {
        return Some(text);
    }
    let (nodes, leaves) = build::program_of(&atoms, None)?;
    let mut out = String::new();
    super::walk_nodes(&nodes, &leaves, extra, &mut |_, leaf, terms| {
        if let Some(text) = pieces.texts.items.get(leaf.key as usize) {
            out.push_str(text);
        }
        if let Some(n) = leaf.attrs.first() {
            out.push_str(&n.at(terms).to_string());
        }
        std::ops::ControlFlow::Continue(())
    });
    Some(out)
}

/// The text of four texts with the same items (the same runs of text
/// between their numbers) at `extra` added copies, each number on the
/// polynomial of degree two at most through its first three values and
/// checked on the fourth: a sum over the copies of a number that grows on
/// a line per copy (the scratch of every decode step, each a position
/// longer) grows so. `None` where the items differ or a number does not.
fn same_items(pieces: &Pieces, grid: &Grid<Vec<Atom>>, extra: [i64; 2]) -> Option<String> {
    let seqs = &grid.at;
    let first = seqs.first()?;
    if seqs.iter().any(|s| s.len() != first.len()) {
        return None;
    }
    let mut out = String::new();
    for (i, item) in first.iter().enumerate() {
        let mut values = Vec::with_capacity(seqs.len());
        for s in seqs {
            let x = s.get(i)?;
            if x.key != item.key || x.attrs.len() != item.attrs.len() {
                return None;
            }
            values.extend(x.attrs.first().copied());
        }
        out.push_str(pieces.texts.items.get(item.key as usize)?);
        if values.is_empty() {
            continue;
        }
        let values: [i64; 4] = values.try_into().ok()?;
        let value = quadratic_at(values, *extra.get(grid.dim as usize)?)?;
        out.push_str(&value.to_string());
    }
    Some(out)
}

/// The value at `n` of the polynomial of degree two at most through
/// `v[0..3]` at 0, 1, 2, if `v[3]` (at 3) is on it (checked arithmetic).
fn quadratic_at(v: [i64; 4], n: i64) -> Option<i64> {
    let d1 = v[1].checked_sub(v[0])?;
    let d2 = v[2].checked_sub(v[1])?.checked_sub(d1)?;
    let d3 = v[3]
        .checked_sub(v[2])?
        .checked_sub(v[2].checked_sub(v[1])?)?;
    if d3 != d2 {
        return None;
    }
    let pairs = n.checked_mul(n.checked_sub(1)?)? / 2;
    v[0].checked_add(d1.checked_mul(n)?)?
        .checked_add(d2.checked_mul(pairs)?)
}

/// The runs of text between numbers, shared by every text of a grid.
#[derive(Debug, Default)]
struct Pieces {
    texts: Table<String>,
}

impl Pieces {
    /// A text as items: each number with the text before it, then the
    /// text after the last number. A digit run that is no plain number
    /// (a leading zero, too long) stays text.
    fn atoms(&mut self, text: &str) -> Vec<Atom> {
        let mut out = Vec::new();
        let mut before = String::new();
        let mut digits = String::new();
        for ch in text.chars().chain(std::iter::once('\0')) {
            if ch.is_ascii_digit() {
                digits.push(ch);
                continue;
            }
            if !digits.is_empty() {
                match build::plain_number(&digits) {
                    Some(n) => {
                        let key = self.texts.id(before.as_str());
                        out.push(Atom {
                            key,
                            attrs: vec![n],
                        });
                        before.clear();
                    }
                    None => before.push_str(&digits),
                }
                digits.clear();
            }
            if ch != '\0' {
                before.push(ch);
            }
        }
        let key = self.texts.id(before.as_str());
        out.push(Atom {
            key,
            attrs: Vec::new(),
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_grow_on_lines_and_lists_with_the_copies() {
        // Parameters grow by 9 a block, a list gets an entry per block,
        // a name keeps its number.
        let text = |k: i64| {
            let list: Vec<String> = (0..2 + k).map(|i| format!("{{\"layer\":{i}}}")).collect();
            format!(
                "{{\"n\":{},\"list\":[{}],\"name\":\"Block_07\"}}",
                18 + 9 * k,
                list.join(",")
            )
        };
        let grid = Grid {
            dim: super::super::Dim::Depth,
            at: [text(1), text(2), text(3), text(4)],
        };
        assert_eq!(
            grown_text(&grid, [40, 0]).as_deref(),
            Some(text(41).as_str())
        );
        // A number off its line: none.
        let grid = Grid {
            dim: super::super::Dim::Depth,
            at: [
                text(1),
                text(2),
                text(3),
                text(4).replace("\"n\":54", "\"n\":55"),
            ],
        };
        assert_eq!(grown_text(&grid, [40, 0]), None);
    }

    #[test]
    fn sums_of_numbers_that_grow_per_copy_grow_on_a_parabola() {
        // Scratch of 100 + 8·i bytes for each of the 2 + k steps.
        let text = |k: i64| {
            let bytes: i64 = (0..2 + k).map(|i| 100 + 8 * i).sum();
            format!("{{\"op\":\"attn\",\"bytes\":{bytes},\"calls\":{}}}", 2 + k)
        };
        let grid = Grid {
            dim: super::super::Dim::Tokens,
            at: [text(0), text(1), text(2), text(3)],
        };
        assert_eq!(
            grown_text(&grid, [0, 1000]).as_deref(),
            Some(text(1000).as_str())
        );
        // Off the parabola (a cubic term): none.
        assert_eq!(quadratic_at([0, 1, 8, 27], 10), None);
        assert_eq!(quadratic_at([5, 7, 9, 11], 100), Some(205));
    }
}
