//! Finding how a sequence grows with its copies: given the same sequence
//! at four counts of copies (`a`, `a+1`, `a+2`, `a+3`), the places where
//! one more copy inserts items, the items it inserts, and each number as a
//! line in the count — checked on all four.
//!
//! The rule. A rebuilt job with one more copy is the same job with the
//! copy's events inserted where copies go (in its segment's run of copies,
//! and where per-copy facts are listed: its parameters at setup, its
//! optimizer state), everything else alike but for numbers that move with
//! the copies (times after the copies, sizes that grow per step, module
//! numbers after the block, distances to a block across the copies). So:
//! - the sequence at `a` embeds in the one at `a+1`: an alignment that
//!   matches every item of the first (same key) and inserts the fewest
//!   runs of items, each run slid as far right as it goes (a run of equal
//!   copies can be inserted anywhere in it: the right end is where the
//!   last copy is);
//! - the sequences at `a+2` and `a+3` are the first with two and three
//!   copies of each run at its place, key for key;
//! - each number of an item of the first is a line in the copies added
//!   (`a` → 0, `a+3` → 3: four points), and each number of the `c`-th
//!   inserted copy of a run a plane in `c` and the copies added `j` (six
//!   points: a copy's time moves with the copies inserted before it, by
//!   another run).
//!
//! Anything else (an item that disappears, a run whose copies differ, a
//! number that does not grow on a line) is no derivation: `None`.

/// The numbers of an item that tell it from the others of its key.
pub(crate) type Name<'a> = &'a dyn Fn(&Atom) -> &[i64];

/// One item of a sequence: what must be equal, and its numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Atom {
    pub key: u32,
    pub attrs: Vec<i64>,
}

/// A number as a line: `base + slope · n`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Line {
    pub base: i64,
    pub slope: i64,
}

impl Line {
    /// The line through the values at 0, 1, …, if they lie on one.
    fn through(values: &[i64]) -> Option<Line> {
        let (&v0, &v1) = (values.first()?, values.get(1).or(values.first())?);
        let slope = v1.checked_sub(v0)?;
        let fits = values.iter().enumerate().all(|(n, &v)| {
            i64::try_from(n)
                .ok()
                .and_then(|n| slope.checked_mul(n))
                .and_then(|d| v0.checked_add(d))
                == Some(v)
        });
        fits.then_some(Line { base: v0, slope })
    }
}

/// A number of a run's copy as a plane: `a + b·c + d·j + e·c·j` for copy
/// `c` (0, 1, …) among `j` copies added.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Plane {
    pub a: i64,
    pub b: i64,
    pub d: i64,
    pub e: i64,
}

impl Plane {
    fn at(self, c: i64, j: i64) -> Option<i64> {
        self.a
            .checked_add(self.b.checked_mul(c)?)?
            .checked_add(self.d.checked_mul(j)?)?
            .checked_add(self.e.checked_mul(c)?.checked_mul(j)?)
    }

    /// The plane through `values[(c, j)]` for every `c < j` of `j` = 1, 2,
    /// 3, if they lie on one.
    fn through(values: &[(i64, i64, i64)]) -> Option<Plane> {
        let v = |c: i64, j: i64| values.iter().find(|p| p.0 == c && p.1 == j).map(|p| p.2);
        let (v01, v02, v12, v13) = (v(0, 1)?, v(0, 2)?, v(1, 2)?, v(1, 3)?);
        let d = v02.checked_sub(v01)?;
        let a = v01.checked_sub(d)?;
        let de = v13.checked_sub(v12)?;
        let ab = v12.checked_sub(de.checked_mul(2)?)?;
        let plane = Plane {
            a,
            b: ab.checked_sub(a)?,
            d,
            e: de.checked_sub(d)?,
        };
        values
            .iter()
            .all(|&(c, j, x)| plane.at(c, j) == Some(x))
            .then_some(plane)
    }
}

/// An item with its numbers as lines (or planes, in a run).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grown<T> {
    pub key: u32,
    pub attrs: Vec<T>,
}

/// How a sequence grows: its items at the first count, each number a line
/// in the copies added, and the runs one more copy inserts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Derived {
    pub base: Vec<Grown<Line>>,
    /// (position in `base`: inserted before that item, the run's items
    /// with each number a plane in the copy's number and the copies).
    pub runs: Vec<(usize, Vec<Grown<Plane>>)>,
}

/// The most alignment cells (items of the first sequence × items
/// inserted) derived: beyond it the caller builds the job whole.
pub(crate) const MAX_CELLS: usize = 1 << 27;

/// How `seqs` (the same sequence at four consecutive counts) grows; see
/// the module docs.
///
/// `name`: the numbers that tell an item from others of its key (its size,
/// its layer's module numbers) where they do; when the alignment by key
/// does not derive, runs are placed again where most kept items keep
/// their names ([`slide_named`], [`align_named`]) and that is tried.
pub(crate) fn derive(seqs: &[Vec<Atom>; 4], name: Option<Name<'_>>) -> Option<Derived> {
    let [x0, x1, ..] = seqs;
    // One pass with a long window, then shorter ones (insertions close
    // together: one more block's frees among every block's), then exact.
    for window in WINDOWS {
        if let Some(inserted) = greedy_insertions(x0, x1, window) {
            if let Some(derived) = derive_from(seqs, inserted, name) {
                return Some(derived);
            }
        }
    }
    derive_from(seqs, inserted_items(x0, x1)?, name)
}

/// How `seqs` grows where `inserted` marks the items of the second that
/// the first lacks: the runs slid right, else placed by names.
fn derive_from(
    seqs: &[Vec<Atom>; 4],
    mut inserted: Vec<bool>,
    name: Option<Name<'_>>,
) -> Option<Derived> {
    let [x0, x1, ..] = seqs;
    slide_right(x1, &mut inserted);
    if let Some(derived) = parse(seqs, &runs_of(x1, &inserted)) {
        return Some(derived);
    }
    let name = name?;
    slide_named(x0, x1, &mut inserted, name);
    align_named(x0, x1, &mut inserted, name);
    parse(seqs, &runs_of(x1, &inserted))
}

/// Slides each run of inserted items (`inserted`) of `b` over the kept
/// items around it that the key alignment equally allows (those before
/// it whose keys repeat the run's end, those after it whose keys repeat
/// its start) to the place where most kept items keep their names
/// (`named`) from `a`: one more block's events go where its copy is, the
/// first of a backward pass, the last of a forward. Ties go right (the
/// key alignment's place).
fn slide_named(a: &[Atom], b: &[Atom], inserted: &mut [bool], named: Name<'_>) {
    let same = |x: Option<&Atom>, y: Option<&Atom>| match (x, y) {
        (Some(x), Some(y)) => named(x) == named(y),
        _ => false,
    };
    let key = |x: usize| b.get(x).map(|x| x.key);
    let is_in = |inserted: &[bool], x: usize| inserted.get(x).copied().unwrap_or(true);
    // `s` walks `b`; `before` counts the inserted items before it.
    let (mut s, mut before) = (0usize, 0usize);
    while s < b.len() {
        if !is_in(inserted, s) {
            s += 1;
            continue;
        }
        let mut e = s;
        while e < b.len() && is_in(inserted, e) {
            e += 1;
        }
        let len = e - s;
        let limit = len.saturating_mul(8).saturating_add(64);
        let mut left = 0;
        while left < limit
            && left < s
            && !is_in(inserted, s - left - 1)
            && key(s - left - 1) == key(e - left - 1)
        {
            left += 1;
        }
        let mut right = 0;
        while right < limit
            && e + right < b.len()
            && !is_in(inserted, e + right)
            && key(e + right) == key(s + right)
        {
            right += 1;
        }
        // The window's kept items and their partners in `a` (from `base`
        // on), with the run at its leftmost place; each step right swaps
        // one partner.
        let w0 = s - left;
        let base = w0 - before;
        let mut score: i64 = (w0..w0 + left)
            .chain(e..e + right)
            .enumerate()
            .map(|(p, x)| i64::from(same(b.get(x), a.get(base + p))))
            .sum();
        let (mut best, mut best_score) = (left, i64::MIN);
        for t in 0..=left + right {
            if t > 0 {
                // The run from w0 + t - 1 to w0 + t: b[w0 + t - 1] is kept
                // at partner place t - 1, b[w0 + t - 1 + len] inserted.
                let partner = a.get(base + t - 1);
                score += i64::from(same(b.get(w0 + t - 1), partner))
                    - i64::from(same(b.get(w0 + t - 1 + len), partner));
            }
            if score >= best_score {
                (best, best_score) = (t, score);
            }
        }
        for x in w0..w0 + left + len + right {
            if let Some(slot) = inserted.get_mut(x) {
                *slot = x >= w0 + best && x < w0 + best + len;
            }
        }
        s = w0 + best + len;
        before += len;
    }
}

/// Re-aligns each stretch of one key in `b` that holds both kept and
/// inserted items (`inserted`), and whose kept items do not all keep
/// their names from `a`, by the names: each kept item of `a` goes to the
/// first item of the stretch after the last one taken with the same name
/// (one more block's frees inserted into a list of every block's, each
/// where its block is). A stretch that cannot be aligned so stays.
fn align_named(a: &[Atom], b: &[Atom], inserted: &mut [bool], name: Name<'_>) {
    let is_kept = |inserted: &[bool], k: usize| !inserted.get(k).copied().unwrap_or(true);
    let (mut s, mut ai) = (0usize, 0usize);
    while let Some(key) = b.get(s).map(|x| x.key) {
        let mut e = s;
        while b.get(e).is_some_and(|x| x.key == key) {
            e += 1;
        }
        let kept = (s..e).filter(|&k| is_kept(inserted, k)).count();
        let Some(wanted) = a.get(ai..ai + kept) else {
            return;
        };
        let named = (s..e)
            .filter(|&k| is_kept(inserted, k))
            .zip(wanted)
            .all(|(k, item)| b.get(k).is_some_and(|x| name(x) == name(item)));
        if kept > 0 && kept < e - s && !named {
            if let Some(mask) = named_mask(wanted, b.get(s..e).unwrap_or(&[]), name) {
                if let Some(range) = inserted.get_mut(s..e) {
                    range.copy_from_slice(&mask);
                }
            }
        }
        ai += kept;
        s = e;
    }
}

/// Which items of `stretch` are inserted when each of `wanted` in turn
/// takes the first item after the last one taken with its name (`None`:
/// some finds none).
fn named_mask(wanted: &[Atom], stretch: &[Atom], name: Name<'_>) -> Option<Vec<bool>> {
    let mut mask = vec![true; stretch.len()];
    let mut k = 0;
    for item in wanted {
        let want = name(item);
        while stretch.get(k).is_some_and(|x| name(x) != want) {
            k += 1;
        }
        *mask.get_mut(k)? = false;
        k += 1;
    }
    Some(mask)
}

/// `seqs` parsed as the first with j copies of each of `runs` at its place
/// (j = 1, 2, 3), each number on its line or plane; see the module docs.
fn parse(seqs: &[Vec<Atom>; 4], runs: &[(usize, Vec<Atom>)]) -> Option<Derived> {
    let [x0, x1, x2, x3] = seqs;
    // Each sequence parsed as the first with j copies of every run; the
    // numbers are read where they lie, not copied. Per item of the first:
    // its numbers at each count, in one table.
    let mut base_vals: Vec<[&[i64]; 4]> = x0.iter().map(|a| [a.attrs.as_slice(); 4]).collect();
    // Per run, per item: (copy, copies, numbers).
    let mut run_vals: Vec<Vec<Vec<CopyNumbers<'_>>>> = runs
        .iter()
        .map(|(_, body)| vec![Vec::new(); body.len()])
        .collect();
    for (j, x) in [x1, x2, x3].into_iter().enumerate() {
        let j = j + 1;
        let mut at = x.iter();
        let mut r = 0;
        for (i, item) in x0
            .iter()
            .enumerate()
            .chain(std::iter::once((x0.len(), &END)))
        {
            while let Some(&(pos, ref body)) = runs.get(r).filter(|(pos, _)| *pos == i) {
                let _ = pos;
                for c in 0..j {
                    for (m, want) in body.iter().enumerate() {
                        let got = at.next()?;
                        if got.key != want.key || got.attrs.len() != want.attrs.len() {
                            return None;
                        }
                        run_vals.get_mut(r)?.get_mut(m)?.push((
                            i64::try_from(c).ok()?,
                            i64::try_from(j).ok()?,
                            got.attrs.as_slice(),
                        ));
                    }
                }
                r += 1;
            }
            if i == x0.len() {
                break;
            }
            let got = at.next()?;
            if got.key != item.key || got.attrs.len() != item.attrs.len() {
                return None;
            }
            *base_vals.get_mut(i)?.get_mut(j)? = got.attrs.as_slice();
        }
        if at.next().is_some() {
            return None;
        }
    }
    let base = x0
        .iter()
        .zip(&base_vals)
        .map(|(a, vals)| grown(a.key, vals))
        .collect::<Option<Vec<Grown<Line>>>>()?;
    let mut out_runs = Vec::with_capacity(runs.len());
    let mut points = Vec::new();
    for ((pos, body), items) in runs.iter().zip(&run_vals) {
        let items = body
            .iter()
            .zip(items)
            .map(|(a, vals)| planes(a.key, vals, &mut points))
            .collect::<Option<Vec<Grown<Plane>>>>()?;
        out_runs.push((*pos, items));
    }
    Some(Derived {
        base,
        runs: out_runs,
    })
}

/// A run item's numbers in one copy: (copy, copies, numbers).
type CopyNumbers<'a> = (i64, i64, &'a [i64]);

/// The end of a sequence, for the parse loop.
static END: Atom = Atom {
    key: u32::MAX,
    attrs: Vec::new(),
};

/// A run's item whose numbers were `vals` (copy, copies, numbers), each
/// on a plane; `points`: room to gather one number's points in.
fn planes(
    key: u32,
    vals: &[CopyNumbers<'_>],
    points: &mut Vec<(i64, i64, i64)>,
) -> Option<Grown<Plane>> {
    let width = vals.first().map_or(0, |v| v.2.len());
    let mut attrs = Vec::with_capacity(width);
    for k in 0..width {
        points.clear();
        for (c, j, v) in vals {
            points.push((*c, *j, *v.get(k)?));
        }
        attrs.push(Plane::through(points)?);
    }
    Some(Grown { key, attrs })
}

/// An item whose numbers were `vals[n]` at count `n`, each on a line.
fn grown(key: u32, vals: &[&[i64]; 4]) -> Option<Grown<Line>> {
    let [v0, v1, v2, v3] = vals;
    let width = v0.len();
    let mut attrs = Vec::with_capacity(width);
    for k in 0..width {
        let column = [*v0.get(k)?, *v1.get(k)?, *v2.get(k)?, *v3.get(k)?];
        attrs.push(Line::through(&column)?);
    }
    Some(Grown { key, attrs })
}

/// The items `b` inserts into `a`: the fewest runs that make `b` from `a`
/// by insertions alone (the exact alignment). `None` when `a` does not
/// embed in `b` or the alignment would be too large.
fn inserted_items(a: &[Atom], b: &[Atom]) -> Option<Vec<bool>> {
    let n = a.len();
    let d = b.len().checked_sub(n)?;
    if d == 0 {
        return (a.iter().zip(b).all(|(x, y)| x.key == y.key)).then(|| vec![false; n]);
    }
    let w = d + 1;
    // Common prefix and suffix need no table.
    let key = |s: &[Atom], i: usize| s.get(i).map(|x| x.key);
    let mut lo = 0;
    while lo < n && key(a, lo) == key(b, lo) {
        lo += 1;
    }
    let mut hi = 0;
    while hi < n - lo && key(a, n - 1 - hi) == key(b, b.len() - 1 - hi) {
        hi += 1;
    }
    if (n - lo - hi + 1).checked_mul(w)? > MAX_CELLS {
        return None;
    }
    // Inside: cost[i][o] = fewest runs to embed a[lo..lo+i] in
    // b[lo..lo+i+o], ending on a match (m) or an insertion (g).
    const INF: u32 = u32::MAX / 2;
    let n_in = n - lo - hi;
    let cells = (n_in + 1).checked_mul(w)?;
    let mut m = vec![INF; cells];
    let mut g = vec![INF; cells];
    // Whence each cell came: bit 0 for m (from g), bit 1 for g (from g).
    let mut from = vec![0u8; cells];
    let at = |i: usize, o: usize| i * w + o;
    if let Some(c) = m.get_mut(0) {
        *c = 0;
    }
    for i in 0..=n_in {
        for o in 0..=d {
            let here = at(i, o);
            if i > 0 {
                let prev = at(i - 1, o);
                if key(a, lo + i - 1) == key(b, lo + i - 1 + o) {
                    let (pm, pg) = (
                        m.get(prev).copied().unwrap_or(INF),
                        g.get(prev).copied().unwrap_or(INF),
                    );
                    if let (Some(c), Some(f)) = (m.get_mut(here), from.get_mut(here)) {
                        // Ties: from the insertion (the run ends later).
                        if pg <= pm {
                            *c = pg;
                            *f |= 1;
                        } else {
                            *c = pm;
                        }
                    }
                }
            }
            if o > 0 {
                let prev = at(i, o - 1);
                let (pm, pg) = (
                    m.get(prev).copied().unwrap_or(INF).saturating_add(1),
                    g.get(prev).copied().unwrap_or(INF),
                );
                if let (Some(c), Some(f)) = (g.get_mut(here), from.get_mut(here)) {
                    if pg <= pm {
                        *c = pg;
                        *f |= 2;
                    } else {
                        *c = pm;
                    }
                }
            }
        }
    }
    let end = at(n_in, d);
    let (em, eg) = (m.get(end).copied()?, g.get(end).copied()?);
    if em >= INF && eg >= INF {
        return None;
    }
    // Trace back: which items of b are inserted.
    let mut inserted = vec![false; b.len()];
    let (mut i, mut o, mut in_gap) = (n_in, d, eg <= em);
    while i > 0 || o > 0 {
        let f = from.get(at(i, o)).copied()?;
        if in_gap {
            *inserted.get_mut(lo + i + o - 1)? = true;
            in_gap = f & 2 != 0;
            o = o.checked_sub(1)?;
        } else {
            in_gap = f & 1 != 0;
            i = i.checked_sub(1)?;
        }
    }
    Some(inserted)
}

/// The items of `b` to window-match after a mismatch: an insertion is
/// taken where the next this many items of both sequences agree (tried in
/// turn).
const WINDOWS: [usize; 3] = [256, 32, 8];

/// The insertions that make `b` from `a` found in one pass, where the
/// inserted runs are few and each is followed by items that tell where it
/// ends (a decode step before the rest of a generation, a block's copy):
/// at each mismatch, the shortest run after which the next `window` items
/// of both agree. `None` when that does not embed `a` in `b`.
fn greedy_insertions(a: &[Atom], b: &[Atom], window: usize) -> Option<Vec<bool>> {
    let mut inserted = vec![false; b.len()];
    let (mut i, mut k) = (0usize, 0usize);
    let agree = |i: usize, k: usize, len: usize| {
        (0..len).all(|t| match (a.get(i + t), b.get(k + t)) {
            (Some(x), Some(y)) => x.key == y.key,
            _ => false,
        })
    };
    while i < a.len() {
        if a.get(i)?.key == b.get(k)?.key {
            i += 1;
            k += 1;
            continue;
        }
        let left = (b.len() - k).checked_sub(a.len() - i)?;
        let window = window.min(a.len() - i);
        let run = (1..=left).find(|&len| agree(i, k + len, window))?;
        for slot in inserted.get_mut(k..k + run)? {
            *slot = true;
        }
        k += run;
    }
    for slot in inserted.get_mut(k..)? {
        *slot = true;
    }
    Some(inserted)
}

/// The runs `inserted` marks in `b`, by the position in `a` before which
/// each goes.
fn runs_of(b: &[Atom], inserted: &[bool]) -> Vec<(usize, Vec<Atom>)> {
    let mut runs: Vec<(usize, Vec<Atom>)> = Vec::new();
    let mut pos = 0;
    let mut open = false;
    for (item, &ins) in b.iter().zip(inserted) {
        if ins {
            match runs.last_mut() {
                Some((p, run)) if open && *p == pos => run.push(item.clone()),
                _ => runs.push((pos, vec![item.clone()])),
            }
            open = true;
        } else {
            pos += 1;
            open = false;
        }
    }
    runs
}

/// Slides each run of inserted items right while the item after it is a
/// kept one with the run's first key (the kept item then matches the run's
/// first place instead), joining runs that meet.
fn slide_right(b: &[Atom], inserted: &mut [bool]) {
    let mut s = 0;
    while s < b.len() {
        if !inserted.get(s).copied().unwrap_or(false) {
            s += 1;
            continue;
        }
        let mut start = s;
        let mut end = s;
        while inserted.get(end).copied().unwrap_or(false) {
            end += 1;
        }
        // [start, end) is a run; slide it while b[end] is kept and equal
        // to b[start], absorbing a run it meets.
        loop {
            match (b.get(start), b.get(end), inserted.get(end).copied()) {
                (Some(x), Some(y), Some(false)) if x.key == y.key => {
                    if let Some(slot) = inserted.get_mut(start) {
                        *slot = false;
                    }
                    if let Some(slot) = inserted.get_mut(end) {
                        *slot = true;
                    }
                    start += 1;
                    end += 1;
                    while inserted.get(end).copied().unwrap_or(false) {
                        end += 1;
                    }
                }
                _ => break,
            }
        }
        s = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(keys: &[u32], attrs: &[i64]) -> Vec<Atom> {
        keys.iter()
            .zip(attrs.iter().chain(std::iter::repeat(&0)))
            .map(|(&key, &v)| Atom {
                key,
                attrs: vec![v],
            })
            .collect()
    }

    /// A prefix, `1 + k` copies of a step [1 2 3] whose second item grows
    /// by 10 a copy, and a suffix whose item's number moves by 3 a copy.
    fn steps(k: usize) -> Vec<Atom> {
        let mut keys = vec![9, 1];
        let mut vals = vec![0, 0];
        for c in 0..=k {
            keys.extend([1, 2, 3]);
            vals.extend([0, 10 * c as i64, 7]);
        }
        keys.extend([1, 8]);
        vals.extend([0, 3 * k as i64]);
        seq(&keys, &vals)
    }

    #[test]
    fn a_run_of_copies_is_found_at_its_right_end_with_its_growth() {
        let d = derive(&[steps(1), steps(2), steps(3), steps(4)], None).unwrap();
        assert_eq!(d.runs.len(), 1);
        let (pos, body) = &d.runs[0];
        // Slid right: before the suffix (the kept `1` of the suffix matches
        // the run's first key, so the run ends after it).
        assert_eq!(*pos, 2 + 6 + 1);
        let keys: Vec<u32> = body.iter().map(|g| g.key).collect();
        assert_eq!(keys, [2, 3, 1]);
        assert_eq!(
            body[0].attrs[0],
            Plane {
                a: 20,
                b: 10,
                d: 0,
                e: 0
            }
        );
        // The suffix's number is a line in the copies added.
        assert_eq!(d.base.last().unwrap().attrs[0], Line { base: 3, slope: 3 });
    }

    #[test]
    fn what_does_not_grow_on_a_line_is_no_derivation() {
        let mut x3 = steps(4);
        let last = x3.len() - 1;
        x3[last].attrs[0] += 1;
        assert!(derive(&[steps(1), steps(2), steps(3), x3], None).is_none());
        // An item that disappears.
        let mut x2 = steps(3);
        x2.remove(0);
        assert!(derive(&[steps(1), steps(2), x2, steps(4)], None).is_none());
    }

    /// A job of `n` blocks: each block allocates (key 1, named by its
    /// number), then frees every block's first tensor and then every
    /// block's second (key 2), as a GPT-2 generation frees its KV cache;
    /// the final item's number moves with the blocks.
    fn interleaved(n: i64) -> Vec<Atom> {
        let item = |key, name: i64| Atom {
            key,
            attrs: vec![0, name],
        };
        let mut out: Vec<Atom> = (0..n).map(|l| item(1, l)).collect();
        out.extend((0..n).map(|l| item(2, l)));
        out.extend((0..n).map(|l| item(2, l)));
        out.push(item(3, 7 * n));
        out
    }

    #[test]
    fn insertions_among_same_keyed_items_are_placed_by_their_names() {
        let seqs = [
            interleaved(3),
            interleaved(4),
            interleaved(5),
            interleaved(6),
        ];
        // By key alone the two frees a block adds go together at the end
        // of the frees, where the names do not grow on lines.
        assert!(derive(&seqs, None).is_none());
        let name: Name<'_> = &|a: &Atom| a.attrs.get(1..).unwrap_or(&[]);
        let d = derive(&seqs, Some(name)).unwrap();
        // One run per list: the allocation, and a free in each list.
        let places: Vec<usize> = d.runs.iter().map(|(pos, _)| *pos).collect();
        assert_eq!(places, [3, 6, 9]);
        for (_, body) in &d.runs {
            assert_eq!(body.len(), 1);
            // The added block's name: 3 + its copy's number.
            assert_eq!(
                body[0].attrs[1],
                Plane {
                    a: 3,
                    b: 1,
                    d: 0,
                    e: 0
                }
            );
        }
        assert_eq!(d.base.last().unwrap().attrs[1], Line { base: 21, slope: 7 });
    }

    #[test]
    fn a_stretch_whose_names_hold_is_not_realigned() {
        // Sizes per block [5, 9, 9], then a last item of size 9: the
        // block added goes before the last item, not wherever the first
        // free size 9 lies.
        let seq = |n: usize| {
            let mut keys = Vec::new();
            let mut vals = Vec::new();
            for _ in 0..n {
                keys.extend([1, 1, 1]);
                vals.extend([5, 9, 9]);
            }
            keys.extend([1, 2]);
            vals.extend([9, 0]);
            seq(&keys, &vals)
        };
        let (a, b) = (seq(2), seq(3));
        let name: Name<'_> = &|a: &Atom| a.attrs.as_slice();
        let mut inserted = vec![false; 6];
        inserted.extend([true; 3]);
        inserted.extend([false; 2]);
        let before = inserted.clone();
        align_named(&a, &b, &mut inserted, name);
        assert_eq!(inserted, before);
    }

    #[test]
    fn the_fewest_runs_are_inserted() {
        // [A B A] + one B inserted between: not split around the A's.
        let a = seq(&[1, 2, 1, 3], &[]);
        let b = seq(&[1, 2, 1, 2, 1, 3], &[]);
        let mut inserted = inserted_items(&a, &b).unwrap();
        slide_right(&b, &mut inserted);
        let runs = runs_of(&b, &inserted);
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].1.len(), 2);
    }
}
