//! Aligning two calls of a block: the longest common subsequence of their
//! `[memory]` sizes, as position maps both ways.

/// The longest common subsequence of two token lists as two position maps;
/// `None` when the table would be too large.
#[allow(clippy::type_complexity)]
pub(super) fn align<T: PartialEq>(
    a: &[T],
    b: &[T],
) -> Option<(Vec<Option<usize>>, Vec<Option<usize>>)> {
    let mut t2p = vec![None; a.len()];
    let mut p2t = vec![None; b.len()];
    // The common case: the predecessor starts with the template's events.
    if a.len() <= b.len() && a.iter().zip(b).all(|(x, y)| x == y) {
        for (i, slot) in t2p.iter_mut().enumerate() {
            *slot = Some(i);
        }
        for (i, slot) in p2t.iter_mut().enumerate().take(a.len()) {
            *slot = Some(i);
        }
        return Some((t2p, p2t));
    }
    let (n, m) = (a.len(), b.len());
    if n.saturating_mul(m) > 64 << 20 {
        return None;
    }
    // table[i][j] = LCS of a[i..], b[j..]
    let w = m + 1;
    let mut table = vec![0u32; (n + 1) * w];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            let v = if a.get(i) == b.get(j) {
                table.get((i + 1) * w + j + 1).copied().unwrap_or(0) + 1
            } else {
                let down = table.get((i + 1) * w + j).copied().unwrap_or(0);
                let right = table.get(i * w + j + 1).copied().unwrap_or(0);
                down.max(right)
            };
            if let Some(cell) = table.get_mut(i * w + j) {
                *cell = v;
            }
        }
    }
    let (mut i, mut j) = (0, 0);
    while i < n && j < m {
        if a.get(i) == b.get(j) {
            if let Some(slot) = t2p.get_mut(i) {
                *slot = Some(j);
            }
            if let Some(slot) = p2t.get_mut(j) {
                *slot = Some(i);
            }
            i += 1;
            j += 1;
        } else if table.get((i + 1) * w + j) >= table.get(i * w + j + 1) {
            i += 1;
        } else {
            j += 1;
        }
    }
    Some((t2p, p2t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_is_the_identity_on_equal_blocks_and_skips_extra_events() {
        let (t2p, p2t) = align(&[1, 2, 3], &[1, 2, 3, 4]).unwrap();
        assert_eq!(t2p, [Some(0), Some(1), Some(2)]);
        assert_eq!(p2t, [Some(0), Some(1), Some(2), None]);
        // The predecessor has extra events (T5's first block).
        let (t2p, _) = align(&[1, 2, 3], &[1, 9, 9, 2, 3]).unwrap();
        assert_eq!(t2p, [Some(0), Some(3), Some(4)]);
    }
}
